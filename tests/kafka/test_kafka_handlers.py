"""The API handlers over a real listener: long polls (max wait, min bytes),
ListOffsets (earliest, latest, by time), acks=0, what is refused (headers,
snappy) with nothing stored, and Metadata."""

from __future__ import annotations

import struct
import threading
import time
import uuid

import pytest

from raylog.storage.record_batch import iter_batches
from kafka_raw import RawKafka

confluent_kafka = pytest.importorskip("confluent_kafka")

from kafka.protocol.consumer import FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse  # noqa: E402
from kafka.protocol.metadata import MetadataRequest, MetadataResponse  # noqa: E402
from kafka.record.default_records import DefaultRecordBatch  # noqa: E402

WAIT_S = 60.0


def _topic(raylog_client, partitions: int = 1) -> str:
    name = f"k-{uuid.uuid4().hex[:12]}"
    raylog_client.create_topic(name, partitions=partitions)
    return name


def _fetch(raw: RawKafka, topic: str, offset: int, *, max_wait_ms: int, min_bytes: int, version: int = 11,
           max_bytes: int = 1 << 20):
    FetchTopic = FetchRequest.FetchTopic
    request = FetchRequest[version](
        replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=1 << 20, isolation_level=0,
        session_id=0, session_epoch=-1, forgotten_topics_data=[], rack_id="",
        topics=[FetchTopic(topic=topic, partitions=[FetchTopic.FetchPartition(
            partition=0, current_leader_epoch=-1, fetch_offset=offset, log_start_offset=-1,
            partition_max_bytes=max_bytes)])])
    answer = raw.request(request, FetchResponse)
    part = answer.responses[0].partitions[0]
    records = []
    data = bytes(part.records or b"")
    pos = 0
    while len(data) - pos >= 61:
        size = 12 + int.from_bytes(data[pos + 8 : pos + 12], "big")
        if pos + size > len(data):
            break  # a batch cut by the answer's bound: clients skip it and fetch it whole next
        batch = DefaultRecordBatch(data[pos : pos + size])  # its own bytes: a codec reads to the buffer's end
        records.extend((r.offset, r.value) for r in batch)
        pos += batch.size_in_bytes
    return part, records


def test_a_long_poll_waits_for_data_and_returns_it(raylog_client, kafka_config):
    topic = _topic(raylog_client)
    with RawKafka(kafka_config) as raw:
        raw.authenticate()
        # nothing there: the poll ends empty (after at most its max wait)
        part, records = _fetch(raw, topic, 0, max_wait_ms=200, min_bytes=1)
        assert part.error_code == 0 and records == [] and part.high_watermark == 0
        # a poll waiting up to a minute gets the record produced meanwhile
        with raylog_client.producer() as producer:
            timer = threading.Timer(0.5, lambda: producer.send(topic, b"late", partition=0).result(WAIT_S))
            timer.start()
            part, records = _fetch(raw, topic, 0, max_wait_ms=int(WAIT_S * 1000), min_bytes=1)
            timer.join()
        assert records == [(0, b"late")]
        # min bytes larger than what there is: the poll waits for more until its max wait
        part, records = _fetch(raw, topic, 0, max_wait_ms=300, min_bytes=1 << 20)
        assert records == [(0, b"late")] and part.high_watermark > 0


@pytest.mark.parametrize("compression", ["gzip", "lz4", None])
def test_a_fetch_answers_at_most_the_bytes_asked_for_however_much_stored_bytes_inflate(raylog_client, kafka_config,
                                                                                      compression):
    """Record batches are passed as stored: a fetch answers at most its
    partition's max bytes, or one whole batch when that alone is larger (as
    Kafka does), and reading on from each answer's last offset + 1 gives
    every record once, in order."""
    topic = _topic(raylog_client)
    producer = raylog_client.producer(batch_size=200, linger_ms=50, compression=compression)
    values = [f"{i:05d}".encode() + b"y" * 95 for i in range(1_000)]
    for value in values:
        producer.send(topic, value, partition=0)
    producer.flush()
    producer.close()
    read, offset, answers = [], 0, 0
    with RawKafka(kafka_config) as raw:
        raw.authenticate()
        while len(read) < len(values) and answers < 2_000:
            part, records = _fetch(raw, topic, offset, max_wait_ms=0, min_bytes=1, max_bytes=4_000)
            answers += 1
            data = bytes(part.records or b"")
            assert len(data) <= 4_000 or len(list(iter_batches(data))) == 1, (len(data), len(records))
            if records:
                offset = _next_offset(data)
            read.extend(records)
    assert [v for _, v in read] == values
    assert [o for o, _ in read] == sorted({o for o, _ in read})
    if compression is None:
        assert answers >= 5  # 22 KB batches of 200: one per answer


