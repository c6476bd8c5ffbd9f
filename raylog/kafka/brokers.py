"""Where the Kafka listeners are, and which one a partition's leader is on.

Each listener registers an ephemeral node ``kafka/listeners/<node identity>``
under the cluster's root (``/raylog/<cluster>``; :meth:`raylog.zk.paths.Paths.kafka_listener`)
holding JSON ``{"host", "port", "broker_id", "node", "security_protocol"}``
(``security_protocol``: ``PLAINTEXT``, ``SASL_PLAINTEXT``, ``SSL`` or
``SASL_SSL``; a TLS listener adds ``ssl_ca``, the PEM text of the CA
certificate its clients verify it with, when it was given one:
:mod:`raylog.kafka.tls`), and keeps the port
it bound in the persistent ``kafka/ports/<node identity>``: a listener
started again (Ray restarts it, or a later ``start_kafka_listeners``) binds
that port first, so the ``bootstrap.servers`` clients were given stay right. The Kafka broker id
of a node is :func:`broker_id` of its stable identity
(:mod:`raylog.actors.placement`), so it survives restarts.

Metadata answers name, for each partition, the listener on the node of its
leader: the replication state's ``leader`` when the partition is replicated,
else its placement's node. Any listener can serve any partition (it
forwards to the partition's data endpoint), so a node without a listener
falls back to the listener on the partition endpoint's host, then to any.

Their replicas and ISR (:func:`replica_ids`) are the replication state's
``replicas`` and ``isr`` as broker ids (:func:`broker_id` of each node),
the leader's being the id Metadata names as leader. A replica on a node
with no listener keeps its id although no broker of that id is listed
(Kafka lists the replicas of a broker that is down the same way); no
replica is reported offline. A partition without replication has its
leader as its only replica.

Thread-safety: the functions keep no state; kazoo clients are thread-safe.
"""

from __future__ import annotations

import json
import zlib

from kazoo.exceptions import NodeExistsError, NoNodeError


def broker_id(identity: str) -> int:
    """The Kafka broker id of the node ``identity`` (CRC32 of its name, 31 bits)."""
    return zlib.crc32(identity.encode("utf-8")) & 0x7FFFFFFF


def register(zk, paths, identity: str, host: str, port: int, security: dict | None = None) -> dict:
    """Publish this node's listener (ephemeral: it goes with the session);
    ``security``: its ``security_protocol`` and ``ssl_ca`` (see the module docstring)."""
    entry = {"host": host, "port": port, "broker_id": broker_id(identity), "node": identity, **(security or {})}
    path = paths.kafka_listener(identity)
    data = json.dumps(entry).encode()
    try:
        zk.create(path, data, ephemeral=True, makepath=True)
    except NodeExistsError:  # a previous listener's session not expired yet: replace it
        zk.delete(path)
        zk.create(path, data, ephemeral=True, makepath=True)
    return entry


def remembered_port(zk, paths, identity: str) -> int:
    """The port the node's listener bound last (``kafka/ports/<node>``), or 0."""
    try:
        data, _ = zk.get(paths.kafka_port(identity))
        return int(data.decode("ascii"))
    except (NoNodeError, ValueError, UnicodeDecodeError):
        return 0


def remember_port(zk, paths, identity: str, port: int) -> None:
    """Keep the port the node's listener bound, for its next start."""
    path = paths.kafka_port(identity)
    data = str(int(port)).encode("ascii")
    try:
        zk.create(path, data, makepath=True)
    except NodeExistsError:
        zk.set(path, data)


def unregister(zk, paths, identity: str) -> None:
    try:
        zk.delete(paths.kafka_listener(identity))
    except NoNodeError:
        pass


def listeners(zk, paths) -> dict[str, dict]:
    """``{node identity: {"host", "port", "broker_id", "node", ...}}`` of the live listeners."""
    found = {}
    try:
        names = zk.get_children(paths.kafka_listeners)
    except NoNodeError:
        return found
    for name in sorted(names):
        try:
            data, _ = zk.get(paths.kafka_listener(name))
        except NoNodeError:
            continue
        try:
            entry = json.loads(data)
        except ValueError:
            continue
        if isinstance(entry, dict):
            found[name] = entry
    return found


def leader_node(zk, paths, topic: str, partition: int) -> str | None:
    """The node identity of the partition's leader, or None if unknown."""
    for path in (paths.state(topic, partition), paths.partition(topic, partition)):
        try:
            data, _ = zk.get(path)
        except NoNodeError:
            continue
        try:
            value = json.loads(data) if data else None
        except ValueError:
            continue
        if isinstance(value, dict):
            node = value.get("leader") or value.get("node")
            if isinstance(node, str):
                return node
    return None


def leader_listener(zk, paths, topic: str, partition: int, found: dict[str, dict],
                    endpoint: dict | None) -> dict | None:
    """The listener entry Metadata names as the partition's leader."""
    if not found:
        return None
    node = leader_node(zk, paths, topic, partition)
    if node in found:
        return found[node]
    if endpoint is not None:
        for entry in found.values():
            if entry.get("host") == endpoint.get("host"):
                return entry
    return next(iter(found.values()))


def replica_ids(zk, paths, topic: str, partition: int, leader_id: int) -> tuple[list[int], list[int]]:
    """``(replica broker ids, ISR broker ids)`` of a partition whose leader
    Metadata names as ``leader_id`` (see the module docstring)."""
    from raylog.zk.partition_state import read_state

    try:
        found = read_state(zk, paths, topic, partition)
    except (KeyError, ValueError, TypeError):  # a state this reader cannot take: the leader alone
        found = None
    if found is None:
        return [leader_id], [leader_id]
    state = found[0]

    def ids(nodes) -> list[int]:
        out = []
        for node in nodes:
            one = leader_id if node == state.leader else broker_id(node)
            if one not in out:
                out.append(one)
        return out

    replicas, isr = ids(state.replicas), ids(state.isr)
    for listed in (replicas, isr):
        if leader_id not in listed:
            listed.insert(0, leader_id)
    return replicas, isr
