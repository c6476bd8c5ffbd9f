"""What clients know about the cluster: topics, partition counts, endpoints.

:class:`Metadata` reads the registry in ZooKeeper and caches what it read:
a topic's config with its partition count and each partition's endpoint
(which moves when a partition actor restarts, on another port or node).
Producers and consumers ask for an endpoint, and after a "not owner" reply
or a dead connection ask again with ``refresh=True`` (the paper's producer
redirect). A client outside Ray needs nothing but this and TCP.

A topic's partition count only grows (``client.add_partitions``): a cached
config is kept current by a ZooKeeper data watch on ``topics/<topic>``, set
when the topic is first read, and callbacks given to :meth:`Metadata.on_partitions`
hear of a count that changed (a producer's partitioner takes it so). A
partition beyond the cached count is looked up once more before it is
refused (:meth:`Metadata.endpoint`), so a partition added a moment ago is
found before the watch fires.

Thread-safe: the caches are plain dicts updated atomically; the watch and
the callbacks run on kazoo's event thread.
"""

from __future__ import annotations

import logging

from raylog.config import TopicConfig
from raylog.errors import (
    ArgumentTypeError,
    BrokerUnavailableError,
    RaylogError,
    UnknownPartitionError,
    UnknownTopicError,
)
from raylog.metadata.settings import ConnectionSettings
from raylog.retry import RetryPolicy
from raylog.zk.registry import Registry
from raylog.zk.session import connect_kazoo

log = logging.getLogger(__name__)


