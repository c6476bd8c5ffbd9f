"""The producer actor: a :class:`raylog.Producer` living in a Ray actor, so
that Ray tasks and actors can produce through one shared, batching handle::

    handle = client.producer_actor(batch_size=50, acks="all")
    ray.get(handle.send_batch.remote("clicks", [b"v1", b"v2"], keys=None))   # -> 2
    ray.get(handle.send.remote("clicks", b"v", headers=[("trace", b"t1")]))  # -> (partition, offset)

Each call's ObjectRef resolves when **its own** messages have their outcome
at the producer's acks level: ``send_batch`` returns the number of messages
(all delivered), ``send`` returns ``(partition, offset)``; a call whose
messages failed raises for those messages only (a
:class:`~raylog.errors.DeliveryError` naming each failed topic-partition and
how many of the call's messages it lost), and no other call sees that
failure. Calls from many tasks share the producer's batches: the actor is
asynchronous, each call awaiting its own futures while the others go on.
With acks=0 a call resolves once its messages are written.

``flush`` waits until everything sent so far has its outcome and returns
the statistics; it does not raise the failures, which belong to the calls
that sent the messages (``stats()["failed_messages"]`` counts them; a
failed message never counts as sent).

Ray runs an asynchronous actor's calls in any order, even one caller's
(``allow_out_of_order_execution`` cannot be off for them): a ``flush``
submitted right after sends may start before them. So a flush settles: it
returns no sooner than ``settle_s`` (default :data:`FLUSH_SETTLE_S`) after
it began, with every send that started until then delivered (sends that
start later belong to later flushes, so a flush ends even while other
callers keep sending). ``Client.close`` (and a script's exit) flush with a
longer settle, :data:`CLOSE_SETTLE_S`.

The actor opens its own ZooKeeper session, so it needs nothing from the
driver but the connection settings.

Actor-confinement: the methods run on the actor's event loop; the wrapped
producer is thread-safe and resolves futures on its sender threads, which
hand each outcome to the loop with ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
from typing import Sequence

from raylog.config import NAMESPACE
from raylog.errors import DeliveryError
from raylog.metadata import ConnectionSettings, Metadata
from raylog.producer import Producer

#: a flush covers the sends that start up to this long after it (seconds):
#: calls submitted before the flush that Ray starts after it are in by then
FLUSH_SETTLE_S = 0.2
#: the settle of the flush at ``Client.close`` and at a script's exit
CLOSE_SETTLE_S = 1.0


def _when_done(future) -> asyncio.Future:
    """An asyncio future of the running loop, done when ``future`` (a
    producer future) is resolved."""
    loop = asyncio.get_running_loop()
    waiter = loop.create_future()

    def done(_):
        loop.call_soon_threadsafe(lambda: waiter.done() or waiter.set_result(None))

    future.add_done_callback(done)
    return waiter


class ProducerActor:
    def __init__(self, settings: ConnectionSettings, options: dict):

        self._metadata = Metadata.connect(settings)
        self._producer = Producer(self._metadata, **options)
        self._last_call = 0.0  # loop time a send last started (see flush)

    async def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Sequence[tuple[str, bytes | None]] | None = None,
    ) -> tuple[int, int]:
        """One message (``value`` None: a tombstone; ``headers``: ``(str,
        bytes | None)`` pairs, as :meth:`raylog.Producer.send`)."""
        self._last_call = asyncio.get_running_loop().time()
        future = self._producer.send(topic, value, key, partition=partition, headers=headers)
        await _when_done(future)
        return tuple(future.result())

    async def send_batch(
        self,
        topic: str,
        values: Sequence[bytes],
        keys: Sequence[bytes | None] | None = None,
        partition: int | None = None,
    ) -> int:
        self._last_call = asyncio.get_running_loop().time()
        call = self._producer.send_batch(topic, values, keys, partition=partition)
        await _when_done(call)
        error = call.exception(0)
        if error is not None:
            raise error
        return len(call)

    async def flush(self, timeout_s: float | None = None, settle_s: float = FLUSH_SETTLE_S) -> dict:
        await self._settled_flush(timeout_s, settle_s)
        return self._producer.stats()

    async def _settled_flush(self, timeout_s: float | None, settle_s: float) -> None:
        """Flush what was sent, wait until ``settle_s`` after this flush
        began, and flush again if a send started meanwhile (see the module
        docstring): bounded, even while other callers keep sending (their
        later sends are theirs to flush). ``timeout_s`` bounds the whole, as
        ``Producer.flush``'s does."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = None if timeout_s is None else started + timeout_s

        async def flush() -> None:
            left = None if deadline is None else max(0.0, deadline - loop.time())
            try:
                await asyncio.to_thread(self._producer.flush, left)
            except DeliveryError:
                pass  # reported to the calls whose messages failed

        await flush()
        settled = started + settle_s
        if deadline is not None:
            settled = min(settled, deadline)
        if loop.time() < settled:
            await asyncio.sleep(settled - loop.time())
        if self._last_call >= started:  # a send Ray started after this flush began
            await flush()

    async def stats(self) -> dict:
        return self._producer.stats()

    # -- transactions (a producer made with transactional_id=...) -------------------
    # One transaction at a time, as the wrapped producer: begin, the sends
    # (each awaited, so every send of it is in the producer before the
    # commit), offsets, then commit or abort. The coordinator is called from
    # a thread, never from the event loop.

    async def begin_transaction(self) -> None:
        self._producer.begin_transaction()

    async def send_offsets_to_transaction(self, offsets, group: str) -> None:
        await asyncio.to_thread(self._producer.send_offsets_to_transaction, dict(offsets), group)

    async def commit_transaction(self, timeout_s: float | None = None) -> None:
        await asyncio.to_thread(self._producer.commit_transaction, timeout_s)

    async def abort_transaction(self, timeout_s: float | None = None) -> None:
        await asyncio.to_thread(self._producer.abort_transaction, timeout_s)

    async def close(self, settle_s: float = FLUSH_SETTLE_S) -> dict:
        await self._settled_flush(None, settle_s)
        try:
            await asyncio.to_thread(self._producer.close)
        except DeliveryError:
            pass  # reported to the calls whose messages failed
        self._metadata.close()
        return self._producer.stats()


def producer_actor(settings: ConnectionSettings, *, name: str | None = None, num_cpus: float = 0.5, **options):
    """Start a producer actor; ``options`` go to :class:`raylog.Producer`."""
    import ray  # heavy (Ray): imported when used

    cls = ray.remote(num_cpus=num_cpus)(ProducerActor)
    if name is not None:
        cls = cls.options(name=name, namespace=NAMESPACE, get_if_exists=True)
    return cls.remote(settings, options)
