"""Format 2 in the partition log (docs/design.md §2): record batches stored
beside format 1's messages, one format a segment, stamped at append,
idempotent batches judged by their own fields, read, recovered, skipped
past and time-indexed -- against the file log and the in-memory log."""

from __future__ import annotations

import os
import struct

import pytest

import raylog.errors
from crc32c import crc32c

from raylog.config import TopicConfig
from raylog.errors import (
    CorruptMessageError,
    InvalidMessageError,
    MessageTooLargeError,
    OutOfOrderSequenceError,
)
from raylog.storage import record_batch as rb
from raylog.storage.batch_producers import BATCHES_REMEMBERED, snapshot_name
from raylog.storage.log import PartitionLog
from raylog.storage.memory import MemoryLog
from raylog.storage.message import encode_message_set
from raylog.storage.record_batch import (
    HEADER_SIZE,
    MAX_BATCH_LENGTH,
    decode_batch,
    encode_batch,
    read_header,
    validate_batch,
)
from raylog.storage.segment import segment_name

from conftest import crash, flip_byte

CONFIG = TopicConfig(flush_messages=10**9, flush_ms=10**9)
KINDS = ["file", "memory"]


@pytest.fixture(params=KINDS)
def make(request, tmp_path):
    opened = []

    def _make(config=CONFIG):
        log = PartitionLog(tmp_path / "p", config) if request.param == "file" else MemoryLog(config)
        opened.append(log)
        return log

    yield _make
    for log in opened:
        if not log.closed:
            log.close()


def _read_bytes(log, offset, max_bytes=1 << 20):
    chunk = log.read(offset, max_bytes)
    return chunk.offset, chunk.tobytes()


def _batches(data):
    """Every batch of ``data`` (whole ones), decoded."""
    return [decode_batch(data, pos) for pos, _h in rb.iter_batches(data)]


def _client_batch_shorter_than_count(count=5_000):
    """A Kafka client's zstd batch of ``count`` empty records, fewer bytes than records."""
    plain = encode_batch([b""] * count, timestamp_ms=0)
    section = rb._compress(rb.CODEC_ZSTD, plain[HEADER_SIZE:])
    head = bytearray(plain[:HEADER_SIZE])
    struct.pack_into(">h", head, 21, rb.CODEC_ZSTD)
    batch = bytearray(head + section)
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    struct.pack_into(">i", batch, 23, count - 1)
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
    assert len(batch) < count
    return bytes(batch)


# --------------------------------------------------------------------------
# appends


def test_batches_are_stamped_with_their_offsets_and_the_leader_epoch(make):
    log = make()
    first = log.append(encode_message_set([b"one", b"two"], timestamp_ms=5))
    a = log.append(encode_batch([b"x", None, b""], keys=[b"k", None, None], timestamp_ms=10), leader_epoch=4)
    b = log.append(encode_batch([b"y"], timestamp_ms=11) + encode_batch([b"z", b"w"], timestamp_ms=12))
    log.flush()
    assert first == 0 and a > first and b > a
    start, data = _read_bytes(log, a)
    assert start == a
    decoded = _batches(data)
    headers = [d.header for d in decoded]
    assert [h.base_offset for h in headers] == [a, b, b + headers[1].size]
    assert [h.partition_leader_epoch for h in headers] == [4, -1, -1]
    assert all(h.next_offset == h.base_offset + h.size for h in headers)
    assert [r.offset for r in decoded[0].records] == [a, a + 1, a + 2]
    # a null value and an empty value stay apart; headers and keys as sent
    assert [(r.key, r.value) for r in decoded[0].records] == [(b"k", b"x"), (None, None), (None, b"")]
    assert log.log_end_offset == b + headers[1].size + headers[2].size


def test_first_batch_after_format_1_rolls_a_segment_of_its_own(tmp_path):
    log = PartitionLog(tmp_path / "p", CONFIG)
    log.append(encode_message_set([b"old"], timestamp_ms=1))
    at = log.append(encode_batch([b"new"], timestamp_ms=2))
    log.append(encode_batch([b"newer"], timestamp_ms=3))
    assert log.segment_bases == [0, at]
    log.close()
    log = PartitionLog(tmp_path / "p", CONFIG)  # the formats are read back from the bytes
    segments = log._view[1]  # noqa: SLF001
    assert [s.format for s in segments] == [1, 2]
    # and back: format 1 after format 2 rolls again
    back = log.append(encode_message_set([b"again"], timestamp_ms=4))
    assert log.segment_bases == [0, at, back]
    log.close()


