"""How a copier cuts what it holds into sets and encodes each as one
format-2 record batch, as pure logic: the source's fetched bytes are indexed
or decoded as the consumer does, progress records and produces are kept in
memory, the target's idempotence is raylog.storage.batch_producers' in-memory
state (the copier's ZooKeeper and target are tested in test_copier.py,
test_mirror_copy.py and test_mirror_format2.py)."""

from __future__ import annotations

import threading

import pytest

from raylog.consumer.batch import MessageBatch, fetched_batch
from raylog.consumer.record import Message
from raylog.errors import BrokerUnavailableError, DuplicateSequenceError
from raylog.mirror import copier as copier_module
from raylog.mirror import progress
from raylog.mirror.copier import CopierStopped, PartitionCopier
from raylog.storage import record_batch
from raylog.storage.batch_producers import BatchProducerState
from raylog.storage.message import encode_message_set
from raylog.transfer.connection import Offsets

TP = ("events", 0)
#: the bytes a 40-byte value without key or headers takes at most in a set's batch
RECORD_40 = 40 + copier_module.RECORD_OVERHEAD


class _Copier(PartitionCopier):
    """A copier whose target is a list: each produced batch."""

    def __init__(self):
        super().__init__(zk=None, target_metadata=None, progress_path="p", checkpoints_path="c",
                         topic=TP[0], partition=TP[1], target_topic="copy", producer_id=7)
        self.sets: list[bytes] = []

    def _produce(self, payload):
        self.sets.append(bytes(payload))
        return sum(len(p) for p in self.sets) - len(payload)


@pytest.fixture
def records(monkeypatch):
    """The progress records the copiers write, in order (in memory)."""
    written: list[dict] = []
    monkeypatch.setattr(progress, "write_progress", lambda zk, path, record, version: written.append(dict(record))
                        or version + 1)
    monkeypatch.setattr(progress, "append_checkpoint", lambda *args: None)
    return written


def _one_batch(payload: bytes) -> record_batch.DecodedBatch:
    """The payload's only record batch, decoded (it must be exactly one)."""
    [(pos, header)] = list(record_batch.iter_batches(payload))
    assert pos == 0 and header.size == len(payload)
    return record_batch.decode_batch(payload)


def _values(payload: bytes) -> list[bytes]:
    return [r.value for r in _one_batch(payload).records]


def _identity(payload: bytes) -> tuple[int, int, int, int]:
    """(producer id, epoch, base sequence, count) of a set's batch."""
    h = _one_batch(payload).header
    return h.producer_id, h.producer_epoch, h.base_sequence, h.count


def _bases(copier) -> list[int]:
    return [_identity(p)[2] for p in copier.sets]


def _log(*sets) -> bytes:
    """A source log of message sets: each ``(count, compression)``; value i
    of the whole log is ``b"m<i>"`` padded to 40 bytes."""
    out, i = [], 0
    for count, compression in sets:
        values = [f"m{j}".encode().ljust(40, b".") for j in range(i, i + count)]
        out.append(encode_message_set(values, [None] * count, list(range(i, i + count)), compression))
        i += count
    return b"".join(out)


def _batches(log: bytes, fetch_bytes: int) -> list[MessageBatch]:
    """The log as a consumer's poll_batch hands it out, ``fetch_bytes`` at a time."""
    out, at = [], 0
    while at < len(log):
        handed, used = fetched_batch(log[at:at + fetch_bytes], at, TP, 1 << 20, 1 << 24)
        if used == 0:  # a compressed wrapper longer than the fetch: fetch it whole
            handed, used = fetched_batch(log[at:], at, TP, 1 << 20, 1 << 24)
        out.append(handed if isinstance(handed, MessageBatch) else MessageBatch.of_records(handed))
        at += used
    return out


