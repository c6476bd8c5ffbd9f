"""The segments' time index (raylog.storage.timeindex) through PartitionLog:
offset_for_time lands on the first message at or after a time, across
segments, with out-of-order timestamps and compressed wrappers, and after
reopening, truncation by recovery, a lost index file and retention."""

from __future__ import annotations

import os
import random

import pytest

from raylog.config import TopicConfig
from raylog.storage.log import PartitionLog
from raylog.storage.message import encode_message_set
from raylog.storage.timeindex import ENTRY, INDEX_INTERVAL_BYTES, SUFFIX

CONFIG = TopicConfig(segment_bytes=64 * 1024, max_message_bytes=8192)


def expected(offsets, times, t, hw):
    """The first message (in log order) with a timestamp at or after t."""
    for offset, ts in zip(offsets, times):
        if ts >= t:
            return offset
    return hw


def fill(log, times, values=None):
    offsets = []
    for i, ts in enumerate(times):
        value = values[i] if values else b"v%05d" % i + b"." * (i % 40)
        offsets.append(log.append(encode_message_set([value], timestamp_ms=ts)))
    log.flush()
    return offsets


def test_offset_for_time_is_the_first_message_at_or_after_the_time(tmp_path):
    rng = random.Random(7)
    # mostly rising times with jitter: not monotonic
    times = [10_000 + i * 5 + rng.randint(-20, 20) for i in range(4000)]
    with PartitionLog(tmp_path, CONFIG) as log:
        offsets = fill(log, times)
        assert len(log.segment_bases) > 2
        hw = log.high_watermark
        for t in [0, 9_000, *rng.sample(range(9_950, 30_100), 300), 40_000]:
            assert log.offset_for_time(t) == expected(offsets, times, t, hw), t
        files = sorted(f for f in os.listdir(tmp_path) if f.endswith(SUFFIX))
        assert len(files) == len(log.segment_bases)
        # sparse: about one entry per INDEX_INTERVAL_BYTES of log
        entries = sum(os.path.getsize(tmp_path / f) for f in files) // ENTRY.size
        assert 0 < entries <= hw // INDEX_INTERVAL_BYTES + len(files)


def test_compressed_sets_are_found_as_their_wrapper(tmp_path):
    with PartitionLog(tmp_path, CONFIG) as log:
        first = log.append(encode_message_set([b"a", b"b"], timestamp_ms=[100, 200]))
        second = log.append(encode_message_set([b"c", b"d"], timestamp_ms=[300, 400], compression="gzip"))
        log.flush()
        assert log.offset_for_time(100) == first
        assert first < log.offset_for_time(150) < second  # a plain set: its second message
        assert log.offset_for_time(350) == second  # inside the wrapper: the wrapper
        assert log.offset_for_time(401) == log.high_watermark


def test_the_index_survives_reopening_and_is_rebuilt_when_lost_or_cut(tmp_path):
    times = list(range(1_000, 5_000))
    with PartitionLog(tmp_path, CONFIG) as log:
        offsets = fill(log, times)
        hw = log.high_watermark
    with PartitionLog(tmp_path, CONFIG) as log:  # reopened: entries read back
        assert all(log.offset_for_time(t) == expected(offsets, times, t, hw) for t in range(900, 5_100, 37))
        log.append(encode_message_set([b"late"], timestamp_ms=9_000))
        log.flush()
        assert log.offset_for_time(8_000) == hw
    for name in os.listdir(tmp_path):  # every index lost or damaged
        if name.endswith(SUFFIX):
            with open(tmp_path / name, "r+b") as f:
                f.truncate(os.path.getsize(tmp_path / name) // 2 + 3)
    with PartitionLog(tmp_path, CONFIG) as log:
        assert all(log.offset_for_time(t) == expected(offsets, times, t, hw) for t in range(900, 5_100, 37))
    # a torn tail cut by recovery: the index forgets what was cut
    last = sorted(n for n in os.listdir(tmp_path) if n.endswith(".log"))[-1]
    with open(tmp_path / last, "ab") as f:
        f.write(b"\x00\x00\x00\x40torn")
    with PartitionLog(tmp_path, CONFIG) as log:
        assert log.recovery_reports
        assert log.offset_for_time(8_000) == hw
        assert log.offset_for_time(10_000) == log.high_watermark


def test_retention_deletes_the_index_with_its_segment(tmp_path):
    config = TopicConfig(segment_bytes=16 * 1024, max_message_bytes=4096, retention_bytes=16 * 1024)
    times = list(range(1_000, 3_000))
    with PartitionLog(tmp_path, config) as log:
        fill(log, times)
        before = set(log.segment_bases)
        deleted = log.delete_old_segments()
        assert deleted
        for base, _size in deleted:
            assert not os.path.exists(tmp_path / f"{base:020d}{SUFFIX}")
        assert log.offset_for_time(0) == log.log_start_offset  # the oldest time left: the log start
        assert set(log.segment_bases) < before


@pytest.mark.parametrize("t", [0, 2_500])
def test_an_empty_log_answers_its_end(tmp_path, t):
    with PartitionLog(tmp_path, CONFIG) as log:
        assert log.offset_for_time(t) == 0
