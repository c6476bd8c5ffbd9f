"""Idempotent Kafka producers through the front door: InitProducerId, a
resent batch stored once (through the same listener, another listener, and
a listener started again: the partition judges the batch by its own
producer fields), a gap refused, and
confluent-kafka's idempotent producer end to end -- on real ZooKeeper, Ray
and sockets."""

from __future__ import annotations

import time
import uuid

import pytest
from kafka_raw import RawKafka

from raylog.kafka import idempotence

confluent_kafka = pytest.importorskip("confluent_kafka")

from kafka.protocol.producer import (  # noqa: E402
    InitProducerIdRequest,
    InitProducerIdResponse,
    ProduceRequest,
    ProduceResponse,
)
from kafka.record.default_records import DefaultRecordBatchBuilder  # noqa: E402

WAIT_S = 60.0


def _topic(raylog_client, partitions: int = 1) -> str:
    name = f"k-{uuid.uuid4().hex[:12]}"
    raylog_client.create_topic(name, partitions=partitions)
    return name


def _read(raylog_client, topic: str, count: int) -> list:
    consumer = raylog_client.consumer([topic], group=f"g-{uuid.uuid4().hex[:8]}", auto_offset_reset="earliest")
    got = []
    deadline = time.monotonic() + WAIT_S
    try:
        while len(got) < count and time.monotonic() < deadline:
            got.extend(consumer.poll(timeout_ms=1000))
        got.extend(consumer.poll(timeout_ms=500))  # nothing more arrives
    finally:
        consumer.close()
    return got


def _batch(producer_id: int, epoch: int, base_sequence: int, values) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                        producer_id=producer_id, producer_epoch=epoch,
                                        base_sequence=base_sequence, batch_size=1 << 20)
    for i, value in enumerate(values):
        builder.append(i, timestamp=1_000 + i, key=None, value=value, headers=[])
    return bytes(builder.build())


def _produce(raw: RawKafka, topic: str, records: bytes):
    """``(error code, base offset)`` of one acks=-1 Produce of ``records`` to partition 0."""
    Topic = ProduceRequest.TopicProduceData
    request = ProduceRequest[8](transactional_id=None, acks=-1, timeout_ms=30_000, topic_data=[
        Topic(name=topic, partition_data=[Topic.PartitionProduceData(index=0, records=records)])])
    part = raw.request(request, ProduceResponse).responses[0].partition_responses[0]
    return part.error_code, part.base_offset


# -- over a listener -------------------------------------------------------------


def test_init_producer_id_allocates_and_bumps_epochs(raylog_client, kafka_config):
    with RawKafka(kafka_config) as raw:
        raw.authenticate()
        first = raw.request(InitProducerIdRequest[1](transactional_id=None, transaction_timeout_ms=60_000),
                            InitProducerIdResponse)
        second = raw.request(InitProducerIdRequest[1](transactional_id=None, transaction_timeout_ms=60_000),
                             InitProducerIdResponse)
        assert first.error_code == 0 and first.producer_id >= 0 and first.producer_epoch == 0
        assert second.producer_id != first.producer_id
        bumped = raw.request(InitProducerIdRequest[4](transactional_id=None, transaction_timeout_ms=60_000,
                                                      producer_id=first.producer_id, producer_epoch=0),
                             InitProducerIdResponse)
        assert (bumped.error_code, bumped.producer_id, bumped.producer_epoch) == (0, first.producer_id, 1)


def test_a_resent_batch_is_stored_once_and_a_gap_is_refused(raylog_client, kafka_config):
    topic = _topic(raylog_client)
    with RawKafka(kafka_config) as raw:
        raw.authenticate()
        pid = raw.request(InitProducerIdRequest[1](transactional_id=None, transaction_timeout_ms=60_000),
                          InitProducerIdResponse).producer_id
        first = _batch(pid, 0, 0, [b"a0", b"a1", b"a2"])
        code, base = _produce(raw, topic, first)
        assert code == 0
        assert _produce(raw, topic, first) == (0, base)  # a retry: the first store's offset, stored once
        code, second_base = _produce(raw, topic, _batch(pid, 0, 3, [b"b0", b"b1"]))  # sequence 3: 3 records before
        assert code == 0 and second_base > base
        assert _produce(raw, topic, _batch(pid, 0, 9, [b"gap"]))[0] == idempotence.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert _produce(raw, topic, _batch(pid, 0, 3, [b"b0", b"b1"])) == (0, second_base)
        assert _produce(raw, topic, _batch(pid, 0, 5, [b"c0"]))[0] == 0
    got = _read(raylog_client, topic, 6)
    assert [m.value for m in got] == [b"a0", b"a1", b"a2", b"b0", b"b1", b"c0"]


