"""Creating, describing and stopping the replicas of a topic (the client's
side; :mod:`raylog.admin.topics` calls these for a topic whose
``replication_factor`` is above 1).

The functions keep no state. Ray is imported inside them (heavy, lazy on
purpose, as in :mod:`raylog.admin.topics`).
"""

from __future__ import annotations

from raylog.config import NAMESPACE, actor_name
from raylog.replication.assignment import replica_actor_name, replica_log_dir
from raylog.replication.replica_actors import ReplicaActors
from raylog.replication.state import create_state, read_state

#: how long describe waits for one replica's answer
STATUS_WAIT_S = 5.0


def record_replicas(zk, registry, topic: str, partition: int, nodes: list, log_dir: str) -> None:
    """The placement (the first replica) and the ``state`` of a new partition."""
    registry.set_placement(topic, partition, nodes[0].identity, log_dir)
    if len(nodes) > 1:
        create_state(zk, registry.paths, topic, partition, [n.identity for n in nodes])


def start_followers(zk, registry, *, zookeeper, cluster, topic, partition, log_dir, config, nodes, host,
                    token, actors: ReplicaActors) -> list:
    """Start every replica actor of a partition but the first leader's."""
    found = read_state(zk, registry.paths, topic, partition)
    if found is None:
        return []
    state = found[0]
    first, plain = state.origin, actor_name(cluster, topic, partition)
    return [
        actors.start(
            zookeeper=zookeeper, cluster=cluster, topic=topic, partition=partition,
            log_dir=replica_log_dir(log_dir, node, first), config=config, node_identity=node, nodes=nodes,
            host=host, token=token, replica=node, name=replica_actor_name(plain, node, first),
        )
        for node in state.replicas[1:]
    ]


def follower_actors(cluster: str, topic: str, partitions: int) -> list:
    """The running follower actors of a topic's partitions (by name)."""
    import ray

    prefixes = tuple(f"{actor_name(cluster, topic, p)}@" for p in range(partitions))
    found = []
    for entry in ray.util.list_named_actors(all_namespaces=True):
        if entry.get("namespace") == NAMESPACE and entry["name"].startswith(prefixes):
            try:
                found.append(ray.get_actor(entry["name"], namespace=NAMESPACE))
            except ValueError:
                continue
    return found


def describe_replicas(zk, registry, cluster: str, topic: str, partition: int) -> dict:
    """Leader, leader epoch, replicas, ISR, each replica's log end (None if
    it does not answer, or when this process has not joined Ray: it is not
    joined here) and whether the partition is under-replicated."""
    import ray

    found = read_state(zk, registry.paths, topic, partition)
    if found is None:
        return {}
    state = found[0]
    plain, first = actor_name(cluster, topic, partition), state.origin
    pending = {}
    for node in state.replicas if ray.is_initialized() else ():
        try:
            actor = ray.get_actor(replica_actor_name(plain, node, first), namespace=NAMESPACE)
            pending[node] = actor.replica_status.remote()
        except ValueError:
            continue
    ends = {node: None for node in state.replicas}
    if pending:
        ray.wait(list(pending.values()), num_returns=len(pending), timeout=STATUS_WAIT_S)
    for node, ref in pending.items():
        try:
            ends[node] = ray.get(ref, timeout=0)["log_end_offset"]
        except Exception:  # noqa: BLE001 - a replica that does not answer shows None
            pass
    return {"leader": state.leader, "leader_epoch": state.leader_epoch, "replicas": list(state.replicas),
            "isr": list(state.isr), "replica_log_end_offsets": ends,
            "under_replicated": len(state.isr) < len(state.replicas)}


def leader_actor(zk, registry, cluster: str, topic: str, partition: int):
    """``(state, actor)``: the partition's replication state and the Ray
    actor of the replica that leads it now (by the ``state`` node). Raises
    ``ValueError`` when the partition is not replicated or the leader's
    actor does not run."""
    import ray

    found = read_state(zk, registry.paths, topic, partition)
    if found is None:
        raise ValueError(f"{topic}-{partition} is not replicated (no state node)")
    state = found[0]
    name = replica_actor_name(actor_name(cluster, topic, partition), state.leader, state.origin)
    return state, ray.get_actor(name, namespace=NAMESPACE)


def replicated_partitions(zk, registry, topics=None) -> list[tuple[str, int, object]]:
    """``(topic, partition, state)`` of every replicated partition of
    ``topics`` (default: every topic), read now."""
    found = []
    for topic in registry.list_topics() if topics is None else topics:
        try:
            config = registry.topic_config(topic)
        except Exception:  # noqa: BLE001 - deleted meanwhile
            continue
        for p in range(config.partitions):
            read = read_state(zk, registry.paths, topic, p)
            if read is not None:
                found.append((topic, p, read[0]))
    return found


def leader_counts(rows, nodes=()) -> dict[str, int]:
    """How many partitions each node leads (``rows`` as
    :func:`replicated_partitions` returns them; ``nodes`` counted as 0 when
    they lead none)."""
    counts = {n: 0 for n in nodes}
    for _, _, state in rows:
        for n in state.replicas:
            counts.setdefault(n, 0)
        counts[state.leader] = counts.get(state.leader, 0) + 1
    return counts


def request_handoff(zk, registry, cluster: str, topic: str, partition: int, target: str, token: bytes,
                    timeout_s: float = 10.0) -> dict:
    """Ask the leader of ``topic``-``partition`` to hand its lead to
    ``target`` (:meth:`raylog.actors.partition.PartitionActor.hand_off`);
    its answer. Raises :class:`~raylog.errors.HandoffError` when it did not
    complete (nothing changed)."""
    import ray

    _, actor = leader_actor(zk, registry, cluster, topic, partition)
    return ray.get(actor.hand_off.remote(target, timeout_s, token), timeout=2 * timeout_s + STATUS_WAIT_S)
