"""Deleting records before an offset (PartitionLog.delete_records_before,
Kafka's DeleteRecords): the log start moves, inside a segment too, is kept
across a reopen, and reads, lookups, counts, retention and truncation honour it."""

import pytest

from raylog.config import TopicConfig
from raylog.errors import OffsetOutOfRangeError
from raylog.storage import log_start
from raylog.storage.counting import count_between, count_range, count_records
from raylog.storage.decoding import decode_messages
from raylog.storage.log import PartitionLog
from raylog.storage.message import encode_message_set
from raylog.storage.record_batch import encode_batch

CONFIG = TopicConfig(segment_bytes=2048, max_message_bytes=1024, flush_messages=10**9, flush_ms=10**9)


def _fill_batches(log, batches=12, records=5):
    """Format 2: ``batches`` batches of ``records`` records each (keyed); their base offsets."""
    bases = []
    for b in range(batches):
        values = [b"%02d-%d" % (b, r) + b"." * 100 for r in range(records)]
        keys = [b"k%02d-%d" % (b, r) for r in range(records)]
        bases.append(log.append(encode_batch(values, keys, timestamp_ms=1000 + b)))
    log.flush()
    return bases


def _fill_messages(log, count=20):
    """Format 1: ``count`` plain messages; their offsets."""
    offsets = [log.append(encode_message_set([b"m%03d" % i + b"." * 200], timestamp_ms=1000 + i))
               for i in range(count)]
    log.flush()
    return offsets


def _records_from(log, offset):
    """Every (offset, value) a reader gets from ``offset`` on (records before it skipped)."""
    got, pos = [], offset
    while pos < log.high_watermark:
        chunk = log.read(pos, 1 << 20)
        records, consumed = decode_messages(chunk.tobytes(), chunk.offset)
        got += [(o, v) for o, _ts, _k, v in records if o >= offset]
        pos = chunk.offset + consumed
    return got


def test_the_start_moves_inside_a_batch_and_a_reader_from_it_skips_the_records_before(tmp_path):
    with PartitionLog(tmp_path / "p", CONFIG) as log:
        bases = _fill_batches(log)
        everything = _records_from(log, 0)
        target = bases[3] + 2  # the third record of the fourth batch
        assert log.delete_records_before(target) == target
        assert log.log_start_offset == target
        assert log.segment_bases[0] <= bases[3] < target  # inside a segment still held
        chunk = log.read(target, 1 << 20)
        assert chunk.offset == bases[3]  # the whole batch, as Kafka serves it
        assert _records_from(log, target) == [r for r in everything if r[0] >= target]
        with pytest.raises(OffsetOutOfRangeError) as err:
            log.read(bases[3], 1 << 20)
        assert err.value.details["earliest"] == target


def test_reads_below_the_start_are_out_of_range_as_below_retention(tmp_path):
    with PartitionLog(tmp_path / "p", CONFIG) as log:
        offsets = _fill_messages(log)
        log.delete_records_before(offsets[5])
        for below in (0, offsets[4], offsets[5] - 1):
            with pytest.raises(OffsetOutOfRangeError, match=rf"outside the log \[{offsets[5]},"):
                log.read(below, 100)
        assert log.read(offsets[5], 1 << 20).offset == offsets[5]


def test_a_format_1_start_inside_a_message_moves_to_the_next_message(tmp_path):
    with PartitionLog(tmp_path / "p", CONFIG) as log:
        offsets = _fill_messages(log)
        assert log.delete_records_before(offsets[7] + 3) == offsets[8]
        assert log.log_start_offset == offsets[8]
        assert [v[:4] for _o, v in _records_from(log, offsets[8])][0] == b"m008"


def test_the_start_is_kept_across_a_reopen(tmp_path):
    with PartitionLog(tmp_path / "p", CONFIG) as log:
        bases = _fill_batches(log)
        target = bases[2] + 1
        log.delete_records_before(target)
    assert log_start.read(str(tmp_path / "p")) == target
    with PartitionLog(tmp_path / "p", CONFIG) as log:
        assert log.log_start_offset == target
        with pytest.raises(OffsetOutOfRangeError):
            log.read(bases[2], 100)