def test_a_fetch_read_ahead_is_used_only_by_the_fetch_it_was_read_for(raylog_client, kafka_config):
    """After an answer that left data below the high watermark the listener
    reads the next answer ahead (Session.after_reply); a fetch of another
    offset or size, or one after more records arrived, still gets exactly
    what a fresh read gives."""
    topic = _topic(raylog_client)
    producer = raylog_client.producer(batch_size=20, linger_ms=20, compression="lz4")
    values = [f"{i:04d}".encode() + b"z" * 60 for i in range(400)]
    for value in values[:300]:
        producer.send(topic, value, partition=0)
    producer.flush()
    with RawKafka(kafka_config) as raw:
        raw.authenticate()
        deadline = time.monotonic() + WAIT_S
        while [v for _, v in _fetch(raw, topic, 0, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20)[1][-1:]] != [
                values[299]]:  # every one of the first 300 visible
            assert time.monotonic() < deadline
            time.sleep(0.05)
        part, first = _fetch(raw, topic, 0, max_wait_ms=0, min_bytes=1, max_bytes=2_000)
        after = _next_offset(bytes(part.records))
        assert 0 < len(first) < 300
        # another offset than the one read ahead: from the start again
        _, again = _fetch(raw, topic, 0, max_wait_ms=0, min_bytes=1, max_bytes=2_000)
        assert again == first
        # the offset read ahead, with another size: a fresh read of that size
        part, bigger = _fetch(raw, topic, after, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20)
        assert [v for _, v in bigger] == values[len(first):300]
        # more records after an answer was read ahead: the rest of them, in order, follow
        part, second = _fetch(raw, topic, after, max_wait_ms=0, min_bytes=1, max_bytes=2_000)
        for value in values[300:]:
            producer.send(topic, value, partition=0)
        producer.flush()
        read, offset = list(first) + list(second), _next_offset(bytes(part.records))
        for _ in range(200):
            if len(read) >= len(values):
                break
            part, more = _fetch(raw, topic, offset, max_wait_ms=1_000, min_bytes=1, max_bytes=2_000)
            if more:
                offset = _next_offset(bytes(part.records))
            read.extend(more)
    producer.close()
    assert [v for _, v in read] == values


def _next_offset(data: bytes) -> int:
    """The offset a client continues at after ``data``'s batches: the last batch's last offset + 1."""
    pos, last = 0, -1
    while len(data) - pos >= 61:
        base, length = struct.unpack_from(">qi", data, pos)
        if pos + 12 + length > len(data):
            break  # a cut last batch: fetched whole next
        last = base + struct.unpack_from(">i", data, pos + 23)[0]  # lastOffsetDelta
        pos += 12 + length
    return last + 1


def test_list_offsets_earliest_latest_and_by_time(raylog_client, kafka_config):
    topic = _topic(raylog_client)
    with raylog_client.producer() as producer:
        for i, ts in enumerate([1_000, 2_000, 3_000]):
            producer.send(topic, f"v{i}".encode(), partition=0, timestamp_ms=ts)
        producer.flush(WAIT_S)
    consumer = raylog_client.consumer([topic], group=f"g-{uuid.uuid4().hex[:8]}", auto_offset_reset="earliest")
    got = []
    deadline = time.monotonic() + WAIT_S
    while len(got) < 3 and time.monotonic() < deadline:
        got.extend(consumer.poll(timeout_ms=1000))
    consumer.close()
    offsets = [m.offset for m in got]
    end = offsets[-1] + 1  # latest: after the last record (the high watermark is the next batch's position)
    Topic = ListOffsetsRequest.ListOffsetsTopic
    with RawKafka(kafka_config) as raw:
        raw.authenticate()
        for version in (1, 5):
            request = ListOffsetsRequest[version](replica_id=-1, isolation_level=0, topics=[Topic(
                name=topic, partitions=[Topic.ListOffsetsPartition(partition_index=0, timestamp=ts, current_leader_epoch=-1)
                                        for ts in (-2, -1, 1_500, 3_000, 9_000)])])
            answer = raw.request(request, ListOffsetsResponse)
            found = [(p.error_code, p.offset, p.timestamp) for p in answer.topics[0].partitions]
            assert found == [(0, 0, -1), (0, end, -1), (0, offsets[1], 2_000), (0, offsets[2], 3_000), (0, -1, -1)]
    # a Kafka client's offsets_for_times
    from kafka import KafkaConsumer, TopicPartition

    kp = KafkaConsumer(bootstrap_servers=kafka_config["bootstrap.servers"].split(","), security_protocol="SASL_PLAINTEXT",
                       sasl_mechanism="SCRAM-SHA-256", sasl_plain_username=kafka_config["sasl.username"],
                       sasl_plain_password=kafka_config["sasl.password"], group_id=None, enable_auto_commit=False)
    try:
        tp = TopicPartition(topic, 0)
        assert kp.offsets_for_times({tp: 2_500})[tp].offset == offsets[2]
    finally:
        kp.close()


