"""The mirror's copier writes format 2 (docs/design.md §2): each set lands in
the target as one record batch under the copier's producer id, with the
records' keys, values (null ones too), headers and create times as the
source holds them, whatever the source's format (format-2 batches from
raylog's producer, format-1 sets plain or compressed); a copier killed
between its intent and the acknowledgement resends the same batch and the
target holds each record once. Real ZooKeeper, Ray and partition actors (one
cluster as source and target)."""

from __future__ import annotations

import time
import uuid

import pytest

from raylog.mirror import progress, spec as specs
from raylog.mirror.copier import PartitionCopier
from raylog.storage import record_batch
from raylog.storage.message import encode_message_set
from raylog.transfer.connection import BrokerConnection
from raylog.transfer.protocol import ACKS_ALL

pytestmark = pytest.mark.timeout(240)


class Crash(Exception):
    pass


def _copier(client, name, topic, target_topic):
    cluster = client.settings.cluster
    return PartitionCopier(
        zk=client._zk, target_metadata=client.metadata,
        progress_path=specs.progress_path(cluster, name, topic, 0),
        checkpoints_path=specs.checkpoints_path(cluster, name, topic, 0),
        topic=topic, partition=0, target_topic=target_topic,
        producer_id=specs.producer_id(cluster, name, cluster, topic, 0),
    )


def _read(client, topic, start=None):
    """Every message of partition 0 (from ``start``), up to its end offset."""
    consumer = client.consumer(topic, auto_offset_reset="earliest")
    try:
        consumer.assign([(topic, 0)])
        if start is not None:
            consumer.seek(topic, 0, start)
        end = client.end_offsets(topic)[0]
        got: list = []
        deadline = time.monotonic() + 60
        while (consumer.position(topic, 0) or 0) < end:
            assert time.monotonic() < deadline, "messages never arrived"
            got += consumer.poll(timeout_ms=300)
        return got
    finally:
        consumer.close()


def _rows(messages) -> list[tuple]:
    return [(m.key, m.value, list(m.headers), m.timestamp) for m in messages]


def _stored_batches(client, topic) -> list[record_batch.BatchHeader]:
    """The headers of the record batches partition 0 stores (raw, over the data channel)."""
    host, port = client.metadata.endpoint(topic, 0, refresh=True, wait_s=10.0)
    start, end = client.offsets(topic, 0)
    headers = []
    with BrokerConnection(host, port, token=client.settings.token, timeout_s=10) as conn:
        at = start
        while at < end:
            data = bytes(conn.fetch(topic, 0, at, 1 << 20).data)
            assert record_batch.format_at(data) == 2, f"format-1 data at {at} in {topic}"
            walked = 0
            for pos, header in record_batch.iter_batches(data):
                headers.append(header)
                walked = pos + header.size
            at += walked
    return headers


def _record(client, name, topic):
    return progress.read_progress(client._zk, specs.progress_path(client.settings.cluster, name, topic, 0))[0]


def _produce_format_2(client, topic) -> list[tuple]:
    """Records with headers, null values, keys and set create times, written
    by raylog's producer (format 2); their rows as sent."""
    sent = []
    producer = client.producer(acks="all", batch_size=300)
    for i in range(40):
        key = None if i % 5 == 0 else b"k%d" % i
        value = None if i % 3 == 0 else (b"" if i % 7 == 0 else b"v%d" % i)
        headers = [] if i % 4 == 0 else [("h", b"%d" % i), ("dup", b"a"), ("dup", None)]
        ts = 1_700_000_000_000 + i
        producer.send(topic, value, key=key, partition=0, headers=headers, timestamp_ms=ts)
        sent.append((key, value, headers, ts))
    producer.flush()
    producer.close()
    return sent


def _copy_all(copier, client, topic, start=None) -> int:
    resume = copier.start() if start is None else start
    copier.sought(client.offsets(topic, 0)[0] if resume is None else resume)
    copier.offer(_read(client, topic, resume))
    return copier.pump(flush=True)


def test_format_2_records_are_mirrored_with_headers_nulls_keys_and_timestamps(raylog_client, make_topic):
    client = raylog_client
    source, target = make_topic(partitions=1), make_topic(partitions=1)
    name = f"f2-{uuid.uuid4().hex[:6]}"
    sent = _produce_format_2(client, source)
    assert _rows(_read(client, source)) == sent  # the source holds them so

    copier = _copier(client, name, source, target)
    try:
        assert _copy_all(copier, client, source) == len(sent)
    finally:
        copier.close()
    assert _rows(_read(client, target)) == sent
    batches = _stored_batches(client, target)
    pid = specs.producer_id(client.settings.cluster, name, client.settings.cluster, source, 0)
    assert {(h.producer_id, h.producer_epoch) for h in batches} == {(pid, 0)}
    # records numbered by count: each batch's base sequence follows the last one's records
    assert [h.base_sequence for h in batches] == [sum(h.count for h in batches[:i]) for i in range(len(batches))]
    record = _record(client, name, source)
    assert record["acked"] and record["end"] == client.end_offsets(source)[0]
    assert record["base_seq"] + record["count"] == len(sent)
    assert record["target_end"] == client.end_offsets(target)[0]


