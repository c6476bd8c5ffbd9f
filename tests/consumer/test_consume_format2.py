"""The consumer reads format 2 (docs/design.md §2) beside format 1: headers,
null values, one offset per record inside a batch, resuming inside a batch.
Real ZooKeeper, Ray, a partition actor and sockets: format-1 messages come
from the producer, format-2 batches through the data channel's PRODUCE (the
partition stores a set as it is sent)."""

from __future__ import annotations

import time

import pytest

from raylog.storage.record_batch import encode_records

pytestmark = pytest.mark.timeout(240)

#: (key, value, headers, timestamp) of the two format-2 batches
BATCH_A = [
    (b"k0", b"v0", [("h", b"1"), ("h", b"2"), ("n", None)], 1000),
    (None, None, None, 1001),  # a tombstone
    (b"k2", b"", [("e", b"")], 1002),  # an empty value, not a tombstone
]
BATCH_B = [(b"k%d" % i, b"b%d" % i, [("i", str(i).encode())], 2000 + i) for i in range(4)]


def _mixed_log(client, topic: str) -> tuple[list[int], list[int]]:
    """Two format-1 messages, then BATCH_A and BATCH_B as format-2 batches;
    the format-1 offsets and the two batches' positions."""
    import ray

    from raylog.transfer.connection import BrokerConnection

    producer = client.producer(acks=1)
    plain = [producer.send(topic, b"plain-%d" % i, partition=0).result()[1] for i in range(2)]
    producer.close()
    host, port = client.metadata.endpoint(topic, 0, refresh=True, wait_s=10.0)
    with BrokerConnection(host, port, token=client.settings.token, timeout_s=10) as conn:
        batches = [conn.produce(topic, 0, encode_records(b)) for b in (BATCH_A, BATCH_B)]
    ray.get(client.partition_actor(topic, 0).flush.remote())
    return plain, batches


def _poll_n(consumer, n: int, timeout_s: float = 60.0) -> list:
    got: list = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n:
        assert time.monotonic() < deadline, f"{n - len(got)} of {n} messages never arrived"
        got += consumer.poll(timeout_ms=200, max_messages=n - len(got))
    return got


def _expected(plain, batches):
    """(offset, key, value, headers, next_offset) of every record in order."""
    out = [(o, None, b"plain-%d" % i, ()) for i, o in enumerate(plain)]
    for p, batch in zip(batches, (BATCH_A, BATCH_B)):
        out += [(p + i, k, v, h or ()) for i, (k, v, h, _ts) in enumerate(batch)]
    return out


def test_format_1_then_format_2_from_the_start_and_from_every_offset_inside(raylog_client, make_topic):
    topic = make_topic(partitions=1)
    plain, batches = _mixed_log(raylog_client, topic)
    want = _expected(plain, batches)
    assert batches[1] > batches[0] > plain[1]

    consumer = raylog_client.consumer(topic, auto_offset_reset="earliest")
    try:
        got = _poll_n(consumer, len(want))
    finally:
        consumer.close()
    assert [(m.offset, m.key, m.value, m.headers) for m in got] == want
    assert got[3].value is None and got[4].value == b""  # a tombstone vs an empty value
    assert got[2].headers == [("h", b"1"), ("h", b"2"), ("n", None)]  # order, duplicates, None
    assert [m.timestamp for m in got[2:]] == [r[3] for r in BATCH_A + BATCH_B]
    # each next_offset is the next record's offset; the last one's the batch's end
    for m, after in zip(got, got[1:]):
        assert m.next_offset == after.offset
    assert got[-1].next_offset > got[-1].offset

    # a seek to every record's offset starts at exactly that record
    consumer = raylog_client.consumer(topic)
    try:
        consumer.assign([(topic, 0)])
        for i, (offset, *_rest) in enumerate(want):
            consumer.seek(topic, 0, offset)
            first = _poll_n(consumer, 1)[0]
            assert (first.offset, first.key, first.value, first.headers) == want[i]
    finally:
        consumer.close()


def test_commit_and_resume_at_every_record_of_a_batch_gives_the_next(raylog_client, make_topic):
    topic = make_topic(partitions=1)
    plain, batches = _mixed_log(raylog_client, topic)
    want = _expected(plain, batches)
    group = "g-format2"
    for i in range(len(want)):
        consumer = raylog_client.consumer(topic, group=group, auto_offset_reset="earliest",
                                          enable_auto_commit=False, session_timeout_ms=3000)
        try:
            m = _poll_n(consumer, 1)[0]
            assert (m.offset, m.key, m.value, m.headers) == want[i], f"resume {i}"
            consumer.commit()
            assert consumer.committed((topic, 0)) == m.next_offset
        finally:
            consumer.close()


def test_poll_batch_gives_format_2_records_their_headers_and_nulls(raylog_client, make_topic):
    topic = make_topic(partitions=1)
    plain, batches = _mixed_log(raylog_client, topic)
    want = _expected(plain, batches)
    consumer = raylog_client.consumer(topic, auto_offset_reset="earliest")
    try:
        got: list = []
        deadline = time.monotonic() + 60
        while len(got) < len(want):
            assert time.monotonic() < deadline
            for batch in consumer.poll_batch(timeout_ms=200, max_messages=len(want) - len(got)):
                got += list(batch)
    finally:
        consumer.close()
    assert [(m.offset, m.key, m.value, m.headers) for m in got] == want
