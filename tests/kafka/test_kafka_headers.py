"""Record headers, null values (tombstones) and empty values through the
Kafka front door with real clients -- confluent-kafka (librdkafka),
kafka-python and aiokafka -- each producing and reading back through itself
and through raylog's consumer; and each client reading from an offset inside
a stored batch (docs/design.md sections 2 and 10). On real ZooKeeper, Ray
and sockets."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from kafka_reads import raylog_read

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")

WAIT_S = 60.0

#: (key, value, headers): duplicate header keys, a null header value, a
#: tombstone, an empty value, an empty header, no headers
RECORDS = [
    (b"k1", b"v1", [("h", b"a"), ("h", b"b"), ("n", None)]),
    (b"k2", None, [("t", b"x")]),
    (None, b"", []),
    (b"k4", b"v4", [("", b"")]),
    (None, None, []),
]
#: what kafka-python's producer takes: no null header value, no record without both key and value
KAFKA_PYTHON_RECORDS = [(k, v, [(hk, b"" if hv is None else hv) for hk, hv in h]) for k, v, h in RECORDS
                        if k is not None or v is not None]
#: what aiokafka's producer takes: no record without both key and value
AIOKAFKA_RECORDS = [r for r in RECORDS if r[0] is not None or r[1] is not None]


def _topic(raylog_client) -> str:
    name = f"h-{uuid.uuid4().hex[:12]}"
    raylog_client.create_topic(name, partitions=1)
    return name


def _norm(key, value, headers):
    return (None if key is None else bytes(key), None if value is None else bytes(value),
            [(k, None if v is None else bytes(v)) for k, v in (headers or [])])


def _check_raylog(raylog_client, topic: str, offsets, records=RECORDS) -> None:
    got = raylog_read(raylog_client, topic, len(records))
    assert [_norm(m.key, m.value, list(m.headers)) for m in got] == [_norm(*r) for r in records]
    assert [m.offset for m in got] == list(offsets)


# -- confluent-kafka -------------------------------------------------------------


def _confluent_produce(config: dict, topic: str, records, **extra) -> list:
    producer = confluent_kafka.Producer({**config, "linger.ms": 50, **extra})
    reports = []
    for key, value, headers in records:
        producer.produce(topic, value=value, key=key, headers=headers, partition=0,
                         on_delivery=lambda err, msg: reports.append((err, msg.offset())))
    assert producer.flush(WAIT_S) == 0
    assert [err for err, _ in reports if err is not None] == []
    return [offset for _, offset in reports]


def _confluent_read(config: dict, topic: str, offset: int, count: int) -> list:
    consumer = confluent_kafka.Consumer({**config, "group.id": "unused", "enable.auto.commit": False,
                                         "fetch.wait.max.ms": 100})
    consumer.assign([confluent_kafka.TopicPartition(topic, 0, offset)])
    got = []
    deadline = time.monotonic() + WAIT_S
    try:
        while len(got) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got.append((msg.offset(), _norm(msg.key(), msg.value(), msg.headers())))
    finally:
        consumer.close()
    return got


@pytest.mark.parametrize("compression", ["none", "snappy", "zstd"])
def test_confluent_headers_and_null_values_read_back(raylog_client, kafka_config, compression):
    topic = _topic(raylog_client)
    offsets = _confluent_produce(kafka_config, topic, RECORDS, **{"compression.type": compression})
    got = _confluent_read(kafka_config, topic, 0, len(RECORDS))
    assert got == [(o, _norm(*r)) for o, r in zip(offsets, RECORDS)]
    _check_raylog(raylog_client, topic, offsets)


# -- kafka-python ----------------------------------------------------------------


def _kafka_python_args(config: dict) -> dict:
    return dict(bootstrap_servers=config["bootstrap.servers"].split(","), security_protocol="SASL_PLAINTEXT",
                sasl_mechanism="SCRAM-SHA-256", sasl_plain_username=config["sasl.username"],
                sasl_plain_password=config["sasl.password"])


def _kafka_python_read(config: dict, topic: str, offset: int, count: int) -> list:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(**_kafka_python_args(config), enable_auto_commit=False, group_id=None)
    got = []
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, offset)
        deadline = time.monotonic() + WAIT_S
        while len(got) < count and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                got.extend((r.offset, _norm(r.key, r.value, r.headers)) for r in records)
    finally:
        consumer.close()
    return got


def test_kafka_python_headers_and_null_values_read_back(raylog_client, kafka_config):
    from kafka import KafkaProducer

    topic = _topic(raylog_client)
    producer = KafkaProducer(**_kafka_python_args(kafka_config), linger_ms=50)
    try:
        futures = [producer.send(topic, value=value, key=key, headers=headers, partition=0)
                   for key, value, headers in KAFKA_PYTHON_RECORDS]
        producer.flush(WAIT_S)
        offsets = [f.get(WAIT_S).offset for f in futures]
    finally:
        producer.close()
    got = _kafka_python_read(kafka_config, topic, 0, len(KAFKA_PYTHON_RECORDS))
    assert got == [(o, _norm(*r)) for o, r in zip(offsets, KAFKA_PYTHON_RECORDS)]
    _check_raylog(raylog_client, topic, offsets, KAFKA_PYTHON_RECORDS)


# -- aiokafka ----------------------------------------------------------------------


def _aiokafka_args(config: dict) -> dict:
    return dict(bootstrap_servers=config["bootstrap.servers"].split(","), security_protocol="SASL_PLAINTEXT",
                sasl_mechanism="SCRAM-SHA-256", sasl_plain_username=config["sasl.username"],
                sasl_plain_password=config["sasl.password"])


async def _aiokafka_produce(config: dict, topic: str, records) -> list:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(**_aiokafka_args(config), linger_ms=50)
    await producer.start()
    try:
        futures = [await producer.send(topic, value=value, key=key, headers=headers, partition=0)
                   for key, value, headers in records]
        return [(await f).offset for f in futures]
    finally:
        await producer.stop()


async def _aiokafka_read(config: dict, topic: str, offset: int, count: int) -> list:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(**_aiokafka_args(config), enable_auto_commit=False, group_id=None)
    await consumer.start()
    got = []
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, offset)
        deadline = time.monotonic() + WAIT_S
        while len(got) < count and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                got.extend((r.offset, _norm(r.key, r.value, r.headers)) for r in records)
    finally:
        await consumer.stop()
    return got


def test_aiokafka_headers_and_null_values_read_back(raylog_client, kafka_config):
    pytest.importorskip("aiokafka")
    topic = _topic(raylog_client)
    offsets = asyncio.run(asyncio.wait_for(_aiokafka_produce(kafka_config, topic, AIOKAFKA_RECORDS), WAIT_S))
    got = asyncio.run(_aiokafka_read(kafka_config, topic, 0, len(AIOKAFKA_RECORDS)))
    assert got == [(o, _norm(*r)) for o, r in zip(offsets, AIOKAFKA_RECORDS)]
    _check_raylog(raylog_client, topic, offsets, AIOKAFKA_RECORDS)


# -- an offset inside a stored batch -------------------------------------------------


def test_each_client_reads_from_an_offset_inside_a_batch(raylog_client, kafka_config):
    """Two stored batches A (3 records) and B (2): from A's second record
    each client gets A1, A2, B0, B1; from an offset past A's last record but
    inside A's bytes (no record of A at or after it) it gets B0, B1; it goes
    on from A to B by A's lastOffsetDelta (raylog's: to A's last byte)."""
    topic = _topic(raylog_client)
    first = _confluent_produce(kafka_config, topic, [(None, f"a{i}".encode(), []) for i in range(3)])
    second = _confluent_produce(kafka_config, topic, [(None, f"b{i}".encode(), []) for i in range(2)])
    assert first == [first[0] + i for i in range(3)] and second[0] > first[2] + 1  # B starts past A's bytes
    values = [b"a0", b"a1", b"a2", b"b0", b"b1"]
    every = list(zip(first + second, values))
    readers = {
        "confluent": lambda offset, n: _confluent_read(kafka_config, topic, offset, n),
        "kafka-python": lambda offset, n: _kafka_python_read(kafka_config, topic, offset, n),
    }
    try:
        import aiokafka  # noqa: F401

        readers["aiokafka"] = lambda offset, n: asyncio.run(_aiokafka_read(kafka_config, topic, offset, n))
    except ImportError:
        pass
    for name, read in readers.items():
        got = [(offset, value) for offset, (_, value, _) in read(first[1], 4)]
        assert got == every[1:], name
        got = [(offset, value) for offset, (_, value, _) in read(first[2] + 1, 2)]
        assert got == every[3:], name
        got = [(offset, value) for offset, (_, value, _) in read(0, 5)]
        assert got == every, name