def test_an_empty_segment_takes_the_format_of_its_first_append(tmp_path):
    log = PartitionLog(tmp_path / "p", CONFIG)
    log.append(encode_batch([b"first"], timestamp_ms=1))
    assert log.segment_bases == [0]
    assert log._active.format == 2  # noqa: SLF001
    log.close()


def test_batch_longer_than_16_mib_is_refused_whatever_max_message_bytes_says():
    head = bytearray(encode_batch([b"v"], timestamp_ms=0)[:HEADER_SIZE])
    struct.pack_into(">i", head, 8, MAX_BATCH_LENGTH + 1)  # byte 8 would be 1: format 1's magic
    with pytest.raises(MessageTooLargeError) as info:
        validate_batch(bytes(head), max_message_bytes=64 << 20)
    assert info.value.details["limit"] == MAX_BATCH_LENGTH
    assert "16 MiB" in str(info.value)
    # just below: the top byte stays 0, the bytes read as format 2
    struct.pack_into(">i", head, 8, MAX_BATCH_LENGTH)
    assert rb.format_at(bytes(head)) == 2


def test_compressed_batch_shorter_than_its_count_is_stored_uncompressed(make):
    log = make(TopicConfig(flush_messages=10**9, flush_ms=10**9, max_message_bytes=1 << 20))
    before = log.append(encode_batch([b"before"], timestamp_ms=0))
    at = log.append(_client_batch_shorter_than_count())
    after = log.append(encode_batch([b"after"], timestamp_ms=0))
    log.flush()
    _start, data = _read_bytes(log, at, 1 << 20)
    header = read_header(data)
    assert header.codec == 0 and header.count == 5_000 and header.size >= 5_000
    assert after == at + header.size > before
    assert [r.offset for r in decode_batch(data).records][-1] == at + 4_999 < after


def test_a_bad_batch_is_refused_and_what_was_stored_is_intact(make):
    log = make()
    good = encode_batch([b"kept"], timestamp_ms=1)
    at = log.append(good)
    end = log.log_end_offset
    bad = bytearray(encode_batch([b"lost"], timestamp_ms=2))
    bad[-1] ^= 0x01
    with pytest.raises(CorruptMessageError):
        log.append(encode_batch([b"also lost"], timestamp_ms=2) + bytes(bad))  # nothing of the append is stored
    with pytest.raises(InvalidMessageError):
        log.append(encode_batch([b"cut"], timestamp_ms=3)[:-2])
    assert log.log_end_offset == end
    log.flush()
    _start, data = _read_bytes(log, at)
    assert [r.value for d in _batches(data) for r in d.records] == [b"kept"]


def test_flush_messages_counts_records_of_batches(tmp_path):
    log = PartitionLog(tmp_path / "p", TopicConfig(flush_messages=10**9, flush_ms=10**9))
    log.append(encode_batch([b"a", b"b", b"c"], timestamp_ms=1))
    assert log.unflushed_messages == 3
    log.close()


# --------------------------------------------------------------------------
# idempotent producers: the batches' own fields


def _idem(values, sequence, producer_id=42, epoch=0, ts=1):
    return encode_batch(values, timestamp_ms=ts, producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence)


def test_a_retried_batch_is_answered_with_its_first_offset_and_a_gap_refused(make):
    log = make()
    a = log.append(_idem([b"a", b"b"], 0))
    b = log.append(_idem([b"c"], 2))
    end = log.log_end_offset
    assert log.append(_idem([b"a", b"b"], 0)) == a
    assert log.append(_idem([b"c"], 2)) == b
    assert log.log_end_offset == end
    with pytest.raises(OutOfOrderSequenceError):
        log.append(_idem([b"gap"], 5))
    assert log.log_end_offset == end
    assert log.append(_idem([b"d"], 3)) == end


def test_an_idempotent_batch_writes_no_journal(tmp_path):
    log = PartitionLog(tmp_path / "p", CONFIG)
    log.append(_idem([b"a"], 0))
    log.flush()
    assert not os.path.exists(tmp_path / "p" / "producer-state")
    log.close()


