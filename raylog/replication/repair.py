"""The supervisor's pass over replicated partitions
(:mod:`raylog.actors.supervisor` calls these):

- :func:`serve_replicas`: every replica of a partition's ``state`` whose
  node is alive and that no actor serves gets its actor again (after a
  cluster restart, or a replica whose actor was lost): leader or follower,
  as the ``state`` node says; a follower fetches from the leader, catches
  up and rejoins the ISR. Replicas a reassignment is taking away
  (``state.removing``) are left alone.
- :func:`replace_lost`: a replica whose node has not been alive for the
  topic's ``replica_replace_after_s`` (0: never) moves to an alive disk node
  that holds no replica of that partition, by the same reassignment as by
  hand (:mod:`raylog.replication.reassign`). The new node is chosen
  deterministically (the stable hash of ``<topic>-<partition>`` over the
  candidates, sorted), so two supervisors racing pick the same one, and every
  change of the ``state`` node is a compare-and-set.

The caller keeps ``lost_since`` (``{(topic, partition, node): monotonic
time first seen gone}``) between passes; nothing else is kept here.
"""

from __future__ import annotations

import logging
import time

from raylog.config import NAMESPACE, actor_name
from raylog.errors import RaylogError
from raylog.replication.assignment import replica_actor_name, replica_log_dir
from raylog.replication.reassign import reassign_partition
from raylog.replication.replica_actors import ReplicaActors
from raylog.replication.state import read_state
from raylog.storage.stable_hash import stable_bucket

log = logging.getLogger(__name__)

#: how long an automatic replacement waits for its new replica to catch up
REPLACE_TIMEOUT_S = 120.0


def _row(topic, partition, node, state, detail="") -> dict:
    return {"topic": topic, "partition": partition, "node": node, "state": state, "detail": detail}


def _actor(name: str):
    import ray  # heavy (Ray): imported when used

    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return None


def serve_replicas(registry, zookeeper: str, nodes: list[dict], alive: set[str], topic: str, partition: int,
                   config, place: dict, *, actors: ReplicaActors, host=None,
                   token=None) -> tuple[list[dict], list[tuple]]:
    """``(rows, started)`` for one replicated partition: a row per replica
    (``serving`` with its role, ``node down``, ``failed``) and, per actor
    started, ``(topic, partition, node, ping ref)``."""
    found = read_state(registry.zk, registry.paths, topic, partition)
    if found is None:
        return [_row(topic, partition, place.get("node"), "failed", "no replication state recorded")], []
    state = found[0]
    plain = actor_name(registry.cluster, topic, partition)
    rows, started = [], []
    for node in state.replicas:
        if node in state.removing:
            continue
        name = replica_actor_name(plain, node, state.origin)
        role = "leader" if node == state.leader else "follower"
        if _actor(name) is not None:
            rows.append(_row(topic, partition, node, "serving", role))
        elif node not in alive:
            rows.append(_row(topic, partition, node, "node down", f"{role}; served when its node is back"))
        else:
            try:
                actor = actors.start(
                    zookeeper=zookeeper, cluster=registry.cluster, topic=topic, partition=partition,
                    log_dir=replica_log_dir(place["log_dir"], node, state.origin), config=config,
                    node_identity=node, nodes=nodes, host=host, token=token, replica=node, name=name,
                )
                started.append((topic, partition, node, actor.ping.remote()))
            except RaylogError as err:
                rows.append(_row(topic, partition, node, "failed", str(err)))
    return rows, started


def replacement_target(topic: str, partition: int, state, alive: set[str], expired: set[str]) -> list[str] | None:
    """The replicas with each node in ``expired`` (gone long enough)
    replaced by an alive disk node holding no replica of the partition, or
    None when that cannot be done now (no spare node, another replica gone
    but not for long enough, the leader not alive)."""
    if state.leader not in alive or state.removing:
        return None
    spare = sorted(alive - set(state.replicas))
    lost = [n for n in state.replicas if n in expired]
    if not lost or len(spare) < len(lost):
        return None
    start = stable_bucket(f"{topic}-{partition}".encode(), len(spare))
    chosen = iter(spare[start:] + spare[:start])
    target = [next(chosen) if n in expired else n for n in state.replicas]
    return target if all(n in alive for n in target) else None


def replace_lost(registry, zookeeper: str, nodes: list[dict], alive: set[str], lost_since: dict, *,
                 actors: ReplicaActors, topic: str | None = None, host=None, token=None,
                 now: float | None = None, background=None) -> list[dict]:
    """Reassign the replicas whose node is gone for longer than their
    topic's ``replica_replace_after_s`` (see the module docstring); a row
    per replacement (``reassigned`` or ``failed``).

    ``background`` (the supervisor's
    :class:`~raylog.replication.background.BackgroundReassignments`): each
    reassignment is started there and this returns at once, with a row
    ``reassigning`` (or ``waiting`` while the most allowed run); the rows of
    those that ended since the last call come first. Without it each runs
    here, up to :data:`REPLACE_TIMEOUT_S`."""
    now = time.monotonic() if now is None else now
    rows, seen = ([] if background is None else background.finished()), set()
    for name in [topic] if topic is not None else registry.list_topics():
        try:
            config = registry.topic_config(name)
        except RaylogError:
            continue  # deleted meanwhile
        if config.replication_factor < 2:
            continue
        for p in range(config.partitions):
            found = read_state(registry.zk, registry.paths, name, p)
            if found is None:
                continue
            state = found[0]
            if background is not None and background.running(name, p):
                seen.update((name, p, node) for node in state.replicas if node not in alive)
                continue  # its reassignment runs; its row comes when it ends
            expired = set()
            for node in state.replicas:
                if node in alive:
                    continue
                key = (name, p, node)
                seen.add(key)
                since = lost_since.setdefault(key, now)
                if config.replica_replace_after_s and now - since >= config.replica_replace_after_s:
                    expired.add(node)
            target = replacement_target(name, p, state, alive, expired) if expired else None
            if target is None:
                continue
            moved = ", ".join(f"{a}->{b}" for a, b in zip(state.replicas, target) if a != b)

            def work(name=name, p=p, target=target, moved=moved, after=config.replica_replace_after_s) -> dict:
                try:
                    reassign_partition(registry.zk, registry, zookeeper=zookeeper, topic=name, partition=p,
                                       replicas=target, nodes=nodes, actors=actors, host=host, token=token,
                                       timeout_s=REPLACE_TIMEOUT_S)
                except RaylogError as err:
                    return _row(name, p, ",".join(target), "failed", f"reassigning {moved}: {err}")
                log.warning("%s-%d: replicas lost for over %s s reassigned (%s)", name, p, after, moved)
                return _row(name, p, ",".join(target), "reassigned", moved)

            if background is None:
                rows.append(work())
            elif background.start(name, p, work) == "busy":
                rows.append(_row(name, p, ",".join(target), "waiting",
                                 f"{moved}: other reassignments run; tried again at the next pass"))
            else:
                rows.append(_row(name, p, ",".join(target), "reassigning", moved))
    if topic is None:
        for key in [k for k in lost_since if k not in seen]:
            del lost_since[key]  # alive again, or no longer a replica
    return rows
