"""Real Kafka clients (confluent-kafka / librdkafka and kafka-python) against
raylog's Kafka listener, on real ZooKeeper and Ray; raylog's own producer and
consumer on the other end."""

from __future__ import annotations

import socket
import struct
import time
import uuid

import pytest
from kafka_reads import raylog_read

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")

#: how long a client may take for anything here (a loaded machine)
WAIT_S = 60.0


@pytest.fixture
def config(kafka_config):
    return kafka_config


def _topic(raylog_client, partitions: int = 1) -> str:
    name = f"k-{uuid.uuid4().hex[:12]}"
    raylog_client.create_topic(name, partitions=partitions)
    return name


def _confluent_produce(config: dict, topic: str, values, keys=None, **extra) -> list:
    producer = confluent_kafka.Producer({**config, **extra})
    delivered = []

    def report(err, msg):
        delivered.append((err, msg.partition() if msg is not None else None, msg.offset() if msg else None))

    for i, value in enumerate(values):
        producer.produce(topic, value=value, key=None if keys is None else keys[i], partition=0, on_delivery=report)
    left = producer.flush(WAIT_S)
    assert left == 0, f"{left} messages not delivered"
    return delivered


@pytest.mark.parametrize("acks, compression", [("1", "none"), ("all", "gzip"), ("all", "zstd"), ("1", "lz4")])
def test_confluent_produce_reads_back_with_raylog_consumer(raylog_client, config, acks, compression):
    topic = _topic(raylog_client)
    values = [f"value-{i}-".encode() * (i % 7 + 1) for i in range(200)]
    keys = [None if i % 3 else f"k{i}".encode() for i in range(200)]
    delivered = _confluent_produce(config, topic, values, keys, **{"acks": acks, "compression.type": compression,
                                                                   "linger.ms": 5})
    assert [err for err, _, _ in delivered if err is not None] == []
    got = raylog_read(raylog_client, topic, len(values))
    assert [m.value for m in got] == values
    assert [m.key for m in got] == keys
    # the offsets librdkafka was told are the offsets raylog's consumer reads
    assert sorted(offset for _, _, offset in delivered) == [m.offset for m in got]


def test_raylog_produce_consumed_by_confluent_and_kafka_python(raylog_client, config):
    topic = _topic(raylog_client)
    values = [f"m{i}".encode() * (1 + i % 5) for i in range(300)]
    with raylog_client.producer(compression="gzip", batch_size=50) as producer:
        for i, value in enumerate(values):
            producer.send(topic, value, key=f"k{i}".encode(), partition=0)
        producer.flush(WAIT_S)
    expected = [(m.offset, m.key, m.value) for m in raylog_read(raylog_client, topic, len(values))]
    assert [v for _, _, v in expected] == values

    consumer = confluent_kafka.Consumer({**config, "group.id": "unused", "enable.auto.commit": False,
                                         "fetch.wait.max.ms": 200})
    consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
    got = []
    deadline = time.monotonic() + WAIT_S
    while len(got) < len(values) and time.monotonic() < deadline:
        msg = consumer.poll(1.0)
        if msg is None:
            continue
        assert msg.error() is None, msg.error()
        got.append((msg.offset(), msg.key(), msg.value()))
    consumer.close()
    assert got == expected

    # from an offset inside a compressed wrapper: that record on
    middle = expected[len(expected) // 2 + 1]
    consumer = confluent_kafka.Consumer({**config, "group.id": "unused", "enable.auto.commit": False})
    consumer.assign([confluent_kafka.TopicPartition(topic, 0, middle[0])])
    msg = None
    deadline = time.monotonic() + WAIT_S
    while msg is None and time.monotonic() < deadline:
        msg = consumer.poll(1.0)
    consumer.close()
    assert msg is not None and (msg.offset(), msg.key(), msg.value()) == middle

    from kafka import KafkaConsumer, TopicPartition

    kp = KafkaConsumer(
        bootstrap_servers=config["bootstrap.servers"].split(","), security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-256", sasl_plain_username=config["sasl.username"],
        sasl_plain_password=config["sasl.password"], enable_auto_commit=False, group_id=None,
        consumer_timeout_ms=int(WAIT_S * 1000),
    )
    try:
        tp = TopicPartition(topic, 0)
        kp.assign([tp])
        kp.seek(tp, 0)
        got = []
        deadline = time.monotonic() + WAIT_S
        while len(got) < len(values) and time.monotonic() < deadline:
            for records in kp.poll(timeout_ms=1000).values():
                got.extend((r.offset, r.key, r.value) for r in records)
        assert got == expected
        # the latest offset: after the last record, where a consumer that read everything stands
        assert kp.end_offsets([tp])[tp] == expected[-1][0] + 1
        assert kp.beginning_offsets([tp])[tp] == 0
    finally:
        kp.close()


def test_a_consumer_that_read_everything_stands_at_the_latest_offset(raylog_client, config):
    """ListOffsets' latest is the offset after the last record, not the high
    watermark (a byte position past it): librdkafka's position after reading
    everything (the last record + 1, what it commits) reaches it, so a caught
    up group has no lag and Quix Streams' changelog recovery (position >=
    latest) ends; a read from it hands out nothing old, and the next record
    written after it comes."""
    topic = _topic(raylog_client)
    producer = confluent_kafka.Producer({**config, "linger.ms": 5})
    for batch in range(3):  # three batches of five records
        for i in range(5):
            producer.produce(topic, b"v%d-%d" % (batch, i), key=b"k%d" % i, partition=0)
        assert producer.flush(WAIT_S) == 0
    group = f"g-{uuid.uuid4().hex[:8]}"
    consumer = confluent_kafka.Consumer({**config, "group.id": group, "enable.auto.commit": False})
    tp = confluent_kafka.TopicPartition(topic, 0)
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, 0, confluent_kafka.OFFSET_BEGINNING)])
        got = []
        deadline = time.monotonic() + WAIT_S
        while len(got) < 15 and time.monotonic() < deadline:
            got += [m.offset() for m in consumer.consume(100, timeout=1.0) if m.error() is None]
        assert len(got) == 15
        low, latest = consumer.get_watermark_offsets(tp, timeout=WAIT_S)
        position = consumer.position([tp])[0].offset
        assert latest == got[-1] + 1 == position, (got, latest, position, raylog_client.offsets(topic, 0))
        assert latest < raylog_client.offsets(topic, 0)[1]  # the high watermark: the next batch's position
        consumer.commit(asynchronous=False)
        assert consumer.committed([tp], timeout=WAIT_S)[0].offset == latest  # a lag of 0
    finally:
        consumer.close()

    # from the latest offset: nothing old, then the next record written
    consumer = confluent_kafka.Consumer({**config, "group.id": f"g-{uuid.uuid4().hex[:8]}",
                                         "enable.auto.commit": False, "auto.offset.reset": "latest"})
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, 0, latest)])
        assert [m for m in consumer.consume(100, timeout=3.0) if m.error() is None] == []
        _confluent_produce(config, topic, [b"after"])
        after = []
        deadline = time.monotonic() + WAIT_S
        while not after and time.monotonic() < deadline:
            after = [m for m in consumer.consume(100, timeout=1.0) if m.error() is None]
        assert [m.value() for m in after] == [b"after"] and after[0].offset() > latest
    finally:
        consumer.close()