def test_acks_zero_is_stored_without_an_answer(raylog_client, kafka_config):
    topic = _topic(raylog_client)
    producer = confluent_kafka.Producer({**kafka_config, "acks": 0, "linger.ms": 5})
    for i in range(50):
        producer.produce(topic, f"z{i}".encode(), partition=0)
    assert producer.flush(WAIT_S) == 0
    consumer = raylog_client.consumer([topic], group=f"g-{uuid.uuid4().hex[:8]}", auto_offset_reset="earliest")
    got = []
    deadline = time.monotonic() + WAIT_S
    while len(got) < 50 and time.monotonic() < deadline:
        got.extend(consumer.poll(timeout_ms=1000))
    consumer.close()
    assert [m.value for m in got] == [f"z{i}".encode() for i in range(50)]


@pytest.mark.parametrize("case", ["headers", "snappy"])
def test_what_format_1_could_not_store_is_stored_as_sent(raylog_client, kafka_config, case):
    """Headers and snappy were refused before format 2 (INVALID_RECORD,
    UNSUPPORTED_COMPRESSION_TYPE); a record batch is now stored as it came."""
    topic = _topic(raylog_client)
    reports = []
    extra = {"message.timeout.ms": 10_000}
    if case == "snappy":
        extra["compression.type"] = "snappy"
    producer = confluent_kafka.Producer({**kafka_config, **extra})
    value = b"compressible " * 100  # librdkafka sends a set uncompressed when compressing does not shrink it
    headers = [("h", b"v")] if case == "headers" else None
    producer.produce(topic, value, partition=0, headers=headers, on_delivery=lambda err, msg: reports.append(err))
    producer.flush(20)
    assert reports == [None]
    consumer = raylog_client.consumer([topic], group=f"g-{uuid.uuid4().hex[:8]}", auto_offset_reset="earliest")
    got = []
    deadline = time.monotonic() + WAIT_S
    while not got and time.monotonic() < deadline:
        got.extend(consumer.poll(timeout_ms=1000))
    consumer.close()
    assert [(m.value, list(m.headers)) for m in got] == [(value, headers or [])]


def test_metadata_names_the_listener_of_each_partition_and_unknown_topics(raylog_client, kafka_config, listeners):
    topic = _topic(raylog_client, partitions=3)
    with RawKafka(kafka_config) as raw:
        raw.authenticate()
        Topic = MetadataRequest.MetadataRequestTopic
        answer = raw.request(MetadataRequest[8](topics=[Topic(name=topic), Topic(name="no-such-topic")],
                                                allow_auto_topic_creation=True,
                                                include_cluster_authorized_operations=False,
                                                include_topic_authorized_operations=False), MetadataResponse)
    brokers = {b.node_id: (b.host, b.port) for b in answer.brokers}
    assert brokers == {e["broker_id"]: (e["host"], e["port"]) for e in listeners}
    by_name = {t.name: t for t in answer.topics}
    assert by_name["no-such-topic"].error_code == 3
    assert sorted(p.partition_index for p in by_name[topic].partitions) == [0, 1, 2]
    assert all(p.error_code == 0 and p.leader_id in brokers for p in by_name[topic].partitions)
    assert "no-such-topic" not in raylog_client.list_topics()  # never created


def test_errors_raylog_would_retry_are_answered_with_codes_kafka_clients_retry():
    """A Kafka client gives a message up on UNKNOWN_SERVER_ERROR; raylog's
    retriable errors never come out as that (a leader's host cut off left
    the new leader short of in-sync replicas for a moment: librdkafka failed
    every message it had sent meanwhile)."""
    from raylog import errors
    from raylog.kafka import handlers

    assert handlers.error_code(errors.NotEnoughReplicasError("2 of 3 in sync")) == handlers.NOT_ENOUGH_REPLICAS
    assert handlers.error_code(errors.ZooKeeperUnavailableError("away")) == handlers.REQUEST_TIMED_OUT
    assert handlers.error_code(errors.HandoffError("moving")) == handlers.REQUEST_TIMED_OUT
    assert handlers.error_code(errors.StaleEpochError("old")) == handlers.NOT_LEADER_OR_FOLLOWER
    assert handlers.error_code(errors.StorageError("EIO")) == handlers.KAFKA_STORAGE_ERROR
    assert handlers.error_code(errors.DiskFullError("full")) == handlers.KAFKA_STORAGE_ERROR
    # a batch over the partition's bound, refused before it was sent, as Kafka names it
    assert handlers.error_code(errors.FrameTooLargeError("big")) == handlers.MESSAGE_TOO_LARGE
    # what no retry mends stays an error the client gives up on
    assert handlers.error_code(errors.LogDirectoryLockedError("locked")) == handlers.UNKNOWN_SERVER_ERROR
    assert handlers.error_code(errors.ConfigError("bad")) == handlers.UNKNOWN_SERVER_ERROR