def test_a_retry_after_a_restart_is_recognised(tmp_path):
    log = PartitionLog(tmp_path / "p", CONFIG)
    a = log.append(_idem([b"a"], 0))
    b = log.append(_idem([b"b", b"c"], 1))
    log.close()
    log = PartitionLog(tmp_path / "p", CONFIG)
    end = log.log_end_offset
    assert log.append(_idem([b"b", b"c"], 1)) == b
    assert log.append(_idem([b"a"], 0)) == a
    assert log.log_end_offset == end
    with pytest.raises(OutOfOrderSequenceError):
        log.append(_idem([b"x"], 9))
    log.close()


def test_after_a_kill_with_a_torn_tail_the_state_matches_the_recovered_log(tmp_path):
    log = PartitionLog(tmp_path / "p", CONFIG)
    a = log.append(_idem([b"a"], 0))
    log.flush()
    b = log.append(_idem([b"b"], 1))
    segment = log._active.path  # noqa: SLF001
    crash(log)
    torn = os.path.getsize(segment) - 5
    with open(segment, "r+b") as f:
        f.truncate(torn)  # the kill tore the last batch
    log = PartitionLog(tmp_path / "p", CONFIG)
    reports = log.recovery_reports
    assert reports and reports[-1].start_offset == b
    assert log.log_end_offset == b
    assert log.append(_idem([b"a"], 0)) == a  # stored: a duplicate
    assert log.append(_idem([b"b"], 1)) == b  # torn off: stored again, at the same place
    log.close()


def test_snapshots_at_rolls_rebuild_the_state(tmp_path):
    config = TopicConfig(flush_messages=10**9, flush_ms=10**9, segment_bytes=4096, max_message_bytes=1024)
    log = PartitionLog(tmp_path / "p", config)
    offsets = [log.append(_idem([b"v%d" % i + b"." * 200], i)) for i in range(60)]
    assert len(log.segment_bases) > 3
    log.close()
    snapshots = sorted(n for n in os.listdir(tmp_path / "p") if n.endswith(".producers"))
    assert 1 <= len(snapshots) <= 2
    newest = int(snapshots[-1].split(".")[0])
    assert newest in log.segment_bases
    log = PartitionLog(tmp_path / "p", config)
    assert log.append(_idem([b"v59" + b"." * 200], 59)) == offsets[59]
    end = log.log_end_offset
    assert log.append(_idem([b"v60"], 60)) == end
    log.close()
    # a damaged snapshot is ignored: the state comes from the log's headers
    flip_byte(tmp_path / "p" / snapshots[-1], 10)
    log = PartitionLog(tmp_path / "p", config)
    assert log.append(_idem([b"v58" + b"." * 200], 58)) == offsets[58]
    with pytest.raises(OutOfOrderSequenceError):
        log.append(_idem([b"gap"], 99))
    log.close()


def test_a_snapshot_past_the_recovered_end_is_dropped(tmp_path):
    config = TopicConfig(flush_messages=10**9, flush_ms=10**9, segment_bytes=4096, max_message_bytes=1024)
    log = PartitionLog(tmp_path / "p", config)
    offsets = [log.append(_idem([b"v%d" % i + b"." * 200], i)) for i in range(60)]
    bases = log.segment_bases
    log.close()
    assert os.path.exists(tmp_path / "p" / snapshot_name(bases[-1]))
    # the last two segments lost: the snapshot at the last one's base lies past the log
    os.unlink(tmp_path / "p" / segment_name(bases[-1]))
    os.unlink(tmp_path / "p" / segment_name(bases[-2]))
    log = PartitionLog(tmp_path / "p", config)
    assert log.log_end_offset == bases[-2]
    assert not os.path.exists(tmp_path / "p" / snapshot_name(bases[-1]))
    # the state is that of the log left: the lost batches are stored again
    first_lost = offsets.index(bases[-2])
    assert log.append(_idem([b"v%d" % (first_lost - 1) + b"." * 200], first_lost - 1)) == offsets[first_lost - 1]
    assert log.append(_idem([b"v%d" % first_lost + b"." * 200], first_lost)) == bases[-2]
    assert all(int(n.split(".")[0]) <= log.log_end_offset
               for n in os.listdir(tmp_path / "p") if n.endswith(".producers"))
    log.close()


# --------------------------------------------------------------------------
# reads


def test_an_offset_inside_a_batch_reads_that_batch(make):
    log = make()
    log.append(encode_batch([b"a"], timestamp_ms=1))
    at = log.append(encode_batch([b"b", b"c", b"d"], timestamp_ms=2))
    log.flush()
    start, data = _read_bytes(log, at + 2)
    assert start == at
    assert [r.value for r in decode_batch(data, 0, from_offset=at + 2).records] == [b"d"]


