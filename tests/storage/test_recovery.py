"""Recovery on open: torn and corrupt tails are cut and reported, never silently."""

import logging
import os

import pytest

from raylog.config import TopicConfig
from raylog.errors import CorruptMessageError, StorageError
from raylog.storage.log import CHECKPOINT_NAME, LOCK_NAME, PartitionLog
from raylog.storage.decoding import decode_messages
from raylog.storage.message import HEADER_SIZE, encode_message_set
from raylog.storage.segment import segment_name
from raylog.storage.format_file import FILE_NAME as FORMAT_NAME

from conftest import crash, flip_byte, read_all

CONFIG = TopicConfig(segment_bytes=4096, max_message_bytes=2048, flush_messages=1_000_000, flush_ms=60_000)


def msgs(*values):
    return encode_message_set([v.encode() for v in values], timestamp_ms=1)


def values(log):
    return [r[3].decode() for r in read_all(log)]


def test_torn_tail_is_truncated_and_reported(tmp_path, caplog):
    log = PartitionLog(tmp_path, CONFIG)
    log.append(msgs("a", "b"))
    log.flush()
    flushed = log.high_watermark
    log.append(msgs("c"))  # written, not flushed: survives a process crash intact
    whole = log.log_end_offset
    torn = msgs("d-was-being-written")
    crash(log)
    with open(tmp_path / segment_name(0), "ab") as f:
        f.write(torn[:15])  # the write was cut short
    with caplog.at_level(logging.WARNING):
        log = PartitionLog(tmp_path, CONFIG)
    (report,) = log.recovery_reports
    assert report.segment_base == 0
    assert (report.start_offset, report.end_offset, report.truncated_bytes) == (whole, whole + 15, 15)
    assert "torn" in report.reason
    assert f"[{whole}, {whole + 15})" in caplog.text and "15 bytes" in caplog.text
    assert flushed < whole == log.high_watermark == log.log_end_offset
    assert values(log) == ["a", "b", "c"]
    assert os.path.getsize(tmp_path / segment_name(0)) == whole
    assert log.append(msgs("e")) == whole  # appends continue where the good data ends
    log.close()
    with PartitionLog(tmp_path, CONFIG) as log:
        assert log.recovery_reports == []
        assert values(log) == ["a", "b", "c", "e"]


def test_flipped_byte_past_the_checkpoint_is_cut_on_reopen(tmp_path, caplog):
    log = PartitionLog(tmp_path, CONFIG)
    log.append(msgs("a"))
    log.flush()
    second = log.log_end_offset
    log.append(msgs("b", "c"))
    end = log.log_end_offset
    crash(log)
    flip_byte(tmp_path / segment_name(0), second + HEADER_SIZE)
    with caplog.at_level(logging.WARNING):
        log = PartitionLog(tmp_path, CONFIG)
    (report,) = log.recovery_reports
    assert (report.start_offset, report.end_offset, report.truncated_bytes) == (second, end, end - second)
    assert "CRC32C" in report.reason and str(second) in report.reason
    assert "recovery" in caplog.text and str(second) in caplog.text
    assert values(log) == ["a"]
    log.close()


def test_damage_below_the_checkpoint_is_found_by_readers(tmp_path):
    with PartitionLog(tmp_path, CONFIG) as log:
        log.append(msgs("a", "b"))
    flip_byte(tmp_path / segment_name(0), HEADER_SIZE)
    with PartitionLog(tmp_path, CONFIG) as log:
        # found on open (the whole active segment is checked), reported, kept...
        (report,) = log.recovery_reports
        assert (report.start_offset, report.end_offset, report.truncated_bytes, report.kept) == (
            0, len(msgs("a")), 0, True)
        with pytest.raises(CorruptMessageError) as err:  # ...and named when read
            log.read(0, 100)
        assert err.value.offset == 0 and err.value.next_offset == len(msgs("a"))
        chunk = log.read(len(msgs("a")), 100)
        records, _ = decode_messages(os.pread(chunk.file.fileno(), chunk.length, chunk.position), chunk.offset)
        assert [r[3] for r in records] == [b"b"]


def test_missing_checkpoint_checks_the_whole_last_segment(tmp_path):
    with PartitionLog(tmp_path, CONFIG) as log:
        log.append(msgs("a", "b", "c"))
    os.unlink(tmp_path / CHECKPOINT_NAME)
    flip_byte(tmp_path / segment_name(0), len(msgs("a")) + HEADER_SIZE + 0)
    with PartitionLog(tmp_path, CONFIG) as log:
        (report,) = log.recovery_reports
        assert report.start_offset == len(msgs("a"))
        assert values(log) == ["a"]