def test_a_wrong_token_fails_authentication(raylog_client, config):
    topic = _topic(raylog_client)
    bad = {**config, "sasl.password": "0" * 64}
    errors = []
    producer = confluent_kafka.Producer({**bad, "error_cb": errors.append})
    producer.produce(topic, b"never", partition=0)
    deadline = time.monotonic() + WAIT_S
    while not any(e.code() == confluent_kafka.KafkaError._AUTHENTICATION for e in errors) \
            and time.monotonic() < deadline:
        producer.poll(0.2)
    producer.purge()
    assert any(e.code() == confluent_kafka.KafkaError._AUTHENTICATION for e in errors), errors
    assert any("SCRAM-SHA-256 authentication failed" in e.str() for e in errors), errors
    # nothing was stored
    assert raylog_client.offsets(topic, 0) == (0, 0)
    # and without any credentials nothing but ApiVersions and SASL is served
    host, port = config["bootstrap.servers"].split(",")[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        body = struct.pack(">hhih", 3, 1, 7, 1) + b"x" + struct.pack(">i", -1)  # Metadata v1, all topics
        sock.sendall(struct.pack(">i", len(body)) + body)
        assert sock.recv(4) == b""  # closed, nothing answered


def test_scram_sha_512_is_served_and_plain_only_over_tls(raylog_client, config):
    from kafka.protocol.sasl import SaslHandshakeRequest, SaslHandshakeResponse
    from kafka_raw import RawKafka

    from raylog.errors import ConfigError

    topic = _topic(raylog_client)
    sha512 = raylog_client.kafka_config(mechanism="SCRAM-SHA-512")
    assert sha512["security.protocol"] == "SASL_PLAINTEXT" and sha512["sasl.mechanisms"] == "SCRAM-SHA-512"
    assert [e for e, _, _ in _confluent_produce(sha512, topic, [b"512"])] == [None]
    assert [m.value for m in raylog_read(raylog_client, topic, 1)] == [b"512"]
    # PLAIN would send the token in the clear: neither offered nor given without TLS
    with RawKafka(config) as raw:
        answer = raw.request(SaslHandshakeRequest[1](mechanism="PLAIN"), SaslHandshakeResponse)
    assert answer.error_code == 33 and list(answer.mechanisms) == ["SCRAM-SHA-512", "SCRAM-SHA-256"]
    with pytest.raises(ConfigError, match="PLAIN .* TLS listeners only"):
        raylog_client.kafka_config(mechanism="PLAIN")
    with pytest.raises(ConfigError, match="mechanism must be one of"):
        raylog_client.kafka_config(mechanism="GSSAPI")