def test_message_boundaries_in_batches(tmp_path):
    log = PartitionLog(tmp_path / "p", CONFIG)
    log.append(encode_message_set([b"old"], timestamp_ms=1))
    a = log.append(encode_batch([b"a", b"b"], timestamp_ms=2))
    b = log.append(encode_batch([b"c"], timestamp_ms=3))
    log.flush()
    hw = log.high_watermark
    assert log.message_boundaries(0, hw, [1, a, a + 1, b, b + 1]) == [a, a, b, b, hw]
    assert log.message_boundaries(a + 1, hw, [a + 1, b + 1]) == [a + 1, hw]
    log.close()


def test_lookups_by_time_over_both_formats(make):
    log = make()
    log.append(encode_message_set([b"t1"], timestamp_ms=1000))
    a = log.append(encode_batch([b"t2", b"t3"], timestamp_ms=[2000, 3000]))
    b = log.append(encode_batch([b"t4"], timestamp_ms=4000))
    log.flush()
    assert log.offset_for_time(1500) == a
    assert log.offset_for_time(3000) == a  # the batch holding the first record at or after the time
    assert log.offset_for_time(3500) == b
    assert log.offset_for_time(5000) == log.high_watermark


def test_the_time_index_of_a_batch_segment_is_rebuilt_from_the_log(tmp_path):
    log = PartitionLog(tmp_path / "p", CONFIG)
    offsets = [log.append(encode_batch([b"x" * 600], timestamp_ms=1000 * i)) for i in range(1, 40)]
    log.close()
    for name in os.listdir(tmp_path / "p"):
        if name.endswith(".timeindex"):
            os.unlink(tmp_path / "p" / name)
    log = PartitionLog(tmp_path / "p", CONFIG)
    assert log.offset_for_time(20_500) == offsets[20]
    log.close()


# --------------------------------------------------------------------------
# recovery and damage


def test_a_corrupt_unflushed_batch_tail_is_cut_and_reported(tmp_path):
    log = PartitionLog(tmp_path / "p", CONFIG)
    log.append(encode_message_set([b"old"], timestamp_ms=1))
    a = log.append(encode_batch([b"a"], timestamp_ms=2))
    log.flush()
    b = log.append(encode_batch([b"b"], timestamp_ms=3))
    log.append(encode_batch([b"c"], timestamp_ms=4))
    segment = log._active  # noqa: SLF001
    path, base = segment.path, segment.base_offset
    crash(log)
    flip_byte(path, b - base + HEADER_SIZE + 2)
    log = PartitionLog(tmp_path / "p", CONFIG)
    (report,) = log.recovery_reports
    assert report.start_offset == b and "CRC" in report.reason
    assert log.log_end_offset == b
    _start, data = _read_bytes(log, a)
    assert [r.value for d in _batches(data) for r in d.records] == [b"a"]
    log.close()


def test_damage_in_a_flushed_batch_is_kept_reported_and_skipped(tmp_path):
    log = PartitionLog(tmp_path / "p", CONFIG)
    a = log.append(encode_batch([b"a"], timestamp_ms=1))
    b = log.append(encode_batch([b"b1", b"b2"], timestamp_ms=2))
    c = log.append(encode_batch([b"c"], timestamp_ms=3))
    log.close()
    flip_byte(tmp_path / "p" / segment_name(0), b + HEADER_SIZE + 3)
    log = PartitionLog(tmp_path / "p", CONFIG)
    (report,) = log.recovery_reports
    assert report.kept and report.start_offset == b and report.end_offset == c
    assert log.log_end_offset > c  # nothing cut
    with pytest.raises(CorruptMessageError) as info:
        log.read(b, 1 << 20)
    assert info.value.details["next_offset"] == c
    with pytest.raises(CorruptMessageError) as info:
        log.read(b + 1, 1 << 20)  # a record of the damaged batch
    assert info.value.details["next_offset"] == c
    _start, data = _read_bytes(log, c)
    assert [r.value for d in _batches(data) for r in d.records] == [b"c"]
    _start, data = _read_bytes(log, a, 10)
    assert [r.value for r in decode_batch(data).records] == [b"a"]
    log.close()


