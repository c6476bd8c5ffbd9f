"""The accumulator alone (in-memory metadata): when batches seal, and that
opening a batch wakes a sender that would otherwise sleep past its linger."""

from __future__ import annotations

import threading

from raylog.config import TopicConfig
from raylog.producer.accumulator import RecordAccumulator
from raylog.storage.message import HEADER_SIZE
from raylog.producer.batch import BATCH_OVERHEAD
from raylog.storage.record_batch import encode_batch, stamp


class Metadata:
    def __init__(self, partitions=3, max_message_bytes=4096):
        self._partitions, self._max = partitions, max_message_bytes

    def partitions(self, topic):
        return self._partitions

    def config(self, topic):
        return TopicConfig(partitions=self._partitions, max_message_bytes=self._max)


def _acc(**options) -> RecordAccumulator:
    options.setdefault("batch_size", 50)
    options.setdefault("linger_ms", 5)
    return RecordAccumulator(Metadata(), compression=None, max_buffered_messages=10_000, **options)


def _sealed(acc):
    return [b for queue in acc.ready.values() for b in queue]


def test_a_batch_seals_before_its_set_outgrows_max_message_bytes():
    acc = _acc()
    values = [b"v" * 300] * 40
    acc.append_many("t", values, None, 0)
    for v in values:
        acc.append("t", v, partition=1)
    acc.seal_all()
    batches = _sealed(acc)
    assert sum(len(b.values) for b in batches) == 80
    for b in batches:
        # the counted size bounds the record batch's (batchLength: the bytes after its first 12)
        assert len(encode_batch(b.values, b.keys, None, 0)) - 12 <= b.size + BATCH_OVERHEAD <= 4096
    assert max(len(b.values) for b in batches) == (4096 - BATCH_OVERHEAD) // (HEADER_SIZE + 300)


def test_a_batch_seals_at_batch_size_and_keys_group_by_partition():
    acc = _acc(batch_size=4)
    keys = [b"k%d" % (i % 5) for i in range(40)]
    call = acc.append_many("t", [b"x"] * 40, keys, None)
    assert len(call) == 40
    full = _sealed(acc)
    assert full and all(len(b.values) == 4 for b in full)
    from raylog.producer.partitioner import partition_for_key

    for b in full + list(acc.open.values()):
        assert {partition_for_key(k, 3) for k in b.keys} == {b.partition}


def test_opening_a_batch_wakes_a_sender_sleeping_past_its_linger():
    """The sender waits without a deadline when nothing is open; the first
    message of a batch must wake it (or the batch waits until it is full)."""
    acc = _acc()
    woke = threading.Event()
    ready = threading.Event()

    def sender():
        with acc.lock:
            acc.sender_waiting, acc.sender_wakes_at = True, float("inf")
            ready.set()
            acc.wake.wait(30)
            acc.sender_waiting = False
        woke.set()

    thread = threading.Thread(target=sender)
    thread.start()
    ready.wait(10)
    acc.append("t", b"lone")  # keyless, far from a full batch
    assert woke.wait(10), "the sender was not woken by a new batch"
    thread.join(10)
    # and the batch is due linger_ms after it opened
    (batch,) = acc.open.values()
    assert acc.seal_expired(batch.deadline) == float("inf") and _sealed(acc) == [batch]


def test_keyed_calls_join_the_open_batches_in_order_and_report_each_message():
    """Later keyed calls join the partitions' open batches (the fast path);
    every batch keeps the calls' order and each call's future finds its
    own messages."""
    from raylog.producer.partitioner import partition_for_key

    acc = _acc(batch_size=50)
    calls = []
    sent = []
    for c in range(3):
        keys = [b"k%d" % ((c * 7 + i) % 11) for i in range(12)]
        values = [b"c%d-%d" % (c, i) for i in range(12)]
        calls.append((acc.append_many("t", values, keys, None), values, keys))
        sent.extend(zip(values, keys))
    assert not _sealed(acc)  # nothing full: all joined the open batches
    acc.seal_all()
    batches = {b.partition: b for b in _sealed(acc)}
    for p, b in batches.items():
        assert list(zip(b.values, b.keys)) == [(v, k) for v, k in sent if partition_for_key(k, 3) == p]
        b.future.resolve(0)
    for call, values, keys in calls:
        for (p, offset), value, key in zip(call.result(), values, keys):
            batch = batches[p]
            assert p == partition_for_key(key, 3)
            index = batch.values.index(value)
            assert offset == index  # record i of a batch at 0 (docs/design.md §2)


