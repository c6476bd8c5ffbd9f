"""Draining a disk node before it stops (Kafka's controlled shutdown):
``raylog nodes drain NODE``, :meth:`raylog.Client.drain_node`.

1. **wait for the others**: every partition with a replica on the node
   must have its other replicas in sync first (at most ``timeout_s``), so
   that the node's stop leaves no partition short of what it had;
2. **leaders**: each partition the node leads is handed
   (:mod:`raylog.replication.handoff`) to an in-sync replica elsewhere, the
   one leading fewest partitions (:func:`~raylog.replication.handoff.choose_target`);
3. **followers**: each partition where the node follows, its leader takes
   the node out of the ISR now and keeps it out until its replica restarts
   (:meth:`raylog.replication.leader.Leader.shed`), so that ``acks="all"``
   never waits for a replica that is about to stop; refused where the ISR
   would fall below ``min_insync_replicas``.

The node **can stop** when it leads nothing and is in no ISR. The report
(:func:`drain_node`) says so, and what blocked otherwise.

The functions keep no state; Ray is imported inside them (heavy, lazy).
"""

from __future__ import annotations

import logging
import time

from raylog.errors import RaylogError
from raylog.replication.admin import leader_actor, leader_counts, replicated_partitions, request_handoff
from raylog.replication.handoff import choose_target
from raylog.replication.state import read_state, running_replicas

log = logging.getLogger(__name__)

#: how long a drained follower stays out of the ISR when its node does not restart
HOLD_S = 600.0


def others_in_sync(state, node: str) -> bool:
    """Whether every replica of ``state`` but ``node`` is in sync."""
    return set(state.replicas) - {node} <= set(state.isr)


def drain_node(zk, registry, cluster: str, node: str, token: bytes, *, timeout_s: float = 60.0,
               handoff_timeout_s: float = 10.0, hold_s: float = HOLD_S) -> dict:
    """Drain ``node`` (see the module docstring). Returns ``{"node",
    "can_stop", "leaders_moved": [...], "followers_shed": [...],
    "blocked": [...], "longest_leaderless_s"}``."""
    import ray

    deadline = time.monotonic() + timeout_s

    def mine():
        return [(t, p, s) for t, p, s in replicated_partitions(zk, registry) if node in s.replicas]

    rows = mine()
    while any(not others_in_sync(s, node) for _, _, s in rows) and time.monotonic() < deadline:
        time.sleep(0.2)
        rows = mine()
    blocked, moved, shed = [], [], []
    for topic, p, state in rows:
        if not others_in_sync(state, node):
            blocked.append({"topic": topic, "partition": p, "reason": f"ISR {','.join(state.isr)} lacks a replica "
                            f"other than {node}"})
    all_rows = replicated_partitions(zk, registry)
    leads = leader_counts(all_rows)
    for topic, p, state in rows:
        if state.leader != node:
            continue
        running = running_replicas(zk, registry.paths, topic, p)
        target = choose_target(state, running, leads, avoid=(node,))
        if target is None:
            blocked.append({"topic": topic, "partition": p, "reason": "no other in-sync replica runs"})
            continue
        try:
            result = request_handoff(zk, registry, cluster, topic, p, target, token, handoff_timeout_s)
        except (RaylogError, ValueError, ray.exceptions.RayError) as err:
            blocked.append({"topic": topic, "partition": p, "reason": f"handoff to {target} failed: {err}"})
            continue
        leads[node] = leads.get(node, 1) - 1
        leads[target] = leads.get(target, 0) + 1
        moved.append({"topic": topic, "partition": p, **result})
    for topic, p, _ in rows:
        found = read_state(zk, registry.paths, topic, p)
        state = None if found is None else found[0]
        if state is None or state.leader == node or node not in state.isr:
            continue
        try:
            _, actor = leader_actor(zk, registry, cluster, topic, p)
            ok = ray.get(actor.shed_follower.remote(node, hold_s, token), timeout=handoff_timeout_s)
        except (RaylogError, ValueError, ray.exceptions.RayError) as err:
            ok, why = False, str(err)
        else:
            why = "the ISR would fall below min_insync_replicas"
        if ok:
            shed.append({"topic": topic, "partition": p, "leader": state.leader})
        else:
            blocked.append({"topic": topic, "partition": p, "reason": f"{node} stays in the ISR: {why}"})
    final = mine()
    can_stop = all(s.leader != node and node not in s.isr for _, _, s in final)
    leaderless = [m["leaderless_s"] for m in moved if m.get("leaderless_s") is not None]
    return {"node": node, "can_stop": can_stop, "leaders_moved": moved, "followers_shed": shed,
            "blocked": blocked, "longest_leaderless_s": max(leaderless, default=None)}

