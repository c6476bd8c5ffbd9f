"""A way past a corrupt message, end to end (real ZooKeeper, Ray, partition
actor): the error names the next readable offset, ``consumer.skip_corrupt()``
moves there, nothing else is skipped and the commit lands past the damage."""

from __future__ import annotations

import os

import pytest

from raylog.errors import CorruptMessageError
from raylog.testing.faults import flip_byte, message_size

from consumer_helpers import wait_for

SESSION_MS = 3000


def _produce(client, topic: str, values: list[bytes]) -> None:
    import ray

    producer = client.producer(batch_size=1, acks=1)  # a record batch each, all of one size
    for v in values:
        producer.send(topic, v)
    producer.close()
    ray.get(client.partition_actor(topic, 0).flush.remote())


def _committed(client, group, topic, partition):
    from raylog.groups.offsets import OffsetStore

    return OffsetStore(client.registry.zk, client.settings.cluster).committed(group, topic, partition)


def _damage_size_field(log_dir: str, offset: int) -> None:
    """Set the top byte of the batchLength field of the record batch at
    ``offset`` (one segment, so the offset is the file position): a size no
    batch has."""
    path = os.path.join(log_dir, sorted(f for f in os.listdir(log_dir) if f.endswith(".log"))[0])
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, b"\x7f", offset + 8)
    finally:
        os.close(fd)


@pytest.mark.parametrize("damage", ["value byte", "size field"])
def test_skip_corrupt_moves_past_the_damage_and_reads_the_rest(raylog_client, make_topic, damage):
    topic = make_topic(partitions=1)
    values = [b"s-%03d" % i for i in range(10)]
    _produce(raylog_client, topic, values)
    log_dir = raylog_client.registry.placement(topic, 0)["log_dir"]
    size = message_size(log_dir, 0)
    bad = 5 * size
    if damage == "value byte":
        flip_byte(log_dir, bad)
    else:
        _damage_size_field(log_dir, bad)
    group = f"g-{topic}"
    consumer = raylog_client.consumer(topic, group=group, auto_offset_reset="earliest",
                                      session_timeout_ms=SESSION_MS, auto_commit_interval_ms=0)
    try:
        got = []
        wait_for(lambda: len(got) >= 5, 30, "the messages before the damage", polling=[consumer], sink=got)
        assert [m.value for m in got] == values[:5]
        # The error is corruption (never "message too large"), with the way out.
        with pytest.raises(CorruptMessageError) as info:
            wait_for(lambda: False, 30, "the corruption error", polling=[consumer], sink=got)
        assert info.value.offset == bad
        assert info.value.next_offset == bad + size
        assert "next readable batch" in str(info.value)
        with pytest.raises(CorruptMessageError):  # still there until the application decides
            consumer.poll(timeout_ms=200)
        assert consumer.skip_corrupt() == {(topic, 0): (bad, bad + size)}
        assert consumer.skipped_corrupt == {(topic, 0): (1, size)}
        rest = []
        wait_for(lambda: len(rest) >= 4, 30, "the messages after the damage", polling=[consumer], sink=rest)
        assert [m.value for m in rest] == values[6:]  # exactly the damaged message skipped
        consumer.commit()
        assert _committed(raylog_client, group, topic, 0) == 10 * size
        assert consumer.skip_corrupt() == {}  # nothing stopped any more
    finally:
        consumer.close()