class Metadata:
    """The cluster as a client sees it: topic configs (cached, kept current
    by a watch: the partition count grows with ``client.add_partitions``)
    and partition endpoints (cached; looked up again with
    ``refresh=True`` after a "not owner" reply or a dead connection), read
    from the cluster's registry in ZooKeeper. Made by the :class:`raylog.Client`
    (``client.metadata``) or, in another process, by :meth:`connect`.
    Thread-safe (see the module docstring)."""

    def __init__(self, registry, settings: ConnectionSettings, *, owns_zk=None):
        self.registry = registry
        self.settings = settings
        self._owns_zk = owns_zk
        self._configs: dict = {}
        self._endpoints: dict[tuple[str, int], tuple[str, int]] = {}
        self._watched: set[str] = set()
        #: topics whose config node the watch saw go (deleted since this view read them)
        self._deleted: set[str] = set()
        self._partition_callbacks: list = []
        self._closed = False

    @classmethod
    def connect(cls, settings: ConnectionSettings) -> "Metadata":
        """A metadata view with its own ZooKeeper session (for producers and
        consumers outside the process that holds the :class:`Client`)."""
        zk = connect_kazoo(settings.zookeeper, token=settings.token, cluster=settings.cluster)
        return cls(Registry(zk, settings.cluster), settings, owns_zk=zk)

    @property
    def zk(self):
        return self.registry.zk

    def config(self, topic: str):
        """The topic's :class:`raylog.TopicConfig` (cached; a watch keeps it
        current, see the module docstring)."""
        config = self._configs.get(topic)
        if config is None:
            if not isinstance(topic, str):
                raise ArgumentTypeError(
                    f"topic must be a str (the topic's name), got {type(topic).__name__}; pass e.g. 'clicks'"
                )
            try:
                config = self._configs[topic] = self.registry.topic_config(topic)
            except UnknownTopicError:
                if topic in self._deleted:
                    raise self._deleted_error(topic) from None
                raise
            self._watch(topic)
        return config

    def _deleted_error(self, topic: str) -> UnknownTopicError:
        return UnknownTopicError(
            f"topic {topic!r} no longer exists in cluster {self.settings.cluster!r} (it was deleted); "
            f"create it again (client.create_topic) or stop sending to it",
            topic=topic,
        )

    def partitions(self, topic: str) -> int:
        return self.config(topic).partitions

    def refresh(self, topic: str):
        """The topic's config read from ZooKeeper now (and cached); the
        callbacks of :meth:`on_partitions` hear of a changed count."""
        old = self._configs.get(topic)
        config = self._configs[topic] = self.registry.topic_config(topic)
        if old is None:
            self._watch(topic)
        elif old.partitions != config.partitions:
            self._partitions_changed(topic, config.partitions)
        return config

    def on_partitions(self, callback) -> None:
        """Call ``callback(topic, count)`` (on kazoo's event thread, or the
        thread of :meth:`refresh`) whenever the partition count of a topic
        this view has read changes (``client.add_partitions``). The
        callback must be quick and must not raise; :meth:`off_partitions`
        ends it."""
        self._partition_callbacks = [*self._partition_callbacks, callback]

    def off_partitions(self, callback) -> None:
        """End a callback given to :meth:`on_partitions` (none given: nothing happens)."""
        self._partition_callbacks = [c for c in self._partition_callbacks if c is not callback]

    def _partitions_changed(self, topic: str, count: int) -> None:
        for callback in self._partition_callbacks:
            try:
                callback(topic, count)
            except Exception:  # noqa: BLE001 - one listener's failure must not stop the others
                log.exception("a partition-count callback failed for topic %s", topic)

    def _watch(self, topic: str) -> None:
        """Arm the data watch that keeps ``topic``'s cached config current
        (once per topic). Without it (ZooKeeper away just now) the cache is
        still refreshed by :meth:`endpoint`'s second look and :meth:`refresh`."""
        if topic in self._watched:
            return
        self._watched.add(topic)

        def fired(data, _stat):
            if self._closed:
                return False  # kazoo ends the watch
            if not data:
                if self._configs.pop(topic, None) is not None:  # deleted: read again when asked
                    self._deleted.add(topic)
                return None
            self._deleted.discard(topic)
            try:
                config = TopicConfig.from_json(data)
            except (ValueError, TypeError, RaylogError):
                return None  # unreadable: the next read reports it
            old = self._configs.get(topic)
            self._configs[topic] = config
            if old is not None and old.partitions != config.partitions:
                self._partitions_changed(topic, config.partitions)
            return None

        try:
            self.zk.DataWatch(self.registry.paths.topic(topic), fired)
        except Exception as err:  # noqa: BLE001 - the watch is an optimisation; see the docstring
            self._watched.discard(topic)
            log.debug("no config watch on topic %s (%s); its count is read again when needed", topic, err)

    def endpoint(self, topic: str, partition: int, *, refresh: bool = False, wait_s: float = 0.0):
        """``(host, port)`` of the partition's data server. With ``wait_s``,
        waits that long for an endpoint to appear (a restarting actor)."""
        key = (topic, partition)
        if not refresh:
            found = self._endpoints.get(key)
            if found is not None:
                return found
        if not 0 <= partition < self.partitions(topic) and (
                partition < 0 or not partition < self.refresh(topic).partitions):  # added just now?
            raise UnknownPartitionError(
                f"topic {topic!r} has partitions 0..{self.partitions(topic) - 1}, not {partition}",
                topic=topic,
                partition=partition,
            )
        backoff = RetryPolicy.until(wait_s, delay_s=0.05, max_delay_s=0.05, jitter=0.0).start()
        while True:
            info = self.registry.endpoint(topic, partition)
            if info is not None:
                found = self._endpoints[key] = (info["host"], int(info["port"]))
                return found
            if not self.registry.topic_exists(topic):
                # Deleted since its config was read: no endpoint will come.
                self._configs.pop(topic, None)
                raise self._deleted_error(topic)
            if not backoff.wait():
                raise BrokerUnavailableError(
                    f"partition {topic}-{partition} has no live endpoint (its actor may be "
                    f"restarting); retry shortly",
                    topic=topic,
                    partition=partition,
                )

    def forget(self, topic: str, partition: int) -> None:
        self._endpoints.pop((topic, partition), None)

    def close(self) -> None:
        self._closed = True
        if self._owns_zk is not None:
            self._owns_zk.stop()
            self._owns_zk.close()
            self._owns_zk = None
