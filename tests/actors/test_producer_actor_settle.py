"""The producer actor's settled flush, as pure logic (no Ray): it covers the
sends that start within its settle and ends even while sends go on."""

from __future__ import annotations

import asyncio

from raylog.actors.producer import ProducerActor


class _Producer:
    def __init__(self):
        self.flushes = 0

    def flush(self, timeout_s=None):
        self.flushes += 1


def _actor() -> ProducerActor:
    actor = object.__new__(ProducerActor)
    actor._producer = _Producer()
    actor._last_call = 0.0
    return actor


def test_a_send_that_starts_within_the_settle_is_flushed_again():
    actor = _actor()

    async def run():
        loop = asyncio.get_running_loop()

        async def late_send():
            await asyncio.sleep(0.05)
            actor._last_call = loop.time()  # Ray started it after the flush

        sender = asyncio.create_task(late_send())
        await actor._settled_flush(None, 0.2)
        await sender

    asyncio.run(run())
    assert actor._producer.flushes == 2


def test_no_send_within_the_settle_means_one_flush():
    actor = _actor()
    asyncio.run(actor._settled_flush(None, 0.05))
    assert actor._producer.flushes == 1


def test_the_flush_ends_while_sends_go_on():
    """Another caller sending every 10 ms never leaves the actor quiet; the
    flush still returns once its settle has passed."""
    actor = _actor()

    async def run():
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()

        async def keep_sending():
            while not stop.is_set():
                actor._last_call = loop.time()
                await asyncio.sleep(0.01)

        sender = asyncio.create_task(keep_sending())
        try:
            await asyncio.wait_for(actor._settled_flush(None, 0.2), timeout=10)
        finally:
            stop.set()
            await sender

    asyncio.run(run())
    assert actor._producer.flushes == 2