def test_unreadable_checkpoint_is_treated_as_missing(tmp_path):
    with PartitionLog(tmp_path, CONFIG) as log:
        log.append(msgs("a", "b"))
    (tmp_path / CHECKPOINT_NAME).write_text("garbage")
    with PartitionLog(tmp_path, CONFIG) as log:
        assert log.recovery_reports == [] and values(log) == ["a", "b"]


def test_damage_in_an_earlier_segment_drops_the_segments_after_it(tmp_path):
    config = CONFIG.replace(segment_bytes=256, max_message_bytes=256)
    log = PartitionLog(tmp_path, config)
    offsets = [log.append(msgs(f"message number {i:02d}" * 3)) for i in range(12)]
    crash(log)  # never flushed: the checkpoint is still 0
    bases = log.segment_bases
    assert len(bases) >= 4
    victim = bases[1]
    flip_byte(tmp_path / segment_name(victim), 30)
    log = PartitionLog(tmp_path, config)
    reports = log.recovery_reports
    assert [r.segment_base for r in reports] == bases[:1:-1] + [victim]
    assert all("follows the damaged data" in r.reason for r in reports[:-1])
    assert reports[-1].start_offset == victim and reports[-1].truncated_bytes > 0
    assert sum(r.truncated_bytes for r in reports) == offsets[-1] + len(msgs("message number 11" * 3)) - victim
    assert log.segment_bases == bases[:2] and log.log_end_offset == victim
    assert not (tmp_path / segment_name(bases[2])).exists()
    assert values(log) == [f"message number {i:02d}" * 3 for i, o in enumerate(offsets) if o < victim]
    log.close()


def test_checkpoint_beyond_the_log_end_is_reported(tmp_path):
    with PartitionLog(tmp_path, CONFIG) as log:
        log.append(msgs("a", "b"))
        end = log.log_end_offset
    os.truncate(tmp_path / segment_name(0), len(msgs("a")))
    with PartitionLog(tmp_path, CONFIG) as log:
        (report,) = log.recovery_reports
        assert report.start_offset == len(msgs("a")) and report.end_offset == end
        assert "missing" in report.reason
        assert values(log) == ["a"]


def test_segments_that_are_not_contiguous_refuse_to_open(tmp_path):
    with PartitionLog(tmp_path, CONFIG.replace(segment_bytes=256, max_message_bytes=256)) as log:
        for i in range(10):
            log.append(msgs(f"m{i}" * 40))
        bases = log.segment_bases
    os.truncate(tmp_path / segment_name(bases[0]), 10)
    with pytest.raises(StorageError, match="not contiguous"):
        PartitionLog(tmp_path, CONFIG)


def test_clean_reopen_reports_nothing_and_keeps_everything(tmp_path, compression):
    with PartitionLog(tmp_path, CONFIG) as log:
        for i in range(50):
            log.append(encode_message_set([f"{i}-{j}".encode() for j in range(4)], compression=compression))
    with PartitionLog(tmp_path, CONFIG) as log:
        assert log.recovery_reports == []
        assert len(read_all(log)) == 200
        assert log.high_watermark == log.log_end_offset


def test_empty_directory_starts_an_empty_log(tmp_path):
    with PartitionLog(tmp_path / "new" / "topic-0", CONFIG) as log:
        assert (log.log_start_offset, log.high_watermark, log.log_end_offset) == (0, 0, 0)
        assert log.segment_bases == [0] and log.size_bytes == 0
    assert sorted(os.listdir(tmp_path / "new" / "topic-0")) == sorted([segment_name(0), CHECKPOINT_NAME, LOCK_NAME, FORMAT_NAME])


def test_checkpoint_with_a_bad_crc_is_not_trusted(tmp_path, caplog):
    with PartitionLog(tmp_path, CONFIG) as log:
        log.append(msgs("a", "b"))
        end = log.log_end_offset
    record = (tmp_path / CHECKPOINT_NAME).read_bytes()
    assert len(record) == 30 and int(record[:20]) == end
    (tmp_path / CHECKPOINT_NAME).write_bytes(b"%020d" % (end * 10) + record[20:])  # digits changed
    flip_byte(tmp_path / segment_name(0), HEADER_SIZE)  # so the full check shows
    with caplog.at_level(logging.WARNING):
        log = PartitionLog(tmp_path, CONFIG)
    assert "damaged recovery point" in caplog.text
    (report,) = log.recovery_reports  # not "missing flushed bytes": the record was ignored
    assert report.start_offset == 0 and "CRC32C" in report.reason
    log.close()
