"""Kafka's transaction APIs through the front door (raylog.kafka.transactions),
driven by confluent-kafka (librdkafka) on real ZooKeeper, Ray and sockets:
init_transactions, a commit over two partitions with a consumer group's
offsets, an abort, a zombie fenced by a second producer of the same
transactional.id, and the answers without a coordinator."""

from __future__ import annotations

import glob
import os
import uuid

import pytest
import ray
from kafka_raw import RawKafka
from kafka_reads import raylog_read

from raylog.kafka import transactions
from raylog.storage.markers import decode_marker, encode_marker
from raylog.storage.record_batch import decode_batch, iter_batches

confluent_kafka = pytest.importorskip("confluent_kafka")

from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse  # noqa: E402
from kafka.protocol.producer import (  # noqa: E402
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    EndTxnResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    ProduceRequest,
    ProduceResponse,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
)

pytestmark = pytest.mark.timeout(600)

WAIT_S = 60.0


@pytest.fixture(scope="module")
def coordinator(raylog_client, listeners):
    """The module's cluster's transaction coordinator, stopped at the end."""
    from raylog.actors.transaction_coordinator import stop_transaction_coordinator

    handle = raylog_client.transaction_coordinator()
    yield handle
    stop_transaction_coordinator(raylog_client.settings.cluster)


def _topic(raylog_client, partitions: int = 2) -> str:
    name = f"kt-{uuid.uuid4().hex[:12]}"
    raylog_client.create_topic(name, partitions=partitions)
    return name


def _producer(kafka_config, tid: str):
    return confluent_kafka.Producer({**kafka_config, "transactional.id": tid, "transaction.timeout.ms": 60_000})


def _log_batches(client, topic: str, partition: int) -> list[tuple]:
    """``(kind, producer_id, epoch, values or commit)`` of each batch in the
    partition's segment files, in offset order; kind is "data" or "marker"."""
    import ray

    ray.get(client.partition_actor(topic, partition).flush.remote())
    out = []
    for path in sorted(glob.glob(os.path.join(client.log_dir(topic, partition), "*.log"))):
        with open(path, "rb") as f:
            data = f.read()
        for pos, header in iter_batches(data):
            if header.control:
                out.append(("marker", header.producer_id, header.producer_epoch, decode_marker(data, pos).commit))
            else:
                values = [r.value for r in decode_batch(data, pos).records]
                out.append(("data", header.producer_id, header.producer_epoch, header.transactional, values))
    return out


def _group_metadata(kafka_config, group: str):
    consumer = confluent_kafka.Consumer({**kafka_config, "group.id": group})
    try:
        return consumer.consumer_group_metadata()
    finally:
        consumer.close()


def _committed(kafka_config, group: str, topic: str, partitions) -> list[int]:
    consumer = confluent_kafka.Consumer({**kafka_config, "group.id": group, "enable.auto.commit": False})
    try:
        found = consumer.committed([confluent_kafka.TopicPartition(topic, p) for p in partitions], timeout=WAIT_S)
    finally:
        consumer.close()
    return [tp.offset for tp in found]


def test_the_first_transactional_call_starts_the_coordinator(raylog_client, kafka_config):
    """(First in the module: no coordinator runs yet.) A cluster runs a
    transaction coordinator only once a transactional client needs one:
    the listener starts it on the first FindCoordinator for a
    transactional id, and answers with itself."""
    from raylog.actors.transaction_coordinator import find_transaction_coordinator

    assert find_transaction_coordinator(raylog_client.settings.cluster) is None
    with RawKafka(kafka_config) as raw:
        raw.authenticate()
        found = raw.request(FindCoordinatorRequest[1](key="tx", key_type=1), FindCoordinatorResponse)
        assert found.error_code == 0, found
        init = raw.request(InitProducerIdRequest[1](transactional_id="tx", transaction_timeout_ms=60_000),
                           InitProducerIdResponse)
        assert init.error_code == 0 and init.producer_id >= 0, init
    assert find_transaction_coordinator(raylog_client.settings.cluster) is not None


