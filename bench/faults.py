"""The fault checker as a long run: raylog's guarantees under seeded faults.

Producers (acks "all" and 1, keyed and keyless, plain and compressed) and a
consumer group of Ray actors (manual and automatic commits) run over a
multi-partition topic on a multi-node Ray cluster while the nemesis injects
every fault kind of :mod:`raylog.testing.faults` (kill or pause a partition
actor, kill a consumer process, expire a ZooKeeper session, drop a
connection, stop and restart ZooKeeper, flip a byte of a flushed segment,
remove a Ray node; with ``--replication-factor`` above 1, kill the current
leader replica); then the checker reads the whole history (see
:mod:`raylog.testing.checker` for the anomaly names).

Prints one JSON line (operations, faults by kind, each anomaly count,
delivery duplicates, the longest time any partition went unread) and the
table; writes ``<out>/report.json``, ``<out>/timeline.png`` (produced and
consumed per second, faults marked) and the history under ``<out>/history``.
Exit code 1 when a forbidden anomaly occurred.

Usage::

    python bench/faults.py --duration 600 --seed 1 [--faults kill-partition,flip-byte] [--out bench/results/faults]
    python bench/faults.py --nodes 3 --replication-factor 3 --min-insync 2   # replicated, kill-leader too
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from raylog.testing import report as reporting
from raylog.testing.runner import add_arguments, options_from_args, run


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(p)
    p.set_defaults(duration=600.0, out=os.path.join("bench", "results", "faults"))
    args = p.parse_args(argv)
    options = options_from_args(args)
    options.progress = True
    result = run(options)
    line = {
        "bench": "faults",
        "seed": args.seed,
        "duration_s": args.duration,
        "valid": result["valid"],
        "operations": result["operations"],
        "faults": result["faults"],
        "anomalies": result["counts"],
        "unseen_by_acks": result["unseen_by_acks"],
        "lost_by_acks": result["lost_by_acks"],
        "replication_factor": args.replication_factor,
        "delivery_duplicates": result["delivery_duplicates"],
        "destroyed_by_faults": result["destroyed_by_faults"],
        "longest_unread_s": result["longest_unread_s"]["max"],
        "longest_unread_partition": result["longest_unread_s"]["partition"],
        "longest_unacknowledged_s": result["longest_unacknowledged_s"]["max"],
        "latency_s": result["latency_s"],
        "elapsed_s": result["run"]["elapsed_s"],
    }
    print(json.dumps(line, sort_keys=True))
    print(reporting.table(result))
    print(f"report: {os.path.abspath(os.path.join(args.out, 'report.json'))}")
    return 0 if result["valid"] else 1


if __name__ == "__main__":
    sys.exit(main())
