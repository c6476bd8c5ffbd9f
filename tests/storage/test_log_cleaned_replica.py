"""Replica writes over cleaned segments (raylog.storage.log, "Replica writes
over cleaned ranges"): a follower that copies a cleaned leader stores every
batch at its own offset (in the cleaned form where offsets are not
positions) and holds the same kept records at the same offsets;
truncate_replica cuts a cleaned segment by offset at a batch boundary;
recovery finishes a replica's write or cut that a crash interrupted; mend
refuses a cleaned segment; a pass never cleans past the committed offset."""

from __future__ import annotations

import os
import shutil

import pytest

from raylog.config import TopicConfig
from raylog.errors import CorruptMessageError, InvalidMessageError, InvalidOffsetError
from raylog.storage.log import PartitionLog
from raylog.storage.record_batch import LOG_OVERHEAD, decode_batch, encode_batch, iter_batches, next_offset_after
from raylog.storage.segment import segment_name

CONFIG = TopicConfig(cleanup_policy="compact", flush_messages=1, flush_ms=10**9, segment_bytes=512,
                     max_message_bytes=512, min_compaction_lag_ms=0, delete_retention_ms=10**12)
NOW = 10**13  # every segment is old by then


def read_all(log):
    """(offset, key, value) of every record a reader from the log start gets."""
    out = []
    offset = log.log_start_offset
    while offset < log.high_watermark:
        data = log.read(offset, 1 << 16).tobytes()
        if not data:
            break
        for pos, header in iter_batches(data):
            if not header.control:
                out.extend((r.offset, r.key, r.value) for r in decode_batch(data, pos, from_offset=offset).records)
        offset = next_offset_after(data, len(data))
    return out


def latest(records):
    table = {}
    for offset, key, value in records:
        table[key] = (offset, value)
    return table


def fill(log, rounds, hot=2, start=0):
    """Batches of four records each: two keys written once (kept by every
    cleaning), a key written in every round (only its last record is kept),
    another key written once; so cleaned segments keep runs of records with
    gaps between them. Returns every (offset, key, value) written."""
    written = []
    n = start
    for r in range(rounds):
        for h in range(hot):
            n += 1
            ks = [b"cold-%d-%d-a" % (n, h), b"cold-%d-%d-b" % (n, h), b"hot-%d" % h, b"cold-%d-%d-c" % (n, h)]
            vs = [b"value-%d-%d" % (n, i) for i in range(len(ks))]
            base = log.append(encode_batch(vs, keys=ks, timestamp_ms=1000))
            written.extend((base + i, ks[i], vs[i]) for i in range(len(ks)))
    log.flush()
    return written


def whole_batches(data) -> int:
    pos = 0
    while pos + LOG_OVERHEAD <= len(data):
        size = LOG_OVERHEAD + int.from_bytes(data[pos + 8 : pos + 12], "big")
        if pos + size > len(data):
            break
        pos += size
    return pos


def copy(leader, follower, max_bytes=300, first_batch_only=False, until=None):
    """What the follower's fetch loop does: read the leader's log from the
    follower's end, append the whole batches, flush; until caught up (or
    ``until(follower)`` says stop)."""
    while follower.log_end_offset < leader.log_end_offset and not (until and until(follower)):
        offset = follower.log_end_offset
        data = leader.read_unflushed(offset, max_bytes).tobytes()
        length = whole_batches(data)
        if first_batch_only and length:
            length = LOG_OVERHEAD + int.from_bytes(data[8:12], "big")
        if not length:
            break
        follower.append_replica(data[:length], offset)
        follower.flush()


def cleaned_bases(log):
    return [s.base_offset for s in log._view[1] if s.cleaned]


@pytest.fixture
def logs(tmp_path):
    opened = {}

    def make(name):
        opened[name] = PartitionLog(tmp_path / name, CONFIG)
        return opened[name]

    yield make
    for log in opened.values():
        if not log.closed:
            log.close()


def test_a_new_follower_of_a_cleaned_leader_holds_the_same_records_at_the_same_offsets(logs, tmp_path):
    leader, follower = logs("leader"), logs("follower")
    written = fill(leader, 8)
    assert leader.clean(NOW, force=True) is not None
    written += fill(leader, 3, start=1000)
    copy(leader, follower)
    assert follower.log_end_offset == leader.log_end_offset
    assert read_all(follower) == read_all(leader)
    assert cleaned_bases(follower), "the cleaned range is stored in the cleaned form"
    assert set(read_all(follower)) <= set(written)  # no offset changed
    # appends go on after the catch-up, at the leader's offsets
    written += fill(leader, 2, start=2000)
    copy(leader, follower)
    assert read_all(follower) == read_all(leader)
    follower.close()
    reopened = PartitionLog(tmp_path / "follower", CONFIG)
    try:
        assert reopened.recovery_reports == []
        assert read_all(reopened) == read_all(leader)
        # the follower cleans on its own: the latest record of each key stays at its offset
        reopened.clean(NOW, force=True)
        assert latest(read_all(reopened)) == latest(read_all(leader)) == latest(written)
        assert set(read_all(reopened)) <= set(written)
    finally:
        reopened.close()


