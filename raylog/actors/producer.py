"""The producer actor: a :class:`raylog.Producer` living in a Ray actor, so
that Ray tasks and actors can produce through one shared, batching handle::

    handle = client.producer_actor(batch_size=50)
    ray.get(handle.send_batch.remote("clicks", [b"v1", b"v2"], keys=None))

Calls queue messages and return once they are queued (the producer batches
and sends in the background); ``flush`` waits until everything queued is
sent and acknowledged. The actor opens its own ZooKeeper session, so it
needs nothing from the driver but the connection settings.

Actor-confinement: the wrapped producer is thread-safe; the actor runs its
methods on a small thread pool so a long ``flush`` does not hold up sends.
"""

from __future__ import annotations

from typing import Sequence

from raylog.metadata import ConnectionSettings, Metadata


class ProducerActor:
    def __init__(self, settings: ConnectionSettings, options: dict):
        from raylog.producer import Producer

        self._metadata = Metadata.connect(settings)
        self._producer = Producer(self._metadata, **options)

    def send(self, topic: str, value: bytes, key: bytes | None = None, partition: int | None = None) -> None:
        self._producer.send(topic, value, key, partition=partition)

    def send_batch(
        self, topic: str, values: Sequence[bytes], keys: Sequence[bytes | None] | None = None
    ) -> int:
        self._producer.send_batch(topic, values, keys)
        return len(values)

    def flush(self, timeout_s: float | None = None) -> dict:
        self._producer.flush(timeout_s)
        return self._producer.stats()

    def stats(self) -> dict:
        return self._producer.stats()

    def close(self) -> dict:
        self._producer.close()
        self._metadata.close()
        return self._producer.stats()


def producer_actor(settings: ConnectionSettings, *, name: str | None = None, num_cpus: float = 0.5, **options):
    """Start a producer actor; ``options`` go to :class:`raylog.Producer`."""
    import ray

    cls = ray.remote(num_cpus=num_cpus, max_concurrency=4)(ProducerActor)
    if name is not None:
        cls = cls.options(name=name, namespace="raylog", get_if_exists=True)
    return cls.remote(settings, options)
