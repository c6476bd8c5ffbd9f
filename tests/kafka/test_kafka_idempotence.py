"""Idempotent Kafka producers through the front door: InitProducerId, the
Kafka-to-raylog sequence translation (pure), a resent batch stored once, a
gap refused, transactional ids refused, and confluent-kafka's idempotent
producer end to end -- on real ZooKeeper, Ray and sockets."""

from __future__ import annotations

import time
import uuid

import pytest
from kafka_raw import RawKafka

from raylog.kafka import idempotence
from raylog.kafka.idempotence import SequenceMap
from raylog.kafka.records import RecordsRefused

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
    Topic = ProduceRequest.TopicProduceData
    request = ProduceRequest[8](transactional_id=None, acks=-1, timeout_ms=30_000, topic_data=[
        Topic(name=topic, partition_data=[Topic.PartitionProduceData(index=0, records=records)])])
    part = raw.request(request, ProduceResponse).responses[0].partition_responses[0]
    return part.error_code, part.base_offset


# -- the translation (pure logic) --------------------------------------------------


def test_batches_are_numbered_per_set_and_a_retry_gets_its_first_number():
    sequences = SequenceMap()
    rid, first = sequences.assign(7, 0, "t", 0, 0, 5)
    assert first == 0
    assert sequences.assign(7, 0, "t", 0, 5, 3) == (rid, 1)  # Kafka counts records, raylog sets
    assert sequences.assign(7, 0, "t", 0, 8, 1) == (rid, 2)
    assert sequences.assign(7, 0, "t", 0, 5, 3) == (rid, 1)  # a retry: the same raylog sequence
    other, zero = sequences.assign(7, 1, "t", 0, 0, 2)  # a new epoch starts a new stream
    assert zero == 0 and other != rid
    assert sequences.assign(7, 0, "t", 1, 0, 1)[1] == 0  # so does another partition


def test_a_gap_and_a_forgotten_duplicate_are_refused_and_change_nothing():
    sequences = SequenceMap()
    rid, _ = sequences.assign(9, 0, "t", 0, 0, 1)
    with pytest.raises(RecordsRefused) as gap:
        sequences.assign(9, 0, "t", 0, 5, 1)
    assert gap.value.code == idempotence.OUT_OF_ORDER_SEQUENCE_NUMBER
    for seq in range(1, idempotence.RECENT_BATCHES + 2):
        sequences.assign(9, 0, "t", 0, seq, 1)
    with pytest.raises(RecordsRefused) as old:
        sequences.assign(9, 0, "t", 0, 0, 1)  # no longer among the recent batches
    assert old.value.code == idempotence.DUPLICATE_SEQUENCE_NUMBER
    assert sequences.assign(9, 0, "t", 0, idempotence.RECENT_BATCHES + 2, 1) == (rid, idempotence.RECENT_BATCHES + 2)


def test_streams_are_bounded():
    sequences = SequenceMap(max_streams=3)
    for pid in range(10):
        sequences.assign(pid, 0, "t", 0, 0, 1)
    assert len(sequences) == 3


def test_an_idempotent_request_of_two_batches_is_refused():
    records = _batch(1, 0, 0, [b"a"]) + _batch(1, 0, 1, [b"b"])
    with pytest.raises(RecordsRefused) as refused:
        idempotence.batch_identity(records)
    assert refused.value.code == idempotence.INVALID_RECORD
    assert idempotence.batch_identity(_batch(-1, -1, -1, [b"a"]))[0] == -1


# -- over a listener -------------------------------------------------------------


def test_init_producer_id_allocates_and_bumps_epochs_and_refuses_transactions(raylog_client, kafka_config):
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
        refused = raw.request(InitProducerIdRequest[1](transactional_id="tx", transaction_timeout_ms=60_000),
                              InitProducerIdResponse)
        assert refused.error_code == idempotence.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


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


def test_a_transactional_producer_fails_at_once_saying_why_and_stores_nothing(raylog_client, kafka_config):
    topic = _topic(raylog_client)
    producer = confluent_kafka.Producer({**kafka_config, "transactional.id": f"tx-{uuid.uuid4().hex[:8]}"})
    with pytest.raises(confluent_kafka.KafkaException) as raised:
        producer.init_transactions(WAIT_S)  # refused, not left to time out
    err = raised.value.args[0]
    assert err.name() == "TRANSACTIONAL_ID_AUTHORIZATION_FAILED" and err.fatal()
    assert "raylog has no transactions" in err.str()
    assert raylog_client.offsets(topic, 0) == (0, 0)
