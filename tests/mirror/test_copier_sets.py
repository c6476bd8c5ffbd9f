"""How a copier cuts what it holds into sets, as pure logic: the source's
fetched bytes are indexed as the consumer indexes them, progress records and
produces are kept in memory (the copier's ZooKeeper and target are tested in
test_copier.py and test_mirror_copy.py)."""

from __future__ import annotations

import threading

import pytest

from raylog.consumer.batch import MessageBatch, fetched_batch
from raylog.consumer.record import Message
from raylog.mirror import copier as copier_module
from raylog.mirror import progress
from raylog.errors import BrokerUnavailableError
from raylog.mirror.copier import CopierStopped, PartitionCopier
from raylog.storage.decoding import decode_messages
from raylog.storage.message import encode_message_set
from raylog.transfer.connection import Offsets

TP = ("events", 0)


class _Copier(PartitionCopier):
    """A copier whose target is a list: each produced set and its sequence."""

    def __init__(self):
        super().__init__(zk=None, target_metadata=None, progress_path="p", checkpoints_path="c",
                         topic=TP[0], partition=TP[1], target_topic="copy", producer_id=7)
        self.sets: list[tuple[int, bytes]] = []

    def _produce(self, payload):
        self.sets.append((self._seq, bytes(payload)))
        return sum(len(p) for _, p in self.sets) - len(payload)


@pytest.fixture
def records(monkeypatch):
    """The progress records the copiers write, in order (in memory)."""
    written: list[dict] = []
    monkeypatch.setattr(progress, "write_progress", lambda zk, path, record, version: written.append(dict(record))
                        or version + 1)
    monkeypatch.setattr(progress, "append_checkpoint", lambda *args: None)
    return written


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
    copier._record, copier._version = record, 0
    copier._seq, copier._pos, copier._redo = 0, 0, None
    if record is not None:
        copier._seq, copier._pos, copier._redo = record["seq"], record["start"], record
    copier._cursor = copier._pos
    return copier


def _values(payload: bytes) -> list[bytes]:
    return [m[3] for m in decode_messages(payload, 0)[0]]


def _copy(log: bytes, fetch_bytes: int) -> _Copier:
    copier = _started(_Copier())
    for batch in _batches(log, fetch_bytes):
        copier.offer_batch(batch)
        copier.pump()
    copier.pump(flush=True)
    return copier


def test_uncompressed_sets_are_sent_as_the_source_stores_them_cut_at_the_byte_bound(records, monkeypatch):
    monkeypatch.setattr(copier_module, "MAX_SET_BYTES", 10 * 62)  # ten messages of 62 bytes
    log = _log((25, None), (7, None), (30, None))
    copier = _copy(log, fetch_bytes=900)  # fetches end inside messages and sets
    assert b"".join(p for _, p in copier.sets) == log  # the stored bytes, nothing encoded again
    assert [seq for seq, _ in copier.sets] == list(range(len(copier.sets)))
    assert [len(_values(p)) for _, p in copier.sets] == [10] * 6 + [2]
    acked = [r for r in records if r["acked"]]
    assert [(r["start"], r["end"], r["count"]) for r in acked] == [
        (i * 620, min((i + 1) * 620, len(log)), 10 if i < 6 else 2) for i in range(7)]
    assert acked[-1]["last_ts"] == 61


def test_a_set_holds_at_most_max_set_messages(records, monkeypatch):
    monkeypatch.setattr(copier_module, "MAX_SET_MESSAGES", 4)
    copier = _copy(_log((10, None)), fetch_bytes=10_000)
    assert [len(_values(p)) for _, p in copier.sets] == [4, 4, 2]


def test_compressed_wrappers_fetched_whole_are_sent_as_they_came(records):
    log = _log((5, None), (6, "gzip"), (9, None), (3, "zstd"), (4, None))
    copier = _copy(log, fetch_bytes=10_000)
    assert b"".join(p for _, p in copier.sets) == log  # the wrappers still compressed


