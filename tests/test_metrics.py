"""Metrics: the partition actor's counters and gauges, Ray's Prometheus
export of them, and consumer-group lag."""

from __future__ import annotations

import time
import urllib.request

import pytest

from raylog import ConfigError, UnknownGroupError

#: bound on waits for a flush or an export; generous for a loaded machine
DEADLINE_S = 120.0


def _produce(client, topic: str, count: int, size: int = 100) -> None:
    producer = client.producer(batch_size=10, linger_ms=1, acks=1)
    for i in range(count):
        producer.send(topic, f"{i:0{size}d}".encode())
    producer.flush()
    producer.close()


def _wait_flushed(actor, ray) -> tuple[int, int]:
    """Wait until the partition's timer flushed everything appended."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        stats = ray.get(actor.stats.remote())
        if stats["high_watermark"] == stats["log_end_offset"] or time.monotonic() > deadline:
            return stats["high_watermark"], stats["log_end_offset"]
        time.sleep(0.05)


def _consume_all(client, topic: str, count: int, **options) -> list:
    consumer = client.consumer(topic, auto_offset_reset="earliest", **options)
    got = []
    deadline = time.monotonic() + DEADLINE_S
    try:
        while len(got) < count and time.monotonic() < deadline:
            got.extend(consumer.poll(timeout_ms=500, max_messages=count - len(got)))
        if options.get("group"):
            consumer.commit()
    finally:
        consumer.close()
    return got


def test_partition_metrics_follow_produce_flush_and_fetch(raylog_client, make_topic, ray_local):
    ray = ray_local
    topic = make_topic(partitions=1)
    actor = raylog_client.partition_actor(topic, 0)
    before = ray.get(actor.metrics.remote())
    assert before["tags"] == {"cluster": raylog_client.settings.cluster, "topic": topic, "partition": "0"}
    assert before["bytes_in_total"] == 0 and before["high_watermark"] == 0

    _produce(raylog_client, topic, 200)
    high_watermark, end = _wait_flushed(actor, ray)
    assert high_watermark == end > 0

    after = ray.get(actor.metrics.remote())
    assert after["bytes_in_total"] == end  # every appended byte, counted once
    assert after["message_sets_in_total"] >= 1
    assert after["messages_in_total"] == 200  # every message, counted once
    assert after["high_watermark"] == high_watermark
    assert after["log_size_bytes"] == end
    assert after["log_start_offset"] == 0 and after["segments"] == 1
    assert after["flushes_timed"] >= 1  # flushed (the producer's flush asks for it at once), and timed
    assert 0 < after["flush_latency_ms_max"] <= after["flush_latency_ms_sum"]
    assert after["recovery_truncated_bytes"] == 0

    assert len(_consume_all(raylog_client, topic, 200)) == 200
    # The server counts a reply once sendfile returns, which may be just
    # after the consumer has it: wait for the count (bounded).
    deadline = time.monotonic() + DEADLINE_S
    while True:
        fetched = ray.get(actor.metrics.remote())
        if fetched["bytes_out_total"] >= after["bytes_out_total"] + end or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert fetched["bytes_out_total"] >= after["bytes_out_total"] + end  # the log data went out
    assert fetched["bytes_in_total"] == end  # reading adds nothing in


def _scrape(ray) -> str:
    node = ray._private.worker.global_worker.node
    url = f"http://{node.node_ip_address}:{node.metrics_export_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as reply:
        return reply.read().decode()


def test_partition_gauges_reach_the_prometheus_export(raylog_client, make_topic, ray_local):
    ray = ray_local
    topic = make_topic(partitions=1)
    _produce(raylog_client, topic, 20)
    high_watermark, _ = _wait_flushed(raylog_client.partition_actor(topic, 0), ray)

    # Ray's metrics agent exports every few seconds; wait for our series.
    wanted = f'topic="{topic}"'
    deadline = time.monotonic() + DEADLINE_S
    lines: list[str] = []
    while time.monotonic() < deadline:
        lines = [
            line
            for line in _scrape(ray).splitlines()
            if line.startswith("ray_raylog_partition_high_watermark{") and wanted in line
        ]
        if lines and float(lines[0].rsplit(" ", 1)[1]) == high_watermark:
            break
        time.sleep(1.0)
    assert lines, "no raylog_partition_high_watermark series for the topic in Ray's export"
    assert float(lines[0].rsplit(" ", 1)[1]) == high_watermark
    assert f'cluster="{raylog_client.settings.cluster}"' in lines[0] and 'partition="0"' in lines[0]


def test_record_group_lag_sets_lag_per_partition(raylog_client, make_topic, ray_local):
    from raylog.metrics import record_group_lag

    topic = make_topic(partitions=1)
    _produce(raylog_client, topic, 10)
    actor = raylog_client.partition_actor(topic, 0)
    end, _ = _wait_flushed(actor, ray_local)

    group = f"g-{topic}"
    got = _consume_all(raylog_client, topic, 4, group=group, enable_auto_commit=False)
    assert len(got) == 4
    committed = got[-1].offset + (got[1].offset - got[0].offset)  # equal-sized messages

    assert record_group_lag(raylog_client, group) == {(topic, 0): end - committed}


def test_record_group_lag_of_an_unknown_group_fails_clearly(raylog_client, ray_local):
    from raylog.metrics import record_group_lag

    with pytest.raises(UnknownGroupError, match="no members and no committed offsets"):
        record_group_lag(raylog_client, "no-such-group")


def test_record_group_lag_needs_ray(raylog_client, monkeypatch, ray_local):
    from raylog.metrics import record_group_lag

    monkeypatch.setattr(ray_local, "is_initialized", lambda: False)
    with pytest.raises(ConfigError, match="needs a Ray connection"):
        record_group_lag(raylog_client, "any")
