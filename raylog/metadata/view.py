"""What clients know about the cluster: topics, partition counts, endpoints.

:class:`Metadata` reads the registry in ZooKeeper and caches what it read:
a topic's partition count (fixed at creation) and each partition's endpoint
(which moves when a partition actor restarts, on another port or node).
Producers and consumers ask for an endpoint, and after a "not owner" reply
or a dead connection ask again with ``refresh=True`` (the paper's producer
redirect). A client outside Ray needs nothing but this and TCP.

Thread-safe: the caches are plain dicts updated atomically.
"""

from __future__ import annotations

from raylog.errors import ArgumentTypeError, BrokerUnavailableError, UnknownPartitionError, UnknownTopicError
from raylog.metadata.settings import ConnectionSettings
from raylog.retry import RetryPolicy
from raylog.zk.registry import Registry
from raylog.zk.session import connect_kazoo


class Metadata:
    """The cluster as a client sees it: topic configs (cached; fixed at
    creation) and partition endpoints (cached; looked up again with
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
        """The topic's :class:`raylog.TopicConfig` (fixed at creation; cached)."""
        config = self._configs.get(topic)
        if config is None:
            if not isinstance(topic, str):
                raise ArgumentTypeError(
                    f"topic must be a str (the topic's name), got {type(topic).__name__}; pass e.g. 'clicks'"
                )
            config = self._configs[topic] = self.registry.topic_config(topic)
        return config

    def partitions(self, topic: str) -> int:
        return self.config(topic).partitions

    def endpoint(self, topic: str, partition: int, *, refresh: bool = False, wait_s: float = 0.0):
        """``(host, port)`` of the partition's data server. With ``wait_s``,
        waits that long for an endpoint to appear (a restarting actor)."""
        key = (topic, partition)
        if not refresh:
            found = self._endpoints.get(key)
            if found is not None:
                return found
        if not 0 <= partition < self.partitions(topic):
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
                raise UnknownTopicError(
                    f"topic {topic!r} no longer exists in cluster {self.settings.cluster!r} (it was deleted); "
                    f"create it again (client.create_topic) or stop sending to it",
                    topic=topic,
                )
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
        if self._owns_zk is not None:
            self._owns_zk.stop()
            self._owns_zk.close()
            self._owns_zk = None