def test_a_listener_that_cannot_start_a_coordinator_tells_the_client_to_retry():
    """A listener given no way to start one (started without it) answers
    COORDINATOR_NOT_AVAILABLE, saying how to start it."""
    link = transactions.CoordinatorLink("no-such-cluster")
    err = link.not_running()
    assert err.retriable and "client.transaction_coordinator()" in str(err)


def test_a_committed_transaction_stores_its_records_markers_and_group_offsets(raylog_client, kafka_config,
                                                                             coordinator):
    topic, source = _topic(raylog_client), _topic(raylog_client, 1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    producer = _producer(kafka_config, f"tx-{uuid.uuid4().hex[:8]}")
    producer.init_transactions(WAIT_S)
    producer.begin_transaction()
    for i in range(6):
        producer.produce(topic, value=f"c{i}".encode(), partition=i % 2)
    producer.send_offsets_to_transaction([confluent_kafka.TopicPartition(source, 0, 42)],
                                         _group_metadata(kafka_config, group), WAIT_S)
    # not committed yet: the offsets wait for the commit
    assert _committed(kafka_config, group, source, [0]) == [confluent_kafka.OFFSET_INVALID]
    producer.commit_transaction(WAIT_S)
    # a second transaction with the same epoch (librdkafka keeps it: EndTxn below version 5)
    producer.begin_transaction()
    producer.produce(topic, value=b"second", partition=0)
    producer.commit_transaction(WAIT_S)

    got = raylog_read(raylog_client, topic, 7)
    assert sorted(m.value for m in got) == sorted([f"c{i}".encode() for i in range(6)] + [b"second"])
    assert _committed(kafka_config, group, source, [0]) == [42]
    for partition in (0, 1):
        batches = _log_batches(raylog_client, topic, partition)
        assert [b[0] for b in batches if b[0] == "marker"], batches
        data = [b for b in batches if b[0] == "data"]
        assert all(b[3] for b in data), "every batch is flagged transactional"
        pid, epoch = data[0][1], data[0][2]
        markers = [b for b in batches if b[0] == "marker"]
        assert all(m == ("marker", pid, epoch, True) for m in markers), batches
        assert batches[-1][0] == "marker"
    assert len([b for b in _log_batches(raylog_client, topic, 0) if b[0] == "marker"]) == 2


def test_an_aborted_transaction_writes_abort_markers_and_no_offsets(raylog_client, kafka_config, coordinator):
    topic, source = _topic(raylog_client), _topic(raylog_client, 1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    producer = _producer(kafka_config, f"tx-{uuid.uuid4().hex[:8]}")
    producer.init_transactions(WAIT_S)
    producer.begin_transaction()
    producer.produce(topic, value=b"a0", partition=0)
    producer.produce(topic, value=b"a1", partition=1)
    producer.send_offsets_to_transaction([confluent_kafka.TopicPartition(source, 0, 7)],
                                         _group_metadata(kafka_config, group), WAIT_S)
    producer.abort_transaction(WAIT_S)
    for partition in (0, 1):
        batches = _log_batches(raylog_client, topic, partition)
        assert batches[-1][0] == "marker" and batches[-1][3] is False, batches
    assert _committed(kafka_config, group, source, [0]) == [confluent_kafka.OFFSET_INVALID]
    # the producer goes on after its abort
    producer.begin_transaction()
    producer.produce(topic, value=b"after", partition=0)
    producer.commit_transaction(WAIT_S)
    assert _log_batches(raylog_client, topic, 0)[-1][3] is True


def test_a_second_producer_of_the_transactional_id_fences_the_first(raylog_client, kafka_config, coordinator):
    topic = _topic(raylog_client)
    tid = f"tx-{uuid.uuid4().hex[:8]}"
    zombie = _producer(kafka_config, tid)
    zombie.init_transactions(WAIT_S)
    zombie.begin_transaction()
    zombie.produce(topic, value=b"zombie", partition=0)
    zombie.flush(WAIT_S)
    successor = _producer(kafka_config, tid)
    successor.init_transactions(WAIT_S)  # aborts the zombie's transaction, bumps the epoch
    with pytest.raises(confluent_kafka.KafkaException) as raised:
        zombie.commit_transaction(WAIT_S)
    err = raised.value.args[0]
    assert err.fatal() and err.code() in (confluent_kafka.KafkaError.PRODUCER_FENCED,
                                          confluent_kafka.KafkaError.INVALID_PRODUCER_EPOCH,
                                          confluent_kafka.KafkaError._FENCED), err
    successor.begin_transaction()
    successor.produce(topic, value=b"successor", partition=0)
    successor.commit_transaction(WAIT_S)
    batches = _log_batches(raylog_client, topic, 0)
    # the zombie's batch aborted (by the fence), the successor's committed
    assert [b[0] for b in batches] == ["data", "marker", "data", "marker"], batches
    assert (batches[0][4], batches[1][3]) == ([b"zombie"], False)
    assert (batches[2][4], batches[3][3]) == ([b"successor"], True)
    assert batches[2][2] > batches[0][2]


def test_the_raw_answers_of_refused_calls(raylog_client, kafka_config, coordinator):
    tid = f"tx-{uuid.uuid4().hex[:8]}"
    with RawKafka(kafka_config) as raw:
        raw.authenticate()
        found = raw.request(FindCoordinatorRequest[1](key=tid, key_type=1), FindCoordinatorResponse)
        assert found.error_code == 0 and found.port > 0
        first = raw.request(InitProducerIdRequest[1](transactional_id=tid, transaction_timeout_ms=60_000),
                            InitProducerIdResponse)
        assert first.error_code == 0 and first.producer_epoch == 0
        bad = raw.request(InitProducerIdRequest[1](transactional_id=tid, transaction_timeout_ms=0),
                          InitProducerIdResponse)
        assert bad.error_code == transactions.INVALID_TRANSACTION_TIMEOUT
        # nothing ongoing: an end is an invalid state
        end = raw.request(EndTxnRequest[1](transactional_id=tid, producer_id=first.producer_id,
                                           producer_epoch=first.producer_epoch, committed=True), EndTxnResponse)
        assert end.error_code == transactions.INVALID_TXN_STATE
        # a second init fences the first epoch
        second = raw.request(InitProducerIdRequest[1](transactional_id=tid, transaction_timeout_ms=60_000),
                             InitProducerIdResponse)
        assert (second.producer_id, second.producer_epoch) == (first.producer_id, 1)
        for version, code in ((1, transactions.INVALID_PRODUCER_EPOCH), (2, transactions.PRODUCER_FENCED)):
            end = raw.request(EndTxnRequest[version](transactional_id=tid, producer_id=first.producer_id,
                                                     producer_epoch=0, committed=True), EndTxnResponse)
            assert end.error_code == code
        unknown = raw.request(EndTxnRequest[1](transactional_id=tid, producer_id=first.producer_id + 1,
                                               producer_epoch=1, committed=True), EndTxnResponse)
        assert unknown.error_code == transactions.INVALID_PRODUCER_ID_MAPPING
        # a partition of an unknown topic: refused, and nothing of the request added
        topic = _topic(raylog_client, 1)
        Add = AddPartitionsToTxnRequest.AddPartitionsToTxnTopic
        added = raw.request(AddPartitionsToTxnRequest[1](
            v3_and_below_transactional_id=tid, v3_and_below_producer_id=second.producer_id,
            v3_and_below_producer_epoch=second.producer_epoch,
            v3_and_below_topics=[Add(name=topic, partitions=[0]), Add(name="no-such-topic", partitions=[0])]),
            AddPartitionsToTxnResponse)
        codes = {(t.name, p.partition_index): p.partition_error_code for t in added.results_by_topic_v3_and_below
                 for p in t.results_by_partition}
        assert codes == {(topic, 0): transactions.OPERATION_NOT_ATTEMPTED,
                         ("no-such-topic", 0): transactions.UNKNOWN_TOPIC_OR_PARTITION}
        assert ray.get(coordinator.describe.remote(tid))["partitions"] == []
        # a negative offset: refused, the transaction holds no offsets
        Commit = TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic
        committed = raw.request(TxnOffsetCommitRequest[1](
            transactional_id=tid, group_id="g", producer_id=second.producer_id,
            producer_epoch=second.producer_epoch, topics=[Commit(name=topic, partitions=[
                Commit.TxnOffsetCommitRequestPartition(partition_index=0, committed_offset=-5,
                                                       committed_metadata=None)])]), TxnOffsetCommitResponse)
        assert committed.topics[0].partitions[0].error_code == transactions.INVALID_REQUEST
        assert ray.get(coordinator.describe.remote(tid))["groups"] == {}
        # KIP-360: naming the fenced identity does not bump; naming the current one does
        zombie = raw.request(InitProducerIdRequest[4](transactional_id=tid, transaction_timeout_ms=60_000,
                                                      producer_id=first.producer_id, producer_epoch=0),
                             InitProducerIdResponse)
        assert zombie.error_code == transactions.PRODUCER_FENCED
        current = raw.request(InitProducerIdRequest[4](transactional_id=tid, transaction_timeout_ms=60_000,
                                                       producer_id=first.producer_id, producer_epoch=1),
                              InitProducerIdResponse)
        assert (current.error_code, current.producer_epoch) == (0, 2)


def test_a_control_batch_from_a_client_is_refused_and_the_partition_keeps_what_it_had(raylog_client, kafka_config,
                                                                                      coordinator):
    topic = _topic(raylog_client, 1)
    producer = confluent_kafka.Producer(kafka_config)
    producer.produce(topic, value=b"kept", partition=0)
    producer.flush(WAIT_S)
    before = raylog_client.offsets(topic, 0)
    Topic = ProduceRequest.TopicProduceData
    with RawKafka(kafka_config) as raw:
        raw.authenticate()
        answer = raw.request(ProduceRequest[8](transactional_id=None, acks=-1, timeout_ms=30_000, topic_data=[
            Topic(name=topic, partition_data=[Topic.PartitionProduceData(
                index=0, records=encode_marker(7, 0, True, 0, 1))])]), ProduceResponse)
    part = answer.responses[0].partition_responses[0]
    assert part.error_code == 87 and "control batches" in part.error_message  # INVALID_RECORD
    assert raylog_client.offsets(topic, 0) == before
    assert [m.value for m in raylog_read(raylog_client, topic, 1)] == [b"kept"]


def test_kafka_pythons_transactional_producer_commits_and_aborts(raylog_client, coordinator):
    import kafka

    topic, source = _topic(raylog_client), _topic(raylog_client, 1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    config = raylog_client.kafka_config(dialect="kafka-python")
    producer = kafka.KafkaProducer(**config, transactional_id=f"tx-{uuid.uuid4().hex[:8]}")
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, value=b"k0", partition=0)
        producer.send(topic, value=b"k1", partition=1)
        producer.send_offsets_to_transaction({kafka.TopicPartition(source, 0): kafka.OffsetAndMetadata(9, "", -1)},
                                             group)
        producer.commit_transaction()
        producer.begin_transaction()
        producer.send(topic, value=b"dropped", partition=0)
        producer.flush()  # stored, then aborted (an abort drops what is not sent yet)
        producer.abort_transaction()
    finally:
        producer.close(timeout=10)
    assert sorted(m.value for m in raylog_read(raylog_client, topic, 3)) == [b"dropped", b"k0", b"k1"]
    assert _committed(raylog_client.kafka_config(), group, source, [0]) == [9]
    batches = _log_batches(raylog_client, topic, 0)
    assert [b[0] for b in batches] == ["data", "marker", "data", "marker"], batches
    assert (batches[1][3], batches[3][3]) == (True, False)
    assert batches[0][2] == batches[2][2], "kafka-python keeps its epoch across transactions (EndTxn below 5)"