def test_a_recorded_start_past_the_log_end_is_bounded_to_it_on_open(tmp_path):
    with PartitionLog(tmp_path / "p", CONFIG) as log:
        _fill_messages(log, 5)
        end = log.high_watermark
    log_start.write(str(tmp_path / "p"), end + 10_000)  # (a log cut shorter than its start)
    with PartitionLog(tmp_path / "p", CONFIG) as log:
        assert log.log_start_offset == end
        offset = log.append(encode_message_set([b"new"]))
        log.flush()
        assert offset == end
    with PartitionLog(tmp_path / "p", CONFIG) as log:  # the new message stays readable
        assert log.log_start_offset == end
        assert [v for _o, v in _records_from(log, end)] == [b"new"]


def test_segments_wholly_below_the_start_are_deleted_the_one_holding_it_kept(tmp_path):
    with PartitionLog(tmp_path / "p", CONFIG) as log:
        bases = _fill_batches(log, batches=30)
        segments = log.segment_bases
        assert len(segments) > 4
        target = segments[3] + 1 if segments[3] in bases else segments[3]
        log.delete_records_before(target)
        assert log.segment_bases == segments[3:]
        assert log.log_start_offset == target
        names = sorted(p.name for p in (tmp_path / "p").glob("*.log"))
        assert len(names) == len(segments) - 3


@pytest.mark.parametrize("policy", ["delete", "compact"])
def test_retention_deletes_a_segment_the_start_passed_once_it_is_closed(tmp_path, policy):
    # retention by time and size off (or a compacted topic): only the start deletes
    config = CONFIG.replace(retention_ms=10**12, cleanup_policy=policy, max_message_bytes=2048)
    big = [b"v" * 1100]  # two of these never share a segment of 2048 bytes
    with PartitionLog(tmp_path / "p", config) as log:
        _fill_batches(log, batches=30)
        log.append(encode_batch(big, keys=[b"k"]))
        log.flush()
        start = log.delete_records_before(-1)
        assert len(log.segment_bases) == 1  # the active segment, at whose end the start lies, stays
        held = log.segment_bases[0]
        log.append(encode_batch(big, keys=[b"k"]))  # rolls: the held segment is closed, wholly below the start
        log.flush()
        assert log.segment_bases == [held, start]
        assert log.delete_old_segments() == [(held, start - held)]
        assert log.segment_bases == [start] and log.log_start_offset == start


def test_the_start_never_moves_backwards(tmp_path):
    with PartitionLog(tmp_path / "p", CONFIG) as log:
        bases = _fill_batches(log)
        assert log.delete_records_before(bases[5]) == bases[5]
        assert log.delete_records_before(bases[2]) == bases[5]
        assert log.delete_records_before(bases[5]) == bases[5]
        assert log.log_start_offset == bases[5]
        assert log_start.read(str(tmp_path / "p")) == bases[5]


def test_minus_one_is_the_high_watermark(tmp_path):
    with PartitionLog(tmp_path / "p", CONFIG) as log:
        _fill_batches(log)
        hw = log.high_watermark
        log.append(encode_batch([b"unflushed"]))  # appended, not below the high watermark yet
        assert log.delete_records_before(-1) == hw
        log.flush()
        assert [v for _o, v in _records_from(log, hw)] == [b"unflushed"]


@pytest.mark.parametrize("bad", ["past", "negative"])
def test_an_offset_beyond_the_high_watermark_is_refused_naming_the_bounds_and_nothing_changes(tmp_path, bad):
    with PartitionLog(tmp_path / "p", CONFIG) as log:
        bases = _fill_batches(log)
        log.append(encode_batch([b"unflushed"]))
        hw, segments = log.high_watermark, log.segment_bases
        everything = _records_from(log, 0)
        offset = hw + 1 if bad == "past" else -2
        with pytest.raises(OffsetOutOfRangeError, match=rf"outside \[0, {hw}\]") as err:
            log.delete_records_before(offset)
        assert err.value.details == {"offset": offset, "earliest": 0, "latest": hw}
        assert log.log_start_offset == 0 and log.segment_bases == segments
        assert not (tmp_path / "p" / log_start.FILE_NAME).exists()
        assert _records_from(log, 0) == everything
        # a replicated leader's bound (its committed offset) is honoured as well
        with pytest.raises(OffsetOutOfRangeError):
            log.delete_records_before(bases[4], high_watermark=bases[3])
        assert log.log_start_offset == 0


