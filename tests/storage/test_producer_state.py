"""The producer-state journal kept with a partition log: duplicates are
recognised after a reopen, a torn journal tail and records of sets beyond a
truncated log are dropped, producer ids and the file stay bounded."""

from __future__ import annotations

import os

import pytest

from raylog.config import TopicConfig
from raylog.errors import DuplicateSequenceError, LogDirectoryLockedError, OutOfOrderSequenceError
from raylog.storage.log import PartitionLog
from raylog.storage.decoding import decode_messages
from raylog.storage.message import encode_message_set
from raylog.storage.producer_state import (
    FILE_NAME,
    HEADER_SIZE,
    RECORD_SIZE,
    SEQUENCES_REMEMBERED,
    ProducerStateTable,
    parse_records,
)

CONFIG = TopicConfig(flush_messages=10**9, flush_ms=10**9)
PID = 99


def one(value: bytes) -> bytes:
    return encode_message_set([value], timestamp_ms=1)


def values(plog: PartitionLog) -> list[bytes]:
    plog.flush()
    chunk = plog.read(plog.log_start_offset, 1 << 24)
    data = os.pread(chunk.file.fileno(), chunk.length, chunk.position)
    return [r[3] for r in decode_messages(data, chunk.offset)[0]]


def put(plog: PartitionLog, value: bytes, sequence: int, pid: int = PID) -> int:
    data = one(value)
    return plog.append_sequenced(data, pid, 0, sequence, [len(data)], name="t-0")


def test_no_journal_file_until_an_idempotent_producer_appends(tmp_path):
    with PartitionLog(tmp_path / "p", CONFIG) as plog:
        plog.append(one(b"plain"))
        assert FILE_NAME not in os.listdir(tmp_path / "p")
        put(plog, b"seq", 0)
        assert FILE_NAME in os.listdir(tmp_path / "p")


def test_a_duplicate_is_recognised_after_the_log_is_reopened_without_a_flush(tmp_path):
    plog = PartitionLog(tmp_path / "p", CONFIG)
    first = put(plog, b"a", 0)
    put(plog, b"b", 1)
    # no flush, no close: as if the process died with the writes in the page cache
    plog._checkpoint.close()
    plog._producers.close()
    os.close(plog._lock_fd)
    with PartitionLog(tmp_path / "p", CONFIG) as again:
        assert put(again, b"a", 0) == first
        assert put(again, b"c", 2) == 2 * len(one(b"a"))
        with pytest.raises(OutOfOrderSequenceError):
            put(again, b"e", 4)
        assert values(again) == [b"a", b"b", b"c"]


def test_a_second_owner_of_the_directory_is_refused_until_the_first_closes(tmp_path):
    first = PartitionLog(tmp_path / "p", CONFIG)
    with pytest.raises(LogDirectoryLockedError, match="locked by another owner") as info:
        PartitionLog(tmp_path / "p", CONFIG)
    assert not info.value.retriable
    first.append(one(b"kept"))
    first.close()
    with PartitionLog(tmp_path / "p", CONFIG) as again:
        assert values(again) == [b"kept"]


def test_records_of_sets_cut_off_by_recovery_are_dropped(tmp_path):
    with PartitionLog(tmp_path / "p", CONFIG) as plog:
        put(plog, b"a", 0)
        second = put(plog, b"b", 1)
    segment = tmp_path / "p" / "00000000000000000000.log"
    os.truncate(segment, second + 5)  # a torn second set
    with PartitionLog(tmp_path / "p", CONFIG) as plog:
        assert plog.log_end_offset == second
        # sequence 1 is not remembered any more: the retry is stored
        assert put(plog, b"b", 1) == second
        assert values(plog) == [b"a", b"b"]


def test_a_journal_record_without_its_set_is_dropped(tmp_path):
    # the journal is written before the segment: a crash between them leaves
    # a record pointing past the log end
    with PartitionLog(tmp_path / "p", CONFIG) as plog:
        put(plog, b"a", 0)
        plog._producers.journal(PID, 0, 1, plog.log_end_offset, [len(one(b"b"))])
    with PartitionLog(tmp_path / "p", CONFIG) as plog:
        put(plog, b"b", 1)
        assert values(plog) == [b"a", b"b"]