def test_a_copier_killed_between_intent_and_ack_resends_and_the_target_holds_each_record_once(
        raylog_client, make_topic, monkeypatch):
    client = raylog_client
    source, target = make_topic(partitions=1), make_topic(partitions=1)
    name = f"f2k-{uuid.uuid4().hex[:6]}"
    sent = _produce_format_2(client, source)

    first = _copier(client, name, source, target)
    real_write = progress.write_progress

    def write_then_crash(zk, path, record, version):
        if record["acked"]:
            raise Crash("killed after the target stored the set, before its record said so")
        return real_write(zk, path, record, version)

    monkeypatch.setattr(progress, "write_progress", write_then_crash)
    try:
        with pytest.raises(Crash):
            _copy_all(first, client, source)
    finally:
        first.close()
        monkeypatch.setattr(progress, "write_progress", real_write)
    intent = _record(client, name, source)
    assert not intent["acked"] and intent["base_seq"] == 0
    assert _rows(_read(client, target)) == sent  # the set was stored
    stored_end = client.end_offsets(target)[0]

    second = _copier(client, name, source, target)
    try:
        resume = second.start()
        assert resume == client.offsets(source, 0)[0]  # the unacknowledged set again, from its start
        assert _copy_all(second, client, source, resume) == len(sent)
    finally:
        second.close()
    assert _rows(_read(client, target)) == sent  # each record once
    assert client.end_offsets(target)[0] == stored_end
    record = _record(client, name, source)
    # the same batch again: answered as the duplicate at its first store, so the target's end is known
    assert record["acked"] and record["base_seq"] == 0 and record["target_end"] == stored_end

    # on from there: new records follow under the next sequence, once
    more = _produce_format_2(client, source)
    third = _copier(client, name, source, target)
    try:
        _copy_all(third, client, source)
    finally:
        third.close()
    assert _rows(_read(client, target)) == sent + more
    assert _record(client, name, source)["base_seq"] == len(sent)


def _produce_format_1(client, topic) -> list[tuple]:
    """Format-1 sets (plain and gzip-compressed) put into the partition over
    the data channel; their rows (format 1: no headers, no null values)."""
    host, port = client.metadata.endpoint(topic, 0, refresh=True, wait_s=10.0)
    rows, sets = [], []
    for n, compression in ((5, None), (6, "gzip"), (4, None)):
        first = len(rows)
        values = [b"f1-%d" % i for i in range(first, first + n)]
        keys = [None if i % 2 else b"key-%d" % i for i in range(first, first + n)]
        stamps = [1_600_000_000_000 + i for i in range(first, first + n)]
        sets.append(encode_message_set(values, keys, stamps, compression))
        rows += [(k, v, [], t) for k, v, t in zip(keys, values, stamps)]
    with BrokerConnection(host, port, token=client.settings.token, timeout_s=10) as conn:
        for message_set in sets:
            conn.produce(topic, 0, message_set, ACKS_ALL)
    return rows


def test_format_1_segments_are_mirrored_into_format_2(raylog_client, make_topic):
    client = raylog_client
    source, target = make_topic(partitions=1), make_topic(partitions=1)
    name = f"f1-{uuid.uuid4().hex[:6]}"
    rows = _produce_format_1(client, source)
    host, port = client.metadata.endpoint(source, 0, refresh=True, wait_s=10.0)
    with BrokerConnection(host, port, token=client.settings.token, timeout_s=10) as conn:
        assert record_batch.format_at(bytes(conn.fetch(source, 0, 0, 1 << 20).data)) == 1
    assert _rows(_read(client, source)) == rows

    copier = _copier(client, name, source, target)
    try:
        assert _copy_all(copier, client, source) == len(rows)
    finally:
        copier.close()
    assert _rows(_read(client, target)) == rows
    batches = _stored_batches(client, target)  # every byte of the target is format 2
    assert sum(h.count for h in batches) == len(rows) and all(h.codec == 0 for h in batches)


def test_an_unacknowledged_intent_of_the_previous_version_is_sent_again_as_a_batch(raylog_client, make_topic):
    """A progress record written by the previous version (format-1 sets
    numbered by set, no base_seq) that is an unacknowledged intent whose set
    the target had stored: the target's format-2 state does not know it, so
    the range is stored a second time (as copier.py's docstring says), its
    target end left unknown; what follows is copied once."""
    client = raylog_client
    source, target = make_topic(partitions=1), make_topic(partitions=1)
    name = f"old-{uuid.uuid4().hex[:6]}"
    rows = _produce_format_1(client, source)
    source_messages = _read(client, source)
    pid = specs.producer_id(client.settings.cluster, name, client.settings.cluster, source, 0)
    # what the previous version did before it was killed: the intent of set 0 (the first five
    # messages), then that set sent as format 1 under per-set sequence 0
    old_set = encode_message_set([m.value for m in source_messages[:5]], [m.key for m in source_messages[:5]],
                                 [m.timestamp for m in source_messages[:5]], None)
    intent = {"seq": 0, "start": source_messages[0].offset, "end": source_messages[5].offset, "count": 5,
              "bytes": len(old_set), "acked": False, "target_end": None, "last_ts": source_messages[4].timestamp}
    progress.write_progress(client._zk, specs.progress_path(client.settings.cluster, name, source, 0), intent, -1)
    host, port = client.metadata.endpoint(target, 0, refresh=True, wait_s=10.0)
    with BrokerConnection(host, port, token=client.settings.token, timeout_s=10) as conn:
        conn.produce(target, 0, old_set, ACKS_ALL, producer_id=pid, sequence=0)

    copier = _copier(client, name, source, target)
    try:
        assert copier.start() == intent["start"]
        copier.sought(intent["start"])
        copier.offer(_read(client, source, intent["start"]))
        assert copier.pump(flush=True) == len(rows)
    finally:
        copier.close()
    assert _rows(_read(client, target)) == rows[:5] + rows  # the intent's range twice, the rest once
    record = _record(client, name, source)
    assert record["acked"] and record["end"] == client.end_offsets(source)[0]
    assert record["base_seq"] + record["count"] == len(rows)  # record sequences from 0