def test_counts_and_time_lookups_start_at_the_start(tmp_path):
    with PartitionLog(tmp_path / "p", CONFIG) as log:
        offsets = _fill_messages(log)
        log.delete_records_before(offsets[6])
        hw = log.high_watermark
        assert count_range(log, offsets[6], hw, 1 << 30) == (len(offsets) - 6, hw)
        assert count_between(log, offsets[6], hw) == (len(offsets) - 6, hw)
        with pytest.raises(OffsetOutOfRangeError):
            count_range(log, offsets[5], hw, 1 << 30)
        assert log.offset_for_time(0) == offsets[6]  # the first message at or after 0 was deleted
        assert log.offset_for_time(1000 + 9) == offsets[9]
        assert log.offsets_before(-2) == [offsets[6]]


def test_a_count_from_a_start_inside_a_batch_counts_the_records_at_and_after_it(tmp_path):
    with PartitionLog(tmp_path / "p", CONFIG) as log:
        bases = _fill_batches(log)
        log.delete_records_before(bases[4] + 3)
        hw = log.high_watermark
        expected = len(_records_from(log, bases[4] + 3))
        assert expected == 2 + 5 * (len(bases) - 5)
        assert count_records(log, log.log_start_offset, hw, 1 << 30, -1) == (expected, hw)
        assert count_records(log, log.log_start_offset, hw, 1 << 30, 4) == (4, bases[5] + 2)
        with pytest.raises(OffsetOutOfRangeError):
            count_records(log, bases[4] + 2, hw, 1 << 30, -1)


def test_truncation_below_the_start_brings_the_start_to_the_cut(tmp_path):
    with PartitionLog(tmp_path / "p", CONFIG) as log:
        bases = _fill_batches(log)
        log.delete_records_before(bases[6] + 1)
        log.truncate_replica(bases[6])
        assert log.log_start_offset == log.log_end_offset == bases[6]
    with PartitionLog(tmp_path / "p", CONFIG) as log:
        assert log.log_start_offset == bases[6]


def test_a_follower_takes_a_larger_leader_start_within_its_log(tmp_path):
    with PartitionLog(tmp_path / "p", CONFIG) as log:
        bases = _fill_batches(log)
        assert log.advance_log_start(bases[2] + 1) == bases[2] + 1
        assert log.advance_log_start(bases[1]) == bases[2] + 1  # never back
        end = log.log_end_offset
        assert log.advance_log_start(end + 500) == end  # not past its own log
    with PartitionLog(tmp_path / "p", CONFIG) as log:
        assert log.log_start_offset == end


def test_the_cleaner_never_brings_back_records_below_the_start(tmp_path):
    config = CONFIG.replace(cleanup_policy="compact", min_compaction_lag_ms=0, min_cleanable_dirty_ratio=0.01)
    with PartitionLog(tmp_path / "p", config) as log:
        for round_ in range(3):  # every key written three times: the cleaner removes the older ones
            for k in range(8):
                log.append(encode_batch([b"r%d-%d" % (round_, k) + b"." * 150], [b"k%d" % k], timestamp_ms=1))
        log.flush()
        first = log.segment_bases[0]
        target = first + 1  # inside the first batch of the first segment
        log.delete_records_before(target)
        kept = _records_from(log, target)
        assert log.clean(now_ms=10**13, force=True) is not None
        assert log.segment_bases[0] == first and log.log_start_offset == target
        with pytest.raises(OffsetOutOfRangeError):
            log.read(first, 100)
        assert all(o >= target for o, _v in _records_from(log, target))
        assert set(_records_from(log, target)) <= set(kept)
    with PartitionLog(tmp_path / "p", config) as log:
        assert log.log_start_offset == target