def test_a_torn_journal_tail_is_dropped_and_the_rest_kept(tmp_path):
    with PartitionLog(tmp_path / "p", CONFIG) as plog:
        first = put(plog, b"a", 0)
        put(plog, b"b", 1)
    path = tmp_path / "p" / FILE_NAME
    size = os.path.getsize(path)
    assert size == 2 * RECORD_SIZE
    os.truncate(path, size - 7)
    with PartitionLog(tmp_path / "p", CONFIG) as plog:
        assert put(plog, b"a", 0) == first  # still remembered
        assert put(plog, b"b", 1) > first  # forgotten: stored again
        assert values(plog) == [b"a", b"b", b"b"]


def test_a_damaged_journal_record_ends_the_replay(tmp_path):
    with PartitionLog(tmp_path / "p", CONFIG) as plog:
        put(plog, b"a", 0)
        put(plog, b"b", 1)
    path = tmp_path / "p" / FILE_NAME
    with open(path, "r+b") as f:
        f.seek(RECORD_SIZE + 10)
        f.write(b"\xff")
    with PartitionLog(tmp_path / "p", CONFIG) as plog:
        assert plog._producers.last_sequence(PID) == 0


def test_producer_ids_are_bounded_oldest_forgotten_first(tmp_path):
    config = CONFIG.replace(max_producer_ids=3)
    with PartitionLog(tmp_path / "p", config) as plog:
        for pid in (1, 2, 3):
            put(plog, b"x", 0, pid)
        put(plog, b"y", 1, 1)  # producer 1 is active again: 2 is now the oldest
        put(plog, b"x", 0, 4)
        assert len(plog._producers) == 3
        assert plog._producers.last_sequence(2) is None
        put(plog, b"again", 5, 2)  # forgotten: any sequence is accepted
    with PartitionLog(tmp_path / "p", config) as plog:
        assert len(plog._producers) == 3


def test_the_journal_file_stays_bounded(tmp_path):
    with PartitionLog(tmp_path / "p", CONFIG.replace(segment_bytes=1 << 30, max_message_bytes=1 << 20)) as plog:
        for sequence in range(60_000):
            put(plog, b"v", sequence)
        # one producer: at most 32 live records; the journal is compacted
        limit = 2 * SEQUENCES_REMEMBERED * RECORD_SIZE + (1 << 20)
        assert os.path.getsize(tmp_path / "p" / FILE_NAME) <= limit + RECORD_SIZE
    with PartitionLog(tmp_path / "p", CONFIG) as plog:
        # the 32 remembered sets and where the producer was learnt (sequence 0)
        assert os.path.getsize(tmp_path / "p" / FILE_NAME) == SEQUENCES_REMEMBERED * RECORD_SIZE + HEADER_SIZE
        assert put(plog, b"v", 59_999) == plog.log_end_offset - len(one(b"v"))


def test_a_joined_run_cut_by_recovery_keeps_the_sets_before_the_cut(tmp_path):
    sets = [one(b"r%d" % i) for i in range(3)]
    with PartitionLog(tmp_path / "p", CONFIG) as plog:
        plog.append_sequenced(b"".join(sets), PID, 0, 0, [len(s) for s in sets], name="t-0")
    assert os.path.getsize(tmp_path / "p" / FILE_NAME) == RECORD_SIZE + 2 * 4  # one record for the run
    os.truncate(tmp_path / "p" / "00000000000000000000.log", 2 * len(sets[0]) + 3)  # the third set torn
    with PartitionLog(tmp_path / "p", CONFIG) as plog:
        assert put(plog, b"r1", 1) == len(sets[0])  # remembered: a duplicate
        assert put(plog, b"r2", 2) == 2 * len(sets[0])  # cut off: stored again
        assert values(plog) == [b"r0", b"r1", b"r2"]


