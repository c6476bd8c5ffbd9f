"""What the parts of the cluster registry share (see :mod:`raylog.zk.registry`):
:class:`RegistryCalls`, how every ZooKeeper call is made (bounded by
``op_timeout_s``, waiting up to ``connect_wait_s`` for a lost connection,
kazoo failures translated by :func:`raylog.zk.errors.zookeeper_errors`) and
the reads the topic and endpoint parts share; and the helpers both use
(:func:`translated`, :func:`first_failure`, :func:`load_json`,
:func:`dump_json`, :data:`CONTENDED_TRIES`)."""

from __future__ import annotations

import functools
import json
import logging
import re
import threading
import time

from kazoo.exceptions import ConnectionClosedError, NodeExistsError, NoNodeError, RolledBackError
from kazoo.protocol.states import KazooState, KeeperState

from raylog.config import TopicConfig
from raylog.errors import (
    SessionExpiredError,
    UnknownPartitionError,
    UnknownTopicError,
    ZooKeeperUnavailableError,
)
from raylog.zk.errors import zk_hosts, zookeeper_errors
from raylog.zk.paths import DEFAULT_CLUSTER, Paths

log = logging.getLogger(__name__)

#: letters, digits, '.', '_' and '-', 1 to 200 of them
TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,200}")

#: how often a write that raced with another writer is tried again
CONTENDED_TRIES = 20


def translated(action: str):
    """Method decorator: run the method inside :func:`zookeeper_errors`
    (of the instance's ``zk``, its KazooClient)."""

    def decorate(method):
        @functools.wraps(method)
        def call(self, *args, **kwargs):
            with zookeeper_errors(self.zk, action):
                return method(self, *args, **kwargs)

        return call

    return decorate


def first_failure(results: list) -> Exception | None:
    """The error that aborted a transaction (kazoo returns, not raises, it)."""
    errors = [r for r in results if isinstance(r, Exception)]
    real = [e for e in errors if not isinstance(e, RolledBackError)]
    return (real or errors or [None])[0]


def load_json(data: bytes | None) -> dict | None:
    """A node's JSON value (None for an empty node)."""
    if not data:
        return None
    return json.loads(data)


def dump_json(value: dict) -> bytes:
    """``value`` as a node's JSON (keys sorted, no spaces)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


class RegistryCalls:
    """ZooKeeper calls and the reads the parts of
    :class:`~raylog.zk.registry.Registry` share; each part holds the one
    instance of its registry.

    Thread-safety: shareable between threads; it keeps only immutable
    settings and the (thread-safe) KazooClient."""

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
        return f"Registry({zk_hosts(self._zk)}, cluster={self.cluster!r})"

    def get_json(self, path: str) -> dict | None:
        try:
            data, _ = self.call(self._zk.get_async, path)
        except NoNodeError:
            return None
        return load_json(data)

    def ready(self, action: str = "call ZooKeeper") -> None:
        """Fail fast (after ``connect_wait_s``) unless the client is connected,
        so that no request waits in kazoo's queue for a reconnect."""
        state = self._zk.state
        if state == KazooState.CONNECTED:
            return
        # Not connected: wait for kazoo's notice of a state change (a
        # listener), not by polling, until connect_wait_s.
        changed = threading.Event()

        def on_change(_state) -> None:
            changed.set()

        deadline = time.monotonic() + self.connect_wait_s
        self._zk.add_listener(on_change)
        try:
            while True:
                changed.clear()
                state = self._zk.state
                if state == KazooState.CONNECTED:
                    return
                if self._zk.client_state == KeeperState.CLOSED:
                    raise ConnectionClosedError("Connection has been closed")
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                changed.wait(left)
        finally:
            self._zk.remove_listener(on_change)
        where = zk_hosts(self._zk)
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

    def call(self, fn_async, *args, **kwargs):
        """One ZooKeeper request, bounded by ``op_timeout_s``."""
        self.ready()
        return fn_async(*args, **kwargs).get(timeout=self.op_timeout_s)

    def commit(self, tx) -> list:
        self.ready()
        return tx.commit_async().get(timeout=self.op_timeout_s)

    def committed(self, tx, contended: tuple[type[Exception], ...]) -> bool:
        """Commit ``tx``: True when it went through, False when it failed
        with one of ``contended`` (someone else changed the nodes first: the
        caller reads them again and builds a new transaction); any other
        failure is raised."""
        failure = first_failure(self.commit(tx))
        if failure is None:
            return True
        if not isinstance(failure, contended):
            raise failure
        return False

    def session_id(self) -> int | None:
        client_id = self._zk.client_id
        return client_id[0] if client_id else None

    def unknown_topic(self, name: str) -> UnknownTopicError:
        return UnknownTopicError(
            f"topic {name!r} does not exist in cluster {self.cluster!r}; "
            f"create it first (client.create_topic)",
            topic=name,
        )

    @translated("read a topic's config")
    def topic_config(self, name: str) -> TopicConfig:
        """The topic's config. Raises UnknownTopicError if there is no such topic."""
        try:
            data, _ = self.call(self._zk.get_async, self.paths.topic(name))
        except NoNodeError:
            raise self.unknown_topic(name) from None
        if not data:  # a node without its config: what a deleted topic's late writer may leave
            raise self.unknown_topic(name)
        return TopicConfig.from_json(data)

    def check_partition(self, topic: str, partition: int) -> TopicConfig:
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

    def ensure_partition_node(self, topic: str, partition: int) -> None:
        try:
            self.call(self._zk.create_async, self.paths.partition(topic, partition), b"")
        except NodeExistsError:
            pass
        except NoNodeError:
            raise self.unknown_topic(topic) from None

    def present(self, topic: str, path_of) -> dict[int, dict]:
        """``{partition: value}`` of the partitions whose ``path_of`` node
        holds one (UnknownTopicError if there is no such topic)."""
        return {p: value for p, value in self.read_partitions(topic, path_of).items() if value is not None}

    def read_partitions(self, topic: str, path_of) -> dict[int, dict | None]:
        """Read ``path_of(topic, p)`` for every partition node, pipelined."""
        try:
            names = self.call(self._zk.get_children_async, self.paths.partitions(topic))
        except NoNodeError:
            raise self.unknown_topic(topic) from None
        partitions = sorted(int(n) for n in names if n.isdigit())
        self.ready()
        pending = [(p, self._zk.get_async(path_of(topic, p))) for p in partitions]
        found: dict[int, dict | None] = {}
        for partition, result in pending:
            try:
                data, _ = result.get(timeout=self.op_timeout_s)
            except NoNodeError:
                continue
            found[partition] = load_json(data)
        return found

    def subtree(self, root: str) -> list[str] | None:
        """``root`` and every node below it, parents before children (None if
        ``root`` does not exist). Each level's listings are pipelined."""
        nodes: list[str] = []
        level = [root]
        while level:
            self.ready()
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
