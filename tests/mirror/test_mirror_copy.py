"""One mirror for the module: it copies existing and new topics, exactly once
in order per partition through kills of its actors, and a consumer group
moved to it at translated offsets reads the rest exactly once
(docs/design.md section 9)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
import ray

from raylog.mirror import spec as specs
from raylog.mirror.translate import translate_group
from raylog.testing.clusters import wait_until
from raylog.testing.faults import actor_pid, resume_process, stop_process


def _read_all(client, topic: str, partitions: int) -> dict[int, list[bytes]]:
    """Every message of every partition, in order (a group-less consumer up to the end offsets)."""
    ends = client.end_offsets(topic)
    out = {p: [] for p in range(partitions)}
    consumer = client.consumer(topic, auto_offset_reset="earliest")
    try:
        deadline = time.monotonic() + 60
        while any((consumer.position(topic, p) or 0) < ends[p] for p in range(partitions)):
            assert time.monotonic() < deadline, "could not read the topic to its end"
            for m in consumer.poll(timeout_ms=300):
                out[m.partition].append(m.value)
    finally:
        consumer.close()
    return out


def _produce(client, topic, values, key=None, partition=None, compression=None):
    producer = client.producer(linger_ms=2, acks="all", compression=compression)
    try:
        for v in values:
            producer.send(topic, v, key=key, partition=partition)
        producer.flush()
    finally:
        producer.close()


TAG = uuid.uuid4().hex[:6]
NAME = f"m-{TAG}"


@pytest.fixture(scope="module")
def mirror(raylog_client, source):
    """One mirror for the module: source topics ``logs-<TAG>-*``, renamed
    ``<source>.<topic>``, two members, a scan every 2 s and a checkpoint
    after every set (so that offset translation is exact in the test)."""
    old = f"logs-{TAG}-a"
    source.create_topic(old, partitions=2, retention_ms=3_600_000)
    source.create_topic(f"other-{TAG}", partitions=1)
    _produce(source, old, [f"a{i}".encode() for i in range(300)])
    handle = raylog_client.mirror(
        source_zookeeper=source.settings.zookeeper, source_cluster=source.settings.cluster,
        topics=f"logs-{TAG}-.*", rename="{source}.{topic}", members=2, name=NAME,
        scan_interval_s=2.0, checkpoint_interval_s=0.0)
    try:
        yield handle
    finally:
        handle.stop()


def test_copies_existing_and_new_topics_with_rename(raylog_client, source, mirror):
    target, handle, tag = raylog_client, mirror, TAG
    old = f"logs-{tag}-a"
    dst_old = f"{source.settings.cluster}.{old}"
    cfg = target.registry.topic_config(dst_old)
    assert cfg.partitions == 2 and cfg.retention_ms == 3_600_000
    assert not target.registry.topic_exists(f"{source.settings.cluster}.other-{tag}")
    new = f"logs-{tag}-b"
    source.create_topic(new, partitions=3)
    _produce(source, new, [f"b{i}".encode() for i in range(200)])
    _produce(source, old, [f"c{i}".encode() for i in range(100)])
    dst_new = f"{source.settings.cluster}.{new}"
    for src_topic, dst_topic, parts in ((old, dst_old, 2), (new, dst_new, 3)):
        assert wait_until(lambda: target.registry.topic_exists(dst_topic), timeout_s=90, interval_s=0.5)
        want = _read_all(source, src_topic, parts)

        def done():
            return _read_all(target, dst_topic, parts) == want
        assert wait_until(done, timeout_s=120, interval_s=1.0), (src_topic, handle.status())
    rows = [r for r in handle.status()["partitions"] if r["topic"] in (old, new)]
    assert {(r["topic"], r["partition"]) for r in rows} == {(old, 0), (old, 1), (new, 0), (new, 1), (new, 2)}
    assert all(r["lag_bytes"] == 0 and r["lag_s"] == 0.0 for r in rows), rows


def test_kills_under_a_running_producer_store_each_message_once_in_order(raylog_client, source, mirror):
    target, handle, name = raylog_client, mirror, NAME
    topic = f"logs-{TAG}-kill"
    dst = f"{source.settings.cluster}.{topic}"
    parts = 2
    source.create_topic(topic, partitions=parts)
    assert wait_until(lambda: target.registry.topic_exists(dst), timeout_s=90, interval_s=0.5)
    stop = threading.Event()

    def produce():
        producer = source.producer(linger_ms=1)
        i = 0
        try:
            while not stop.is_set():
                producer.send(topic, f"v{i}".encode(), key=f"k{i % 7}".encode())
                i += 1
                if i % 50 == 0:
                    producer.flush()
                    time.sleep(0.05)
        finally:
            producer.flush()
            producer.close()

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    try:
        cluster = target.settings.cluster
        for round_ in range(4):
            time.sleep(2.0)
            victim = ray.get_actor(specs.member_name(cluster, name, round_ % 2), namespace=specs.NAMESPACE)
            ray.kill(victim, no_restart=False)  # Ray starts it again; it resumes from its progress records
        stop.set()
        thread.join(timeout=60)
        want = _read_all(source, topic, parts)
        assert sum(map(len, want.values())) > 100

        def done():
            return sum(map(len, _read_all(target, dst, parts).values())) >= sum(map(len, want.values()))
        assert wait_until(done, timeout_s=150, interval_s=1.0), handle.status()
        time.sleep(2.0)  # anything stored twice would show up by now
        assert _read_all(target, dst, parts) == want
    finally:
        stop.set()


def test_a_frozen_target_partition_holds_back_its_own_copy_only(raylog_client, source, mirror):
    """A target partition that does not answer (its process stopped) stalls
    the copy of that partition alone: the member that copies it copies its
    other partitions meanwhile (each copier sends on a thread of its own),
    and once it answers again everything is there exactly once, in order."""
    target = raylog_client
    topic = f"logs-{TAG}-frozen"
    dst = f"{source.settings.cluster}.{topic}"
    parts = 4  # two members: each copies two partitions or more
    source.create_topic(topic, partitions=parts)
    assert wait_until(lambda: target.registry.topic_exists(dst), timeout_s=90, interval_s=0.5)
    for p in range(parts):
        _produce(source, topic, [f"x{p}-{i}".encode() for i in range(20)], partition=p)
    assert wait_until(lambda: all(len(v) == 20 for v in _read_all(target, dst, parts).values()),
                      timeout_s=90, interval_s=0.5), mirror.status()
    pid = actor_pid(target.partition_actor(dst, 0))
    stop_process(pid)
    try:
        for p in range(parts):
            _produce(source, topic, [f"y{p}-{i}".encode() for i in range(30)], partition=p)
        # well inside the copier's 120 s of retries against the frozen partition
        others = lambda: all(target.count_messages(dst, p, 0) == 50 for p in range(1, parts))  # noqa: E731
        assert wait_until(others, timeout_s=40, interval_s=0.5), mirror.status()
    finally:
        resume_process(pid)
    want = _read_all(source, topic, parts)
    assert wait_until(lambda: _read_all(target, dst, parts) == want, timeout_s=150, interval_s=1.0), mirror.status()


def _caught_up(handle, topic) -> bool:
    rows = [r for r in handle.status()["partitions"] if r["topic"] == topic]
    return bool(rows) and all(r["lag_bytes"] == 0 for r in rows)


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_a_group_moved_at_translated_offsets_reads_the_rest_exactly_once(raylog_client, source, mirror, compression):
    """With a compressed source the records reach the target as uncompressed
    record batches (raylog.mirror.copier: each set one batch built from its
    records), and offsets still translate."""
    target, handle = raylog_client, mirror
    topic, group = f"logs-{TAG}-tr-{compression}", f"g-{TAG}-{compression}"
    dst = f"{source.settings.cluster}.{topic}"
    source.create_topic(topic)
    assert wait_until(lambda: target.registry.topic_exists(dst), timeout_s=90, interval_s=0.5)
    _produce(source, topic, [f"old{i}".encode().ljust(200, b".") for i in range(100)], compression=compression)
    assert wait_until(lambda: _caught_up(handle, topic), timeout_s=90, interval_s=0.5), handle.status()
    if compression:
        assert source.end_offsets(topic)[0] < 100 * 222 // 4 < 100 * 200 < target.end_offsets(dst)[0]
    # the group reads the first 100 on the source and commits
    consumer = source.consumer(topic, group=group, auto_offset_reset="earliest", enable_auto_commit=False)
    read = []
    assert wait_until(lambda: read.extend(consumer.poll(timeout_ms=300, max_messages=100 - len(read)))
                      or len(read) == 100, timeout_s=60)
    consumer.commit()
    consumer.close()
    _produce(source, topic, [f"new{i}".encode() for i in range(50)], compression=compression)
    assert wait_until(lambda: _caught_up(handle, topic), timeout_s=90, interval_s=0.5), handle.status()
    rows = translate_group(target, group, NAME)
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
