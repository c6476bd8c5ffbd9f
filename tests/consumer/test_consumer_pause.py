"""``Consumer.pause`` / ``resume`` / ``paused`` (Kafka's): a paused partition
is not fetched and none of its messages are handed out; its position stays;
a seek moves it and leaves it paused; resume reads on from the position,
nothing lost or repeated. Real ZooKeeper, Ray, partition actors and sockets."""

from __future__ import annotations

import time

import pytest

from raylog.errors import ConfigError


def _send(client, topic: str, values_by_partition: dict[int, list[bytes]]) -> dict[int, list[int]]:
    import ray

    producer = client.producer(acks=1)
    futures = {p: [producer.send(topic, v, partition=p) for v in vs] for p, vs in values_by_partition.items()}
    producer.flush()
    producer.close()
    for p in values_by_partition:
        ray.get(client.partition_actor(topic, p).flush.remote())
    return {p: [f.result()[1] for f in fs] for p, fs in futures.items()}


def _poll_for(consumer, seconds: float) -> list:
    got, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        got += consumer.poll(timeout_ms=200)
    return got


def _poll_n(consumer, n: int, timeout_s: float = 60.0) -> list:
    got, deadline = [], time.monotonic() + timeout_s
    while len(got) < n:
        assert time.monotonic() < deadline, f"{n - len(got)} of {n} messages never arrived"
        got += consumer.poll(timeout_ms=200, max_messages=n - len(got))
    return got


def test_a_paused_partition_is_not_read_until_resumed_and_nothing_is_lost_or_repeated(raylog_client, make_topic):
    topic = make_topic(partitions=2)
    first = _send(raylog_client, topic, {0: [b"a0-%d" % i for i in range(10)], 1: [b"a1-%d" % i for i in range(10)]})
    consumer = raylog_client.consumer(topic, auto_offset_reset="earliest")
    try:
        consumer.assign([(topic, 0), (topic, 1)])
        got = _poll_n(consumer, 5)  # some of the first messages, of one partition or both
        consumer.pause([(topic, 1)])
        assert consumer.paused() == {(topic, 1)}
        position_1 = consumer.position(topic, 1)
        _send(raylog_client, topic, {0: [b"b0-%d" % i for i in range(10)], 1: [b"b1-%d" % i for i in range(10)]})
        while_paused = _poll_for(consumer, 3.0)
        assert while_paused and all(m.partition == 0 for m in while_paused), [m.value for m in while_paused]
        assert consumer.position(topic, 1) == position_1
        consumer.resume([(topic, 1)])
        assert consumer.paused() == frozenset()
        got += while_paused
        read_1 = sum(1 for m in got if m.partition == 1)
        got += _poll_n(consumer, 40 - len(got))
        by_partition = {p: [m.value for m in got if m.partition == p] for p in (0, 1)}
        assert by_partition[1] == [b"a1-%d" % i for i in range(10)] + [b"b1-%d" % i for i in range(10)], read_1
        assert by_partition[0] == [b"a0-%d" % i for i in range(10)] + [b"b0-%d" % i for i in range(10)]
        assert [m.offset for m in got if m.partition == 1][:10] == first[1]
    finally:
        consumer.close()


def test_a_seek_moves_a_paused_partition_and_leaves_it_paused(raylog_client, make_topic):
    topic = make_topic(partitions=1)
    offsets = _send(raylog_client, topic, {0: [b"m-%d" % i for i in range(20)]})[0]
    consumer = raylog_client.consumer(topic, auto_offset_reset="earliest")
    try:
        consumer.assign([(topic, 0)])
        consumer.pause([(topic, 0)])
        consumer.seek(topic, 0, offsets[15])
        assert consumer.paused() == {(topic, 0)} and consumer.position(topic, 0) == offsets[15]
        assert _poll_for(consumer, 2.0) == []
        consumer.resume([(topic, 0)])
        assert [m.value for m in _poll_n(consumer, 5)] == [b"m-%d" % i for i in range(15, 20)]
    finally:
        consumer.close()


def test_pausing_a_partition_not_assigned_is_refused_and_pauses_nothing(raylog_client, make_topic):
    topic = make_topic(partitions=2)
    consumer = raylog_client.consumer(topic, auto_offset_reset="earliest")
    try:
        consumer.assign([(topic, 0)])
        with pytest.raises(ConfigError, match=rf"cannot pause {topic}-1: not assigned"):
            consumer.pause([(topic, 0), (topic, 1)])
        assert consumer.paused() == frozenset()
        with pytest.raises(ConfigError, match="cannot resume"):
            consumer.resume([(topic, 1)])
    finally:
        consumer.close()
