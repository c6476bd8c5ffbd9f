"""A log written in format 1 by the code before format 2 (the checked-in
fixture ``tests/storage/fixtures/format1-log``) is served after the
upgrade by a real partition actor: its files are put into a partition's
directory, the actor is killed and Ray starts it again on them; then raylog's
consumer and a Kafka client (confluent-kafka, through the Kafka front door)
read every message, record batches are appended after it (raylog's producer
and the Kafka client), and everything reads back in order."""

from __future__ import annotations

import os
import shutil
import signal
import time
import uuid

import pytest

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "storage", "fixtures", "format1-log")
#: what the fixture holds (tests/storage/test_mixed_format_reads.py, FIXTURE_VALUES)
FIXTURE_VALUES = [b"one", b"two", b"three"] + [b"w%d" % i for i in range(20)] + [b"", b"six", b"seven"]
WAIT_S = 120.0


def _restarted(client, topic: str, old_pid: int) -> dict:
    import ray
    from ray.exceptions import RayError

    actor = client.partition_actor(topic, 0)
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            stats = ray.get(actor.stats.remote(), timeout=10)
            if stats["pid"] != old_pid:
                return stats
        except RayError:
            pass
        assert time.monotonic() < deadline, f"the partition actor restarted within {WAIT_S} s"
        time.sleep(0.2)


def _raylog_values(client, topic: str, count: int) -> list:
    consumer = client.consumer([topic], group=f"g-{uuid.uuid4().hex[:8]}", auto_offset_reset="earliest")
    got = []
    deadline = time.monotonic() + WAIT_S
    try:
        while len(got) < count and time.monotonic() < deadline:
            got.extend(consumer.poll(timeout_ms=1000))
    finally:
        consumer.close()
    return got


def _kafka_values(config: dict, topic: str, count: int) -> list:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    consumer = confluent_kafka.Consumer(
        {**config, "group.id": f"k-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest", "enable.auto.commit": False}
    )
    consumer.subscribe([topic])
    got = []
    deadline = time.monotonic() + WAIT_S
    try:
        while len(got) < count and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                got.append(msg)
    finally:
        consumer.close()
    return got


def test_a_format_1_log_from_before_is_served_appended_to_and_read_after_the_upgrade(raylog_client):
    import ray

    topic = f"upgrade-{uuid.uuid4().hex[:8]}"
    raylog_client.create_topic(topic, partitions=1, segment_bytes=300, max_message_bytes=256)
    actor = raylog_client.partition_actor(topic, 0)
    old = ray.get(actor.stats.remote())
    assert old["high_watermark"] == 0
    for name in os.listdir(FIXTURE):  # the old log's files, then the process dies
        shutil.copyfile(os.path.join(FIXTURE, name), os.path.join(old["log_dir"], name))
    os.kill(old["pid"], signal.SIGKILL)
    new = _restarted(raylog_client, topic, old["pid"])
    assert new["recovery_reports"] == []  # the old log is sound, nothing truncated
    start, end = raylog_client.offsets(topic, 0)
    assert start == 0 and end > 0

    # served as it is: raylog's consumer and a Kafka client read every message of format 1
    messages = _raylog_values(raylog_client, topic, len(FIXTURE_VALUES))
    assert [m.value for m in messages] == FIXTURE_VALUES
    assert [m.headers for m in messages] == [()] * len(FIXTURE_VALUES)
    raylog_client.start_kafka_listeners()
    config = raylog_client.kafka_config()
    kafka = _kafka_values(config, topic, len(FIXTURE_VALUES))
    assert [m.value() for m in kafka] == FIXTURE_VALUES
    assert [m.offset() for m in kafka] == [m.offset for m in messages]

    # appended to: raylog's producer and a Kafka client (headers, a tombstone), after the old segments
    producer = raylog_client.producer(acks=-1)
    producer.send(topic, b"after-upgrade", partition=0).result(timeout_s=WAIT_S)
    producer.close()
    confluent_kafka = pytest.importorskip("confluent_kafka")
    kp = confluent_kafka.Producer({**config, "acks": "all", "enable.idempotence": True})
    kp.produce(topic, value=b"from-kafka", key=b"k", partition=0, headers=[("h", b"1")])
    kp.produce(topic, value=None, key=b"k", partition=0)
    assert kp.flush(WAIT_S) == 0
    want = FIXTURE_VALUES + [b"after-upgrade", b"from-kafka", None]
    everything = _raylog_values(raylog_client, topic, len(want))
    assert [m.value for m in everything] == want
    assert list(everything[-2].headers) == [("h", b"1")]
    offsets = [m.offset for m in everything]
    assert offsets == sorted(set(offsets)) and offsets[: len(messages)] == [m.offset for m in messages]
    assert [m.value() for m in _kafka_values(config, topic, len(want))] == want