def test_a_follower_that_copied_before_the_cleaning_goes_on_after_it(logs):
    leader, follower = logs("leader"), logs("follower")
    written = fill(leader, 6)
    copy(leader, follower)
    leader.clean(NOW, force=True)
    written += fill(leader, 4, start=1000)
    copy(leader, follower)
    assert follower.log_end_offset == leader.log_end_offset
    assert latest(read_all(follower)) == latest(read_all(leader)) == latest(written)
    follower.clean(NOW, force=True)
    leader.clean(NOW, force=True)
    assert latest(read_all(follower)) == latest(read_all(leader))
    assert set(read_all(follower)) <= set(written) and set(read_all(leader)) <= set(written)


def test_a_follower_behind_a_cleaned_segment_that_ends_in_a_gap_skips_the_gap(logs):
    # Fetched one batch at a time, every gap of the cleaned range is met at
    # the start of a fetch: each becomes an empty cleaned segment or part of one.
    leader, follower = logs("leader"), logs("follower")
    written = fill(leader, 8)
    leader.clean(NOW, force=True)
    fill(leader, 1, start=1000)
    copy(leader, follower, first_batch_only=True)
    assert read_all(follower) == read_all(leader)
    assert follower.log_end_offset == leader.log_end_offset
    assert set(read_all(follower)) - set(read_all(leader)) == set() and written


def _batches(log):
    """(base offset, next offset) of every batch a reader of ``log`` gets."""
    out = []
    offset = log.log_start_offset
    while offset < log.high_watermark:
        data = log.read(offset, 1 << 16).tobytes()
        if not data:
            break
        out.extend((h.base_offset, h.next_offset) for _p, h in iter_batches(data))
        offset = next_offset_after(data, len(data))
    return out


@pytest.mark.parametrize("where", ["kept batch", "inside a batch", "gap", "segment base"])
def test_truncate_replica_cuts_a_cleaned_segment_at_a_batch_boundary(logs, tmp_path, where):
    leader, follower = logs("leader"), logs("follower")
    written = fill(leader, 8)
    copy(leader, follower)
    follower.clean(NOW, force=True)
    segment = next(s for s in follower._view[1] if s.cleaned and len(s.offsets) >= 2)
    base = segment.base_offset
    entries = segment.offsets.entries()
    kept = [(b, n) for b, n in _batches(follower) if base <= b and n <= segment.end_offset]
    gaps = [(a[1], b[0]) for a, b in zip(kept, kept[1:]) if a[1] < b[0]]
    assert gaps, "the cleaner removed something between two kept batches"
    cut, expected = {
        "kept batch": (entries[1].offset, entries[1].offset),
        "inside a batch": next((e.offset + 1, e.offset) for e in entries if e.span > 1),
        "gap": next((a + 1, a + 1) for a, b in gaps if b - a >= 2),
        "segment base": (base, base),
    }[where]
    before = read_all(follower)
    follower.truncate_replica(cut)
    assert follower.log_end_offset == expected
    assert follower.high_watermark <= expected
    assert read_all(follower) == [r for r in before if r[0] < expected]
    # appends go on, at the leader's offsets, and a reopen finds the same log
    copy(leader, follower)
    assert follower.log_end_offset == leader.log_end_offset
    assert latest(read_all(follower)) == latest(written)
    assert set(read_all(follower)) <= set(written)
    after = read_all(follower)
    follower.close()
    reopened = PartitionLog(tmp_path / "follower", CONFIG)
    try:
        assert reopened.recovery_reports == [] and read_all(reopened) == after
    finally:
        reopened.close()


def test_a_batch_the_log_ends_inside_of_is_taken_whole(logs):
    # The replica's copy is cleaned (a batch rewritten into runs), the new
    # leader's is not: the replica's end lies inside one of the leader's
    # batches. It cuts back to that batch's start and takes it whole.
    plain, cleaned, follower = logs("plain"), logs("cleaned"), logs("follower")
    written = fill(plain, 8)
    copy(plain, cleaned)
    cleaned.clean(NOW, force=True)

    def inside_a_plain_batch(log):
        end = log.log_end_offset
        return end < plain.log_end_offset and plain.read_unflushed(end, 1).offset < end

    copy(cleaned, follower, first_batch_only=True, until=inside_a_plain_batch)
    end = follower.log_end_offset
    assert inside_a_plain_batch(follower), "a rewritten batch ends inside one of the plain log's"
    start = plain.read_unflushed(end, 1).offset
    mine = [r for r in read_all(follower) if r[0] < start]
    copy(plain, follower)
    assert follower.log_end_offset == plain.log_end_offset
    assert read_all(follower) == mine + [r for r in read_all(plain) if r[0] >= start]
    assert latest(read_all(follower)) == latest(written)


