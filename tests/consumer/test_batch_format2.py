"""``Consumer.poll_batch`` reads format 2 beside format 1 (docs/design.md §2):
the batch columns carry headers and null values, ``to_arrow()`` has a
``headers`` column and a nullable ``value``; and ``skip_corrupt`` passes over
a damaged format-2 batch and reads the records after it. Real ZooKeeper, Ray,
a partition actor and sockets (the log: tests/format2_log.py)."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest

from format2_log import BATCH_A, BATCH_B, expected, flip_in_batch, mixed_log
from raylog.errors import CorruptMessageError

pytestmark = pytest.mark.timeout(240)


def _batches(consumer, n: int, timeout_s: float = 60.0) -> list:
    got: list = []
    deadline = time.monotonic() + timeout_s
    while sum(len(b) for b in got) < n:
        assert time.monotonic() < deadline, "messages never arrived"
        got += consumer.poll_batch(timeout_ms=200, max_messages=n - sum(len(b) for b in got))
    return got


def test_poll_batch_columns_and_arrow_of_format_1_then_format_2(raylog_client, make_topic):
    topic = make_topic(partitions=1)
    plain, positions = mixed_log(raylog_client, topic)
    want = expected(plain, positions)
    consumer = raylog_client.consumer(topic, auto_offset_reset="earliest")
    try:
        batches = _batches(consumer, len(want))
    finally:
        consumer.close()

    offsets, keys, values, headers = [], [], [], []
    for batch in batches:
        assert len(batch.headers) == len(batch) == len(batch.values) == len(batch.keys)
        offsets += list(batch.offsets)
        keys += [None if k is None else bytes(k) for k in batch.keys]
        values += [None if v is None else bytes(v) for v in batch.values]
        headers += batch.headers
    assert list(zip(offsets, keys, values, headers)) == want
    assert values[PLAIN_TOMBSTONE] is None and values[PLAIN_TOMBSTONE + 1] == b""

    table = pa.Table.from_batches([b.to_arrow() for b in batches])
    assert table.schema.field("value").nullable
    assert table.schema.field("headers").type == pa.list_(
        pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
    rows = table.to_pylist()
    assert [(r["offset"], r["key"], r["value"], [(h["key"], h["value"]) for h in r["headers"]]) for r in rows] == want
    assert rows[0]["headers"] == [] and rows[1]["headers"] == []  # format 1: empty lists
    assert rows[PLAIN_TOMBSTONE]["value"] is None and rows[PLAIN_TOMBSTONE + 1]["value"] == b""
    assert [r["timestamp"] for r in rows[2:]] == [r[3] for r in BATCH_A + BATCH_B]


#: the index of BATCH_A's tombstone among all records (after the format-1 messages)
PLAIN_TOMBSTONE = 3


def test_an_indexed_format_1_batch_has_empty_header_lists(raylog_client, make_topic):
    topic = make_topic(partitions=1)
    producer = raylog_client.producer(acks=1)
    for i in range(5):
        producer.send(topic, b"x%d" % i, key=b"k", partition=0)
    producer.close()
    consumer = raylog_client.consumer(topic, auto_offset_reset="earliest")
    try:
        batches = _batches(consumer, 5)
    finally:
        consumer.close()
    table = pa.Table.from_batches([b.to_arrow() for b in batches])
    assert table.column("headers").to_pylist() == [[]] * 5
    assert table.column("value").to_pylist() == [b"x%d" % i for i in range(5)]
    assert sum(b.headers.count([]) for b in batches) == 5


def test_skip_corrupt_passes_a_damaged_format_2_batch_and_reads_on(raylog_client, make_topic):
    topic = make_topic(partitions=1)
    bad = [(b"d%d" % i, b"damaged-%d" % i, [("x", b"y")], 3000 + i) for i in range(3)]
    plain, positions = mixed_log(raylog_client, topic, batches=(BATCH_A, bad, BATCH_B))
    flip_in_batch(raylog_client, topic, positions[1])
    good = [r for r in expected(plain, positions, (BATCH_A, bad, BATCH_B))
            if not positions[1] <= r[0] < positions[1] + len(bad)]

    consumer = raylog_client.consumer(topic, auto_offset_reset="earliest")
    try:
        got: list = []
        error = None
        deadline = time.monotonic() + 60
        while error is None:
            assert time.monotonic() < deadline, "the damaged batch was never reported"
            try:
                for batch in consumer.poll_batch(timeout_ms=200):
                    got += list(batch)
            except CorruptMessageError as err:
                error = err
        # the records before the damaged batch were all handed out, nothing of it
        assert [(m.offset, m.key, m.value, list(m.headers)) for m in got] == good[: len(plain) + len(BATCH_A)]
        assert error.offset == positions[1]
        skipped = consumer.skip_corrupt()
        assert skipped == {(topic, 0): (positions[1], positions[2])}
        assert consumer.skipped_corrupt  # counted
        deadline = time.monotonic() + 60
        while len(got) < len(good):
            assert time.monotonic() < deadline, "the records after the damaged batch never arrived"
            for batch in consumer.poll_batch(timeout_ms=200):
                got += list(batch)
    finally:
        consumer.close()
    assert [(m.offset, m.key, m.value, list(m.headers)) for m in got] == good