def test_a_set_bound_never_takes_a_wrapper_apart(records, monkeypatch):
    """A set that fills up inside a wrapper ends before it; a wrapper larger
    than a set goes whole, alone: every byte goes on as the source stores it."""
    monkeypatch.setattr(copier_module, "MAX_SET_BYTES", 8 * 62)
    log = _log((5, None), (6, "gzip"), (9, None), (12, "zstd"), (4, None))
    copier = _copy(log, fetch_bytes=10_000)
    assert b"".join(p for _, p in copier.sets) == log
    # the gzip wrapper and two plain messages fill a set; the zstd wrapper (744 bytes unpacked) goes alone
    assert [len(_values(p)) for _, p in copier.sets] == [5, 8, 7, 12, 4]
    acked = [r for r in records if r["acked"]]
    assert all(a["end"] == b["start"] for a, b in zip(acked, acked[1:])) and acked[-1]["end"] == len(log)
    assert all(r["bytes"] == len(p) for r, (_, p) in zip(acked, copier.sets))


def test_a_wrapper_handed_out_in_parts_is_sent_in_order_encoded_again(records):
    """A consumer that hands a wrapper out in two polls (its message limit
    fell inside): those messages are encoded again, uncompressed."""
    log = _log((5, None), (6, "gzip"), (4, None))
    whole = _batches(log, 10_000)[0]
    assert not whole.indexed and whole.stored_cuts() == [1, 2, 3, 4, 5, 11, 12, 13, 14]
    copier = _started(_Copier())
    for part in (whole[:8], whole[8:]):  # inside the gzip wrapper
        assert not part.has_stored_bytes
        copier.offer_batch(part)
    copier.pump(flush=True)
    [(_, payload)] = copier.sets
    assert _values(payload) == [f"m{i}".encode().ljust(40, b".") for i in range(15)]
    assert len(payload) == 15 * 62  # uncompressed
    assert whole[5:].has_stored_bytes and bytes(whole[5:].stored_bytes()) == log[5 * 62:]


def test_the_batch_path_sends_the_same_messages_in_the_same_sets_as_the_message_path(records):
    log = _log((300, None), (50, "gzip"), (300, None))
    by_batch = _copy(log, fetch_bytes=5_000)
    ranges = [(r["start"], r["end"], r["count"]) for r in records if r["acked"]]
    records.clear()
    by_message = _started(_Copier())
    for batch in _batches(log, 5_000):
        by_message.offer(list(batch))
        by_message.pump()
    by_message.pump(flush=True)
    assert [(r["start"], r["end"], r["count"]) for r in records if r["acked"]] == ranges
    assert [_values(p) for _, p in by_batch.sets] == [_values(p) for _, p in by_message.sets]
    assert len(b"".join(p for _, p in by_batch.sets)) < len(b"".join(p for _, p in by_message.sets))


def test_redelivered_messages_are_skipped_and_a_gap_asks_for_a_seek(records):
    log = _log((20, None))
    whole = _batches(log, 10_000)[0]
    copier = _started(_Copier())
    copier.offer_batch(whole[:8])
    copier.offer_batch(whole[3:12])  # 3..7 again, then 8..11
    copier.pump(flush=True)
    assert _values(copier.sets[0][1]) == [f"m{i}".encode().ljust(40, b".") for i in range(12)]
    copier.offer_batch(whole[15:])  # 12..14 never came
    assert copier.need_seek and not copier.lingering
    copier.sought(copier.position)
    copier.offer_batch(whole[12:])
    copier.pump(flush=True)
    assert b"".join(p for _, p in copier.sets) == log


def test_a_resend_is_exactly_the_unacknowledged_intent(records, monkeypatch):
    monkeypatch.setattr(copier_module, "MAX_SET_BYTES", 5 * 62)  # smaller than the intent: it is sent whole
    log = _log((30, None))
    intent = {"seq": 4, "start": 3 * 62, "end": 17 * 62, "count": 14, "acked": False,
              "target_end": None, "last_ts": 16}
    copier = _started(_Copier(), intent)
    handed, _ = fetched_batch(log[3 * 62:], 3 * 62, TP, 1 << 20, 1 << 24)
    copier.offer_batch(handed[:10])
    assert copier.pump(flush=True) == 0  # the intent's range is not all held yet
    copier.offer_batch(handed[10:])
    copier.pump(flush=True)
    assert copier.sets[0] == (4, log[3 * 62:17 * 62])
    assert [seq for seq, _ in copier.sets] == [4, 5, 6, 7]
    assert [len(_values(p)) for _, p in copier.sets] == [14, 5, 5, 3]