def test_a_replica_append_of_bad_or_misplaced_batches_is_refused_and_writes_nothing(logs):
    leader, follower = logs("leader"), logs("follower")
    fill(leader, 8)
    leader.clean(NOW, force=True)
    copy(leader, follower)
    end, records = follower.log_end_offset, read_all(follower)
    fill(leader, 1, start=1000)
    data = leader.read_unflushed(end, 1 << 16).tobytes()
    data = data[: whole_batches(data)]
    with pytest.raises(InvalidOffsetError):
        follower.append_replica(data, end + 1)  # not the log end
    old = leader.read_unflushed(leader.log_start_offset, 1 << 16).tobytes()
    old = old[: whole_batches(old)]
    with pytest.raises(InvalidMessageError):
        follower.append_replica(old, end)  # batches this replica holds already
    bad = bytearray(data)
    bad[-1] ^= 0xFF
    with pytest.raises(CorruptMessageError):
        follower.append_replica(bytes(bad), end)
    assert (follower.log_end_offset, read_all(follower)) == (end, records)
    follower.append_replica(data, end)
    follower.flush()
    copy(leader, follower)
    assert read_all(follower) == read_all(leader)


def test_recovery_finishes_a_cleaned_write_or_cut_that_a_crash_interrupted(logs, tmp_path):
    leader, follower = logs("leader"), logs("follower")
    fill(leader, 8)
    leader.clean(NOW, force=True)
    cleaned_end = max(s.end_offset for s in leader._view[1] if s.cleaned)
    copy(leader, follower, max_bytes=1 << 16, until=lambda f: f.log_end_offset >= cleaned_end)
    follower.close()
    directory = tmp_path / "follower"
    # a crash after the cleaned segment's swap, before the new active segment was made
    last = max(int(n[:20]) for n in os.listdir(directory) if n.endswith(".log"))
    assert os.path.getsize(directory / segment_name(last)) == 0
    os.unlink(directory / segment_name(last))
    reopened = PartitionLog(directory, CONFIG)
    assert reopened.log_end_offset == cleaned_end
    assert read_all(reopened) == [r for r in read_all(leader) if r[0] < cleaned_end]
    # a crash in a cut, after the index was rewritten and before the file was cut
    segment = next(s for s in reopened._view[1] if s.cleaned and len(s.offsets) >= 2)
    whole = segment.path + ".whole"
    shutil.copyfile(segment.path, whole)
    cut = segment.offsets.entries()[1].offset
    reopened.truncate_replica(cut)
    after = read_all(reopened)
    reopened.close()
    os.replace(whole, segment.path)
    os.unlink(directory / segment_name(cut))
    again = PartitionLog(directory, CONFIG)
    try:
        assert again.log_end_offset == cut and read_all(again) == after
        copy(leader, again)
        assert read_all(again) == read_all(leader)
    finally:
        again.close()


def test_mend_refuses_a_range_of_a_cleaned_segment(logs):
    leader, follower = logs("leader"), logs("follower")
    fill(leader, 8)
    copy(leader, follower)
    follower.clean(NOW, force=True)
    records = read_all(follower)
    segment = next(s for s in follower._view[1] if s.cleaned and len(s.offsets))
    entry = segment.offsets.entries()[0]
    data = segment.read_at(entry.position, segment.offsets.size_of(entry))
    with pytest.raises(InvalidOffsetError, match="cleaned"):
        follower.mend(entry.offset, data)
    assert read_all(follower) == records


def test_a_pass_never_cleans_past_the_clean_limit(logs):
    log = logs("leader")
    fill(log, 8)
    limit = log.segment_bases[2]
    log.clean_limit = lambda: limit
    result = log.clean(NOW, force=True)
    assert result is not None and result.cleaned_to <= limit
    assert all(s.end_offset <= limit for s in log._view[1] if s.cleaned)
    log.clean_limit = None
    assert log.clean(NOW, force=True).cleaned_to > limit


def test_mend_refuses_a_cleaned_replicas_bytes_for_a_range_stored_uncleaned(logs):
    leader, follower = logs("leader"), logs("follower")
    fill(leader, 8)
    copy(leader, follower)
    leader.clean(NOW, force=True)
    records = read_all(follower)
    segment = next(s for s in leader._view[1] if s.cleaned and len(s.offsets) >= 2)
    entry = segment.offsets.entries()[0]
    # the cleaned leader's bytes from that offset, as a peer serves them, for the follower's same range
    data = leader.read(entry.offset, 1 << 16).tobytes()
    end = next(s.end_offset for s in follower._view[1] if s.base_offset <= entry.offset < s.end_offset)
    data = data[: min(len(data), end - entry.offset)]
    assert data
    with pytest.raises(CorruptMessageError):
        follower.mend(entry.offset, data)
    assert read_all(follower) == records
