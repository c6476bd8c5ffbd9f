"""A key lands on the same partition whoever writes it, when raylog's
producer uses the writing Kafka client's key hash (``partitioner=``):
librdkafka's default (``consistent_random``: CRC-32) and ``murmur2_random``
(Kafka's Java client's murmur2), and kafka-python's default (murmur2), each
through the Kafka front door, against raylog's producer on the same topic.
On real ZooKeeper, Ray and sockets."""

from __future__ import annotations

import uuid

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")

WAIT_S = 60.0
PARTITIONS = 7
KEYS = [f"key-{i}".encode() for i in range(40)]


def _confluent_partitions(config: dict, topic: str, **extra) -> dict:
    producer = confluent_kafka.Producer({**config, **extra})
    placed = {}

    def report(err, msg):
        assert err is None, err
        placed[msg.key()] = msg.partition()

    for key in KEYS:
        producer.produce(topic, value=b"v", key=key, on_delivery=report)
    assert producer.flush(WAIT_S) == 0
    return placed


def _raylog_partitions(raylog_client, topic: str, partitioner: str) -> dict:
    producer = raylog_client.producer(partitioner=partitioner, acks=1)
    try:
        one = {key: producer.send(topic, b"v", key=key).result(WAIT_S)[0] for key in KEYS}
        producer.send_batch(topic, [b"b"] * len(KEYS), KEYS).result(WAIT_S)
    finally:
        producer.close()
    return one


@pytest.mark.parametrize("librdkafka, raylog_name", [("consistent_random", "crc32"), ("murmur2_random", "murmur2")])
def test_raylog_places_keys_as_librdkafka_does(raylog_client, kafka_config, librdkafka, raylog_name):
    topic = f"kp-{uuid.uuid4().hex[:10]}"
    raylog_client.create_topic(topic, partitions=PARTITIONS)
    theirs = _confluent_partitions(kafka_config, topic, partitioner=librdkafka)
    ours = _raylog_partitions(raylog_client, topic, raylog_name)
    assert ours == theirs
    assert len(set(ours.values())) > 3  # spread, not one partition
    # send_batch (grouped by partition in one pass) placed every key as send did
    consumer = raylog_client.consumer(topic, auto_offset_reset="earliest")
    try:
        found, read = {}, 0
        while read < 3 * len(KEYS):
            for m in consumer.poll(timeout_ms=500):
                found.setdefault(m.key, set()).add(m.partition)
                read += 1
    finally:
        consumer.close()
    assert {k: p.pop() for k, p in found.items() if len(p) == 1} == theirs


def test_raylog_places_keys_as_kafka_pythons_default_partitioner(raylog_client, kafka_config):
    topic = f"kp-{uuid.uuid4().hex[:10]}"
    raylog_client.create_topic(topic, partitions=PARTITIONS)
    producer = kafka.KafkaProducer(
        bootstrap_servers=kafka_config["bootstrap.servers"], security_protocol=kafka_config["security.protocol"],
        sasl_mechanism=kafka_config["sasl.mechanisms"], sasl_plain_username=kafka_config["sasl.username"],
        sasl_plain_password=kafka_config["sasl.password"])
    try:
        theirs = {key: producer.send(topic, value=b"v", key=key).get(WAIT_S).partition for key in KEYS}
    finally:
        producer.close()
    assert _raylog_partitions(raylog_client, topic, "murmur2") == theirs


def test_an_unknown_partitioner_is_refused_before_anything_is_sent(raylog_client):
    from raylog.errors import ConfigError

    with pytest.raises(ConfigError, match="partitioner must be one of"):
        raylog_client.producer(partitioner="java")
