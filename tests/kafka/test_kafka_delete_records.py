"""DeleteRecords through the Kafka front door (raylog.kafka.admin, issue 49)
with kafka-python's KafkaAdminClient, confluent-kafka's AdminClient and raw
requests, on real ZooKeeper, Ray and sockets: a partition's records before
the offset asked are deleted as ``client.delete_records`` deletes them,
checked against raylog's own view (``client.offsets``) and Kafka's
(ListOffsets earliest, a consumer from earliest, a Fetch below the start);
an offset past the high watermark, an unknown topic or partition and a
partition named twice are refused per partition and nothing changes; a
request naming too many partitions closes the connection; every served
version answers."""

from __future__ import annotations

import uuid

import pytest

from raylog.testing.clusters import wait_until

confluent_kafka = pytest.importorskip("confluent_kafka")

from confluent_kafka import TopicPartition as ConfluentPartition  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402

from tests.kafka.kafka_raw import RawKafka  # noqa: E402

WAIT_S = 120.0


def _topic(client, partitions: int = 1) -> str:
    name = f"kd-{uuid.uuid4().hex[:12]}"
    client.create_topic(name, partitions=partitions)
    return name


def _sasl(kafka_config) -> dict:
    return dict(bootstrap_servers=kafka_config["bootstrap.servers"].split(","), security_protocol="SASL_PLAINTEXT",
                sasl_mechanism="SCRAM-SHA-256", sasl_plain_username=kafka_config["sasl.username"],
                sasl_plain_password=kafka_config["sasl.password"])


def _produce(kafka_config, name: str, partition: int, count: int, per_batch: int = 5) -> list[int]:
    """Kafka record batches of ``per_batch`` records (kafka-python's producer, acks all: below the high
    watermark when acknowledged); the offsets stored."""
    from kafka import KafkaProducer

    producer = KafkaProducer(**_sasl(kafka_config), acks="all", linger_ms=10_000, batch_size=1 << 20)
    offsets = []
    try:
        for first in range(0, count, per_batch):
            futures = [producer.send(name, b"v-%03d" % i, partition=partition)
                       for i in range(first, min(count, first + per_batch))]
            producer.flush(WAIT_S)
            offsets += [f.get(timeout=WAIT_S).offset for f in futures]
    finally:
        producer.close()
    return offsets