def test_a_message_larger_than_a_set_goes_alone(records, monkeypatch):
    monkeypatch.setattr(copier_module, "MAX_SET_BYTES", 30)
    copier = _copy(_log((3, None)), fetch_bytes=10_000)
    assert [len(_values(p)) for _, p in copier.sets] == [1, 1, 1]


def test_messages_offered_one_by_one_are_held_as_decoded(records):
    copier = _started(_Copier())
    log = _log((4, None))
    copier.offer([Message(TP[0], TP[1], i * 62, i, None, f"m{i}".encode().ljust(40, b".")) for i in range(4)])
    copier.pump(flush=True)
    assert copier.sets == [(0, log)]


@pytest.mark.parametrize("size_before, known", [(4 * 62, True), (100, False), (None, False)])
def test_a_resend_of_another_size_leaves_the_target_end_unknown(records, size_before, known):
    """A resend holds the same messages, but the set sent before may have had
    other bytes (a wrapper whole, now in part): the target keeps the first."""
    log = _log((4, None))
    intent = {"seq": 2, "start": 0, "end": 4 * 62, "count": 4, "acked": False, "target_end": None, "last_ts": 3}
    if size_before is not None:
        intent["bytes"] = size_before
    copier = _started(_Copier(), intent)
    copier.offer_batch(_batches(log, 10_000)[0])
    copier.pump(flush=True)
    assert copier.sets == [(2, log)]
    assert records[-1]["acked"] and records[-1]["bytes"] == len(log)
    assert records[-1]["target_end"] == (len(log) if known else None)


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
    with pytest.raises(CopierStopped, match="sequence 0 waited for the target.*sent again when the mirror resumes"):
        copier.pump(flush=True)  # without the stop: 120 s of tries
    assert [(r["seq"], r["acked"], r["start"], r["end"]) for r in records] == [(0, False, 0, 3 * 62)]


class _Target:
    """A target partition's idempotence as the log keeps it, in memory: a
    sequence it stored before is answered with its first base and stored
    nothing; the next one is appended."""

    def __init__(self):
        self.log = bytearray()
        self.bases: dict[int, int] = {}

    def produce_sets(self, topic, partition, sets, acks, *, producer_id, sequences):
        [payload], [seq] = sets, sequences
        if seq in self.bases:
            return [self.bases[seq]]
        assert seq == max(self.bases, default=-1) + 1, "out of order"
        self.bases[seq] = len(self.log)
        self.log += bytes(payload)
        return [self.bases[seq]]

    def offsets(self, topic, partition):
        return Offsets(0, len(self.log))

    def close(self):
        pass


@pytest.mark.parametrize("lost_set_was_stored", [True, False])
def test_after_an_intent_lost_to_retention_the_next_set_is_stored_whatever_became_of_it(records, lost_set_was_stored):
    """A copier restarted with an unacknowledged intent whose source range
    retention has removed gives it up and sends the next set under its
    sequence; if the target had stored the lost set, it answers the new one
    as that duplicate, and the copier sends it again under the next."""
    target = _Target()
    target.produce_sets("copy", 0, [b"x" * 10], 1, producer_id=7, sequences=[0])
    if lost_set_was_stored:
        target.produce_sets("copy", 0, [b"lost set" * 5], 1, producer_id=7, sequences=[1])
    intent = {"seq": 1, "start": 0, "end": 3 * 62, "count": 3, "acked": False, "target_end": None, "last_ts": 2}
    copier = _started(PartitionCopier(zk=None, target_metadata=None, progress_path="p", checkpoints_path="c",
                                      topic=TP[0], partition=TP[1], target_topic="copy", producer_id=7), intent)
    copier._connection = lambda: target
    log = _log((6, None))
    copier.skip_to(3 * 62)  # the source's earliest offset is now past the intent
    handed, _ = fetched_batch(log[3 * 62:], 3 * 62, TP, 1 << 20, 1 << 24)
    copier.sought(3 * 62)
    copier.offer_batch(handed)
    copier.pump(flush=True)
    assert bytes(target.log).endswith(log[3 * 62:])  # stored, once
    assert bytes(target.log).count(log[3 * 62:]) == 1
    assert records[-1]["acked"] and records[-1]["seq"] == (2 if lost_set_was_stored else 1)
    assert records[-1]["target_end"] == len(target.log)
