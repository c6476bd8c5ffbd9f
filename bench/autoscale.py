"""The autoscaled benchmark: throughput while the autoscaler adds nodes, and
their removal after; the same run as ``raylog bench``.

    .venv/bin/python bench/autoscale.py                       # a local autoscaling cluster of its own
    .venv/bin/python bench/autoscale.py --phases 1,2 --phase-seconds 20
    .venv/bin/python bench/autoscale.py --zookeeper ZK:2181 --ray-address HEAD:6379   # an existing cluster

Prints JSON lines (node events, one per phase, the scale-down) and a table;
a progress bar on stderr while it runs. The logic lives in
:mod:`raylog.tools.bench` (the CLI imports it; Ray workers import the
consumer task from there); this script only puts the connection options
where the ``raylog`` command line expects them, before the command name, so
that both entry points parse, run and exit alike. See ``--help``.
"""

from __future__ import annotations

import sys

#: options of the ``raylog`` command itself (they precede the command name)
CONNECTION_OPTIONS = ("--zookeeper", "--ray-address", "--cluster", "--token")


def raylog_args(argv: list[str]) -> list[str]:
    """``argv`` of this script as arguments of ``raylog``: the connection
    options first, then ``bench`` and everything else."""
    connection, rest = [], []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            rest.extend(argv[i:])
            break
        if arg in CONNECTION_OPTIONS and i + 1 < len(argv):
            connection += argv[i : i + 2]
            i += 2
            continue
        if arg.split("=", 1)[0] in CONNECTION_OPTIONS and "=" in arg:
            connection.append(arg)
        else:
            rest.append(arg)
        i += 1
    return [*connection, "bench", *rest]


def main(argv: list[str] | None = None) -> int:
    from raylog.tools.cli import run

    return run(raylog_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
