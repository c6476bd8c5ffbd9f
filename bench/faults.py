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
    python bench/faults.py --hosts 5 --replication-factor 3 --min-insync 2   # on hosts, network faults too (root)

With ``--workload compact`` the run checks the compaction guarantee instead:
a compacted topic, writes and deletes per key with acks "all", the cleaner
crashed mid-swap, before its swap and with a full disk (see
:mod:`raylog.testing.compaction_checker`).

With ``--workload txn`` the run checks the transactions guarantee:
transactional writers (some transactions aborted on purpose, some
committing an input group's offsets), read_committed and read_uncommitted
readers, a writer's producer dropped mid-transaction and the transaction
coordinator killed (see :mod:`raylog.testing.txn_checker` for Jepsen's
anomalies it counts).

With ``--hosts N`` the run uses the hosts kit (:mod:`raylog.testing.hosts`):
N network namespaces with their own addresses, disks and Ray nodes, and the
network faults (a host cut off, partitions, a one-way partition, a leader cut
from ZooKeeper, a host killed or paused) join the mix. The JSON line then
also gives, per partition, the longest time it went unread and the longest
time no send to it was acknowledged (``unavailable_s``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from raylog.testing import report as reporting
from raylog.testing.history import OK, history_files, read_history
from raylog.testing.runner import add_arguments, options_from_args, run


def unavailable_per_partition(result: dict, history_dir: str) -> dict:
    """``{"topic/p": {"unread_s", "unacknowledged_s"}}``: per partition the
    longest time nobody read it and the longest time between two acknowledged
    sends to it (from the first acknowledgement of the run to the last)."""
    acks: dict[str, list[float]] = {}
    for op in read_history(history_files(history_dir)):
        if op["type"] == "send" and op["outcome"] == OK and op.get("partition") is not None:
            acks.setdefault(f"{op['topic']}/{op['partition']}", []).append(op["t1"])
    everything = sorted(t for times in acks.values() for t in times)
    out = {}
    unread = result["longest_unread_s"]["per_partition"]
    for tp in sorted(set(acks) | set(unread)):
        times = sorted(acks.get(tp, ()))
        edges = ([everything[0]] + times + [everything[-1]]) if everything else []
        gap = max((b - a for a, b in zip(edges, edges[1:])), default=None)
        out[tp] = {"unread_s": unread.get(tp), "unacknowledged_s": None if gap is None else round(gap, 3)}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(p)
    p.set_defaults(duration=600.0, out=os.path.join("bench", "results", "faults"))
    args = p.parse_args(argv)
    options = options_from_args(args)
    options.progress = True
    result = run(options)
    if result.get("workload") == "compact":
        return _compact_report(args, result)
    if result.get("workload") == "txn":
        return _txn_report(args, result)
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
        "hosts": args.hosts,
        "unavailable_s": unavailable_per_partition(result, os.path.join(args.out, "history")),
        "nemesis_errors": result["run"].get("nemesis_errors"),
    }
    print(json.dumps(line, sort_keys=True))
    print(reporting.table(result))
    print("longest unavailability per partition (unread / no acknowledgement):")
    for tp, gaps in line["unavailable_s"].items():
        print(f"  {tp:<10} {gaps['unread_s']} s / {gaps['unacknowledged_s']} s")
    print(f"report: {os.path.abspath(os.path.join(args.out, 'report.json'))}")
    return 0 if result["valid"] else 1


def _compact_report(args, result) -> int:
    """The compaction workload's JSON line and table."""
    run_info = result["run"]
    line = {
        "bench": "faults", "workload": "compact", "seed": args.seed, "duration_s": args.duration,
        "valid": result["valid"], "operations": result["operations"], "keys": result["keys"],
        "faults": result["faults"], "anomalies": result["counts"],
        "replication_factor": args.replication_factor, "hosts": args.hosts,
        "cleaner_passes": (run_info.get("cleaner") or {}).get("passes"),
        "elapsed_s": run_info["elapsed_s"], "nemesis_errors": run_info.get("nemesis_errors"),
    }
    print(json.dumps(line, sort_keys=True))
    print(reporting.table(result))
    print(f"report: {os.path.abspath(os.path.join(args.out, 'report.json'))}")
    return 0 if result["valid"] else 1


def _txn_report(args, result) -> int:
    """The transactional workload's JSON line and table."""
    run_info = result["run"]
    line = {
        "bench": "faults", "workload": "txn", "seed": args.seed, "duration_s": args.duration,
        "valid": result["valid"], "operations": result["operations"], "faults": result["faults"],
        "anomalies": result["counts"], "write_cycles_concurrent": result["write_cycles_concurrent"],
        "replication_factor": args.replication_factor, "hosts": args.hosts,
        "elapsed_s": run_info["elapsed_s"], "nemesis_errors": run_info.get("nemesis_errors"),
    }
    print(json.dumps(line, sort_keys=True))
    print(reporting.table(result))
    print(f"report: {os.path.abspath(os.path.join(args.out, 'report.json'))}")
    return 0 if result["valid"] else 1


if __name__ == "__main__":
    sys.exit(main())
