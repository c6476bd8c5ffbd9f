"""client.delete_records (raylog.admin.topics.TopicAdmin.delete_records,
Kafka's DeleteRecords) on a real ZooKeeper and Ray: each partition's log
start moves to the offset asked, a consumer from earliest and the
partition's offsets start there; bad requests are refused with a typed
error and nothing of any partition changes."""

from __future__ import annotations

import pytest

from raylog.errors import ArgumentTypeError, OffsetOutOfRangeError, UnknownPartitionError, UnknownTopicError
from raylog.testing.clusters import wait_until

WAIT_S = 60.0


def _fill(client, topic: str, partitions: int, count: int) -> None:
    producer = client.producer(acks=1)
    for p in range(partitions):
        for i in range(count):
            producer.send(topic, b"%d-%03d" % (p, i), partition=p)
    producer.flush(30)
    producer.close()


def _read_all(client, topic: str, want: int) -> list:
    consumer = client.consumer(topic, auto_offset_reset="earliest")
    got = []
    try:
        assert wait_until(lambda: got.extend(consumer.poll(200)) or len(got) >= want, WAIT_S), got
        assert not consumer.poll(300)  # nothing more
    finally:
        consumer.close()
    return got


# -------------------------------------------------------------- failures first


def test_an_offset_past_the_high_watermark_is_refused_naming_the_bounds_and_nothing_changes(raylog_client,
                                                                                            make_topic):
    topic = make_topic(partitions=2)
    _fill(raylog_client, topic, 2, 10)
    before = [raylog_client.offsets(topic, p) for p in (0, 1)]
    everything = _read_all(raylog_client, topic, 20)
    middle = sorted(m.offset for m in everything if m.partition == 0)[5]
    hw1 = before[1][1]
    with pytest.raises(OffsetOutOfRangeError, match=rf"outside \[0, {hw1}\]") as caught:
        raylog_client.delete_records(topic, {0: middle, 1: hw1 + 1})
    assert caught.value.details["latest"] == hw1 and caught.value.details["partition"] == 1
    assert [raylog_client.offsets(topic, p) for p in (0, 1)] == before  # partition 0 untouched too
    assert sorted((m.partition, m.value) for m in _read_all(raylog_client, topic, 20)) == sorted(
        (m.partition, m.value) for m in everything)


def test_an_unknown_topic_partition_or_a_wrong_type_is_refused(raylog_client, make_topic):
    topic = make_topic(partitions=1)
    _fill(raylog_client, topic, 1, 3)
    before = raylog_client.offsets(topic, 0)
    with pytest.raises(UnknownTopicError):
        raylog_client.delete_records(topic + "-none", {0: 0})
    with pytest.raises(UnknownPartitionError, match="partitions 0..0"):
        raylog_client.delete_records(topic, {0: before[1], 1: 0})
    with pytest.raises(ArgumentTypeError, match="must be an int"):
        raylog_client.delete_records(topic, {0: "10"})
    assert raylog_client.offsets(topic, 0) == before


# -------------------------------------------------------------- the deletion


def test_records_before_the_offsets_are_gone_for_consumers_and_offsets(raylog_client, make_topic):
    topic = make_topic(partitions=2)
    _fill(raylog_client, topic, 2, 20)
    everything = _read_all(raylog_client, topic, 40)
    offsets0 = sorted(m.offset for m in everything if m.partition == 0)
    hw1 = raylog_client.offsets(topic, 1)[1]
    answer = raylog_client.delete_records(topic, {0: offsets0[7], 1: -1})
    assert answer == {0: offsets0[7], 1: hw1}
    assert raylog_client.offsets(topic, 0) == (offsets0[7], raylog_client.offsets(topic, 0)[1])
    assert raylog_client.offsets(topic, 1) == (hw1, hw1)
    rows = {row["partition"]: row for row in raylog_client.describe_topic(topic)["partitions"]}
    assert rows[0]["log_start_offset"] == offsets0[7] and rows[1]["log_start_offset"] == hw1
    got = _read_all(raylog_client, topic, 13)
    assert sorted(m.value for m in got) == [b"0-%03d" % i for i in range(7, 20)]
    assert raylog_client.count_messages(topic, 0, offsets0[7]) == 13
    # never backwards: an offset below the start answers the start
    assert raylog_client.delete_records(topic, {0: offsets0[2]}) == {0: offsets0[7]}
    # a restarted partition actor keeps the start (it is on disk)
    import ray

    actor = raylog_client.partition_actor(topic, 0)
    pid = ray.get(actor.pid.remote())
    ray.kill(actor, no_restart=False)
    assert wait_until(lambda: _pid_or_none(actor) not in (None, pid), WAIT_S)
    assert wait_until(lambda: _start_or_none(raylog_client, topic) is not None, WAIT_S)
    assert raylog_client.offsets(topic, 0)[0] == offsets0[7]
    assert [m.value for m in _read_all(raylog_client, topic, 13)][0] == b"0-007"


def _pid_or_none(actor):
    import ray

    try:
        return ray.get(actor.pid.remote(), timeout=5)
    except Exception:  # noqa: BLE001 - the actor restarting
        return None


def _start_or_none(client, topic):
    try:
        return client.offsets(topic, 0)[0]
    except Exception:  # noqa: BLE001 - the actor restarting
        return None
