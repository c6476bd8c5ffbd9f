"""The batch path: ``poll_batch`` hands out views of fetched sets that hold
exactly what ``poll`` would have handed out (offsets, timestamps, keys,
values, next offsets), compiled or not, plain or compressed; a bad message
is raised as ``poll`` raises it, with the messages before it delivered."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raylog.consumer.batch import MessageBatch, fetched_batch
from raylog.consumer.fetcher import decode_fetched
from raylog.errors import CorruptMessageError
from raylog.storage import message as message_module
from raylog.storage.message import encode_message_set

TP = ("t", 3)


def _as_messages(records) -> list:
    return list(records) if not isinstance(records, MessageBatch) else [records[i] for i in range(len(records))]


@pytest.fixture(params=["c", "python"])
def impl(request, monkeypatch):
    from raylog.storage import _speedups

    monkeypatch.setattr(message_module, "_speedups", _speedups if request.param == "c" else None)
    return request.param


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.binary(max_size=80), st.one_of(st.none(), st.binary(max_size=10))), min_size=1, max_size=30),
    st.sampled_from([None, "zstd"]),
    st.integers(min_value=0, max_value=40),
)
def test_a_batch_holds_what_the_decoder_gives(msgs, compression, cut):
    from raylog.storage import _speedups

    values = [v for v, _ in msgs]
    keys = [k for _, k in msgs]
    data = encode_message_set(values, keys, 1234, compression)
    data = data[: len(data) - cut] if cut < len(data) - 22 else data  # a fetch cut mid-message
    for fast in (_speedups, None):
        saved = message_module._speedups
        message_module._speedups = fast
        try:
            want, used = decode_fetched(data, 500, TP, 1 << 20, 1 << 24)
            got, got_used = fetched_batch(data, 500, TP, 1 << 20, 1 << 24)
        finally:
            message_module._speedups = saved
        assert got_used == used
        assert _as_messages(got) == list(want)
        assert [m.next_offset for m in _as_messages(got)] == [m.next_offset for m in want]
        if isinstance(got, MessageBatch):
            assert got.next_offset == 500 + used
            assert list(got.offsets) == [m.offset for m in want]
            assert list(got.timestamps) == [m.timestamp for m in want]
            assert [bytes(v) for v in got.values] == [m.value for m in want]
            assert [None if k is None else bytes(k) for k in got.keys] == [m.key for m in want]
            half = len(got) // 2
            if half:
                assert _as_messages(got[half:]) == list(want)[half:]
                assert got[:half].next_offset == want[half].offset


def test_a_corrupt_message_raises_as_the_decoder_does(impl):
    data = bytearray(encode_message_set([b"a" * 50] * 10, None, 1))
    data[5 * 72 + 30] ^= 1
    with pytest.raises(CorruptMessageError) as fast:
        fetched_batch(bytes(data), 0, TP, 1 << 20, 1 << 24)
    with pytest.raises(CorruptMessageError) as ref:
        decode_fetched(bytes(data), 0, TP, 1 << 20, 1 << 24)
    assert str(fast.value) == str(ref.value)


@pytest.mark.parametrize("impl", ["c", "python"], indirect=True)
def test_to_arrow_has_the_columns(impl):
    pytest.importorskip("pyarrow")
    data = encode_message_set([b"v1", b"v2"], [b"k", None], [5, 6])
    batch, _ = fetched_batch(data, 0, TP, 1 << 20, 1 << 24)
    if not isinstance(batch, MessageBatch):  # without the compiled index: decoded messages
        batch = MessageBatch.of_records(batch)
    table = batch.to_arrow()
    assert table.column_names == ["offset", "timestamp", "key", "value", "headers"]
    assert table.column("headers").to_pylist() == [[], []]  # format 1 has none
    assert table.column("value").to_pylist() == [b"v1", b"v2"]
    assert table.column("key").to_pylist() == [b"k", None]
    assert table.column("timestamp").to_pylist() == [5, 6]


def test_poll_batch_and_poll_read_the_same_feed_and_commit_alike(raylog_client, make_topic):
    topic = make_topic(partitions=2)
    producer = raylog_client.producer(acks="all", batch_size=50)
    sent = [b"m-%d" % i for i in range(2000)]
    producer.send_many(topic, sent, [b"k%d" % (i % 5) for i in range(2000)])
    producer.send_many(topic, [b"z-%d" % i for i in range(100)], partition=0)
    producer.flush()
    producer.close()
    sent += [b"z-%d" % i for i in range(100)]
    consumer = raylog_client.consumer(topic, group="batches", auto_offset_reset="earliest")
    got = []
    first = consumer.poll(timeout_ms=5000, max_messages=7)  # poll and poll_batch mix on one consumer
    got.extend(m.value for m in first)
    rounds = 0
    while len(got) < len(sent):
        rounds += 1
        assert rounds < 200, f"{len(got)} of {len(sent)} arrived"
        batches = consumer.poll_batch(timeout_ms=2000, max_messages=300)
        assert sum(map(len, batches)) <= 300
        for b in batches:
            assert isinstance(b, MessageBatch) and b.topic == topic
            got.extend(bytes(v) for v in b.values)
    assert sorted(got) == sorted(sent)  # each exactly once
    positions = {p: consumer.position(topic, p) for p in range(2)}
    assert positions == {p: raylog_client.offsets(topic, p)[1] for p in range(2)}
    consumer.commit()
    consumer.close()


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.binary(max_size=60), st.one_of(st.none(), st.binary(max_size=8))), min_size=1, max_size=25),
    st.integers(min_value=0, max_value=24),
    st.integers(min_value=1, max_value=25),
)
def test_stored_bytes_are_the_set_that_encoding_the_messages_gives(msgs, start, stop):
    """What a mirror sends on as it is: the stored bytes of any run of an
    indexed batch equal those messages encoded again, uncompressed."""
    start, stop = min(start, len(msgs) - 1), min(max(stop, start + 1), len(msgs))
    values, keys = [v for v, _ in msgs], [k for _, k in msgs]
    stamps = list(range(5000, 5000 + len(msgs)))
    data = encode_message_set(values, keys, stamps, None)
    batch, used = fetched_batch(data, 9_000, TP, 1 << 20, 1 << 24)
    assert batch.indexed and batch.records is None and used == len(data)
    run = batch[start:] if start else batch
    want = encode_message_set(values[start:stop], keys[start:stop], stamps[start:stop], None)
    assert bytes(run.stored_bytes(stop - start)) == want


def test_a_decoded_batch_has_no_stored_bytes():
    data = encode_message_set([b"a", b"b"], [None, None], [1, 2], "gzip")
    records, _ = fetched_batch(data, 0, TP, 1 << 20, 1 << 24)
    batch = MessageBatch.of_records(records)  # as poll_batch hands decoded messages out
    assert not batch.indexed and [m.value for m in batch.records] == [b"a", b"b"]
    with pytest.raises(ValueError, match="no stored bytes"):
        batch.stored_bytes()


def test_poll_batch_splits_compressed_sets_only_between_wrappers(raylog_client, make_topic):
    """A fetch of compressed sets handed out in parts (max_messages is
    smaller than what was fetched) is split where a wrapper starts, so that
    every part keeps its stored bytes (what a mirror sends on as it came);
    and a part never holds more than max_messages."""
    topic = make_topic()
    consumer = raylog_client.consumer(topic, auto_offset_reset="earliest")
    # (fetches decoded after the first poll_batch keep their bytes; it comes before the data here)
    assert consumer.poll_batch(timeout_ms=100) == []
    producer = raylog_client.producer(acks="all", compression="zstd")
    for i in range(1000):
        producer.send(topic, b"w-%d" % i, partition=0)
        if i % 50 == 49:
            producer.flush()  # a wrapper of 50
    producer.close()
    try:
        handed, stored = [], 0
        while (consumer.position(topic, 0) or 0) < raylog_client.end_offsets(topic)[0]:
            for batch in consumer.poll_batch(timeout_ms=2000, max_messages=120):
                assert len(batch) <= 120 and batch.has_stored_bytes
                handed.append(len(batch))
                stored += len(batch.stored_bytes())
        assert sum(handed) == 1000 and stored == raylog_client.end_offsets(topic)[0]
        assert max(handed) <= 120 and len(handed) > 1000 // 120
    finally:
        consumer.close()