def test_confluent_idempotent_producer_delivers_each_message_once_in_order(raylog_client, kafka_config):
    topic = _topic(raylog_client)
    producer = confluent_kafka.Producer({**kafka_config, "enable.idempotence": True, "acks": "all",
                                         "linger.ms": 5, "batch.num.messages": 37})
    reports = []
    count = 400
    for i in range(count):
        producer.produce(topic, f"i{i}".encode(), partition=0,
                         on_delivery=lambda err, msg: reports.append((err, msg.offset())))
        if i % 50 == 0:
            producer.poll(0)
    assert producer.flush(WAIT_S) == 0
    assert len(reports) == count and all(err is None for err, _ in reports), reports[:3]
    offsets = [offset for _, offset in reports]
    assert offsets == sorted(set(offsets))
    got = _read(raylog_client, topic, count)
    assert [m.value for m in got] == [f"i{i}".encode() for i in range(count)]
    assert [m.offset for m in got] == offsets


class _SecondListener:
    """Another Kafka listener of the cluster, in this process (as a node's
    listener actor serves, under an identity of its own); stopped on exit."""

    def __init__(self, raylog_client, identity: str):
        from raylog.kafka.service import KafkaListenerActor

        settings = raylog_client.settings
        self.actor = KafkaListenerActor(settings.zookeeper, settings.cluster, identity, "127.0.0.1", 0)

    def config(self, kafka_config: dict) -> dict:
        entry = self.actor.entry()
        return {**kafka_config, "bootstrap.servers": f"{entry['host']}:{entry['port']}"}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.actor.stop()


def test_a_batch_resent_through_another_listener_and_after_a_restart_is_stored_once(raylog_client, kafka_config):
    """The same batch (same producer id, epoch and sequence) sent through
    two different listeners, and through a listener started again, is
    stored once: every copy is answered with the first store's offset."""
    topic = _topic(raylog_client)
    identity = f"second-{uuid.uuid4().hex[:6]}"
    with RawKafka(kafka_config) as raw:
        raw.authenticate()
        pid = raw.request(InitProducerIdRequest[1](transactional_id=None, transaction_timeout_ms=60_000),
                          InitProducerIdResponse).producer_id
        first = _batch(pid, 0, 0, [b"a0", b"a1"])
        code, base = _produce(raw, topic, first)
        assert code == 0
    with _SecondListener(raylog_client, identity) as second:
        assert second.config(kafka_config)["bootstrap.servers"] != kafka_config["bootstrap.servers"]
        with RawKafka(second.config(kafka_config)) as other:
            other.authenticate()
            assert _produce(other, topic, first) == (0, base)  # the retry through another listener
            code, next_base = _produce(other, topic, _batch(pid, 0, 2, [b"b0"]))
            assert code == 0 and next_base > base
    with _SecondListener(raylog_client, identity) as again:  # the listener started again
        with RawKafka(again.config(kafka_config)) as other:
            other.authenticate()
            assert _produce(other, topic, first) == (0, base)
            assert _produce(other, topic, _batch(pid, 0, 2, [b"b0"])) == (0, next_base)
            assert _produce(other, topic, _batch(pid, 0, 7, [b"gap"]))[0] == idempotence.OUT_OF_ORDER_SEQUENCE_NUMBER
    got = _read(raylog_client, topic, 3)
    assert [(m.offset, m.value) for m in got] == [(base, b"a0"), (base + 1, b"a1"), (next_base, b"b0")]
