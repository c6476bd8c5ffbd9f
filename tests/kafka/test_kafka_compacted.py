"""A compacted topic through the Kafka front door (docs/design.md sections 3
and 10; issue 46): made with confluent-kafka's AdminClient
(``cleanup.policy=compact``, small segments), written by a confluent-kafka
producer (many values over few keys, tombstones), cleaned by the partition's
own cleaner thread, then read from the log start by confluent-kafka and
kafka-python consumers: exactly the records raylog's own consumer reads (the
latest value of each key, tombstones kept while ``delete.retention.ms``
lasts), at the same offsets, with the cleaner's gaps; both of the
listener's read paths (sendfile from the segment file after LOCATE, and the
relayed read through the data channel); and a Fetch at an offset the cleaner
removed, answered from the next kept record. Real ZooKeeper, Ray,
partition, listener and clients."""

from __future__ import annotations

import os
import shutil
import time
import uuid

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")

from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

pytestmark = pytest.mark.timeout(600)

WAIT_S = 120.0
RECORDS = 4_000
KEYS = 40
TOMBSTONED = 10  # keys 0 .. 9 end with a tombstone


def _value(i: int) -> bytes:
    return b"value-%05d-" % i + b"x" * (i % 50)


def _log_dir(raylog_client, topic: str) -> str:
    return raylog_client.registry.placement(topic, 0)["log_dir"]


def _raylog_records(raylog_client, topic: str) -> list[tuple[int, bytes, bytes | None]]:
    end = raylog_client.end_offsets(topic)[0]
    consumer = raylog_client.consumer(topic, auto_offset_reset="earliest")
    got = []
    try:
        deadline = time.monotonic() + WAIT_S
        while True:
            batch = consumer.poll(timeout_ms=500)
            got += batch
            if got and got[-1].next_offset >= end and not batch:
                return [(m.offset, m.key, m.value) for m in got]
            assert time.monotonic() < deadline, "raylog's consumer did not reach the log end"
    finally:
        consumer.close()


@pytest.fixture(scope="module")
def compacted(raylog_client, listeners):
    """``(topic, produced offsets, raylog's records after cleaning)``."""
    config = raylog_client.kafka_config()
    admin = AdminClient(config)
    topic = f"kc-{uuid.uuid4().hex[:12]}"
    futures = admin.create_topics([NewTopic(topic, num_partitions=1, config={
        "cleanup.policy": "compact", "segment.bytes": "16384", "max.message.bytes": "8192",
        "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "86400000"})], operation_timeout=WAIT_S)
    assert futures[topic].result(timeout=WAIT_S) is None
    produced = {}
    errors = []

    def delivered(err, msg):
        if err is not None:
            errors.append(err)
        else:
            produced[msg.offset()] = (msg.key(), msg.value())

    # two idempotent producers, one after the other: the cleaner keeps an empty batch of the first one's
    # last batch (every record of it rewritten by the second), which Kafka's consumers must pass over
    for part in range(2):
        producer = confluent_kafka.Producer({**config, "acks": "all", "linger.ms": 5, "batch.size": 4000,
                                             "enable.idempotence": True})
        for i in range(part * RECORDS // 2, (part + 1) * RECORDS // 2):
            key = i % KEYS
            tombstone = key < TOMBSTONED and i >= RECORDS - 2 * KEYS
            producer.produce(topic, None if tombstone else _value(i), key=b"key-%02d" % key, partition=0,
                             on_delivery=delivered)
            producer.poll(0)
        assert producer.flush(WAIT_S) == 0 and not errors, errors
    latest = {}
    for offset in sorted(produced):
        key, value = produced[offset]
        latest[key] = value
    assert sum(value is None for value in latest.values()) == TOMBSTONED

    # the cleaner thread (every 15 s at most) cleans the closed segments: wait for its index files
    # and for the records read to settle below what was written
    directory = _log_dir(raylog_client, topic)
    deadline = time.monotonic() + 240
    before = None
    while True:
        cleaned = [n for n in os.listdir(directory) if n.endswith(".index")]
        records = _raylog_records(raylog_client, topic)
        assert {key: value for _, key, value in records} == latest
        if cleaned and len(records) < RECORDS // 4 and records == before:
            break
        before = records
        assert time.monotonic() < deadline, f"the cleaner did not clean ({len(records)} records, {cleaned})"
        time.sleep(3)
    return topic, produced, records


def _empty_batches(raylog_client, topic: str) -> int:
    """The empty batches (count 0) in the partition's segment files."""
    from raylog.storage.record_batch import iter_batches

    directory = _log_dir(raylog_client, topic)
    found = 0
    for name in os.listdir(directory):
        if name.endswith(".log"):
            with open(os.path.join(directory, name), "rb") as f:
                found += sum(1 for _pos, header in iter_batches(f.read()) if header.count == 0)
    return found


def _confluent(config: dict, topic: str, offset: int, until: int) -> list[tuple[int, bytes, bytes | None]]:
    """Records from ``offset`` up to the one at ``until`` (included)."""
    consumer = confluent_kafka.Consumer({**config, "group.id": f"g-{uuid.uuid4().hex[:8]}",
                                         "enable.auto.commit": False, "fetch.wait.max.ms": 100,
                                         "max.partition.fetch.bytes": 4096})
    got = []
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, 0, offset)])
        deadline = time.monotonic() + WAIT_S
        while (not got or got[-1][0] < until) and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=1000, timeout=1.0):
                assert msg.error() is None, msg.error()
                got.append((msg.offset(), msg.key(), msg.value()))
    finally:
        consumer.close()
    return got


def _kafka_python(config: dict, topic: str, offset: int, until: int) -> list[tuple[int, bytes, bytes | None]]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=config["bootstrap.servers"].split(","), security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-256", sasl_plain_username=config["sasl.username"],
        sasl_plain_password=config["sasl.password"], enable_auto_commit=False, group_id=None,
        max_partition_fetch_bytes=4096)
    got = []
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, offset)
        deadline = time.monotonic() + WAIT_S
        while (not got or got[-1][0] < until) and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=1000).values():
                got.extend((r.offset, r.key, r.value) for r in records)
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