def test_keyless_keyed_and_timestamped_sends_share_the_sticky_batch_in_step():
    """``send``'s keyless fast path joins a sticky batch that keyed or
    timestamped messages made (a None key, the batch's time): keys and
    timestamps stay one per value, and each future finds its own message."""
    from raylog.storage.decoding import decode_messages

    acc = RecordAccumulator(Metadata(partitions=1), batch_size=6, linger_ms=5, compression=None,
                            max_buffered_messages=100)
    sent = [(b"a", None, None), (b"b", b"k", None), (b"c", None, None), (b"d", None, 7), (b"e", None, None),
            (b"f", b"kk", None), (b"g", None, None)]
    futures = [acc.append("t", v, k, None, ts) for v, k, ts in sent]
    acc.seal_all()
    first, second = _sealed(acc)
    created = int(first.created * 1000)
    assert first.values == [v for v, _, _ in sent[:6]] and second.values == [b"g"]
    assert first.keys == [None, b"k", None, None, None, b"kk"] and second.keys is None
    assert first.timestamps == [created, created, created, 7, created, created] and second.timestamps is None
    for b in (first, second):
        b.future.resolve(1000)
    decoded, _ = decode_messages(stamp(encode_batch(first.values, first.keys, None, first.timestamps), 1000), 1000)
    assert [f.result() for f in futures[:6]] == [(0, offset) for offset, *_ in decoded]
    assert [(ts, k, v) for _, ts, k, v in decoded] == [(ts or created, k, v) for v, k, ts in sent[:6]]
    assert futures[6].result() == (0, 1000)


def test_keyless_sends_with_batch_size_1_each_make_a_sealed_set():
    acc = _acc(batch_size=1)
    futures = [acc.append("t", b"v%d" % i) for i in range(3)]
    assert not acc.open and sorted(b.values for b in _sealed(acc)) == [[b"v0"], [b"v1"], [b"v2"]]
    for b in _sealed(acc):
        b.future.resolve(40)
    assert [f.result().offset for f in futures] == [40, 40, 40]


def test_keyed_calls_fill_seal_and_open_batches_without_losing_or_reordering():
    """Keyed calls whose groups exactly fill a batch, overflow it, or find
    no open batch: every message lands once, in call order within its
    partition, no batch holds more than batch_size, buffered counts them
    all, and each call's future finds its own messages."""
    import random

    from raylog.producer.partitioner import partition_for_key

    rng = random.Random(5)
    acc = _acc(batch_size=6)
    calls, sent = [], []
    for c in range(40):
        n = rng.choice([1, 3, 6, 7, 12, 20])
        keys = [b"k%d" % rng.randrange(9) for _ in range(n)]
        values = [b"c%d-%d" % (c, i) for i in range(n)]
        calls.append((acc.append_many("t", values, keys, None), values, keys))
        sent.extend(zip(values, keys))
    assert acc.buffered == len(sent)
    sealed_early = _sealed(acc)
    assert sealed_early and all(len(b) == 6 for b in sealed_early)
    acc.seal_all()
    batches = _sealed(acc)
    assert all(1 <= len(b) <= 6 and len(b.keys) == len(b.values) for b in batches)
    where = {}
    for p in range(3):
        mine = [b for b in batches if b.partition == p]
        got = [(v, k) for b in mine for v, k in zip(b.values, b.keys)]
        assert got == [(v, k) for v, k in sent if partition_for_key(k, 3) == p]
        base = 1000 * p
        for b in mine:
            b.future.resolve(base)
            offset = base
            for v, k in zip(b.values, b.keys):
                where[v] = (p, offset)
                offset += 1  # record i of a batch at base has offset base + i
            base += 1000 // 3
    for call, values, _ in calls:
        assert call.result() == [where[v] for v in values]
