"""A copier killed between producing a set and recording it: the copier that
takes over resends the same set under the same sequence, and the target
stores it once (raylog.mirror.copier)."""

from __future__ import annotations

import time
import uuid

import pytest

from raylog.mirror import progress, spec as specs
from raylog.mirror import copier as copier_module
from raylog.mirror.copier import PartitionCopier
from raylog.storage import record_batch


class Crash(Exception):
    pass


def _messages(client, topic, start=None):
    consumer = client.consumer(topic, auto_offset_reset="earliest")
    try:
        if start is not None:
            consumer.seek(topic, 0, start)
        end = client.end_offsets(topic)[0]
        out = []
        while (consumer.position(topic, 0) or 0) < end:
            out.extend(consumer.poll(timeout_ms=300))
        return out
    finally:
        consumer.close()


def _copier(target, source, name, topic):
    cluster = target.settings.cluster
    return PartitionCopier(
        zk=target._zk, target_metadata=target.metadata,
        progress_path=specs.progress_path(cluster, name, topic, 0),
        checkpoints_path=specs.checkpoints_path(cluster, name, topic, 0),
        topic=topic, partition=0, target_topic=topic,
        producer_id=specs.producer_id(cluster, name, source.settings.cluster, topic, 0),
    )


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_a_kill_between_produce_and_record_stores_nothing_twice(raylog_client, source, monkeypatch, compression):
    target = raylog_client
    topic, name = f"crash-{uuid.uuid4().hex[:6]}", f"c-{uuid.uuid4().hex[:6]}"
    source.create_topic(topic)
    target.create_topic(topic)
    producer = source.producer(compression=compression, batch_size=40, acks="all")
    for i in range(120):
        producer.send(topic, f"m{i}".encode(), key=b"k")
    producer.flush()
    producer.close()
    sent = _messages(source, topic)

    first = _copier(target, source, name, topic)
    assert first.start() is None
    first.sought(source.offsets(topic, 0)[0])
    first.offer(sent)
    real_write = progress.write_progress

    def write_then_crash(zk, path, record, version):
        if record["acked"]:
            raise Crash("killed after the target stored the set, before its record said so")
        return real_write(zk, path, record, version)

    monkeypatch.setattr(progress, "write_progress", write_then_crash)
    with pytest.raises(Crash):
        first.pump(flush=True)
    first.close()
    monkeypatch.setattr(progress, "write_progress", real_write)
    assert [m.value for m in _messages(target, topic)] == [m.value for m in sent]

    second = _copier(target, source, name, topic)
    resume = second.start()
    assert resume == source.offsets(topic, 0)[0]  # the unacknowledged set again, from its start
    second.sought(resume)
    second.offer(_messages(source, topic, resume))
    assert second.pump(flush=True) == len(sent)
    second.close()
    got = _messages(target, topic)
    assert [(m.key, m.value) for m in got] == [(m.key, m.value) for m in sent]
    assert [m.timestamp for m in got] == [m.timestamp for m in sent]
    record, _ = progress.read_progress(target._zk, specs.progress_path(target.settings.cluster, name, topic, 0))
    assert record["acked"] and record["end"] == source.end_offsets(topic)[0]


def _fresh_copier(target, source, prefix: str, values: list[bytes]):
    """``(topic, mirror name, the source's messages, a copier at the start)``:
    a new topic of ``values`` on the source, empty on the target."""
    topic, name = f"{prefix}-{uuid.uuid4().hex[:6]}", f"{prefix[0]}-{uuid.uuid4().hex[:6]}"
    source.create_topic(topic)
    target.create_topic(topic)
    producer = source.producer(acks="all")
    for value in values:
        producer.send(topic, value)
    producer.close()
    sent = _messages(source, topic)
    copier = _copier(target, source, name, topic)
    copier.sought(copier.start() or source.offsets(topic, 0)[0])
    return topic, name, sent, copier


def test_a_set_is_due_once_full(raylog_client, source, monkeypatch):
    target = raylog_client
    topic, name, sent, copier = _fresh_copier(target, source, "full", [b"v" * 100] * 12)
    # five 100-byte records fill a set's batch
    monkeypatch.setattr(copier_module, "MAX_SET_BYTES",
                        record_batch.HEADER_SIZE + 5 * (100 + copier_module.RECORD_OVERHEAD))
    copier.offer(sent[:4])
    assert not copier.due()
    copier.offer(sent[4:6])  # past MAX_SET_BYTES: full, due before its linger
    assert copier.due()
    assert copier.pump() == 5 and copier.lingering and not copier.due()
    copier.close()


def test_a_set_waits_for_more_messages_until_it_is_full_or_its_linger_is_over(raylog_client, source):
    target = raylog_client
    topic, name, sent, copier = _fresh_copier(target, source, "linger", [f"m{i}".encode() for i in range(30)])
    copier.offer(sent[:10])
    assert copier.pump() == 0 and copier.lingering  # held: not full, its linger not over
    assert not copier.due()  # the member sends for it only once it is due
    copier.offer(sent[10:])
    assert copier.due(time.monotonic() + copier_module.LINGER_S)
    assert copier.pump(time.monotonic() + copier_module.LINGER_S) == 30  # one set of all thirty
    assert not copier.lingering and not copier.due(time.monotonic() + 60)
    record, _ = progress.read_progress(target._zk, specs.progress_path(target.settings.cluster, name, topic, 0))
    assert (record["seq"], record["base_seq"], record["count"], record["acked"]) == (0, 0, 30, True)
    copier.close()
    assert [m.value for m in _messages(target, topic)] == [m.value for m in sent]
