"""The segments' record counts (raylog.storage.countindex) under COUNT
(raylog.storage.counting.count_between, count_records): a count of any range
equals a walk of it, a count of a range walked before reads only about a
checkpoint interval at each end, the checkpoints follow truncation, mends and
the cleaner's rewrites, damage is still an error, and no client can make a
segment keep more than one checkpoint per MIN_SPACING_BYTES."""

from __future__ import annotations

import random

import pytest

from raylog.config import TopicConfig
from raylog.errors import CorruptMessageError, InvalidOffsetError, OffsetOutOfRangeError
from raylog.storage.countindex import CHECKPOINT_BYTES, MIN_SPACING_BYTES, SegmentCounts
from raylog.storage.counting import count_between, count_range, count_records
from raylog.storage.log import PartitionLog
from raylog.storage.message import encode_message_set
from raylog.storage.record_batch import encode_batch

from conftest import flip_byte

SEGMENT_BYTES = 3 * CHECKPOINT_BYTES


class ReadCounter:
    """The log, with the bytes its reads asked for counted (what a count walked)."""

    def __init__(self, log):
        self._log = log
        self.asked = 0

    def read(self, offset, max_bytes):
        piece = self._log.read(offset, max_bytes)
        self.asked += piece.length
        return piece

    def __getattr__(self, name):
        return getattr(self._log, name)


def fill(log, batches: int, *, compressed_every: int = 0, seed: int = 1) -> list[int]:
    """Append ``batches`` record batches of 1–40 records (some compressed);
    returns the batch boundaries (their offsets, then the log end)."""
    rng = random.Random(seed)
    bounds = []
    for i in range(batches):
        n = rng.randint(1, 40)
        values = [rng.randbytes(rng.randint(50, 400)) for _ in range(n)]
        codec = "gzip" if compressed_every and i % compressed_every == 0 else None
        bounds.append(log.append(encode_batch(values, compression=codec)))
    log.flush()
    bounds.append(log.high_watermark)
    return bounds


@pytest.fixture
def log(tmp_path):
    log = PartitionLog(tmp_path / "t-0", TopicConfig(segment_bytes=SEGMENT_BYTES, flush_messages=10**9,
                                                     flush_ms=10**9))
    yield log
    log.close()


def walked(log, start, end) -> int:
    """The reference: a plain walk of the range."""
    return count_range(log, start, end, 1 << 40).messages


def test_a_count_of_any_range_equals_a_walk_and_a_second_count_reads_only_near_its_ends(log):
    bounds = fill(log, 2500, compressed_every=7)
    assert len(log.segment_bases) >= 4
    end = log.high_watermark
    counter = ReadCounter(log)
    first = count_between(counter, 0, end)
    assert first == (walked(log, 0, end), end)
    assert counter.asked >= end  # the first count walked (and checked) every byte
    for segment in log._view[1]:  # noqa: SLF001 - the counts learnt, one per interval walked
        assert len(segment.counts) >= segment.size // CHECKPOINT_BYTES
    rng = random.Random(7)
    for _ in range(40):
        a, b = sorted(rng.sample(bounds, 2))
        counter.asked = 0
        assert count_between(counter, a, b) == (walked(log, a, b), b), (a, b)
        # a walk from the last checkpoint before each end: about one interval each
        assert counter.asked <= 2 * (CHECKPOINT_BYTES + 64 * 1024), (a, b, counter.asked)
    counter.asked = 0
    assert count_between(counter, 0, end).messages == first.messages
    assert counter.asked <= CHECKPOINT_BYTES + 64 * 1024  # the active segment's last interval