def _relay_reads(raylog_client, topic: str) -> None:
    """Every segment file replaced by a copy of itself (same bytes, another
    inode): a LOCATE names the file the partition holds open, which the path
    no longer is, so the listener reads the batches through the data
    channel."""
    directory = _log_dir(raylog_client, topic)
    for name in sorted(os.listdir(directory)):
        if name.endswith(".log"):
            path = os.path.join(directory, name)
            shutil.copyfile(path, path + ".copy")
            os.replace(path + ".copy", path)


@pytest.mark.parametrize("path", ["sendfile", "relayed"])  # in this order: "relayed" replaces the files
def test_kafka_consumers_read_a_cleaned_topic_as_raylog_does(raylog_client, kafka_config, listeners, compacted,
                                                            path):
    topic, produced, records = compacted
    offsets = [offset for offset, _, _ in records]
    assert offsets == sorted(set(offsets))
    removed = sorted(set(produced) - set(offsets))
    assert removed and removed[0] < offsets[-1]  # the cleaner left gaps below the kept records
    assert _empty_batches(raylog_client, topic) > 0  # and empty batches of the producer's last batches
    if path == "relayed":
        _relay_reads(raylog_client, topic)
    before = _listener_stats(raylog_client, listeners)
    for read in (_confluent, _kafka_python):
        got = read(kafka_config, topic, 0, offsets[-1])
        assert got == records, read.__name__
        assert all(produced[offset] == (key, value) for offset, key, value in got)
    after = _listener_stats(raylog_client, listeners)
    from_files = after["fetch_bytes_sent_from_files"] - before["fetch_bytes_sent_from_files"]
    relayed = after["fetch_bytes_relayed"] - before["fetch_bytes_relayed"]
    if path == "sendfile":
        assert from_files > 0 and relayed == 0
    else:
        assert relayed > 0


@pytest.mark.parametrize("client", ["confluent-kafka", "kafka-python"])
def test_a_fetch_at_a_removed_offset_starts_at_the_next_kept_record(raylog_client, kafka_config, listeners,
                                                                   compacted, client):
    topic, produced, records = compacted
    kept = [offset for offset, _, _ in records]
    removed = sorted(set(produced) - set(kept))
    # removed records spread over the cleaned segments, each followed by a kept one
    picks = [r for r in removed if r < kept[-1]]
    picks = picks[:: max(1, len(picks) // 5)][:5]
    assert picks
    read = _confluent if client == "confluent-kafka" else _kafka_python
    for offset in picks:
        following = [record for record in records if record[0] > offset]
        got = read(kafka_config, topic, offset, following[0][0])
        assert got and got[0] == following[0], (offset, got[:1], following[:1])
        assert got == following[:len(got)]


def test_a_record_without_a_key_is_refused_and_the_topic_keeps_what_it_had(raylog_client, kafka_config, compacted):
    topic, _, records = compacted
    errors = []
    producer = confluent_kafka.Producer({**kafka_config, "acks": "all", "retries": 0})
    producer.produce(topic, b"no key", partition=0, on_delivery=lambda err, msg: errors.append(err))
    assert producer.flush(WAIT_S) == 0
    [err] = errors
    assert err is not None and err.code() == confluent_kafka.KafkaError.INVALID_RECORD, err
    assert _raylog_records(raylog_client, topic) == records
