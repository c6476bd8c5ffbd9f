"""Headers and null values (docs/design.md §2) through raylog's producer,
on real Ray, ZooKeeper and partition actors: kept as sent, in order,
duplicates allowed; a tombstone (None) stays distinct from b""; a bad header
is refused with a typed error and nothing accepted is lost."""

from __future__ import annotations

import time

import pytest

from raylog.errors import ArgumentTypeError
from raylog.storage.record_batch import format_at

#: every test runs with the compiled send and with the reference (conftest.py)
BOTH_SEND_PATHS = True


def _consume(client, topic: str, count: int, timeout_s: float = 30.0) -> list:
    consumer = client.consumer(topic, auto_offset_reset="earliest")
    got: list = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        got.extend(consumer.poll(timeout_ms=500))
    consumer.close()
    return got


@pytest.mark.parametrize("compression", [None, "gzip", "zstd", "lz4"])
def test_headers_and_tombstones_arrive_as_sent(raylog_client, make_topic, compression):
    topic = make_topic(partitions=1)
    producer = raylog_client.producer(acks="all", batch_size=4, linger_ms=5, compression=compression)
    sent = [
        (b"k1", b"v1", [("trace", b"a"), ("trace", b"b"), ("none", None)]),
        (b"k1", None, []),  # a tombstone
        (b"k2", b"", [("only", b"")]),  # an empty value, not a tombstone
        (None, b"v4", [("ünïcode", b"\x00\xff")]),
        (None, None, None),
    ]
    futures = [producer.send(topic, v, k, headers=h) for k, v, h in sent]
    offsets = [f.result(timeout_s=30).offset for f in futures]
    producer.close()
    got = _consume(raylog_client, topic, len(sent))
    assert [(m.key, m.value, list(m.headers)) for m in got] == [(k, v, h or []) for k, v, h in sent]
    assert [m.offset for m in got] == offsets
    # what the partition stores is a record batch (format 2)
    start, _ = raylog_client.offsets(topic, 0)
    host, port = raylog_client.metadata.endpoint(topic, 0, refresh=True)
    from raylog.transfer.connection import BrokerConnection

    with BrokerConnection(host, port, token=raylog_client.settings.token) as conn:
        assert format_at(conn.fetch(topic, 0, start, 1 << 16).data) == 2


def test_a_bad_header_is_refused_typed_and_what_was_accepted_is_delivered(raylog_client, make_topic):
    topic = make_topic(partitions=1)
    producer = raylog_client.producer(acks=1, batch_size=10, linger_ms=5)
    kept = producer.send(topic, b"kept", headers=[("h", b"1")])
    for bad in ([("h", "text")], [(b"bytes-key", b"v")], [("only-a-key",)], "h=v"):
        with pytest.raises(ArgumentTypeError, match="headers"):
            producer.send(topic, b"refused", headers=bad)
    with pytest.raises(ArgumentTypeError, match="tombstone"):
        producer.send(topic, "text")
    after = producer.send(topic, b"after")
    producer.flush()
    producer.close()
    got = _consume(raylog_client, topic, 2)
    assert [(m.value, list(m.headers)) for m in got] == [(b"kept", [("h", b"1")]), (b"after", [])]
    assert [kept.result().offset, after.result().offset] == [m.offset for m in got]