def test_an_idempotent_batch_needs_one_sync_a_sequenced_set_two(tmp_path, monkeypatch):
    log = PartitionLog(tmp_path / "p", CONFIG)
    log.append(encode_message_set([b"warm"], timestamp_ms=1))
    log.flush()
    syncs = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (syncs.append(fd), real(fd))[1])
    sequenced = encode_message_set([b"f1"], timestamp_ms=2)
    log.append_sequenced(sequenced, 7, 0, 0, [len(sequenced)])  # (creates the journal)
    log.flush()
    del syncs[:]
    log.append_sequenced(sequenced, 7, 0, 1, [len(sequenced)])
    log.flush()
    format_1 = len(syncs)
    del syncs[:]
    log.append(_idem([b"f2"], 0))  # rolls a segment of format 2 (its own sync of the old one)
    log.flush()
    del syncs[:]
    log.append(_idem([b"f2-next"], 1))
    log.flush()
    # format 1: the segment and the producer-state journal; format 2: the segment
    # (the recovery point is written without a sync of its own)
    assert (format_1, len(syncs)) == (2, 1)
    log.close()


def test_mending_a_damaged_batch_with_a_replica_copy(tmp_path):
    log = PartitionLog(tmp_path / "p", CONFIG)
    log.append(encode_batch([b"a"], timestamp_ms=1))
    b = log.append(encode_batch([b"b"], timestamp_ms=2))
    log.append(encode_batch([b"c"], timestamp_ms=3))
    log.flush()
    copy = log.read(b, 1).tobytes()
    log.close()
    flip_byte(tmp_path / "p" / segment_name(0), b + HEADER_SIZE + 1)
    log = PartitionLog(tmp_path / "p", CONFIG)
    with pytest.raises(CorruptMessageError):
        log.read(b, 1)
    with pytest.raises(CorruptMessageError):  # bytes that are not the batch stored there
        log.mend(b, rb.stamp(copy, b + 1))
    log.mend(b, copy)
    assert [r.value for r in decode_batch(log.read(b, 1).tobytes()).records] == [b"b"]
    log.close()


def test_a_batch_torn_before_its_format_shows_is_cut_like_any_torn_tail(tmp_path):
    log = PartitionLog(tmp_path / "p", CONFIG)
    log.append(encode_message_set([b"old"], timestamp_ms=1))
    log.flush()
    at = log.append(encode_batch([b"new"], timestamp_ms=2))  # the first of a new segment
    crash(log)
    path = tmp_path / "p" / segment_name(at)
    with open(path, "r+b") as f:
        f.truncate(10)  # byte 16, the magic, never reached the disk
    log = PartitionLog(tmp_path / "p", CONFIG)
    (report,) = log.recovery_reports
    assert report.start_offset == at and report.truncated_bytes == 10
    assert log.log_end_offset == at
    assert log.append(encode_batch([b"again"], timestamp_ms=3)) == at
    log.close()


def test_skipping_a_damaged_batch_after_format_1_segments(tmp_path):
    log = PartitionLog(tmp_path / "p", CONFIG)
    log.append(encode_message_set([b"f1-%d" % i for i in range(5)], timestamp_ms=1))
    a = log.append(encode_batch([b"a1", b"a2"], timestamp_ms=2))
    b = log.append(encode_batch([b"b1"], timestamp_ms=3))
    log.close()
    flip_byte(tmp_path / "p" / segment_name(a), 30)  # inside the first batch's crc-covered fields
    log = PartitionLog(tmp_path / "p", CONFIG)
    (report,) = log.recovery_reports
    assert report.kept and (report.start_offset, report.end_offset) == (a, b)
    with pytest.raises(CorruptMessageError) as info:
        log.read(a + 1, 1 << 20)
    assert info.value.details["next_offset"] == b
    _start, data = _read_bytes(log, info.value.details["next_offset"])
    assert [r.value for d in _batches(data) for r in d.records] == [b"b1"]
    assert log.message_boundaries(0, log.high_watermark, [a - 1]) == [a]
    log.close()


