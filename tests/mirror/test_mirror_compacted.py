"""A mirror of a compacted topic (docs/design.md §3, §6, §9): the source's
cleaner has left gaps in its log; the mirror copies the kept records across
them without failing, the target topic it creates keeps the source's
``cleanup_policy`` (and compaction settings), and the target holds the
latest value of each key that the source holds. Real ZooKeeper, Ray and
partition actors (two clusters on them)."""

from __future__ import annotations

import os
import time

import pytest

pytestmark = pytest.mark.timeout(600)

RECORDS = 20_000
KEYS = 200
DELETED = {b"key-%d" % k for k in range(0, KEYS, 10)}
SETTINGS = dict(cleanup_policy="compact", segment_bytes=64 * 1024, max_message_bytes=32 * 1024,
                retention_check_ms=300, min_cleanable_dirty_ratio=0.01, flush_ms=20)


def _table(client, topic) -> dict:
    rows = client.read_table(topic).take_all()
    return {r["key"]: r["value"] for r in rows}


def _records(client, topic) -> list:
    """(key, value) of every record partition 0 holds, in order (the consumer skips gaps)."""
    consumer = client.consumer(topic, auto_offset_reset="earliest")
    try:
        consumer.assign([(topic, 0)])
        end = client.end_offsets(topic)[0]
        got: list = []
        deadline = time.monotonic() + 120
        while (consumer.position(topic, 0) or 0) < end:
            assert time.monotonic() < deadline, "the consumer did not reach the log end"
            got += consumer.poll(timeout_ms=300)
        return [(m.key, m.value) for m in got]
    finally:
        consumer.close()


def test_a_mirror_of_a_compacted_topic_copies_the_kept_records_across_the_gaps(raylog_client, source):
    topic = f"compacted-{os.getpid()}-{int(time.time())}"
    source.create_topic(topic, partitions=1, **SETTINGS)
    producer = source.producer(acks=1)
    try:
        for i in range(RECORDS):
            producer.send(topic, b"value-%d" % i, key=b"key-%d" % (i % KEYS))
        for key in sorted(DELETED):
            producer.send(topic, None, key=key)
        producer.flush()
    finally:
        producer.close()
    latest = {b"key-%d" % k: b"value-%d" % (RECORDS - KEYS + k) for k in range(KEYS)}
    latest = {k: v for k, v in latest.items() if k not in DELETED}

    directory = source.log_dir(topic, 0)
    deadline = time.monotonic() + 240
    while not any(n.endswith(".index") for n in os.listdir(directory)):
        assert time.monotonic() < deadline, "the source's cleaner did not clean"
        time.sleep(1)
    kept = _records(source, topic)
    assert len(kept) < RECORDS // 2  # the source's log has gaps

    handle = raylog_client.mirror(source_zookeeper=source.settings.zookeeper,
                                  source_cluster=source.settings.cluster, topics=topic,
                                  rename="{source}.{topic}", name=f"compacted-{os.getpid()}", scan_interval_s=2.0)
    copy = f"{source.settings.cluster}.{topic}"
    try:
        deadline = time.monotonic() + 240
        while True:
            if raylog_client.metadata.registry.topic_exists(copy):
                end = raylog_client.end_offsets(copy)[0]
                if end and _table(raylog_client, copy) == latest:
                    break
            assert time.monotonic() < deadline, f"the mirror did not copy the kept records: {handle.status()}"
            time.sleep(2)
        config = raylog_client.metadata.registry.topic_config(copy)
        assert config.cleanup_policy == "compact"
        assert config.min_cleanable_dirty_ratio == SETTINGS["min_cleanable_dirty_ratio"]
        # every kept record of the source, once each, in order (unless the target's cleaner ran meanwhile:
        # then its records are a compacted view of them, each key's latest included)
        copied = _records(raylog_client, copy)
        kept_now = _records(source, topic)
        assert copied == kept_now or (set(copied) <= set(kept) | set(kept_now) and
                                      dict(copied) == dict(kept_now))
        assert _table(raylog_client, copy) == _table(source, topic) == latest
    finally:
        handle.stop()