def test_a_set_torn_after_its_first_messages_is_cut_back_whole_so_a_retry_stores_each_message_once(tmp_path):
    """A sequenced set of five messages whose fourth was torn by the death
    of the process: recovery keeps whole messages, so the first three would
    stay and the producer's retry of the whole set would store them twice.
    The log is cut back to the set's start instead."""
    first = one(b"before")
    batch = encode_message_set([b"m%d" % i for i in range(5)], timestamp_ms=1)
    with PartitionLog(tmp_path / "p", CONFIG) as plog:
        put(plog, b"before", 0)
        assert plog.append_sequenced(batch, PID, 0, 1, [len(batch)], name="t-0") == len(first)
    message = len(batch) // 5
    os.truncate(tmp_path / "p" / "00000000000000000000.log", len(first) + 3 * message + 4)
    with PartitionLog(tmp_path / "p", CONFIG) as plog:
        assert plog.log_end_offset == len(first)
        reasons = [r.reason for r in plog.recovery_reports]
        assert any("idempotent producer's set" in r for r in reasons), reasons
        assert plog.append_sequenced(batch, PID, 0, 1, [len(batch)], name="t-0") == len(first)
        assert plog.append_sequenced(batch, PID, 0, 1, [len(batch)], name="t-0") == len(first)  # a duplicate
        assert values(plog) == [b"before"] + [b"m%d" % i for i in range(5)]


def state(table) -> dict:
    """``{producer id: (last sequence, {sequence: (base, length)} remembered)}``."""
    remembered: dict = {}
    for pid, _, sequence, base, lengths in parse_records(table.records_from(0, 1 << 30)):
        remembered.setdefault(pid, {})[sequence] = (base, lengths[0])
    return {pid: (table.last_sequence(pid), remembered.get(pid, {})) for pid in table._producers}


def test_after_a_truncation_and_a_reopen_the_state_is_a_replay_of_the_remaining_log(tmp_path):
    """Producers: LONG has more sets than are remembered and the truncation
    cuts every remembered one (earlier ones stay in the log); GONE has all
    its sets cut; PART some; KEPT none."""
    LONG, GONE, PART, KEPT = 1, 2, 3, 4
    plog = PartitionLog(tmp_path / "p", CONFIG)
    appended = []  # (pid, sequence, base, length) in log order
    next_sequence = dict.fromkeys((LONG, GONE, PART, KEPT), 0)

    def send(pid):
        base = put(plog, b"%d-%d" % (pid, next_sequence[pid]), next_sequence[pid], pid)
        appended.append((pid, next_sequence[pid], base, plog.log_end_offset - base))
        next_sequence[pid] += 1

    for _ in range(4):
        send(KEPT)
    for _ in range(8):
        send(LONG)
        send(PART)
    cut = plog.log_end_offset
    for _ in range(SEQUENCES_REMEMBERED):
        send(LONG)
    for _ in range(3):
        send(GONE)
        send(PART)
    plog.truncate_replica(cut)
    truncated = state(plog._producers)
    plog.close()

    replay = ProducerStateTable(None)  # a fresh replay of what remains
    for pid, sequence, base, length in appended:
        if base + length <= cut:
            replay.remember(pid, 0, sequence, base, (length,))
    expected = state(replay)
    with PartitionLog(tmp_path / "p", CONFIG) as again:
        reopened = state(again._producers)
        assert reopened == truncated
        assert sorted(reopened) == sorted(expected) == [LONG, PART, KEPT]
        for pid in (PART, KEPT):
            assert reopened[pid] == expected[pid]
        # LONG's remaining sets' offsets were forgotten with the slots the cut sets took: its last
        # sequence is known, so an older retry is refused and never stored again.
        assert reopened[LONG] == (expected[LONG][0], {}) and expected[LONG][0] == 7
        with pytest.raises(DuplicateSequenceError):
            put(again, b"old", 3, LONG)
        with pytest.raises(OutOfOrderSequenceError):
            put(again, b"gap", 9, LONG)
        assert put(again, b"next", 8, LONG) == cut
        assert put(again, b"new", 5, GONE) == again.log_end_offset - len(one(b"new"))  # unknown: any start
