"""Many messages per call (RecordAccumulator.append_many): the sender is woken once the
call lets go of the lock, and never left asleep while a call waits for
buffer space; keyed calls fill the same batches with the compiled groups
(``_fastsend.GroupFill``) as with the reference. Every test runs both ways
(``fill``)."""

from __future__ import annotations

import random
import threading

import pytest

from raylog.config import TopicConfig
from raylog.producer.accumulator import RecordAccumulator
from raylog.producer.batch import ProducerBatch
from raylog.producer.partitioner import StickyPartitioner

try:
    from raylog.producer import _fastsend
except ImportError:  # built without a compiler
    _fastsend = None


class Metadata:
    def __init__(self, max_message_bytes: int = 1 << 20):
        self.max_message_bytes = max_message_bytes

    def partitions(self, topic):
        return 3

    def config(self, topic):
        return TopicConfig(partitions=3, max_message_bytes=self.max_message_bytes)


@pytest.fixture(params=["c", "python"])
def fill(request):
    """The keyed groups' fill: compiled (``c``) or the reference alone."""
    if request.param == "c" and _fastsend is None:
        pytest.skip("raylog.producer._fastsend is not built")
    return request.param


def _acc(fill: str, max_message_bytes: int = 1 << 20, **options) -> RecordAccumulator:
    options.setdefault("batch_size", 10)
    options.setdefault("max_buffered_messages", 10_000)
    acc = RecordAccumulator(
        Metadata(max_message_bytes), linger_ms=5, compression=None, max_block_s=5, **options
    )
    if fill == "c":
        acc.fill_groups = _fastsend.GroupFill(ProducerBatch)
    return acc


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
def test_a_call_wakes_a_sleeping_sender_once_it_lets_go_of_the_lock(kind, fill):
    acc = _acc(fill)
    sender = FakeSender(acc)
    try:
        keys = KEYS[kind]
        acc.append_many("t", [b"v"] * (len(keys) if keys else 3), keys, None)  # nothing full: only linger
        assert not acc.deferring and not acc.wake_deferred
        assert sender.woken.wait(10), "the sender was not woken by the call's new batches"
    finally:
        sender.stop()


@pytest.mark.parametrize("kind", sorted(KEYS))
def test_a_call_waiting_for_buffer_space_has_the_sender_woken_meanwhile(kind, fill):
    """The call fills the buffer many times over; it can only finish if the
    sender is woken while the call waits (not only when the call ends)."""
    acc = _acc(fill, max_buffered_messages=25)
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


def _keyed_script(acc: RecordAccumulator) -> dict:
    """Keyed calls of many sizes (groups that fit their open batch, fill
    it exactly, overflow it into the next, or pass its limit in bytes),
    with keyless messages among the keys, and calls between them that open
    batches without keys or with timestamps; then everything sealed. What
    it returns describes every batch (partition, values, keys, timestamps,
    size, in sealing order) and where each call's messages went."""
    acc._sticky = StickyPartitioner(seed=3)
    rng = random.Random(11)
    calls = []
    for i in range(400):
        n = rng.choice([1, 2, 3, 7, 10, 11, 25, 40])
        keys = [None if rng.random() < 0.08 else b"key-%d" % rng.randrange(40) for _ in range(n)]
        values = [b"v%d.%d-" % (i, j) + b"x" * rng.choice([0, 5, 60, 300, 700]) for j in range(n)]
        calls.append(acc.append_many("t", values, keys, None))
        if i % 9 == 4:
            acc.append("t", b"stamped", partition=i % 3, timestamp_ms=1000 + i)
        if i % 13 == 6:
            acc.append_many("t", [b"plain"] * 3, None, i % 3)
        if i % 17 == 0:
            acc.append("t", b"sticky")
    acc.seal_all()
    where, batches = {}, []
    for p in sorted(acc.ready):
        for batch in acc.ready[p]:
            where[id(batch.future)] = len(batches)
            # (a timestamp of the batch's own is its creation time: "now")
            stamps = None if batch.timestamps is None else [t if t < 10**6 else "now" for t in batch.timestamps]
            batches.append((batch.partition, batch.values, batch.keys, stamps, batch.size))
    placed = [
        [(where[id(future)], first, count, list(positions) if not isinstance(positions, int) else positions)
         for future, first, count, positions in call._parts]
        for call in calls
    ]
    return {"batches": batches, "calls": placed, "buffered": acc.buffered, "sizes": [len(c) for c in calls]}


def test_the_compiled_groups_fill_the_same_batches_as_the_reference():
    if _fastsend is None:
        pytest.skip("raylog.producer._fastsend is not built")
    compiled = _keyed_script(_acc("c", max_message_bytes=4000, batch_size=10))
    reference = _keyed_script(_acc("python", max_message_bytes=4000, batch_size=10))
    assert compiled == reference
    batches = compiled["batches"]
    # the script met every case: full batches, ones cut by bytes, timestamps, keyless ones
    assert any(len(values) == 10 for _, values, _, _, _ in batches)
    assert any(len(values) < 10 and size + 22 + 300 > 4000 for _, values, _, _, size in batches)
    assert any(timestamps is not None for _, _, _, timestamps, _ in batches)
    assert any(keys is not None and None in keys for _, _, keys, _, _ in batches)
    assert compiled["buffered"] == sum(len(values) for _, values, _, _, _ in batches)


def test_every_message_of_a_keyed_call_is_placed_once_in_order(fill):
    acc = _acc(fill, max_message_bytes=4000, batch_size=10)
    script = _keyed_script(acc)
    for call, size in zip(script["calls"], script["sizes"]):
        positions = sorted(p for _, _, count, where in call for p in (where if isinstance(where, list) else
                                                                     range(where, where + count)))
        assert positions == list(range(size))
        for b, first, count, where in call:
            assert 0 <= first and first + count <= len(script["batches"][b][1])


def test_a_group_fill_refuses_arguments_it_cannot_take():
    if _fastsend is None:
        pytest.skip("raylog.producer._fastsend is not built")
    fill = _fastsend.GroupFill(ProducerBatch)
    with pytest.raises(TypeError):
        fill([], 0, {}, "t", 10, 22, [])  # seven arguments
    with pytest.raises(TypeError):
        fill((), 0, {}, "t", 10, 22, [], print, print)  # groups not a list
    with pytest.raises(ValueError):
        fill([], 0, {}, "t", 0, 22, [], print, print)
    with pytest.raises(TypeError):
        _fastsend.GroupFill(object)  # no slots