def test_the_first_batch_segment_marks_the_directory_for_older_code_to_refuse(tmp_path):
    from raylog.storage import format_file

    log = PartitionLog(tmp_path / "p", CONFIG)
    log.append(encode_message_set([b"old"], timestamp_ms=1))
    assert format_file.check_directory(str(tmp_path / "p")).segments == 1  # format 1 only: as before
    log.append(encode_batch([b"new"], timestamp_ms=2))
    log.close()
    formats = format_file.decode((tmp_path / "p" / format_file.FILE_NAME).read_bytes(), "x")
    assert formats == format_file.CURRENT._replace(segments=2)
    # a raylog that reads segments only up to version 1 refuses the directory
    with pytest.raises(raylog.errors.StorageFormatError):
        old_reads = format_file.READS
        try:
            format_file.READS = format_file.CURRENT
            format_file.check_directory(str(tmp_path / "p"))
        finally:
            format_file.READS = old_reads
    log = PartitionLog(tmp_path / "p", CONFIG)  # this one reads it
    assert log.recovery_reports == []
    log.close()


def test_a_replica_stores_the_leaders_batches_and_judges_a_retry_as_the_leader_did(tmp_path):
    leader = PartitionLog(tmp_path / "leader", CONFIG)
    follower = PartitionLog(tmp_path / "follower", CONFIG)
    leader.append(encode_message_set([b"old"], timestamp_ms=1))
    a = leader.append(_idem([b"a"], 0), leader_epoch=2)
    leader.append(encode_batch([b"b"], timestamp_ms=3), leader_epoch=2)
    leader.flush()
    pos = 0
    while pos < leader.high_watermark:
        chunk = leader.read_unflushed(pos, 1 << 20)
        follower.append_replica(chunk.tobytes(), pos)
        pos += chunk.length
    assert follower.segment_bases == leader.segment_bases
    end = follower.log_end_offset
    assert follower.append(_idem([b"a"], 0)) == a  # the leader's store, recognised
    assert follower.log_end_offset == end
    restamped = rb.stamp(leader.read(a, 1).tobytes(), a + 1)
    with pytest.raises(InvalidMessageError):  # bytes that do not belong at the offset given
        follower.append_replica(restamped, end)
    assert follower.log_end_offset == end
    leader.close()
    follower.close()


def test_transaction_markers_are_not_judged_by_sequence(make):
    log = make()
    first = log.append_marker(9, 0, True, 0, timestamp_ms=1)
    second = log.append_marker(9, 0, True, 0, timestamp_ms=1)  # the next transaction's: stored, not a retry
    assert second > first
    data = encode_batch([b"d"], timestamp_ms=2, producer_id=9, producer_epoch=0, base_sequence=0, transactional=True)
    at = log.append(data)
    assert log.append(data) == at


def test_the_state_is_rebuilt_from_headers_across_read_blocks(tmp_path):
    log = PartitionLog(tmp_path / "p", CONFIG)
    offsets = [log.append(_idem([b"%d" % i + b"." * 600], i)) for i in range(400)]  # ~250 KB, no roll
    log.close()
    assert not [n for n in os.listdir(tmp_path / "p") if n.endswith(".producers")]
    log = PartitionLog(tmp_path / "p", CONFIG)
    end = log.log_end_offset
    kept = 400 - BATCHES_REMEMBERED  # the oldest batch still remembered
    assert log.append(_idem([b"399" + b"." * 600], 399)) == offsets[399]
    assert log.append(_idem([b"%d" % kept + b"." * 600], kept)) == offsets[kept]
    with pytest.raises(raylog.errors.DuplicateSequenceError):  # stored, no longer remembered
        log.append(_idem([b"%d" % (kept - 1) + b"." * 600], kept - 1))
    assert log.log_end_offset == end
    assert log.append(_idem([b"400"], 400)) == end
    log.close()



def test_a_replica_restarted_at_its_leaders_start_forgets_every_producer(tmp_path):
    config = TopicConfig(flush_messages=10**9, flush_ms=10**9, segment_bytes=4096, max_message_bytes=1024)
    log = PartitionLog(tmp_path / "p", config)
    for i in range(40):
        log.append(_idem([b"v%d" % i + b"." * 200], i))
    assert [n for n in os.listdir(tmp_path / "p") if n.endswith(".producers")]
    restart = log.log_end_offset + 1000
    log.restart_replica_at(restart)
    assert not [n for n in os.listdir(tmp_path / "p") if n.endswith(".producers")]
    assert log.append(_idem([b"v0"], 0)) == restart  # not taken for a retry: nothing is known here
    log.close()
    log = PartitionLog(tmp_path / "p", config)
    assert log.append(_idem([b"v0"], 0)) == restart  # the retry, after a reopen
    log.close()