def _started(copier, record=None):
    """``copier`` started from ``record`` (None: nothing mirrored yet) as
    :meth:`PartitionCopier.start` does, at source offset 0."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(progress, "read_progress", lambda zk, path: (record, 0))
        copier.start()
    if copier.position is None:
        copier.sought(0)
    return copier


def _copy(log: bytes, fetch_bytes: int) -> _Copier:
    copier = _started(_Copier())
    for batch in _batches(log, fetch_bytes):
        copier.offer_batch(batch)
        copier.pump()
    copier.pump(flush=True)
    return copier


def _f1_values(start: int, stop: int) -> list[bytes]:
    return [f"m{i}".encode().ljust(40, b".") for i in range(start, stop)]


def test_every_set_is_one_record_batch_under_the_copiers_id_cut_at_the_batch_byte_bound(records, monkeypatch):
    """Format-1 messages go as one format-2 batch per set, records numbered
    from 0 (the next set's base = the last base + its count), and a set's
    batch never exceeds MAX_SET_BYTES as the batch measures it."""
    limit = record_batch.HEADER_SIZE + 10 * RECORD_40  # ten records of the batch's bound
    monkeypatch.setattr(copier_module, "MAX_SET_BYTES", limit)
    log = _log((25, None), (7, None), (30, None))
    copier = _copy(log, fetch_bytes=900)  # fetches end inside messages and sets
    assert [_identity(p) for p in copier.sets] == [(7, 0, 10 * i, 10 if i < 6 else 2) for i in range(7)]
    assert [v for p in copier.sets for v in _values(p)] == _f1_values(0, 62)
    assert all(len(p) <= limit for p in copier.sets)
    acked = [r for r in records if r["acked"]]
    assert [(r["seq"], r["base_seq"], r["start"], r["end"], r["count"]) for r in acked] == [
        (i, 10 * i, i * 620, min((i + 1) * 620, len(log)), 10 if i < 6 else 2) for i in range(7)]
    assert [r["bytes"] for r in acked] == [len(p) for p in copier.sets]
    assert acked[-1]["last_ts"] == 61
    assert [r.timestamp for p in copier.sets for r in _one_batch(p).records] == list(range(62))


def test_a_set_holds_at_most_max_set_messages(records, monkeypatch):
    monkeypatch.setattr(copier_module, "MAX_SET_MESSAGES", 4)
    copier = _copy(_log((10, None)), fetch_bytes=10_000)
    assert [len(_values(p)) for p in copier.sets] == [4, 4, 2]
    assert _bases(copier) == [0, 4, 8]


def test_compressed_wrappers_are_copied_as_uncompressed_records(records):
    log = _log((5, None), (6, "gzip"), (9, None), (3, "zstd"), (4, None))
    copier = _copy(log, fetch_bytes=10_000)
    assert [v for p in copier.sets for v in _values(p)] == _f1_values(0, 27)
    assert all(_one_batch(p).header.codec == 0 for p in copier.sets)


def test_a_set_bound_cuts_inside_a_wrapper(records, monkeypatch):
    """The records of a compressed wrapper each have an offset: a set full
    inside one ends there, and the next set starts at the next record."""
    monkeypatch.setattr(copier_module, "MAX_SET_BYTES", record_batch.HEADER_SIZE + 8 * RECORD_40)
    log = _log((5, None), (6, "gzip"), (9, None), (12, "zstd"), (4, None))
    copier = _copy(log, fetch_bytes=10_000)
    assert [v for p in copier.sets for v in _values(p)] == _f1_values(0, 36)
    assert [len(_values(p)) for p in copier.sets] == [8, 8, 8, 8, 4]
    acked = [r for r in records if r["acked"]]
    assert all(a["end"] == b["start"] for a, b in zip(acked, acked[1:])) and acked[-1]["end"] == len(log)
    assert [r["base_seq"] for r in acked] == [0, 8, 16, 24, 32]


def test_a_wrapper_handed_out_in_parts_is_sent_in_order(records):
    """A consumer that hands a wrapper out in two polls (its message limit
    fell inside): one set of them all, in order."""
    log = _log((5, None), (6, "gzip"), (4, None))
    whole = _batches(log, 10_000)[0]
    copier = _started(_Copier())
    for part in (whole[:8], whole[8:]):  # inside the gzip wrapper
        copier.offer_batch(part)
    copier.pump(flush=True)
    [payload] = copier.sets
    assert _values(payload) == _f1_values(0, 15) and _identity(payload) == (7, 0, 0, 15)


def test_the_batch_path_sends_the_same_batches_as_the_message_path(records):
    log = _log((300, None), (50, "gzip"), (300, None))
    by_batch = _copy(log, fetch_bytes=5_000)
    by_message = _started(_Copier())
    for batch in _batches(log, 5_000):
        by_message.offer(list(batch))
        by_message.pump()
    by_message.pump(flush=True)
    assert by_batch.sets == by_message.sets


def test_redelivered_messages_are_skipped_and_a_gap_asks_for_a_seek(records):
    log = _log((20, None))
    whole = _batches(log, 10_000)[0]
    copier = _started(_Copier())
    copier.offer_batch(whole[:8])
    copier.offer_batch(whole[3:12])  # 3..7 again, then 8..11
    copier.pump(flush=True)
    assert _values(copier.sets[0]) == _f1_values(0, 12)
    copier.offer_batch(whole[15:])  # 12..14 never came
    assert copier.need_seek and not copier.lingering
    copier.sought(copier.position)
    copier.offer_batch(whole[12:])
    copier.pump(flush=True)
    assert [v for p in copier.sets for v in _values(p)] == _f1_values(0, 20)
    assert _bases(copier) == [0, 12]


def test_a_resend_rebuilds_the_same_batch_as_the_unacknowledged_intent(records, monkeypatch):
    """A copier killed after its intent sends the same records from the same
    base sequence when it starts again: the same bytes (the target answers
    them as the duplicate), then sets follow from base + count."""
    log = _log((30, None))
    first = _started(_Copier())
    first._pos = first._cursor = 3 * 62
    first._base, first._seq = 40, 4
    first.offer_batch(_batches(log, 10_000)[0][3:17])
    first.pump(flush=True)
    [sent] = first.sets
    intent = dict(records[-2])
    assert not intent["acked"] and intent["base_seq"] == 40 and intent["bytes"] == len(sent)
    monkeypatch.setattr(copier_module, "MAX_SET_BYTES", record_batch.HEADER_SIZE + 5 * RECORD_40)
    copier = _started(_Copier(), intent)  # smaller sets now: the intent is still sent whole
    handed, _ = fetched_batch(log[3 * 62:], 3 * 62, TP, 1 << 20, 1 << 24)
    copier.offer_batch(handed[:10])
    assert copier.pump(flush=True) == 0  # the intent's range is not all held yet
    copier.offer_batch(handed[10:])
    copier.pump(flush=True)
    assert copier.sets[0] == sent  # byte for byte
    assert [_identity(p)[2:] for p in copier.sets] == [(40, 14), (54, 5), (59, 5), (64, 3)]
    resent = records[2]  # the second copier wrote no intent before it
    assert resent["acked"] and resent["base_seq"] == 40 and resent["target_end"] == len(sent)  # same bytes


def test_a_message_larger_than_a_set_goes_alone(records, monkeypatch):
    monkeypatch.setattr(copier_module, "MAX_SET_BYTES", 30)
    copier = _copy(_log((3, None)), fetch_bytes=10_000)
    assert [len(_values(p)) for p in copier.sets] == [1, 1, 1]
    assert _bases(copier) == [0, 1, 2]


def test_messages_offered_one_by_one_are_held_as_decoded(records):
    copier = _started(_Copier())
    copier.offer([Message(TP[0], TP[1], i * 62, i, None, f"m{i}".encode().ljust(40, b".")) for i in range(4)])
    copier.pump(flush=True)
    assert copier.sets == [record_batch.encode_batch(_f1_values(0, 4), [None] * 4, None, [0, 1, 2, 3],
                                                     producer_id=7, producer_epoch=0, base_sequence=0)]


#: format-2 source batches: (key, value, headers, timestamp) each
SOURCE_A = [(b"k0", b"v0", [("h", b"1"), ("h", b"2"), ("n", None)], 1000), (None, None, None, 1001),
            (b"k2", b"", [("e", b"")], 1002)]
SOURCE_B = [(b"k%d" % i, b"b%d" % i, [("i", str(i).encode())], 2000 + i) for i in range(4)]


def test_format_2_records_keep_keys_null_values_headers_and_timestamps(records):
    """Source record batches (a compressed one too) are copied record by
    record: keys, null and empty values, headers (null values, duplicates)
    and create times as they were."""
    a = record_batch.stamp(record_batch.encode_records(SOURCE_A), 0)
    b = record_batch.stamp(record_batch.encode_records(SOURCE_B, "gzip"), len(a))
    copier = _copy(a + b, fetch_bytes=10_000)
    [payload] = copier.sets
    got = [(r.key, r.value, r.headers, r.timestamp) for r in _one_batch(payload).records]
    assert got == [(k, v, list(h or ()), t) for k, v, h, t in SOURCE_A + SOURCE_B]
    assert _identity(payload) == (7, 0, 0, 7) and _one_batch(payload).header.codec == 0
    assert records[-1]["end"] == len(a + b) and records[-1]["last_ts"] == 2003


def test_headers_count_toward_the_set_bound(records, monkeypatch):
    """A set's batch stays within MAX_SET_BYTES with big headers too."""
    rows = [(b"k", b"v", [("big", b"h" * 300)], i) for i in range(12)]
    log = b""
    for i in range(0, 12, 3):
        log += record_batch.stamp(record_batch.encode_records(rows[i:i + 3]), len(log))
    limit = 1500
    monkeypatch.setattr(copier_module, "MAX_SET_BYTES", limit)
    copier = _copy(log, fetch_bytes=100_000)
    assert all(len(p) <= limit for p in copier.sets) and len(copier.sets) > 1
    assert [r.headers for p in copier.sets for r in _one_batch(p).records] == [h for _k, _v, h, _t in rows]


@pytest.mark.parametrize("size_before, known", [("same", True), (100, False), (None, False)])
def test_a_resend_of_another_size_leaves_the_target_end_unknown(records, size_before, known):
    """An intent whose size differs from the batch built again (one of the
    previous version: a format-1 set) leaves the target's end unknown."""
    log = _log((4, None))
    intent = {"seq": 2, "base_seq": 6, "start": 0, "end": 4 * 62, "count": 4, "acked": False, "target_end": None,
              "last_ts": 3}
    batch = record_batch.encode_batch(_f1_values(0, 4), [None] * 4, None, [0, 1, 2, 3], producer_id=7,
                                      producer_epoch=0, base_sequence=6)
    if size_before is not None:
        intent["bytes"] = len(batch) if size_before == "same" else size_before
    copier = _started(_Copier(), intent)
    copier.offer_batch(_batches(log, 10_000)[0])
    copier.pump(flush=True)
    assert copier.sets == [batch]
    assert records[-1]["acked"] and records[-1]["bytes"] == len(batch)
    assert records[-1]["target_end"] == (len(batch) if known else None)


def test_a_record_of_the_previous_version_resumes_at_record_sequence_0(records):
    """Progress records written before format 2 (no base_seq; "seq" counted
    format-1 sets): an acknowledged one resumes at its end, records numbered
    from 0; an unacknowledged intent is sent again from base sequence 0."""
    log = _log((8, None))
    acked = {"seq": 5, "start": 0, "end": 3 * 62, "count": 3, "bytes": 3 * 62, "acked": True,
             "target_end": 9000, "last_ts": 2}
    copier = _started(_Copier(), acked)
    assert copier.position == 3 * 62
    copier.offer_batch(_batches(log, 10_000)[0][3:])
    copier.pump(flush=True)
    assert [_identity(p) for p in copier.sets] == [(7, 0, 0, 5)]
    assert (records[-1]["seq"], records[-1]["base_seq"]) == (6, 0)
    intent = dict(acked, acked=False, target_end=None)
    again = _started(_Copier(), intent)
    assert again.position == 0
    again.offer_batch(_batches(log, 10_000)[0])
    again.pump(flush=True)
    assert [_identity(p)[2:] for p in again.sets] == [(0, 3), (3, 5)]  # the intent's range alone, then on
    assert records[-3]["acked"] and records[-3]["target_end"] is None  # another size than the format-1 set


def test_record_sequences_wrap_in_the_batch_past_2_31(records):
    """The progress record counts on; a batch carries its base sequence
    modulo 2**31, as the target's producer state numbers them."""
    acked = {"seq": 9, "base_seq": (1 << 31) - 6, "start": 0, "end": 62, "count": 4, "bytes": 1, "acked": True,
             "target_end": None, "last_ts": 0}
    copier = _started(_Copier(), acked)
    copier.offer_batch(_batches(_log((4, None)), 10_000)[0][1:])
    copier.pump(flush=True)
    assert _identity(copier.sets[0])[2:] == ((1 << 31) - 2, 3)
    assert records[-1]["base_seq"] == (1 << 31) - 2
    copier.offer_batch(_batches(_log((5, None)), 10_000)[0][4:])
    copier.pump(flush=True)
    assert _identity(copier.sets[1])[2:] == (1, 1) and records[-1]["base_seq"] == (1 << 31) + 1


class _Unreachable:
    """A target connection that never gets through."""

    def produce_sets(self, *args, **kwargs):
        raise BrokerUnavailableError("the target's host does not answer")

    def close(self):
        pass


def test_a_mirror_that_stops_gives_up_a_set_its_target_does_not_take_and_keeps_the_intent(records):
    copier = _started(PartitionCopier(zk=None, target_metadata=None, progress_path="p", checkpoints_path="c",
                                      topic=TP[0], partition=TP[1], target_topic="copy", producer_id=7))
    copier._connection = lambda: _Unreachable()
    copier.offer_batch(_batches(_log((3, None)), 10_000)[0])
    threading.Timer(0.5, copier.stopping.set).start()
    with pytest.raises(CopierStopped, match="record sequence 0 waited for the target.*sent again when the mirror "
                                            "resumes"):
        copier.pump(flush=True)  # without the stop: 120 s of tries
    assert [(r["base_seq"], r["acked"], r["start"], r["end"]) for r in records] == [(0, False, 0, 3 * 62)]


class _Target:
    """A target partition's format-2 idempotence, in memory: its batch
    producer state (raylog.storage.batch_producers) judges each batch as the
    log does; a duplicate is answered with its first store's offset (or
    DuplicateSequenceError) and stored nothing."""

    def __init__(self):
        self.log = bytearray()
        self.state = BatchProducerState(None)

    def produce_sets(self, topic, partition, sets, acks, **kwargs):
        assert not kwargs, "the batch carries the producer: nothing out of band"
        [payload] = sets
        header = record_batch.read_header(payload)
        try:
            first = self.state.judge([(0, header)])
        except DuplicateSequenceError as err:
            return [err]
        if first is not None:
            return [first]
        base = len(self.log)
        self.log += bytes(payload)
        self.state.remember([(base, header)])
        return [base]

    def offsets(self, topic, partition):
        return Offsets(0, len(self.log))

    def close(self):
        pass


def _batch(values, base_sequence):
    return record_batch.encode_batch(values, producer_id=7, producer_epoch=0, base_sequence=base_sequence,
                                     timestamp_ms=0)


@pytest.mark.parametrize("lost", ["stored", "stored, another count", "never stored"])
def test_after_an_intent_lost_to_retention_the_next_set_is_stored_whatever_became_of_it(records, lost):
    """A copier restarted with an unacknowledged intent whose source range
    retention has removed gives it up and sends the next set from its base
    sequence; if the target had stored the lost set, it answers the new one
    as that duplicate (same first and last sequence: its offset; another
    count: DuplicateSequenceError), and the copier sends it again from the
    sequence after the lost set's records."""
    target = _Target()
    target.produce_sets("copy", 0, [_batch([b"x" * 10], 0)], 1)
    lost_count = 2 if lost == "stored, another count" else 3
    if lost != "never stored":
        target.produce_sets("copy", 0, [_batch([b"lost"] * lost_count, 1)], 1)
    intent = {"seq": 1, "base_seq": 1, "start": 0, "end": lost_count * 62, "count": lost_count, "acked": False,
              "target_end": None, "last_ts": 2}
    copier = _started(PartitionCopier(zk=None, target_metadata=None, progress_path="p", checkpoints_path="c",
                                      topic=TP[0], partition=TP[1], target_topic="copy", producer_id=7), intent)
    copier._connection = lambda: target
    log = _log((6, None))
    copier.skip_to(3 * 62)  # the source's earliest offset is now past the intent
    handed, _ = fetched_batch(log[3 * 62:], 3 * 62, TP, 1 << 20, 1 << 24)
    copier.sought(3 * 62)
    copier.offer_batch(handed)
    copier.pump(flush=True)
    stored = [v for _pos, h in record_batch.iter_batches(bytes(target.log))
              for v in _values(bytes(target.log)[_pos:_pos + h.size])]
    assert stored[-3:] == _f1_values(3, 6) and stored.count(_f1_values(3, 4)[0]) == 1  # stored, once
    base = 1 if lost == "never stored" else 1 + lost_count
    assert records[-1]["acked"] and (records[-1]["seq"], records[-1]["base_seq"]) == (
        (1, 1) if lost == "never stored" else (2, base))
    assert records[-1]["target_end"] == len(target.log)
    # the next set follows in order
    assert target.state.last_sequence(7) == base + 2
