"""A consumer group moved from the source to the mirror at translated
offsets reads the rest exactly once (raylog.mirror.translate)."""

from __future__ import annotations

import uuid

from raylog.mirror.translate import translate_group
from raylog.testing.clusters import wait_until


def _produce(client, topic, values):
    producer = client.producer(acks="all")
    for v in values:
        producer.send(topic, v)
    producer.flush()
    producer.close()


def _caught_up(handle) -> bool:
    rows = handle.status()["partitions"]
    return bool(rows) and all(r["lag_bytes"] == 0 for r in rows)


def test_a_moved_group_reads_the_rest_exactly_once(raylog_client, source):
    target = raylog_client
    tag = uuid.uuid4().hex[:6]
    topic, group = f"tr-{tag}", f"g-{tag}"
    source.create_topic(topic)
    _produce(source, topic, [f"old{i}".encode() for i in range(100)])
    handle = target.mirror(source_zookeeper=source.settings.zookeeper, source_cluster=source.settings.cluster,
                           topics=topic, rename="{source}.{topic}", name=f"t-{tag}", checkpoint_interval_s=0.0)
    try:
        assert wait_until(lambda: _caught_up(handle), timeout_s=90, interval_s=0.5), handle.status()
        # the group reads the first 100 on the source and commits
        consumer = source.consumer(topic, group=group, auto_offset_reset="earliest", enable_auto_commit=False)
        read = []
        assert wait_until(lambda: read.extend(consumer.poll(timeout_ms=300, max_messages=100 - len(read)))
                          or len(read) == 100, timeout_s=60)
        consumer.commit()
        consumer.close()
        _produce(source, topic, [f"new{i}".encode() for i in range(50)])
        assert wait_until(lambda: _caught_up(handle), timeout_s=90, interval_s=0.5), handle.status()
    finally:
        handle.stop()
    dst = f"{source.settings.cluster}.{topic}"
    rows = translate_group(target, group, f"t-{tag}")
    assert [(r["topic"], r["target_topic"]) for r in rows] == [(topic, dst)]
    moved = target.consumer(dst, group=group, auto_offset_reset="earliest")
    got = []
    end = target.end_offsets(dst)[0]
    try:
        assert wait_until(lambda: got.extend(m.value for m in moved.poll(timeout_ms=300))
                          or (moved.position(dst, 0) or 0) >= end, timeout_s=60)
    finally:
        moved.close()
    assert got == [f"new{i}".encode() for i in range(50)]
