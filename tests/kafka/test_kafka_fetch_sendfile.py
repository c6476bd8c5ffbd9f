"""A Kafka Fetch of stored batches, from a partition on the listener's own
machine, goes from the segment file to the client's socket by sendfile
(docs/design.md section 10): the listener reads none of the bytes. When the
segment cannot be used as located (deleted by retention since, replaced by
another file of that name) the bytes are read through the data channel as
before and the client gets the same records; so are format-1 messages
(converted to Kafka batches on the way). Real ZooKeeper, Ray, listener,
partition and a confluent-kafka (librdkafka) consumer."""

from __future__ import annotations

import os
import time
import uuid

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")

WAIT_S = 60.0


def _topic_with(raylog_client, values) -> str:
    topic = f"k-{uuid.uuid4().hex[:12]}"
    raylog_client.create_topic(topic, partitions=1)
    with raylog_client.producer(batch_size=50) as producer:
        for i, value in enumerate(values):
            producer.send(topic, value, key=b"k%d" % i, partition=0)
        producer.flush(WAIT_S)
    return topic


def _consume(config: dict, topic: str, n: int) -> list[tuple[int, bytes, bytes]]:
    consumer = confluent_kafka.Consumer({**config, "group.id": f"g-{uuid.uuid4().hex[:8]}",
                                         "enable.auto.commit": False, "fetch.wait.max.ms": 100,
                                         "max.partition.fetch.bytes": 16_384})
    got = []
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + WAIT_S
        while len(got) < n and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=1000, timeout=1.0):
                assert msg.error() is None, msg.error()
                got.append((msg.offset(), msg.key(), msg.value()))
    finally:
        consumer.close()
    return got


def _listener_stats(raylog_client, listeners) -> dict:
    import ray

    from raylog.config import NAMESPACE
    from raylog.kafka.service import listener_name

    [entry] = listeners
    actor = ray.get_actor(listener_name(raylog_client.settings.cluster, entry["node"]), namespace=NAMESPACE)
    return ray.get(actor.stats.remote(), timeout=WAIT_S)


def _segment(raylog_client, topic: str) -> str:
    log_dir = raylog_client.registry.placement(topic, 0)["log_dir"]
    [name] = [n for n in os.listdir(log_dir) if n.endswith(".log")]
    return os.path.join(log_dir, name)


def _fetched(before: dict, after: dict) -> tuple[int, int]:
    return (after["fetch_bytes_sent_from_files"] - before["fetch_bytes_sent_from_files"],
            after["fetch_bytes_relayed"] - before["fetch_bytes_relayed"])


@pytest.fixture
def values():
    return [b"value-%d-" % i * (1 + i % 9) for i in range(2_000)]


def test_stored_batches_go_from_the_segment_file_to_the_client(raylog_client, kafka_config, listeners, values):
    topic = _topic_with(raylog_client, values)
    stored = os.path.getsize(_segment(raylog_client, topic))
    before = _listener_stats(raylog_client, listeners)
    got = _consume(kafka_config, topic, len(values))
    from_files, relayed = _fetched(before, _listener_stats(raylog_client, listeners))
    assert [(k, v) for _, k, v in got] == [(b"k%d" % i, v) for i, v in enumerate(values)]
    assert [o for o, _, _ in got] == sorted({o for o, _, _ in got})
    assert relayed == 0 and from_files >= stored


@pytest.mark.parametrize("change", ["deleted", "replaced"])
def test_a_segment_gone_or_replaced_since_it_was_located_is_read_through_the_data_channel(
        raylog_client, kafka_config, listeners, values, change):
    """The partition keeps its open file (it serves from it); the path now
    names nothing, or a file of the same size full of other bytes (what a
    Fetch must never send)."""
    topic = _topic_with(raylog_client, values)
    path = _segment(raylog_client, topic)
    size = os.path.getsize(path)
    os.unlink(path)
    if change == "replaced":
        with open(path, "wb") as f:
            f.write(b"\xff" * size)
    before = _listener_stats(raylog_client, listeners)
    got = _consume(kafka_config, topic, len(values))
    from_files, relayed = _fetched(before, _listener_stats(raylog_client, listeners))
    assert [(k, v) for _, k, v in got] == [(b"k%d" % i, v) for i, v in enumerate(values)]
    assert from_files == 0 and relayed >= size


def test_format_1_messages_are_converted_and_relayed_as_before(raylog_client, kafka_config, listeners):
    """The paper's messages (written through the data channel as a format-1
    client does, plain and gzip wrappers) are not Kafka bytes: LOCATE says
    so and the listener converts what it reads through the data channel."""
    from raylog.storage.message import encode_message_set

    topic = f"k-{uuid.uuid4().hex[:12]}"
    raylog_client.create_topic(topic, partitions=1)
    sets = [[b"f1-%d-%d" % (i, j) for j in range(20)] for i in range(30)]
    host, port = raylog_client.metadata.endpoint(topic, 0, refresh=True)
    with raylog_client.settings.broker_connection(host, port) as conn:
        for i, values in enumerate(sets):
            conn.produce(topic, 0, encode_message_set(values, compression="gzip" if i % 2 else None))
    before = _listener_stats(raylog_client, listeners)
    expected = [v for values in sets for v in values]
    got = _consume(kafka_config, topic, len(expected))
    from_files, relayed = _fetched(before, _listener_stats(raylog_client, listeners))
    assert [v for _, _, v in got] == expected
    assert [o for o, _, _ in got] == sorted({o for o, _, _ in got})
    assert from_files == 0 and relayed > 0
