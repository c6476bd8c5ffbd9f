"""Kafka commits land where raylog's groups keep offsets: a Kafka consumer
commits and another resumes there; raylog sees the same offsets; a commit
into a group of live raylog consumers is refused."""

from __future__ import annotations

import time
import uuid

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")

WAIT_S = 60.0


def _consume(consumer, count: int) -> list:
    got = []
    deadline = time.monotonic() + WAIT_S
    while len(got) < count and time.monotonic() < deadline:
        msg = consumer.poll(1.0)
        if msg is None:
            continue
        assert msg.error() is None, msg.error()
        got.append(msg)
    return got


def test_commit_and_resume_through_raylog_group_offsets(raylog_client, kafka_config):
    topic = f"k-{uuid.uuid4().hex[:12]}"
    raylog_client.create_topic(topic)
    values = [f"r{i}".encode() for i in range(40)]
    with raylog_client.producer(compression="zstd", batch_size=7) as producer:
        for value in values:
            producer.send(topic, value, partition=0)
        producer.flush(WAIT_S)
    group = f"kg-{uuid.uuid4().hex[:8]}"
    settings = {**kafka_config, "group.id": group, "enable.auto.commit": False}

    first = confluent_kafka.Consumer(settings)
    first.assign([confluent_kafka.TopicPartition(topic, 0, confluent_kafka.OFFSET_BEGINNING)])
    got = _consume(first, 15)
    assert [m.value() for m in got] == values[:15]
    next_offset = got[-1].offset() + 1  # inside a zstd wrapper: a record offset
    first.commit(offsets=[confluent_kafka.TopicPartition(topic, 0, next_offset)], asynchronous=False)
    first.close()

    # raylog keeps it where its groups keep offsets
    from raylog.groups.offsets import OffsetStore

    assert OffsetStore(raylog_client._zk, raylog_client.settings.cluster).committed(group, topic, 0) == next_offset

    # a second Kafka consumer of the group resumes there (OffsetFetch, then a fetch inside the wrapper)
    second = confluent_kafka.Consumer(settings)
    second.assign([confluent_kafka.TopicPartition(topic, 0, confluent_kafka.OFFSET_STORED)])
    assert [m.value() for m in _consume(second, 25)] == values[15:]
    committed = second.committed([confluent_kafka.TopicPartition(topic, 0)], timeout=WAIT_S)
    assert committed[0].offset == next_offset
    second.close()

    # and so does a raylog consumer of the same group
    consumer = raylog_client.consumer([topic], group=group)
    try:
        got = []
        deadline = time.monotonic() + WAIT_S
        while len(got) < 25 and time.monotonic() < deadline:
            got.extend(consumer.poll(timeout_ms=1000))
        assert [m.value for m in got] == values[15:]
        # while it is a member, a Kafka commit into the group is refused and changes nothing
        intruder = confluent_kafka.Consumer(settings)
        with pytest.raises(confluent_kafka.KafkaException, match="UNKNOWN_MEMBER_ID"):
            intruder.commit(offsets=[confluent_kafka.TopicPartition(topic, 0, 0)], asynchronous=False)
        intruder.close()
    finally:
        consumer.close()
    assert OffsetStore(raylog_client._zk, raylog_client.settings.cluster).committed(group, topic, 0) != 0
