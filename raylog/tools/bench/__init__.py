"""The autoscaled benchmark: throughput while the autoscaler adds nodes, and
the nodes' removal after the load stops (``raylog bench``, ``bench/autoscale.py``).

The run, in stages:

1. **cluster**: without an address, a local autoscaling cluster of this
   machine is started through :mod:`raylog.tools.local_cluster` with the
   config ``raylog/tools/configs/bench-autoscale.yaml`` (package data; Ray's fake multi-node provider: every node is
   a set of real Ray processes here; a head with no CPU for tasks, up to two
   disk nodes, up to two compute nodes of 2 CPUs; idle nodes go after 12 s).
   It is always stopped at the end, by the PIDs it recorded, also after an
   error or Ctrl-C. With ``--zookeeper`` and ``--ray-address`` the bench
   runs on that cluster instead and stops nothing but its own actors.
2. **disk nodes**: partition actors ask for no resources, so a topic does
   not make the autoscaler start disk nodes; the bench asks for them
   (``request_resources`` with ``raylog_disk`` bundles, which also keeps
   them from being scaled away), then creates a topic spread over them.
3. **phases**: phase *k* runs ``phases[k]`` producer actors
   (:meth:`raylog.Client.producer_actor`, ``num_cpus=1``, fed with batches
   by this driver) and as many consumer tasks (``num_cpus=1``, one consumer
   group) for ``phase_seconds``. Asking for more CPUs than the cluster has
   leaves actors and tasks pending, and the autoscaler adds nodes. Each
   phase reports the nodes alive, how many producers and consumers ran, and
   producer and consumer messages per second over the phase's wall time.
4. **scale down**: the load stops (producers flushed and killed, consumer
   tasks ended) and the bench waits, bounded, until every node added during
   the phases is gone.

Output: one JSON line per node event and per phase (plus the start, the
topic, the scale-down and the end), then a table; a progress bar on stderr
while it runs (when stderr is a terminal).

On this 2-core machine all fake nodes share the same cores, so more nodes
do not mean more throughput: the run shows the autoscaling at work, not
scaling of throughput.

Modules: :mod:`~raylog.tools.bench.settings`, :mod:`~raylog.tools.bench.report`,
:mod:`~raylog.tools.bench.cluster`, :mod:`~raylog.tools.bench.run`.

Thread-safety: a run, its :class:`NodeTracker` and its progress bar belong
to the thread that calls :func:`run`.
"""

from __future__ import annotations

from raylog.errors import BenchError
from raylog.tools.bench.report import NodeInfo, NodeTracker, format_table, phase_report
from raylog.tools.bench.run import Run, consume_until, run
from raylog.tools.bench.settings import CONFIG, BenchSettings, parse_phases

__all__ = [
    "BenchError",
    "BenchSettings",
    "CONFIG",
    "NodeInfo",
    "NodeTracker",
    "Run",
    "consume_until",
    "format_table",
    "parse_phases",
    "phase_report",
    "run",
]
