"""client.add_partitions (raylog.admin.topics.TopicAdmin.add_partitions) on
a real ZooKeeper and Ray: a live topic grows, the new partitions are placed,
recorded and served; a producer made before the change sends to them (by
partition and by key), a consumer and a consumer group read them; bad totals
are refused with a typed error and the topic and its data stay as they were."""

from __future__ import annotations

import os
import uuid

import pytest

from raylog.errors import ArgumentTypeError, ConfigNotLiveError, InvalidPartitionsError, UnknownTopicError
from raylog.testing.clusters import wait_until

WAIT_S = 60.0


def _read(consumer, want: int, timeout_s: float = WAIT_S) -> list:
    got = []
    assert wait_until(lambda: got.extend(consumer.poll(200)) or len(got) >= want, timeout_s), got
    return got


# -------------------------------------------------------------- failures first


@pytest.mark.parametrize("total", [1, 2, 0, -3])
def test_a_total_not_larger_than_now_is_refused_naming_the_count_and_keeps_the_data(raylog_client, make_topic,
                                                                                    total):
    topic = make_topic(partitions=2)
    producer = raylog_client.producer(acks=1)
    for p in (0, 1):
        producer.send(topic, b"kept-%d" % p, partition=p)
    producer.flush(30)
    before = raylog_client.describe_topic(topic)
    with pytest.raises(InvalidPartitionsError, match="has 2 partitions") as caught:
        raylog_client.add_partitions(topic, total)
    assert caught.value.current == 2
    after = raylog_client.describe_topic(topic)
    assert after["config"] == before["config"] and len(after["partitions"]) == 2
    assert [row["high_watermark"] for row in after["partitions"]] == [
        row["high_watermark"] for row in before["partitions"]]
    assert raylog_client.metadata.partitions(topic) == 2
    consumer = raylog_client.consumer(topic, auto_offset_reset="earliest")
    assert sorted(m.value for m in _read(consumer, 2)) == [b"kept-0", b"kept-1"]
    consumer.close()
    producer.close()


def test_a_total_above_the_bound_a_wrong_type_and_an_unknown_topic_are_refused(raylog_client, make_topic):
    from raylog.admin.topics import MAX_PARTITIONS

    topic = make_topic(partitions=1)
    with pytest.raises(InvalidPartitionsError, match=str(MAX_PARTITIONS)):
        raylog_client.add_partitions(topic, MAX_PARTITIONS + 1)
    with pytest.raises(ArgumentTypeError, match="must be an int"):
        raylog_client.add_partitions(topic, "3")
    with pytest.raises(UnknownTopicError):
        raylog_client.add_partitions(f"t-{uuid.uuid4().hex[:12]}", 3)
    assert raylog_client.describe_topic(topic)["config"].partitions == 1
    # alter_topic still refuses the count, pointing here
    with pytest.raises(ConfigNotLiveError, match="add_partitions"):
        raylog_client.alter_topic(topic, partitions=3)


# -------------------------------------------------------------- what works


def test_added_partitions_are_recorded_served_and_written_by_a_producer_made_before(raylog_client, make_topic):
    topic = make_topic(partitions=2, retention_ms=3_600_000)
    producer = raylog_client.producer(acks=1)
    producer.send(topic, b"before", partition=1).result(30)

    config = raylog_client.add_partitions(topic, 5)
    assert config.partitions == 5 and config.retention_ms == 3_600_000  # the topic's settings kept
    assert raylog_client.metadata.partitions(topic) == 5
    described = raylog_client.describe_topic(topic)
    assert [row["partition"] for row in described["partitions"]] == [0, 1, 2, 3, 4]
    home = os.path.dirname(described["partitions"][0]["log_dir"])  # beside the topic's first
    assert all(row["served"] and row["node"] and row["log_dir"] == os.path.join(home, f"{topic}-{row['partition']}")
               for row in described["partitions"])

    # the producer made before the change: a new partition by number at once
    assert producer.send(topic, b"to-4", partition=4).result(30).partition == 4
    # and keys over the new count (its metadata's watch)
    assert wait_until(lambda: producer._acc.partitions(topic) == 5, 30)  # noqa: SLF001 - the producer's own count
    keys = [b"key-%d" % i for i in range(200)]
    futures = [producer.send(topic, b"v", key=key) for key in keys]
    producer.flush(30)
    landed = {f.result(0).partition for f in futures}
    assert landed & {2, 3, 4}, "no key went to a new partition"
    from raylog.producer.partitioner import partition_for_key

    assert [f.result(0).partition for f in futures] == [partition_for_key(k, 5) for k in keys]

    # a consumer without a group, assigned all partitions after the change, reads them all
    consumer = raylog_client.consumer(topic, auto_offset_reset="earliest")
    got = _read(consumer, 202)
    assert sorted({m.partition for m in got}) == sorted({1, 4} | landed)
    assert {m.value for m in got if m.partition == 4} >= {b"to-4"}
    consumer.close()
    producer.close()


def test_a_consumer_group_rebalances_over_the_added_partitions(raylog_client, make_topic):
    topic = make_topic(partitions=1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    first = raylog_client.consumer(topic, group=group, auto_offset_reset="earliest")
    second = raylog_client.consumer(topic, group=group, auto_offset_reset="earliest")
    try:
        assert wait_until(lambda: (first.poll(100), second.poll(100)) and
                   len(first.assignment()) + len(second.assignment()) == 1, WAIT_S)
        raylog_client.add_partitions(topic, 4)
        # the members' watch on the topic sees the new count: range assignment over 4
        assert wait_until(lambda: (first.poll(100), second.poll(100)) and
                   sorted(first.assignment() | second.assignment()) == [(topic, p) for p in range(4)]
                   and len(first.assignment()) == len(second.assignment()) == 2, WAIT_S)
        producer = raylog_client.producer(acks=1)
        for p in range(4):
            producer.send(topic, b"p%d" % p, partition=p)
        producer.flush(30)
        producer.close()
        got = []
        assert wait_until(lambda: got.extend(first.poll(100) + second.poll(100)) or len(got) >= 4, WAIT_S)
        assert sorted((m.partition, m.value) for m in got) == [(p, b"p%d" % p) for p in range(4)]
    finally:
        first.close()
        second.close()