def test_count_records_with_a_bound_jumps_by_the_counts_and_stops_at_the_same_record(log):
    bounds = fill(log, 2000, compressed_every=5, seed=3)
    end = log.high_watermark
    total = count_between(log, 0, end).messages  # learnt once
    counter = ReadCounter(log)
    for n in (1, 17, 5000, total // 3, total - 1, total, total + 5):
        counter.asked = 0
        got = count_records(counter, 0, end, 64 << 20, n)
        assert got.messages == min(n, total)
        # the same answer as walking that many records one stretch at a time
        pos = seen = 0
        while seen < min(n, total) and pos < end:
            step = count_records(log, pos, end, 1 << 16, min(n, total) - seen)
            pos, seen = step.next_offset, seen + step.messages
        assert got.next_offset == pos, n
        assert counter.asked <= 3 * (CHECKPOINT_BYTES + 64 * 1024), (n, counter.asked)
    mid = bounds[len(bounds) // 2]
    assert count_records(log, mid, end, 64 << 20, -1) == (walked(log, mid, end), end)


def test_the_walk_of_bytes_never_counted_is_bounded_by_max_bytes_and_resumes(log):
    fill(log, 1500)
    end = log.high_watermark
    pos = total = requests = 0
    while pos < end:
        counted = count_between(log, pos, end, 200_000)
        assert pos < counted.next_offset <= end
        pos, total, requests = counted.next_offset, total + counted.messages, requests + 1
    assert total == walked(log, 0, end) and requests >= end // 200_000
    # walked before: answered at once, walking at most the bytes after the last checkpoint
    assert count_between(log, 0, end, 2 * CHECKPOINT_BYTES) == (total, end)


def test_truncation_and_mends_drop_the_counts_past_the_cut(log):
    bounds = fill(log, 1500, seed=5)
    end = log.high_watermark
    count_between(log, 0, end)
    cut = bounds[len(bounds) * 2 // 3]
    log.truncate_replica(cut)
    for segment in log._view[1]:  # noqa: SLF001
        assert all(at <= cut for at, _ in segment.counts.checkpoints())
    fill(log, 300, seed=9)  # other bytes after the cut
    end = log.high_watermark
    assert count_between(log, 0, end) == (walked(log, 0, end), end)
    counts = SegmentCounts(100)
    counts.add(100 + MIN_SPACING_BYTES, 5)
    counts.add(100 + 2 * MIN_SPACING_BYTES, 9)
    counts.truncate(100 + MIN_SPACING_BYTES + 1)
    assert counts.checkpoints() == [(100, 0), (100 + MIN_SPACING_BYTES, 5)]


def test_damage_is_an_error_and_no_checkpoint_is_kept_past_it(log):
    bounds = fill(log, 600, seed=11)
    segment = log._view[1][0]  # noqa: SLF001
    damaged = bounds[len(bounds) // 3]
    assert damaged < segment.base_offset + segment.size
    flip_byte(segment.path, damaged - segment.base_offset + 70)  # inside the batch's records
    with pytest.raises(CorruptMessageError):
        count_between(log, 0, log.high_watermark)
    assert all(at <= damaged for at, _ in segment.counts.checkpoints())
    with pytest.raises(CorruptMessageError):  # and again: never a count that skips it
        count_between(log, 0, log.high_watermark)
    assert count_between(log, 0, damaged) == (walked(log, 0, damaged), damaged)


def test_bad_ranges_raise_as_a_walk_does(log):
    bounds = fill(log, 50)
    hw = log.high_watermark
    with pytest.raises(OffsetOutOfRangeError):
        count_between(log, 0, hw + 1)
    with pytest.raises(OffsetOutOfRangeError):
        count_between(log, bounds[3], bounds[2])
    with pytest.raises(InvalidOffsetError):
        count_between(log, bounds[1] + 3, hw)  # a record's offset is not a boundary for COUNT v0
    with pytest.raises(InvalidOffsetError):
        count_between(log, 0, bounds[1] + 1)  # nor for its end


def test_format_1_segments_are_counted_by_their_checkpoints_too(tmp_path):
    log = PartitionLog(tmp_path / "old", TopicConfig(segment_bytes=SEGMENT_BYTES, flush_messages=10**9,
                                                     flush_ms=10**9))
    try:
        rng = random.Random(2)
        for _ in range(3000):
            log.append(encode_message_set([rng.randbytes(rng.randint(50, 400)) for _ in range(rng.randint(1, 9))]))
        log.flush()
        end = log.high_watermark
        assert count_between(log, 0, end) == (walked(log, 0, end), end)
        counter = ReadCounter(log)
        assert count_between(counter, 0, end).next_offset == end
        assert counter.asked <= CHECKPOINT_BYTES + 64 * 1024
    finally:
        log.close()


def test_tiny_counts_of_a_client_keep_no_checkpoints_closer_than_the_spacing(log):
    fill(log, 1200, seed=13)
    end = log.high_watermark
    pos = 0
    while pos < end:  # one message per request, as a hostile client might ask
        pos = count_between(log, pos, end, 1).next_offset
    for segment in log._view[1]:  # noqa: SLF001
        at = [p for p, _ in segment.counts.checkpoints()]
        gaps = [b - a for a, b in zip(at, at[1:])]
        assert all(g >= MIN_SPACING_BYTES for g in gaps[:-1]), gaps  # the last may be the segment's end
        assert len(at) <= segment.size // MIN_SPACING_BYTES + 2
