"""The cluster registry: topics, partition placement and partition endpoints
in ZooKeeper (the layout of docs/design.md §4, built by :class:`raylog.zk.paths.Paths`).

::

    registry = Registry(zk, cluster="default")
    registry.create_topic("clicks", TopicConfig(partitions=8))
    registry.set_placement("clicks", 0, node="ray:ab12...", log_dir="/data/clicks-0")
    registry.register_endpoint("clicks", 0, "10.0.0.5", 9092, "raylog/default/clicks/0", epoch=3)
    registry.endpoint("clicks", 0)   # {"host": "10.0.0.5", "port": 9092, "actor": ..., "epoch": 3}

What lives where:

* ``topics/<topic>`` holds the topic's :class:`~raylog.config.TopicConfig`
  as JSON. :meth:`Registry.create_topic` creates it together with
  ``partitions/`` and one node per partition, in one transaction; a topic is
  there whole or not at all. :meth:`Registry.add_partitions` grows it the same way:
  the config with the new count (a compare-and-set on the node's version)
  and the new partitions' nodes with their placements, in one transaction.
* ``topics/<topic>/partitions/<p>`` holds the placement
  ``{"node": ..., "log_dir": ...}`` (empty until one is set).
* ``topics/<topic>/partitions/<p>/endpoint`` is ephemeral and holds
  ``{"host", "port", "actor", "epoch"}`` while a partition actor serves. The
  epoch orders incarnations of a partition actor: a newer epoch replaces the
  node an older one left behind (its session may not have expired yet), an
  older epoch is refused, and only the epoch that registered an endpoint
  removes it. Concurrent registrations are fenced by the data version of the
  partition node: each endpoint creation rewrites the placement unchanged,
  so that version grows (watchers of the partition node see a data change
  with the same data); see ``Registry._read_fence``.

Failures. Every ZooKeeper call is bounded by ``op_timeout_s``. While the
connection is down a call waits up to ``connect_wait_s`` for it to come back,
then raises :class:`~raylog.errors.ZooKeeperUnavailableError`; a session
that expired under a call raises :class:`~raylog.errors.SessionExpiredError`
(both ``retriable``). One function, :func:`zookeeper_errors`, does this
translation for the whole module, and other ZooKeeper modules may use it too.
"""

from __future__ import annotations

import logging
import re
import time

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, NotEmptyError

from raylog.config import TopicConfig
from raylog.errors import ConfigError, RaylogError, TopicExistsError
from raylog.storage.fileops import replica_log_dir
from raylog.zk.endpoints import EndpointRegistry, EndpointWatch
from raylog.zk.paths import DEFAULT_CLUSTER
from raylog.zk.paths import tombstone_id
from raylog.zk.registry_helpers import CONTENDED_TRIES, RegistryCalls, dump_json, first_failure, load_json, translated

log = logging.getLogger(__name__)

#: letters, digits, '.', '_' and '-', 1 to 200 of them
TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,200}")


def validate_topic_name(name: str) -> str:
    """Return ``name`` if it is a valid topic name, else raise ConfigError."""
    if not isinstance(name, str) or not TOPIC_NAME.fullmatch(name):
        raise ConfigError(
            f"invalid topic name {name!r}: use 1 to 200 letters, digits, '.', '_' or '-'"
        )
    if name in (".", ".."):
        raise ConfigError(f"invalid topic name {name!r}: '.' and '..' are reserved")
    return name


