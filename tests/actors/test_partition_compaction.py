"""A compacted topic end to end (docs/design.md §3 and §6): a partition
actor on real Ray and ZooKeeper runs its cleaner, and raylog's consumer,
reading from the log start, gets exactly the latest value of each key (the
acceptance's 1 M records over 10 k keys, scaled down to 100 k over 1 k;
bench/compaction.py runs the full size)."""

from __future__ import annotations

import os
import time

import pytest

pytestmark = pytest.mark.timeout(600)

RECORDS = 100_000
KEYS = 1_000


def _log_dir(data_dir: str, topic: str) -> str:
    for root, dirs, _files in os.walk(data_dir):
        if f"{topic}-0" in dirs:
            return os.path.join(root, f"{topic}-0")
    raise AssertionError(f"no log directory of {topic} under {data_dir}")


def test_a_consumer_from_the_start_reads_exactly_the_latest_value_of_each_key(raylog_client, make_topic):
    topic = make_topic(partitions=1, cleanup_policy="compact", segment_bytes=256 * 1024, max_message_bytes=128 * 1024, retention_check_ms=300,
                       min_cleanable_dirty_ratio=0.01, flush_ms=20)
    producer = raylog_client.producer(acks=1)
    try:
        for i in range(RECORDS):
            producer.send(topic, b"value-%d" % i, key=b"key-%d" % (i % KEYS), partition=0)
        producer.flush()
    finally:
        producer.close()
    # the last record of each key lies in the active segment, which is never cleaned; a last
    # small round rolls them out of it (the segment fills), so that the cleaner reaches them
    latest = {b"key-%d" % k: b"value-%d" % (RECORDS - KEYS + k) for k in range(KEYS)}
    directory = _log_dir(raylog_client.data_dir, topic)

    deadline = time.monotonic() + 240
    while True:
        cleaned = [n for n in os.listdir(directory) if n.endswith(".index")]
        records = _read_all(raylog_client, topic)
        table = {}
        for message in records:
            table[message.key] = message.value
        offsets = [m.offset for m in records]
        assert offsets == sorted(set(offsets))  # offsets only grow
        assert table == latest  # every key's latest value, at every moment, cleaned or not
        if cleaned and len(records) <= RECORDS // 4:
            break
        assert time.monotonic() < deadline, f"the cleaner did not clean ({len(records)} records, {cleaned})"
        time.sleep(2)
    # the closed segments hold each key once at most: what a reader gets is the active
    # segment's records and one record a key before it
    assert len(records) < RECORDS // 4


def _read_all(client, topic):
    consumer = client.consumer(topic, auto_offset_reset="earliest")
    got = []
    try:
        end = client.end_offsets(topic)[0]
        deadline = time.monotonic() + 120
        while True:
            batch = consumer.poll(timeout_ms=500)
            got += batch
            if got and got[-1].next_offset >= end and not batch:
                return got
            assert time.monotonic() < deadline, "the consumer did not reach the log end"
    finally:
        consumer.close()
