"""The cluster registry: topics, partition placement and partition endpoints
in ZooKeeper (the layout of DESIGN §4, built by :class:`raylog.zk.paths.Paths`).

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
  there whole or not at all.
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

import functools
import json
import logging
import re
import threading
import time
from typing import Any, Callable

from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
)
from kazoo.protocol.states import KazooState, KeeperState
from kazoo.recipe.watchers import DataWatch

from raylog.config import TopicConfig
from raylog.errors import (
    ConfigError,
    StaleEpochError,
    RaylogError,
    SessionExpiredError,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
    ZooKeeperUnavailableError,
)
from raylog.zk.errors import _hosts, zookeeper_errors  # noqa: F401 (re-exported)
from raylog.zk.paths import DEFAULT_CLUSTER, Paths, tombstone_id

log = logging.getLogger(__name__)

#: letters, digits, '.', '_' and '-', 1 to 200 of them
TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,200}")

#: how often a write that raced with another writer is tried again
_CONTENDED_TRIES = 20


def validate_topic_name(name: str) -> str:
    """Return ``name`` if it is a valid topic name, else raise ConfigError."""
    if not isinstance(name, str) or not TOPIC_NAME.fullmatch(name):
        raise ConfigError(
            f"invalid topic name {name!r}: use 1 to 200 letters, digits, '.', '_' or '-'"
        )
    if name in (".", ".."):
        raise ConfigError(f"invalid topic name {name!r}: '.' and '..' are reserved")
    return name


# --------------------------------------------------------------------------
# kazoo failures → raylog errors, in one place


def _translated(action: str):
    """Method decorator: run the method inside :func:`zookeeper_errors`."""

    def decorate(method):
        @functools.wraps(method)
        def call(self, *args, **kwargs):
            with zookeeper_errors(self._zk, action):
                return method(self, *args, **kwargs)

        return call

    return decorate


def _first_failure(results: list) -> Exception | None:
    """The error that aborted a transaction (kazoo returns, not raises, it)."""
    errors = [r for r in results if isinstance(r, Exception)]
    real = [e for e in errors if not isinstance(e, RolledBackError)]
    return (real or errors or [None])[0]


def _load(data: bytes | None) -> dict | None:
    if not data:
        return None
    return json.loads(data)


def _dump(value: dict) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


# --------------------------------------------------------------------------
# the registry


class EndpointWatch:
    """A running :meth:`Registry.watch_endpoint`; :meth:`cancel` stops it
    (the callback is not called after ``cancel`` returns, except for a call
    already running). Thread-safe."""

    def __init__(self, topic: str, partition: int):
        self.topic = topic
        self.partition = partition
        self._cancelled = threading.Event()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        self._cancelled.set()

    def __repr__(self):
        state = "cancelled" if self.cancelled else "active"
        return f"EndpointWatch({self.topic}-{self.partition}, {state})"


class Registry:
    """Topics, placements and endpoints of one cluster in ZooKeeper.

    ``zk`` is a started :class:`kazoo.client.KazooClient`; the registry does
    not own it (the caller stops and closes it).

    Thread-safety: a registry may be shared between threads. It keeps no
    state of its own besides immutable settings; every read goes to
    ZooKeeper (nothing is cached) and the KazooClient is thread-safe.
    """

    def __init__(
        self,
        zk,
        cluster: str = DEFAULT_CLUSTER,
        *,
        op_timeout_s: float = 10.0,
        connect_wait_s: float = 2.0,
    ):
        self._zk = zk
        self.cluster = cluster
        self.paths = Paths(cluster)
        self.op_timeout_s = op_timeout_s
        self.connect_wait_s = connect_wait_s

    @property
    def zk(self):
        """The KazooClient this registry uses."""
        return self._zk

    def __repr__(self):
        return f"Registry({_hosts(self._zk)}, cluster={self.cluster!r})"

    # ------------------------------------------------------------- topics

    @_translated("create a topic")
    def create_topic(self, name: str, config: TopicConfig) -> None:
        """Create the topic with its partition nodes, atomically.

        Raises TopicExistsError if it exists, ConfigError for a bad name.
        """
        validate_topic_name(name)
        if not isinstance(config, TopicConfig):
            raise ConfigError(f"config must be a TopicConfig, got {type(config).__name__}")
        self._call(self._zk.ensure_path_async, self.paths.topics)
        tx = self._zk.transaction()
        tx.create(self.paths.topic(name), config.to_json())
        tx.create(self.paths.partitions(name), b"")
        for partition in range(config.partitions):
            tx.create(self.paths.partition(name, partition), b"")
        failure = _first_failure(self._commit(tx))
        if isinstance(failure, NodeExistsError):
            raise TopicExistsError(
                f"topic {name!r} already exists in cluster {self.cluster!r}; "
                f"pick another name or delete it first",
                topic=name,
            )
        if failure is not None:
            raise failure

    @_translated("delete a topic")
    def delete_topic(self, name: str) -> list[dict]:
        """Delete the topic and everything under it (placements, endpoints),
        atomically, and in the same transaction leave a **tombstone** for
        every partition log placed on a node (``tombstones/<id>``, see
        :meth:`tombstones`): the promise that the log will be removed from
        its node, kept until someone did it. Returns the tombstones written.
        Raises UnknownTopicError if there is no such topic."""
        validate_topic_name(name)
        root = self.paths.topic(name)
        self._call(self._zk.ensure_path_async, self.paths.tombstones)
        for _ in range(_CONTENDED_TRIES):
            nodes = self._subtree(root)
            if nodes is None:
                raise self._unknown_topic(name)
            tombstones = self._tombstones_of(name)
            tx = self._zk.transaction()
            for path in reversed(nodes):  # children before their parents
                tx.delete(path)
            for stone in tombstones:
                path = self.paths.tombstone(tombstone_id(stone["node"], stone["log_dir"]))
                if self._call(self._zk.exists_async, path) is None:
                    tx.create(path, _dump(stone))
                else:  # an older delete of the same directory, not yet honoured
                    tx.set_data(path, _dump(stone))
            failure = _first_failure(self._commit(tx))
            if failure is None:
                return tombstones
            if not isinstance(failure, (NotEmptyError, NoNodeError, NodeExistsError)):
                raise failure
            # a node appeared or vanished while we listed; list again
        raise RaylogError(
            f"could not delete topic {name!r}: its nodes kept changing "
            f"(partition actors still registering?); stop them and retry",
            topic=name,
        )

    @_translated("list topics")
    def list_topics(self) -> list[str]:
        """Names of all topics of the cluster, sorted."""
        try:
            return sorted(self._call(self._zk.get_children_async, self.paths.topics))
        except NoNodeError:
            return []

    @_translated("read a topic's config")
    def topic_config(self, name: str) -> TopicConfig:
        """The topic's config. Raises UnknownTopicError if there is no such topic."""
        try:
            data, _ = self._call(self._zk.get_async, self.paths.topic(name))
        except NoNodeError:
            raise self._unknown_topic(name) from None
        return TopicConfig.from_json(data)

    @_translated("check whether a topic exists")
    def topic_exists(self, name: str) -> bool:
        return self._call(self._zk.exists_async, self.paths.topic(name)) is not None

    # ---------------------------------------------------------- placement

    @_translated("set a partition's placement")
    def set_placement(self, topic: str, partition: int, node: str, log_dir: str) -> None:
        """Record the node (a stable identity) and the log directory of a
        partition. Raises UnknownTopicError / UnknownPartitionError."""
        self._check_partition(topic, partition)
        path = self.paths.partition(topic, partition)
        data = _dump({"node": node, "log_dir": log_dir})
        try:
            self._call(self._zk.set_async, path, data)
        except NoNodeError:
            try:
                self._call(self._zk.create_async, path, data)
            except NoNodeError:
                raise self._unknown_topic(topic) from None
            except NodeExistsError:
                self._call(self._zk.set_async, path, data)

    def _get_json(self, path: str) -> dict | None:
        try:
            data, _ = self._call(self._zk.get_async, path)
        except NoNodeError:
            return None
        return _load(data)

    @_translated("read a partition's placement")
    def placement(self, topic: str, partition: int) -> dict | None:
        """``{"node": ..., "log_dir": ...}``, or None if none is set (or the
        topic or partition does not exist)."""
        return self._get_json(self.paths.partition(topic, partition))

    @_translated("read a topic's placements")
    def placements(self, topic: str) -> dict[int, dict]:
        """``{partition: placement}`` for the partitions that have one.
        Raises UnknownTopicError if there is no such topic."""
        found = self._read_partitions(topic, self.paths.partition)
        return {p: value for p, value in found.items() if value is not None}

    # --------------------------------------------------------- tombstones

    def _tombstones_of(self, topic: str) -> list[dict]:
        now_ms = int(time.time() * 1000)
        return [
            {"topic": topic, "partition": p, "node": place["node"], "log_dir": place["log_dir"], "deleted_ms": now_ms}
            for p, place in sorted(self.placements(topic).items())
            if place.get("node") and place.get("log_dir")
        ]

    @_translated("list tombstones")
    def tombstones(self) -> dict[str, dict]:
        """``{id: {"topic", "partition", "node", "log_dir", "deleted_ms"}}``:
        logs of deleted partitions not yet removed from their nodes.

        Whoever serves or removes ``log_dir`` on ``node`` honours its
        tombstone first: it empties the directory (holding the directory's
        lock) and then calls :meth:`remove_tombstone`. A topic created
        again under the same name therefore never serves the old messages,
        even when the old log's node was down during the delete."""
        try:
            names = self._call(self._zk.get_children_async, self.paths.tombstones)
        except NoNodeError:
            return {}
        self._ready()
        pending = [(n, self._zk.get_async(self.paths.tombstone(n))) for n in sorted(names)]
        found = {}
        for name, result in pending:
            try:
                data, _ = result.get(timeout=self.op_timeout_s)
            except NoNodeError:
                continue
            found[name] = _load(data)
        return found

    @_translated("read a tombstone")
    def tombstone(self, node: str, log_dir: str) -> dict | None:
        """The tombstone of ``log_dir`` on ``node``, or None."""
        return self._get_json(self.paths.tombstone(tombstone_id(node, log_dir)))

    @_translated("remove a tombstone")
    def remove_tombstone(self, node: str, log_dir: str) -> bool:
        """Remove the tombstone of ``log_dir`` on ``node`` (its log is gone);
        True if there was one."""
        try:
            self._call(self._zk.delete_async, self.paths.tombstone(tombstone_id(node, log_dir)))
            return True
        except NoNodeError:
            return False

    # ---------------------------------------------------------- endpoints

    @_translated("register a partition endpoint")
    def register_endpoint(
        self, topic: str, partition: int, host: str, port: int, actor: str, epoch: int
    ) -> None:
        """Publish where a partition is served, as an ephemeral node of this
        client's session.

        An endpoint left by an older epoch is replaced; one of the same epoch
        is overwritten (and taken over by this session). Raises StaleEpochError
        if a newer epoch already serves the partition: this caller is stale
        and must stop serving. Raises UnknownTopicError / UnknownPartitionError.
        """
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise ConfigError(f"epoch must be a non-negative integer, got {epoch!r}")
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise ConfigError(f"port must be in 1..65535, got {port!r}")
        self._check_partition(topic, partition)
        data = _dump({"host": host, "port": port, "actor": actor, "epoch": epoch})
        path = self.paths.endpoint(topic, partition)
        for _ in range(_CONTENDED_TRIES):
            fence = self._read_fence(topic, partition)
            if fence is None:
                self._ensure_partition_node(topic, partition)
                continue
            fence_data, fence_version = fence
            try:
                old, stat = self._call(self._zk.get_async, path)
            except NoNodeError:
                old, stat = None, None
            tx = self._zk.transaction()
            if stat is None:
                tx.set_data(self.paths.partition(topic, partition), fence_data, fence_version)
                tx.create(path, data, ephemeral=True)
            else:
                old_epoch = self._epoch_of(old)
                if old_epoch > epoch:
                    raise StaleEpochError(
                        f"partition {topic}-{partition} is already served by a newer epoch "
                        f"({old_epoch} > {epoch}); this partition actor is stale and must stop",
                        topic=topic,
                        partition=partition,
                        epoch=epoch,
                        current_epoch=old_epoch,
                    )
                if old_epoch == epoch and stat.ephemeralOwner == self._session_id():
                    # our own node: overwrite in place
                    tx.check(self.paths.partition(topic, partition), fence_version)
                    tx.set_data(path, data, stat.version)
                else:
                    # an older epoch, or the same epoch of another session:
                    # replace it, so that the node lives and dies with ours
                    tx.set_data(self.paths.partition(topic, partition), fence_data, fence_version)
                    tx.delete(path, stat.version)
                    tx.create(path, data, ephemeral=True)
            failure = _first_failure(self._commit(tx))
            if failure is None:
                return
            if not isinstance(failure, (BadVersionError, NoNodeError, NodeExistsError)):
                raise failure
            # another registration (or a placement change) came first; look again
        raise RaylogError(
            f"could not register the endpoint of {topic}-{partition}: it kept changing "
            f"under concurrent registrations; retry",
            topic=topic,
            partition=partition,
        )

    @_translated("read a partition endpoint")
    def endpoint(self, topic: str, partition: int) -> dict | None:
        """``{"host", "port", "actor", "epoch"}`` of the actor serving the
        partition, or None while none serves it (or the topic is gone)."""
        return self._get_json(self.paths.endpoint(topic, partition))

    @_translated("read a topic's endpoints")
    def endpoints(self, topic: str) -> dict[int, dict]:
        """``{partition: endpoint}`` for the partitions being served.
        Raises UnknownTopicError if there is no such topic."""
        found = self._read_partitions(topic, self.paths.endpoint)
        return {p: value for p, value in found.items() if value is not None}

    @_translated("unregister a partition endpoint")
    def unregister_endpoint(self, topic: str, partition: int, epoch: int) -> bool:
        """Remove the endpoint if ``epoch`` registered it; True if removed.
        An endpoint of another epoch (a newer actor) is left alone."""
        path = self.paths.endpoint(topic, partition)
        for _ in range(_CONTENDED_TRIES):
            fence = self._read_fence(topic, partition)
            if fence is None:
                return False
            try:
                data, stat = self._call(self._zk.get_async, path)
            except NoNodeError:
                return False
            if self._epoch_of(data) != epoch:
                return False
            tx = self._zk.transaction()
            tx.check(self.paths.partition(topic, partition), fence[1])
            tx.delete(path, stat.version)
            failure = _first_failure(self._commit(tx))
            if failure is None:
                return True
            if not isinstance(failure, (BadVersionError, NoNodeError)):
                raise failure
            # changed meanwhile; look again
        return False

    @_translated("watch a partition endpoint")
    def watch_endpoint(
        self, topic: str, partition: int, callback: Callable[[dict | None], Any]
    ) -> EndpointWatch:
        """Call ``callback(endpoint or None)`` now and whenever the
        partition's endpoint appears, changes or goes away.

        The first call happens before this method returns, in the calling
        thread; later ones on kazoo's event thread, so keep the callback
        short and hand real work to a thread of your own. An exception from
        it is logged and the watch goes on. Returning False from it, or
        calling ``cancel()`` on the returned watch, stops watching. The watch
        survives connection loss and session expiry (kazoo sets it again and
        calls back if the endpoint changed meanwhile).
        """
        self._ready(f"watch the endpoint of {topic}-{partition}")
        watch = EndpointWatch(topic, partition)

        def on_change(data, stat, event=None):
            if watch.cancelled:
                return False
            try:
                value = _load(data)
            except ValueError:
                log.warning("endpoint of %s-%d holds invalid JSON: %r", topic, partition, data)
                value = None
            try:
                keep = callback(value)
            except Exception:  # noqa: BLE001 - a watcher must not kill the watch
                log.exception("endpoint watch callback for %s-%d failed", topic, partition)
                return None
            if keep is False:
                watch.cancel()
                return False
            return None

        DataWatch(self._zk, self.paths.endpoint(topic, partition), on_change)
        return watch

    # ------------------------------------------------------------ internals

    def _ready(self, action: str = "call ZooKeeper") -> None:
        """Fail fast (after ``connect_wait_s``) unless the client is connected,
        so that no request waits in kazoo's queue for a reconnect."""
        deadline = time.monotonic() + self.connect_wait_s
        while True:
            state = self._zk.state
            if state == KazooState.CONNECTED:
                return
            if self._zk.client_state == KeeperState.CLOSED:
                raise ConnectionClosedError("Connection has been closed")
            if time.monotonic() >= deadline:
                break
            time.sleep(0.02)
        where = _hosts(self._zk)
        if state == KazooState.LOST:
            raise SessionExpiredError(
                f"cannot {action}: the ZooKeeper session was lost and no new session "
                f"is established yet (ZooKeeper at {where}); ephemeral nodes of the "
                f"old session are gone; retry, and register them again",
                hosts=where,
            )
        raise ZooKeeperUnavailableError(
            f"cannot {action}: not connected to ZooKeeper at {where} (the connection is "
            f"{str(state).lower()}); check that ZooKeeper runs and is reachable; the "
            f"client reconnects by itself and the call succeeds again once it is back",
            hosts=where,
        )

    def _call(self, fn_async, *args, **kwargs):
        """One ZooKeeper request, bounded by ``op_timeout_s``."""
        self._ready()
        return fn_async(*args, **kwargs).get(timeout=self.op_timeout_s)

    def _commit(self, tx) -> list:
        self._ready()
        return tx.commit_async().get(timeout=self.op_timeout_s)

    def _session_id(self) -> int | None:
        client_id = self._zk.client_id
        return client_id[0] if client_id else None

    @staticmethod
    def _epoch_of(data: bytes | None) -> int:
        """The epoch stored in an endpoint node (-1 if unreadable: replace it)."""
        try:
            epoch = json.loads(data)["epoch"]
            return epoch if isinstance(epoch, int) else -1
        except (TypeError, ValueError, KeyError):
            return -1

    def _unknown_topic(self, name: str) -> UnknownTopicError:
        return UnknownTopicError(
            f"topic {name!r} does not exist in cluster {self.cluster!r}; "
            f"create it first (client.create_topic)",
            topic=name,
        )

    def _check_partition(self, topic: str, partition: int) -> TopicConfig:
        config = self.topic_config(topic)
        if not isinstance(partition, int) or isinstance(partition, bool) or not (
            0 <= partition < config.partitions
        ):
            raise UnknownPartitionError(
                f"topic {topic!r} has partitions 0..{config.partitions - 1}, not {partition!r}",
                topic=topic,
                partition=partition,
            )
        return config

    def _read_fence(self, topic: str, partition: int) -> tuple[bytes, int] | None:
        """The partition node's data and data version (None if it is missing).

        That version is the fencing counter of the partition's endpoint: it
        only grows, and every write that creates an endpoint node rewrites
        the same data with it as the expected version (every other endpoint
        write checks it). A write prepared from an older view of the
        endpoint therefore fails, even if the endpoint node was meanwhile
        replaced by one with the same node version (ZooKeeper restarts node
        versions at 0, so the endpoint's own version cannot tell).
        """
        try:
            data, stat = self._call(self._zk.get_async, self.paths.partition(topic, partition))
        except NoNodeError:
            return None
        return data, stat.version

    def _ensure_partition_node(self, topic: str, partition: int) -> None:
        try:
            self._call(self._zk.create_async, self.paths.partition(topic, partition), b"")
        except NodeExistsError:
            pass
        except NoNodeError:
            raise self._unknown_topic(topic) from None

    def _read_partitions(self, topic: str, path_of) -> dict[int, dict | None]:
        """Read ``path_of(topic, p)`` for every partition node, pipelined."""
        try:
            names = self._call(self._zk.get_children_async, self.paths.partitions(topic))
        except NoNodeError:
            raise self._unknown_topic(topic) from None
        partitions = sorted(int(n) for n in names if n.isdigit())
        self._ready()
        pending = [(p, self._zk.get_async(path_of(topic, p))) for p in partitions]
        found: dict[int, dict | None] = {}
        for partition, result in pending:
            try:
                data, _ = result.get(timeout=self.op_timeout_s)
            except NoNodeError:
                continue
            found[partition] = _load(data)
        return found

    def _subtree(self, root: str) -> list[str] | None:
        """``root`` and every node below it, parents before children (None if
        ``root`` does not exist). Each level's listings are pipelined."""
        nodes: list[str] = []
        level = [root]
        while level:
            self._ready()
            pending = [(path, self._zk.get_children_async(path)) for path in level]
            level = []
            for path, result in pending:
                try:
                    children = result.get(timeout=self.op_timeout_s)
                except NoNodeError:
                    if path == root:
                        return None
                    continue  # vanished meanwhile; the delete will notice
                nodes.append(path)
                level.extend(f"{path}/{child}" for child in children)
        return nodes
