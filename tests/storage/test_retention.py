"""Retention: whole old segments only, never the active one, by time and by size."""

import os

import pytest

from raylog.config import TopicConfig
from raylog.errors import OffsetOutOfRangeError
from raylog.storage.log import PartitionLog
from raylog.storage.message import encode_message_set
from raylog.storage.segment import segment_name

from conftest import read_all

HOUR_MS = 3600 * 1000
NOW_MS = 1_700_000_000_000


def config(**changes):
    base = TopicConfig(segment_bytes=1024, max_message_bytes=1024, flush_messages=1_000_000, retention_ms=HOUR_MS)
    return base.replace(**changes)


def fill(log, count=20, size=400):
    for i in range(count):
        log.append(encode_message_set([f"{i:03d}".encode() + b"." * size], timestamp_ms=1))
    log.flush()


def age(tmp_path, base, ms_before_now):
    t = (NOW_MS - ms_before_now) / 1000
    os.utime(tmp_path / segment_name(base), (t, t))


def test_time_retention_never_deletes_the_active_segment(tmp_path):
    with PartitionLog(tmp_path, config()) as log:
        fill(log)
        bases = log.segment_bases
        for base in bases:
            age(tmp_path, base, 2 * HOUR_MS)
        deleted = log.delete_old_segments(NOW_MS)
        assert [b for b, _ in deleted] == bases[:-1]
        assert log.segment_bases == bases[-1:] and log.log_start_offset == bases[-1]
        assert sorted(os.listdir(tmp_path)) == sorted([segment_name(bases[-1]), "format", "lock", "recovery-point"])
        assert log.delete_old_segments(NOW_MS) == []


def test_time_retention_deletes_only_the_old_prefix(tmp_path):
    with PartitionLog(tmp_path, config()) as log:
        fill(log)
        bases = log.segment_bases
        assert len(bases) >= 5
        for base in bases:
            age(tmp_path, base, 0)
        age(tmp_path, bases[0], 2 * HOUR_MS)
        age(tmp_path, bases[1], HOUR_MS + 1)
        age(tmp_path, bases[3], 5 * HOUR_MS)  # old, but newer data comes before it
        deleted = log.delete_old_segments(NOW_MS)
        assert deleted == [(bases[0], bases[1] - bases[0]), (bases[1], bases[2] - bases[1])]
        assert log.log_start_offset == bases[2]
        with pytest.raises(OffsetOutOfRangeError) as err:
            log.read(0, 100)
        assert err.value.earliest == bases[2]
        assert read_all(log)[0][0] == bases[2]


def test_size_retention_deletes_oldest_while_larger_than_the_limit(tmp_path):
    with PartitionLog(tmp_path, config(retention_bytes=2500, retention_ms=10 * HOUR_MS)) as log:
        fill(log)
        bases, total = log.segment_bases, log.size_bytes
        deleted = log.delete_old_segments(NOW_MS)
        assert deleted and [b for b, _ in deleted] == bases[: len(deleted)]
        assert log.size_bytes == total - sum(size for _, size in deleted)
        assert log.size_bytes <= 2500 < log.size_bytes + deleted[-1][1]
        assert log.log_start_offset == bases[len(deleted)]


def test_size_retention_zero_keeps_only_the_active_segment(tmp_path):
    with PartitionLog(tmp_path, config(retention_bytes=0, retention_ms=10 * HOUR_MS)) as log:
        fill(log)
        log.delete_old_segments(NOW_MS)
        assert len(log.segment_bases) == 1 and log.size_bytes > 0
        assert log.read(log.log_start_offset, 10).length > 0


def test_retention_keeps_segments_that_are_not_flushed(tmp_path):
    with PartitionLog(tmp_path, config(retention_bytes=0)) as log:
        fill(log)
        flushed = log.high_watermark
        for i in range(10):
            log.append(encode_message_set([b"u" * 400]))  # rolls, but no flush
        deleted = log.delete_old_segments(NOW_MS + 100 * HOUR_MS)
        assert all(base + size <= flushed for base, size in deleted)
        assert log.log_start_offset <= flushed


def test_retention_survives_reopen(tmp_path):
    with PartitionLog(tmp_path, config(retention_bytes=0)) as log:
        fill(log)
        log.delete_old_segments(NOW_MS)
        start, hw = log.log_start_offset, log.high_watermark
    with PartitionLog(tmp_path, config()) as log:
        assert (log.log_start_offset, log.high_watermark) == (start, hw)
        assert log.recovery_reports == []


def test_no_limits_delete_nothing(tmp_path):
    with PartitionLog(tmp_path, config(retention_ms=10 * HOUR_MS)) as log:
        fill(log)
        assert log.delete_old_segments(NOW_MS) == []
        assert log.delete_old_segments() == []  # real clock: the files are new


# -- segment_ms: a quiet partition's active segment rolls by age -----------------


class Clock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_quiet_active_segment_rolls_after_segment_ms_so_retention_reaches_it(tmp_path):
    clock = Clock(NOW_MS / 1000)
    cfg = config(segment_bytes=1 << 20, segment_ms=60_000, retention_ms=120_000)
    with PartitionLog(tmp_path, cfg, clock=clock) as log:
        log.append(encode_message_set([b"old"], timestamp_ms=1))
        log.flush()
        assert not log.maybe_roll()  # young: stays
        clock.now += 61
        assert log.maybe_roll()
        assert len(log.segment_bases) == 2
        assert not log.maybe_roll()  # the new active segment is empty: never rolls
        age(tmp_path, 0, 121_000)
        deleted = log.delete_old_segments(NOW_MS)
        assert [b for b, _ in deleted] == [0]
        log.append(encode_message_set([b"new"], timestamp_ms=1))
        log.flush()
        assert [r[3] for r in read_all(log)] == [b"new"]


def test_segment_ms_counts_from_the_first_message_of_the_segment(tmp_path):
    clock = Clock(NOW_MS / 1000)
    with PartitionLog(tmp_path, config(segment_bytes=1 << 20, segment_ms=60_000), clock=clock) as log:
        clock.now += 3600  # an empty segment does not age
        log.append(encode_message_set([b"a"], timestamp_ms=1))
        clock.now += 30
        assert not log.maybe_roll()
        clock.now += 31
        assert log.maybe_roll()