def _consume_from_earliest(kafka_config, name: str, partition: int, want: int, seek: int | None = None) -> list:
    """(offset, value) of what a kafka-python consumer from earliest gets
    (``seek``: it asks for that offset first)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(**_sasl(kafka_config), auto_offset_reset="earliest", enable_auto_commit=False)
    tp = TopicPartition(name, partition)
    got = []
    try:
        consumer.assign([tp])
        if seek is not None:
            consumer.seek(tp, seek)

        def more():
            for records in consumer.poll(timeout_ms=500).values():
                got.extend((r.offset, r.value) for r in records)
            return len(got) >= want

        assert wait_until(more, WAIT_S), got
        for records in consumer.poll(timeout_ms=500).values():
            got.extend((r.offset, r.value) for r in records)
    finally:
        consumer.close()
    return got


def _delete_raw(kafka_config, version: int, entries, timeout_ms: int = 30_000):
    """A raw DeleteRecords of ``entries`` ``[(topic, [(partition, offset)])]``;
    ``{(topic, partition): (error_code, low_watermark)}``."""
    from kafka.protocol.admin import DeleteRecordsRequest, DeleteRecordsResponse

    Topic = DeleteRecordsRequest.DeleteRecordsTopic
    Partition = Topic.DeleteRecordsPartition
    topics = [Topic(name=name, partitions=[Partition(partition_index=p, offset=o) for p, o in parts])
              for name, parts in entries]
    with RawKafka(kafka_config) as raw:
        raw.authenticate()
        answer = raw.request(DeleteRecordsRequest[version](topics=topics, timeout_ms=timeout_ms),
                             DeleteRecordsResponse)
    return [((t.name, p.partition_index), (p.error_code, p.low_watermark)) for t in answer.topics
            for p in t.partitions]


def _fetch(kafka_config, name: str, offset: int) -> tuple[int, int, bytes]:
    """A raw Fetch (version 5, the first with log_start_offset) of partition
    0 at ``offset``: ``(error_code, log_start_offset, records)``."""
    from kafka.protocol.consumer import FetchRequest, FetchResponse

    FetchTopic = FetchRequest.FetchTopic
    with RawKafka(kafka_config) as raw:
        raw.authenticate()
        answer = raw.request(FetchRequest[5](
            replica_id=-1, max_wait_ms=100, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
            topics=[FetchTopic(topic=name, partitions=[FetchTopic.FetchPartition(
                partition=0, fetch_offset=offset, log_start_offset=-1, partition_max_bytes=1 << 20)])]),
            FetchResponse)
    part = answer.responses[0].partitions[0]
    return part.error_code, part.log_start_offset, bytes(part.records or b"")


# -------------------------------------------------------------- failures first


def test_bad_partitions_are_refused_each_on_its_own_and_nothing_changes(raylog_client, kafka_config):
    name = _topic(raylog_client, partitions=2)
    offsets = _produce(kafka_config, name, 0, 10)
    hw = raylog_client.offsets(name, 0)[1]
    missing = f"kd-{uuid.uuid4().hex[:12]}"
    answer = _delete_raw(kafka_config, 1, [(name, [(0, hw + 1), (5, 0), (1, 0), (1, 0)]), (missing, [(0, 0)])])
    assert answer == [
        ((name, 0), (1, -1)),  # OFFSET_OUT_OF_RANGE: past the high watermark
        ((name, 5), (3, -1)),  # UNKNOWN_TOPIC_OR_PARTITION
        ((name, 1), (42, -1)), ((name, 1), (42, -1)),  # INVALID_REQUEST: named twice
        ((missing, 0), (3, -1)),
    ]
    assert raylog_client.offsets(name, 0) == (0, hw)
    assert [o for o, _v in _consume_from_earliest(kafka_config, name, 0, 10)] == offsets
    assert missing not in raylog_client.list_topics()


def test_too_many_partitions_in_one_request_close_the_connection_and_delete_nothing(raylog_client, kafka_config):
    from kafka.protocol.admin import DeleteRecordsRequest

    from raylog.kafka.admin import MAX_PARTITIONS

    name = _topic(raylog_client)
    _produce(kafka_config, name, 0, 5)
    before = raylog_client.offsets(name, 0)
    Topic = DeleteRecordsRequest.DeleteRecordsTopic
    many = [Topic(name=name, partitions=[Topic.DeleteRecordsPartition(partition_index=0, offset=-1)] * (
        MAX_PARTITIONS + 1))]
    with RawKafka(kafka_config) as raw:
        raw.authenticate()
        request = DeleteRecordsRequest[1](topics=many, timeout_ms=1000)
        request.with_header(correlation_id=7, client_id="raw")
        raw.sock.sendall(bytes(request.encode(header=True, framed=True)))
        assert raw.read_frame() is None
    assert raylog_client.offsets(name, 0) == before


class _RefusingTopics:
    """A topic administration whose ``delete_records`` raises the error named
    by the partition index (the answer's mapping, without a cluster)."""

    def __init__(self, errors):
        self.errors = errors

    def delete_records(self, topic, offsets, timeout_s):
        (partition, _offset), = offsets.items()
        raise self.errors[partition]


def test_each_refusal_is_answered_with_its_kafka_code():
    from types import SimpleNamespace

    from kafka.protocol.admin import DeleteRecordsRequest

    from raylog.errors import (
        BrokerUnavailableError,
        NotOwnerError,
        OffsetOutOfRangeError,
        RequestTimeoutError,
        UnknownPartitionError,
    )
    from raylog.kafka.admin import delete_records

    errors = [OffsetOutOfRangeError("past"), UnknownPartitionError("none"), NotOwnerError("moved"),
              BrokerUnavailableError("starting"), RequestTimeoutError("slow")]
    Topic = DeleteRecordsRequest.DeleteRecordsTopic
    body = DeleteRecordsRequest[1](topics=[Topic(name="t", partitions=[
        Topic.DeleteRecordsPartition(partition_index=p, offset=5) for p in range(5)])], timeout_ms=1000)
    answer = delete_records(SimpleNamespace(topics=_RefusingTopics(errors)), body, 1)
    # OFFSET_OUT_OF_RANGE, UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER_OR_FOLLOWER twice, REQUEST_TIMED_OUT
    assert [(p.partition_index, p.error_code, p.low_watermark) for p in answer.topics[0].partitions] == [
        (0, 1, -1), (1, 3, -1), (2, 6, -1), (3, 6, -1), (4, 7, -1)]
    unserved = delete_records(SimpleNamespace(topics=None), body, 1)  # a listener without topic administration
    assert {p.error_code for p in unserved.topics[0].partitions} == {31}  # CLUSTER_AUTHORIZATION_FAILED


# -------------------------------------------------------------- what works


@pytest.mark.parametrize("version", [0, 1, 2])
def test_every_served_version_deletes_and_answers_the_new_low_watermark(raylog_client, kafka_config, version):
    name = _topic(raylog_client)
    offsets = _produce(kafka_config, name, 0, 10)
    assert _delete_raw(kafka_config, version, [(name, [(0, offsets[6])])]) == [((name, 0), (0, offsets[6]))]
    assert raylog_client.offsets(name, 0)[0] == offsets[6]


def test_kafka_python_admin_deletes_records_inside_a_batch(raylog_client, kafka_config):
    from kafka import KafkaConsumer, TopicPartition
    from kafka.admin import KafkaAdminClient

    name = _topic(raylog_client)
    offsets = _produce(kafka_config, name, 0, 20, per_batch=5)
    target = offsets[7]  # the third record of the second batch
    assert offsets[5] < target < offsets[9]
    admin = KafkaAdminClient(**_sasl(kafka_config))
    try:
        result = admin.delete_records({TopicPartition(name, 0): target})
    finally:
        admin.close()
    assert result[TopicPartition(name, 0)]["low_watermark"] == target
    # raylog's own view
    assert raylog_client.offsets(name, 0)[0] == target
    assert raylog_client.describe_topic(name)["partitions"][0]["log_start_offset"] == target
    # Kafka's: ListOffsets earliest, a consumer from earliest, a Fetch below the start
    consumer = KafkaConsumer(**_sasl(kafka_config))
    try:
        assert consumer.beginning_offsets([TopicPartition(name, 0)]) == {TopicPartition(name, 0): target}
    finally:
        consumer.close()
    assert _consume_from_earliest(kafka_config, name, 0, 13) == [(o, b"v-%03d" % i) for i, o in enumerate(offsets)
                                                                 if i >= 7]
    # a Fetch below the start: OFFSET_OUT_OF_RANGE with the partition's log start; at the start: its batch
    assert _fetch(kafka_config, name, offsets[2])[:2] == (1, target)
    code, log_start_offset, records = _fetch(kafka_config, name, target)
    assert (code, log_start_offset) == (0, target) and records[:8] == offsets[5].to_bytes(8, "big")
    # a fetch of offsets[2] is out of range: the consumer resets to earliest and gets the start on
    assert _consume_from_earliest(kafka_config, name, 0, 13, seek=offsets[2])[0] == (target, b"v-007")
    # raylog's consumer from earliest: the records at and after the start only
    own = raylog_client.consumer(name, auto_offset_reset="earliest")
    got = []
    try:
        assert wait_until(lambda: got.extend(own.poll(200)) or len(got) >= 13, WAIT_S), got
    finally:
        own.close()
    assert [m.value for m in got] == [b"v-%03d" % i for i in range(7, 20)]


def test_confluent_admin_deletes_records_to_the_high_watermark(raylog_client, kafka_config):
    name = _topic(raylog_client)
    _produce(kafka_config, name, 0, 10)
    hw = raylog_client.offsets(name, 0)[1]
    admin = AdminClient(kafka_config)
    futures = admin.delete_records([ConfluentPartition(name, 0, -1)])  # OFFSET_END: everything
    deleted = next(iter(futures.values())).result(timeout=WAIT_S)
    assert deleted.low_watermark == hw
    assert raylog_client.offsets(name, 0) == (hw, hw)
