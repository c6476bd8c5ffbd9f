"""The replication state of a partition in ZooKeeper (docs/design.md section 4).

``topics/<topic>/partitions/<p>/state`` (persistent) holds JSON::

    {"leader": <node identity>, "leader_epoch": <int>, "isr": [<node>, ...],
     "replicas": [<node>, ...], "epochs": [[<epoch>, <start offset>], ...],
     "origin": <node>, "removing": [<node>, ...]}

``leader`` serves the partition; ``leader_epoch`` grows by one with every
change of leader; ``isr`` lists the in-sync replicas (the leader always
among them); ``replicas`` all the nodes that hold a replica, the first being
the preferred leader; ``epochs`` the offset at which each leader epoch after
the first began (the new leader's log end when it took over): a replica
whose data is of an older epoch truncates to that boundary before it
follows (Kafka's leader-epoch truncation), so logs never diverge; ``origin``
the first leader at create, whose replica has the partition's plain actor
name and log directory (:mod:`raylog.replication.assignment`): an identity
that stays when a reassignment (:mod:`raylog.replication.reassign`) changes
``replicas``; a state written before it existed means ``replicas[0]``;
``removing`` the replicas a reassignment is taking away (the old leader
while a target replica takes over from it), which no repair starts again. The
node is written only by a compare-and-set on its ZooKeeper version
(:func:`compare_and_set`), so two writers never both win.

``topics/<topic>/partitions/<p>/replicas/<node>`` (ephemeral) holds the JSON
endpoint of one replica actor, ``{"host", "port", "actor"}``, present while
it runs.

A partition of a topic with replication factor 1 has no ``state`` node.

Thread-safety: :class:`PartitionState` is immutable; the functions keep no
state (kazoo clients are thread-safe).
"""

from __future__ import annotations

import dataclasses
import json

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from raylog.errors import UnknownTopicError

from raylog.zk.partition_state import (
    PartitionState,
    read_state,
    replica_path,
    replicas_path,
    running_replicas,
    state_path,
)

__all__ = [
    "PartitionState", "compare_and_set", "create_state", "read_state", "register_replica", "replica_path",
    "replicas_path", "running_replicas", "state_path", "take_over", "leave_isr",
]


def create_state(zk, paths, topic: str, partition: int, replicas: list[str]) -> PartitionState:
    """The first state of a new partition: the first replica leads, epoch 0,
    every replica in sync (all logs are empty)."""
    state = PartitionState(replicas[0], 0, tuple(replicas), tuple(replicas))
    path = state_path(paths, topic, partition)
    try:
        zk.create(path, state.to_json(), makepath=True)
    except NodeExistsError:
        zk.set(path, state.to_json())
    return state


def compare_and_set(zk, paths, topic: str, partition: int, state: PartitionState, version: int) -> int | None:
    """Write ``state`` if the node still has ``version``; the new version,
    or None when another writer changed it first (read it again)."""
    try:
        return zk.set(state_path(paths, topic, partition), state.to_json(), version=version).version
    except BadVersionError:
        return None


def register_replica(zk, paths, topic: str, partition: int, node: str, endpoint: dict) -> None:
    """The ephemeral ``replicas/<node>`` node of a running replica actor.
    Raises :class:`UnknownTopicError` when the partition's ``state`` node is
    gone (the topic was deleted while this replica was away): the
    registration never makes the deleted topic's nodes again."""
    path = replica_path(paths, topic, partition, node)
    data = json.dumps(endpoint, sort_keys=True).encode()
    try:
        _create_replica(zk, paths, topic, partition, path, data)
    except NodeExistsError:
        stat = zk.exists(path)
        if stat is not None and stat.ephemeralOwner == zk.client_id[0]:
            zk.set(path, data)  # ours already: never absent for a moment (a follower would take over)
            return
        zk.delete(path)  # left by an earlier session of this replica
        _create_replica(zk, paths, topic, partition, path, data)


def _create_replica(zk, paths, topic: str, partition: int, path: str, data: bytes) -> None:
    try:
        zk.create(path, data, ephemeral=True)
        return
    except NoNodeError:
        pass
    # the first replica of the partition to register makes ``replicas``; only under a
    # ``state`` node that exists (a deleted topic's nodes are not made again)
    if zk.exists(state_path(paths, topic, partition)) is None:
        raise UnknownTopicError(f"{topic}-{partition} has no replication state in ZooKeeper (the topic was deleted); "
                                f"this replica does not serve it", topic=topic)
    try:
        zk.create(replicas_path(paths, topic, partition))
    except NodeExistsError:
        pass
    zk.create(path, data, ephemeral=True)


def take_over(zk, paths, topic: str, partition: int, node: str, log_end: int, *, unclean: bool = False):
    """Make ``node`` the leader when the leader's replica is gone: only an
    ISR member may, by a compare-and-set with the next leader epoch, which
    begins at ``log_end``. With ``unclean`` (the topic's
    ``unclean_leader_election``) a replica outside the ISR may too, once no
    ISR member runs; the ISR is then ``node`` alone. ``(state, version)``
    when ``node`` leads, else None."""
    found = read_state(zk, paths, topic, partition)
    if found is None:
        return None
    state, version = found
    if state.leader == node:
        return found
    if zk.exists(replica_path(paths, topic, partition, state.leader)):
        return None
    if node in state.isr:
        isr = tuple(n for n in state.isr if n != state.leader)
    elif unclean and not set(state.isr) & set(running_replicas(zk, paths, topic, partition)):
        isr = (node,)
    else:
        return None
    epoch = state.leader_epoch + 1
    new = dataclasses.replace(state, leader=node, leader_epoch=epoch, isr=isr, epochs=state.epochs + ((epoch, log_end),))
    version = compare_and_set(zk, paths, topic, partition, new, version)
    return None if version is None else (new, version)


def leave_isr(zk, paths, topic: str, partition: int, node: str, min_insync: int) -> bool:
    """A follower about to stop takes itself out of the ISR by
    compare-and-set (while the ISR keeps ``min_insync`` members), so that
    the leader's ``acks="all"`` stops waiting for it at its next read of
    the state; True when it is out."""
    for _ in range(10):
        found = read_state(zk, paths, topic, partition)
        if found is None:
            return False
        state, version = found
        if node not in state.isr:
            return True
        if state.leader == node or len(state.isr) - 1 < min_insync:
            return False
        if compare_and_set(zk, paths, topic, partition, state.with_isr(set(state.isr) - {node}), version) is not None:
            return True
    return False
