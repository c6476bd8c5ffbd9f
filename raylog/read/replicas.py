"""Which replica a bounded read reads from: the candidates of a range (found
on the driver when the plan is made) and the choice of one (made where the
read runs).

A range's **candidates** are the replicas that may serve it: the leader
(always first; its endpoint is the range's ``host``/``port``) and, for a
replicated partition, every other in-sync replica whose ``replicas/<node>``
node holds an endpoint, each with its Ray node. A follower serves a read
only up to the high watermark it learned from the leader
(:mod:`raylog.replication.follower_reads`); a range ends at or below the
high watermark seen when planned, so an in-sync follower serves it whole
once it has heard of that high watermark.

The **choice**:

- :func:`assigned_replica`: Ray Data gives each read task one candidate,
  spread over the ranges (a CRC32 of topic, partition and piece, the
  number of a split partition's range, modulo the candidates in node
  order): the task prefers that candidate's node and reads from it;
- :func:`local_replica`: a reader that runs somewhere (a Spark executor)
  takes the candidate on its own Ray node, else on its own host (the leader
  first among several there), else the leader.

Whatever the choice, a reader falls back to the leader on any error or
delay of a follower (:mod:`raylog.read.reader`).

The functions keep no state.
"""

from __future__ import annotations

import zlib
from typing import NamedTuple, Sequence

from raylog.zk.nodes import node_identity
from raylog.zk.partition_state import read_state, running_replicas


class Replica(NamedTuple):
    """One candidate replica of a range: its raylog node (identity), data
    socket, Ray node (id and IP; None when unknown), whether it leads, and
    its actor's name (None: the partition's plain actor name)."""

    node: str
    host: str
    port: int
    node_id: str | None = None
    node_ip: str | None = None
    leader: bool = False
    actor: str | None = None


def ray_node_of(identity: str | None, nodes: Sequence[dict] | None) -> tuple[str | None, str | None]:
    """``(Ray node id, node IP)`` of the alive Ray node whose identity is ``identity``."""
    for node in nodes or ():
        if identity is not None and node.get("Alive") and node_identity(node) == identity:
            return node["NodeID"], node["NodeManagerAddress"]
    return None, None


def find_candidates(registry, topic: str, partition: int, leader_endpoint: tuple[str, int],
                    nodes: Sequence[dict] | None) -> tuple[Replica, ...]:
    """The candidates of ``topic``-``partition`` now (leader first): from its
    ``state`` (the leader and the ISR) and its ``replicas/<node>`` endpoints;
    for a partition without replication, its one actor on its placement
    node."""
    host, port = leader_endpoint
    found = read_state(registry.zk, registry.paths, topic, partition)
    if found is None:
        identity = (registry.placement(topic, partition) or {}).get("node")
        return (Replica(identity or "", host, port, *ray_node_of(identity, nodes), leader=True),)
    state = found[0]
    running = running_replicas(registry.zk, registry.paths, topic, partition)
    leader = running.get(state.leader) or {}
    if (leader.get("host"), leader.get("port")) != (host, port):
        # the state names a leader whose replica endpoint is not the partition's endpoint (a change under
        # way): the one replica known to serve is the endpoint's; no followers this time
        owner = next((n for n, e in running.items() if (e.get("host"), e.get("port")) == (host, port)), None)
        return (Replica(owner or state.leader, host, port, *ray_node_of(owner, nodes), leader=True,
                        actor=running.get(owner, {}).get("actor")),)
    out = [Replica(state.leader, host, port, *ray_node_of(state.leader, nodes), leader=True,
                   actor=leader.get("actor"))]
    for node in sorted(state.isr):
        endpoint = running.get(node)
        if node == state.leader or not endpoint or not endpoint.get("host") or not endpoint.get("port"):
            continue
        out.append(Replica(node, endpoint["host"], int(endpoint["port"]), *ray_node_of(node, nodes),
                           actor=endpoint.get("actor")))
    return tuple(out)


def assigned_replica(candidates: Sequence[Replica], topic: str, partition: int, piece: int) -> Replica | None:
    """The candidate the read task of piece ``piece`` (0, 1 ... for the
    ranges of one partition) of ``topic``-``partition`` is given: spread
    deterministically over the candidates in node order (by a CRC32 of the
    three, not in step with the leaders' layout); None without candidates."""
    if not candidates:
        return None
    ordered = sorted(candidates, key=lambda r: r.node)
    return ordered[zlib.crc32(f"{topic}/{partition}/{piece}".encode()) % len(ordered)]


def local_replica(candidates: Sequence[Replica], node_id: str | None = None,
                  host: str | None = None) -> Replica | None:
    """The candidate on Ray node ``node_id``, else on ``host`` (the leader
    first among several), else the leader; None without candidates."""
    if not candidates:
        return None
    leader = next((r for r in candidates if r.leader), candidates[0])
    if node_id is not None:
        on_node = [r for r in candidates if r.node_id == node_id]
        if on_node:
            return on_node[0]
    if host is not None:
        on_host = [r for r in candidates if host in (r.node_ip, r.host)]
        if on_host:
            return leader if leader in on_host else on_host[0]
    return leader


def where_am_i() -> tuple[str | None, str | None]:
    """``(Ray node id, node IP)`` of this process: the node id when it is a
    Ray worker or driver, the IP Ray would give this node otherwise (None
    when neither is known)."""
    try:
        import ray  # heavy (Ray): imported when used

        if ray.is_initialized():
            return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()
        return None, ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - locality is a preference: without it, the leader
        return None, None
