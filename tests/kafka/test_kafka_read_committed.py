"""The Kafka Fetch with isolation_level 1 (read_committed): answered up to
the last stable offset with the aborted transactions named, so that
confluent-kafka with ``isolation.level=read_committed`` sees what raylog's
read_committed consumer sees; the data written by raylog's transactional
producer, on real Ray and ZooKeeper."""

from __future__ import annotations

import time

import pytest

from tests.consumer.test_consumer_read_committed import by_partition, poll_until, write_history

confluent_kafka = pytest.importorskip("confluent_kafka")

pytestmark = pytest.mark.timeout(600)

WAIT_S = 60


@pytest.fixture(scope="module", autouse=True)
def coordinator_stopped_after(raylog_client):
    from raylog.actors.transaction_coordinator import stop_transaction_coordinator

    yield
    stop_transaction_coordinator(raylog_client.settings.cluster)


def _confluent_read(config: dict, topic: str, isolation: str, count: int, settle_s: float = 2.0) -> dict:
    consumer = confluent_kafka.Consumer({**config, "group.id": f"rc-{isolation}", "enable.auto.commit": False,
                                         "isolation.level": isolation, "fetch.wait.max.ms": 200})
    consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in (0, 1)])
    got: dict[int, list] = {}
    deadline = time.monotonic() + WAIT_S
    settle = None
    try:
        while time.monotonic() < deadline and (settle is None or time.monotonic() < settle):
            msg = consumer.poll(0.5)
            if msg is not None:
                assert msg.error() is None, msg.error()
                got.setdefault(msg.partition(), []).append((msg.offset(), msg.value()))
            if settle is None and sum(map(len, got.values())) >= count:
                settle = time.monotonic() + settle_s  # then nothing more may come
    finally:
        consumer.close()
    for values in got.values():
        assert [o for o, _ in values] == sorted(o for o, _ in values)
    return got


def test_confluent_read_committed_gets_what_raylogs_read_committed_consumer_gets(raylog_client, make_topic,
                                                                                 listeners, kafka_config):
    """Seen red before the fix: the Fetch named no aborted transaction and
    answered up to the high watermark."""
    topic = make_topic(2)
    expected = write_history(raylog_client, topic, "kafka-rc-history")
    ours = raylog_client.consumer(topic, auto_offset_reset="earliest", isolation_level="read_committed")
    try:
        raylog_got = poll_until(ours, sum(map(len, expected["committed"].values())))
    finally:
        ours.close()
    assert by_partition(raylog_got) == expected["committed"]
    raylog_pairs = {p: [(m.offset, m.value) for m in raylog_got if m.partition == p] for p in (0, 1)}

    committed = _confluent_read(kafka_config, topic, "read_committed", sum(map(len, expected["committed"].values())))
    assert committed == raylog_pairs
    uncommitted = _confluent_read(kafka_config, topic, "read_uncommitted",
                                  sum(map(len, expected["uncommitted"].values())))
    assert {p: [v for _, v in values] for p, values in uncommitted.items()} == expected["uncommitted"]


def test_confluent_read_committed_is_held_by_an_open_transaction(raylog_client, make_topic, listeners,
                                                                 kafka_config):
    topic = make_topic(2)
    plain = raylog_client.producer(linger_ms=1)
    txn = raylog_client.producer(transactional_id="kafka-rc-open", linger_ms=1)
    try:
        for p in (0, 1):
            plain.send(topic, b"before", partition=p)
        plain.flush(WAIT_S)
        txn.begin_transaction()
        for p in (0, 1):
            txn.send(topic, b"open", partition=p)
        txn.flush(WAIT_S)
        for p in (0, 1):
            plain.send(topic, b"after", partition=p)
        plain.flush(WAIT_S)
        held = _confluent_read(kafka_config, topic, "read_committed", 2)
        assert {p: [v for _, v in values] for p, values in held.items()} == {0: [b"before"], 1: [b"before"]}
        txn.commit_transaction()
        done = _confluent_read(kafka_config, topic, "read_committed", 6)
        assert {p: [v for _, v in values] for p, values in done.items()} == \
            {p: [b"before", b"open", b"after"] for p in (0, 1)}
    finally:
        txn.close()
        plain.close()