class Registry:
    """Topics, placements and endpoints of one cluster in ZooKeeper.

    ``zk`` is a started :class:`kazoo.client.KazooClient`; the registry does
    not own it (the caller stops and closes it).

    Thread-safety: a registry may be shared between threads. It keeps no
    state of its own besides immutable settings; every read goes to
    ZooKeeper (nothing is cached) and the KazooClient is thread-safe.

    Its parts: :attr:`calls` (:class:`~raylog.zk.registry_helpers.RegistryCalls`,
    how every call is made, and the shared reads) and :attr:`endpoint_part`
    (:class:`~raylog.zk.endpoints.EndpointRegistry`, whose methods this
    registry offers as its own); topics, placements and tombstones are here.
    """

    def __init__(
        self,
        zk,
        cluster: str = DEFAULT_CLUSTER,
        *,
        op_timeout_s: float = 10.0,
        connect_wait_s: float = 2.0,
    ):
        self.calls = RegistryCalls(zk, cluster, op_timeout_s=op_timeout_s, connect_wait_s=connect_wait_s)
        self.endpoint_part = EndpointRegistry(self.calls)
        self.zk = zk
        self.cluster = cluster
        self.paths = self.calls.paths
        self.op_timeout_s = op_timeout_s
        self.connect_wait_s = connect_wait_s

    def __repr__(self):
        return repr(self.calls)

    # -- the endpoint part's --------------------------------------------------------

    def register_endpoint(self, topic: str, partition: int, host: str, port: int, actor: str, epoch: int) -> None:
        """See :meth:`raylog.zk.endpoints.EndpointRegistry.register_endpoint`."""
        self.endpoint_part.register_endpoint(topic, partition, host, port, actor, epoch)

    def endpoint(self, topic: str, partition: int) -> dict | None:
        """See :meth:`raylog.zk.endpoints.EndpointRegistry.endpoint`."""
        return self.endpoint_part.endpoint(topic, partition)

    def endpoints(self, topic: str) -> dict[int, dict]:
        """See :meth:`raylog.zk.endpoints.EndpointRegistry.endpoints`."""
        return self.endpoint_part.endpoints(topic)

    def unregister_endpoint(self, topic: str, partition: int, epoch: int) -> bool:
        """See :meth:`raylog.zk.endpoints.EndpointRegistry.unregister_endpoint`."""
        return self.endpoint_part.unregister_endpoint(topic, partition, epoch)

    def watch_endpoint(self, topic: str, partition: int, callback) -> EndpointWatch:
        """See :meth:`raylog.zk.endpoints.EndpointRegistry.watch_endpoint`."""
        return self.endpoint_part.watch_endpoint(topic, partition, callback)

    # -- topics ---------------------------------------------------------------------

    def topic_config(self, name: str) -> TopicConfig:
        """The topic's config. Raises UnknownTopicError if there is no such topic."""
        return self.calls.topic_config(name)

    @translated("create a topic")
    def create_topic(self, name: str, config: TopicConfig) -> None:
        """Create the topic with its partition nodes, atomically.

        Raises TopicExistsError if it exists, ConfigError for a bad name.
        """
        validate_topic_name(name)
        if not isinstance(config, TopicConfig):
            raise ConfigError(f"config must be a TopicConfig, got {type(config).__name__}")
        self.calls.call(self.zk.ensure_path_async, self.paths.topics)
        tx = self.zk.transaction()
        tx.create(self.paths.topic(name), config.to_json())
        tx.create(self.paths.partitions(name), b"")
        for partition in range(config.partitions):
            tx.create(self.paths.partition(name, partition), b"")
        failure = first_failure(self.calls.commit(tx))
        if isinstance(failure, NodeExistsError):
            raise TopicExistsError(
                f"topic {name!r} already exists in cluster {self.cluster!r}; "
                f"pick another name or delete it first",
                topic=name,
            )
        if failure is not None:
            raise failure

    @translated("read a topic's config")
    def topic_config_version(self, name: str) -> tuple[TopicConfig, int]:
        """The topic's config and the data version of its node (for a
        compare-and-set, :meth:`add_partitions`). Raises UnknownTopicError."""
        try:
            data, stat = self.calls.call(self.zk.get_async, self.paths.topic(name))
        except NoNodeError:
            raise self.calls.unknown_topic(name) from None
        if not data:
            raise self.calls.unknown_topic(name)
        return TopicConfig.from_json(data), stat.version

    @translated("add partitions to a topic")
    def add_partitions(self, name: str, config: TopicConfig, version: int, placements: dict[int, dict]) -> bool:
        """Grow a topic, atomically: write ``config`` (its config with the
        new partition count) over the node's data ``version`` read before,
        and create the node of each new partition with its placement
        (``{p: {"node": ..., "log_dir": ...}}``, every partition from the
        old count up), in one transaction. False when the topic's node
        changed since it was read (nothing written: read it again); raises
        UnknownTopicError if the topic is gone."""
        tx = self.zk.transaction()
        tx.set_data(self.paths.topic(name), config.to_json(), version=version)
        for partition, place in sorted(placements.items()):
            tx.create(self.paths.partition(name, partition), dump_json(place))
        failure = first_failure(self.calls.commit(tx))
        if failure is None:
            return True
        if isinstance(failure, NoNodeError) and not self.topic_exists(name):
            raise self.calls.unknown_topic(name)
        if isinstance(failure, (BadVersionError, NodeExistsError, NoNodeError)):
            return False
        raise failure

    @translated("delete a topic")
    def delete_topic(self, name: str) -> list[dict]:
        """Delete the topic and everything under it (placements, endpoints),
        atomically, and in the same transaction leave a **tombstone** for
        every partition log placed on a node (``tombstones/<id>``, see
        :meth:`tombstones`): the promise that the log will be removed from
        its node, kept until someone did it. Returns the tombstones written.
        Raises UnknownTopicError if there is no such topic."""
        validate_topic_name(name)
        root = self.paths.topic(name)
        self.calls.call(self.zk.ensure_path_async, self.paths.tombstones)
        for _ in range(CONTENDED_TRIES):
            nodes = self.calls.subtree(root)
            if nodes is None:
                raise self.calls.unknown_topic(name)
            tombstones = self._tombstones_of(name)
            tx = self.zk.transaction()
            for path in reversed(nodes):  # children before their parents
                tx.delete(path)
            for stone in tombstones:
                path = self.paths.tombstone(tombstone_id(stone["node"], stone["log_dir"]))
                if self.calls.call(self.zk.exists_async, path) is None:
                    tx.create(path, dump_json(stone))
                else:  # an older delete of the same directory, not yet honoured
                    tx.set_data(path, dump_json(stone))
            if self.calls.committed(tx, (NotEmptyError, NoNodeError, NodeExistsError)):
                return tombstones
            # a node appeared or vanished while we listed; list again
        raise RaylogError(
            f"could not delete topic {name!r}: its nodes kept changing "
            f"(partition actors still registering?); stop them and retry",
            topic=name,
        )

    @translated("list topics")
    def list_topics(self) -> list[str]:
        """Names of all topics of the cluster, sorted."""
        try:
            return sorted(self.calls.call(self.zk.get_children_async, self.paths.topics))
        except NoNodeError:
            return []

    @translated("check whether a topic exists")
    def topic_exists(self, name: str) -> bool:
        return self.calls.call(self.zk.exists_async, self.paths.topic(name)) is not None

    @translated("set a partition's placement")
    def set_placement(self, topic: str, partition: int, node: str, log_dir: str) -> None:
        """Record the node (a stable identity) and the log directory of a
        partition. Raises UnknownTopicError / UnknownPartitionError."""
        self.calls.check_partition(topic, partition)
        path = self.paths.partition(topic, partition)
        data = dump_json({"node": node, "log_dir": log_dir})
        try:
            self.calls.call(self.zk.set_async, path, data)
        except NoNodeError:
            try:
                self.calls.call(self.zk.create_async, path, data)
            except NoNodeError:
                raise self.calls.unknown_topic(topic) from None
            except NodeExistsError:
                self.calls.call(self.zk.set_async, path, data)

    @translated("read a partition's placement")
    def placement(self, topic: str, partition: int) -> dict | None:
        """``{"node": ..., "log_dir": ...}``, or None if none is set (or the
        topic or partition does not exist)."""
        return self.calls.get_json(self.paths.partition(topic, partition))

    @translated("read a topic's placements")
    def placements(self, topic: str) -> dict[int, dict]:
        """``{partition: placement}`` for the partitions that have one.
        Raises UnknownTopicError if there is no such topic."""
        return self.calls.present(topic, self.paths.partition)

    def _tombstones_of(self, topic: str) -> list[dict]:
        """One per log of the topic: the placement's, and for a replicated
        partition every replica's (:mod:`raylog.replication`)."""
        now_ms = int(time.time() * 1000)
        stones = []
        for p, place in sorted(self.placements(topic).items()):
            if not (place.get("node") and place.get("log_dir")):
                continue
            logs = {place["node"]: place["log_dir"]}
            # the replication state (raylog.replication.state), read as plain JSON
            state = self.calls.get_json(self.paths.state(topic, p)) or {}
            for node in state.get("replicas", ()):
                logs.setdefault(node, replica_log_dir(place["log_dir"], node, state.get("origin") or state["replicas"][0]))
            stones += [{"topic": topic, "partition": p, "node": node, "log_dir": log_dir, "deleted_ms": now_ms}
                       for node, log_dir in logs.items()]
        return stones

    @translated("write a tombstone")
    def add_tombstone(self, topic: str, partition: int, node: str, log_dir: str) -> None:
        """A tombstone for one log that is to go from its node (a replica a
        reassignment removed); honoured as a deleted topic's are."""
        path = self.paths.tombstone(tombstone_id(node, log_dir))
        stone = dump_json({"topic": topic, "partition": partition, "node": node, "log_dir": log_dir,
                       "deleted_ms": int(time.time() * 1000), "reassigned": True})
        self.calls.call(self.zk.ensure_path_async, self.paths.tombstones)
        try:
            self.calls.call(self.zk.create_async, path, stone)
        except NodeExistsError:
            self.calls.call(self.zk.set_async, path, stone)

    @translated("list tombstones")
    def tombstones(self) -> dict[str, dict]:
        """``{id: {"topic", "partition", "node", "log_dir", "deleted_ms"}}``:
        logs of deleted partitions not yet removed from their nodes.

        Whoever serves or removes ``log_dir`` on ``node`` honours its
        tombstone first: it empties the directory (holding the directory's
        lock) and then calls :meth:`remove_tombstone`. A topic created
        again under the same name therefore never serves the old messages,
        even when the old log's node was down during the delete."""
        try:
            names = self.calls.call(self.zk.get_children_async, self.paths.tombstones)
        except NoNodeError:
            return {}
        self.calls.ready()
        pending = [(n, self.zk.get_async(self.paths.tombstone(n))) for n in sorted(names)]
        found = {}
        for name, result in pending:
            try:
                data, _ = result.get(timeout=self.op_timeout_s)
            except NoNodeError:
                continue
            found[name] = load_json(data)
        return found

    @translated("read a tombstone")
    def tombstone(self, node: str, log_dir: str) -> dict | None:
        """The tombstone of ``log_dir`` on ``node``, or None."""
        return self.calls.get_json(self.paths.tombstone(tombstone_id(node, log_dir)))

    @translated("remove a tombstone")
    def remove_tombstone(self, node: str, log_dir: str) -> bool:
        """Remove the tombstone of ``log_dir`` on ``node`` (its log is gone);
        True if there was one."""
        try:
            self.calls.call(self.zk.delete_async, self.paths.tombstone(tombstone_id(node, log_dir)))
            return True
        except NoNodeError:
            return False
