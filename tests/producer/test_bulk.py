"""Many messages per call (producer/bulk.py): the sender is woken once the
call lets go of the lock, and never left asleep while a call waits for
buffer space."""

from __future__ import annotations

import threading

import pytest

from raylog.config import TopicConfig
from raylog.producer.accumulator import RecordAccumulator


class Metadata:
    def partitions(self, topic):
        return 3

    def config(self, topic):
        return TopicConfig(partitions=3, max_message_bytes=1 << 20)


def _acc(**options) -> RecordAccumulator:
    options.setdefault("batch_size", 10)
    options.setdefault("max_buffered_messages", 10_000)
    return RecordAccumulator(Metadata(), linger_ms=5, compression=None, max_block_s=5, **options)


class FakeSender:
    """Sleeps on ``acc.wake`` without a deadline (as the sender does when no
    batch is open) and, each time it is woken, resolves every sealed batch
    and frees its buffer space."""

    def __init__(self, acc):
        self.acc, self.stopping = acc, False
        self.asleep, self.woken = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.asleep.wait(10)

    def _run(self):
        acc = self.acc
        with acc.lock:
            while not self.stopping:
                for queue in acc.ready.values():
                    while queue:
                        batch = queue.popleft()
                        acc.buffered -= len(batch.values)
                        batch.future.resolve(0)
                acc.space.notify_all()
                acc.sender_waiting, acc.sender_wakes_at = True, float("inf")
                self.asleep.set()
                acc.wake.wait()
                acc.sender_waiting = False
                self.woken.set()

    def stop(self):
        with self.acc.lock:
            self.stopping = True
            self.acc.wake.notify_all()
        self.thread.join(10)


KEYS = {"keyless": None, "keyed": [b"k%d" % i for i in range(7)] * 3}


@pytest.mark.parametrize("kind", sorted(KEYS))
def test_a_call_wakes_a_sleeping_sender_once_it_lets_go_of_the_lock(kind):
    acc = _acc()
    sender = FakeSender(acc)
    try:
        keys = KEYS[kind]
        acc.append_many("t", [b"v"] * (len(keys) if keys else 3), keys, None)  # nothing full: only linger
        assert not acc.deferring and not acc.wake_deferred
        assert sender.woken.wait(10), "the sender was not woken by the call's new batches"
    finally:
        sender.stop()


@pytest.mark.parametrize("kind", sorted(KEYS))
def test_a_call_waiting_for_buffer_space_has_the_sender_woken_meanwhile(kind):
    """The call fills the buffer many times over; it can only finish if the
    sender is woken while the call waits (not only when the call ends)."""
    acc = _acc(max_buffered_messages=25)
    sender = FakeSender(acc)
    try:
        keys = None if KEYS[kind] is None else KEYS[kind] * 20
        n = 420 if keys is not None else 400
        call = acc.append_many("t", [b"v%d" % i for i in range(n)], keys, None)
        assert len(call) == n
        with acc.lock:
            acc.seal_all()
            acc.wake.notify()
        assert len(call.result(10)) == n and acc.buffered == 0
    finally:
        sender.stop()
