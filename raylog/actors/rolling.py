"""A rolling restart of the disk nodes, one at a time, that no producer
notices (``raylog nodes restart --rolling``, :meth:`raylog.Client.rolling_restart`):
for each node

1. **drain** it (:mod:`raylog.replication.drain`): its leads handed off,
   its followers out of the ISR; refused (the roll stops there) when the
   node cannot stop without leaving a partition short;
2. **restart** it: by default every raylog actor on it (its replicas, and
   the partitions it serves alone) is shut down cleanly and started again
   by Ray in a new process (an upgrade of raylog's code, say); a caller
   that can restart the whole node (its Ray node, a machine) hands in
   ``restart(node)`` instead;
3. **wait** until every partition with a replica on it has its whole ISR
   again (each replica caught up), at most ``timeout_s``, before the next.

Afterwards, leads go back to the preferred replicas on demand
(:func:`raylog.replication.preferred.balance_leaders`) or by themselves
after a quiet period.

The functions keep no state; Ray is imported inside them (heavy, lazy).
"""

from __future__ import annotations

import logging
import time

from raylog.actors.placement import disk_nodes
from raylog.config import NAMESPACE, actor_name
from raylog.errors import RollingRestartError
from raylog.replication.admin import replicated_partitions
from raylog.replication.assignment import replica_actor_name
from raylog.replication.drain import drain_node

log = logging.getLogger(__name__)

#: how long a clean shutdown of one actor may take before it is killed anyway
SHUTDOWN_WAIT_S = 10.0


def node_actors(registry, cluster: str, node: str) -> list[str]:
    """The names of the raylog actors on ``node``: its replicas, and the
    partitions of unreplicated topics placed there."""
    names = []
    for topic in registry.list_topics():
        config = registry.topic_config(topic)
        placements = registry.placements(topic)
        for p in range(config.partitions):
            plain = actor_name(cluster, topic, p)
            if config.replication_factor > 1:
                continue
            if (placements.get(p) or {}).get("node") == node:
                names.append(plain)
    for topic, p, state in replicated_partitions(registry.zk, registry):
        if node in state.replicas:
            names.append(replica_actor_name(actor_name(cluster, topic, p), node, state.origin))
    return names


def restart_actors(registry, cluster: str, node: str, token: bytes) -> int:
    """Shut every raylog actor on ``node`` down cleanly and let Ray start
    it again in a new process; how many."""
    import ray

    count = 0
    for name in node_actors(registry, cluster, node):
        try:
            actor = ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            continue
        try:
            ray.get(actor.shutdown.remote(token=token), timeout=SHUTDOWN_WAIT_S)
        except Exception as err:  # noqa: BLE001 - killed below all the same
            log.info("%s did not shut down cleanly (%s); killing it", name, err)
        ray.kill(actor, no_restart=False)  # Ray starts it again, in a new process
        count += 1
    return count


def whole(registry, node: str) -> bool:
    """Whether every replicated partition with a replica on ``node`` has
    all its replicas in sync."""
    return all(set(s.replicas) <= set(s.isr) for _, _, s in replicated_partitions(registry.zk, registry)
               if node in s.replicas)


def rolling_restart(zk, registry, cluster: str, token: bytes, *, nodes=None, restart=None,
                    timeout_s: float = 300.0, on_step=None) -> list[dict]:
    """Restart ``nodes`` (default: every alive disk node) one at a time (see
    the module docstring). ``restart(node)`` restarts one node (default:
    :func:`restart_actors`); ``on_step(node, step, detail)`` hears of each
    step. One row per node: ``{"node", "leaders_moved",
    "longest_leaderless_s", "restart_s", "whole_after_s"}``. Raises
    :class:`~raylog.errors.RollingRestartError` when a node cannot be drained or does not
    come back whole within ``timeout_s``."""
    import ray

    if nodes is None:
        nodes = [n.identity for n in disk_nodes(ray.nodes())]
    restart = restart or (lambda node: restart_actors(registry, cluster, node, token))
    on_step = on_step or (lambda node, step, detail: None)
    rows = []
    for node in nodes:
        on_step(node, "drain", None)
        report = drain_node(zk, registry, cluster, node, token, timeout_s=timeout_s)
        if not report["can_stop"]:
            raise RollingRestartError(f"{node} cannot stop yet: {report['blocked'][:3]}; the nodes after it were "
                                      f"not restarted")
        on_step(node, "restart", report)
        started = time.monotonic()
        restart(node)
        restarted = time.monotonic()
        on_step(node, "wait", None)
        deadline = restarted + timeout_s
        while not whole(registry, node):
            if time.monotonic() > deadline:
                raise RollingRestartError(f"{node} restarted but its replicas did not all rejoin the ISR within "
                                          f"{timeout_s:g} s; the nodes after it were not restarted")
            time.sleep(0.2)
        rows.append({"node": node, "leaders_moved": len(report["leaders_moved"]),
                     "longest_leaderless_s": report["longest_leaderless_s"],
                     "restart_s": round(restarted - started, 3),
                     "whole_after_s": round(time.monotonic() - restarted, 3)})
        on_step(node, "done", rows[-1])
    return rows
