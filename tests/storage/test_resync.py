"""The way past damaged bytes: a corrupt message names the next readable
offset (a confirmed search), a damaged size field is corruption, recovery
checks the whole active segment and reports damage in flushed data."""

import os

import pytest

from raylog.config import TopicConfig
from raylog.errors import CorruptMessageError, InvalidOffsetError
from raylog.storage.decoding import decode_messages
from raylog.storage.log import PartitionLog
from raylog.storage.message import HEADER_SIZE, encode_message_set
from raylog.storage.segment import segment_name

from conftest import flip_byte

CONFIG = TopicConfig(segment_bytes=1 << 20, max_message_bytes=4096, flush_messages=1_000_000, flush_ms=60_000)


def one(value: bytes, ts: int = 1) -> bytes:
    return encode_message_set([value], timestamp_ms=ts)


def fill(log, n=20):
    offsets = [log.append(one(b"value-%03d" % i * 4, ts=1000 + i)) for i in range(n)]
    log.flush()
    return offsets


def read_from(log, offset):
    out = []
    while offset < log.high_watermark:
        chunk = log.read(offset, 1 << 16)
        records, used = decode_messages(chunk.tobytes(), offset)
        out += [r[3] for r in records]
        offset += used
    return out


def poke(path, position, data: bytes):
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, data, position)
    finally:
        os.close(fd)


def test_a_damaged_size_field_is_corruption_with_the_next_offset_not_too_large(tmp_path):
    with PartitionLog(tmp_path, CONFIG) as log:
        offsets = fill(log)
        poke(tmp_path / segment_name(0), offsets[7], b"\x7f")  # a size of ~2 GiB
        with pytest.raises(CorruptMessageError) as err:
            log.read(offsets[7], 1 << 16)
        assert err.value.offset == offsets[7] and err.value.next_offset == offsets[8]
        assert "raise max_message_bytes" not in str(err.value)
        # every message after the damage reads as written
        assert read_from(log, err.value.next_offset) == [b"value-%03d" % i * 4 for i in range(8, 20)]


def test_a_crc_mismatch_names_the_next_offset(tmp_path):
    with PartitionLog(tmp_path, CONFIG) as log:
        offsets = fill(log)
        flip_byte(tmp_path / segment_name(0), offsets[3] + HEADER_SIZE + 1)
        with pytest.raises(CorruptMessageError) as err:
            log.read(offsets[3], 1 << 16)
        assert (err.value.offset, err.value.next_offset) == (offsets[3], offsets[4])


def test_size_and_crc_both_damaged_the_search_finds_the_next_message(tmp_path):
    with PartitionLog(tmp_path, CONFIG) as log:
        offsets = fill(log)
        # the size names a place inside the next message: its hint is wrong
        poke(tmp_path / segment_name(0), offsets[5] + 3, b"\x30")
        flip_byte(tmp_path / segment_name(0), offsets[5] + HEADER_SIZE + 1)
        with pytest.raises(CorruptMessageError) as err:
            log.read(offsets[5], 1 << 16)
        assert err.value.next_offset == offsets[6]


def test_an_offset_inside_damaged_bytes_is_corrupt_and_inside_a_good_message_is_invalid(tmp_path):
    with PartitionLog(tmp_path, CONFIG) as log:
        offsets = fill(log)
        poke(tmp_path / segment_name(0), offsets[9], b"\xff\xff")
        with pytest.raises(CorruptMessageError) as err:
            log.read(offsets[9] + 5, 1 << 16)
        assert err.value.next_offset == offsets[10] and err.value.damaged_from == offsets[9]
        with pytest.raises(InvalidOffsetError) as err:
            log.read(offsets[12] + 1, 1 << 16)  # a good message: the offset is the caller's mistake
        assert err.value.next_offset == offsets[13]


def test_damage_to_the_log_end_skips_to_the_end():
    from raylog.storage.resync import next_readable

    good = one(b"a" * 40) + one(b"b" * 40)
    data = bytearray(good + one(b"c" * 40))
    data[len(good)] = 0xFF  # the last message's size field
    read = lambda offset, length: bytes(data[offset:offset + length])  # noqa: E731
    assert next_readable(read, len(good), len(data), 4096) == len(data)


def test_a_message_inside_a_damaged_value_is_not_taken_without_a_follower():
    from raylog.storage.resync import next_readable, walk_to

    fake = one(b"fake" * 4)
    victim = one(b"x" * 10 + fake + b"y" * 10)  # a value that holds a message, not at its end
    after = one(b"after" * 5)
    data = bytearray(one(b"before") + victim + after)
    bad = len(one(b"before"))
    data[bad] = 0xFF
    read = lambda offset, length: bytes(data[offset:offset + length])  # noqa: E731
    assert next_readable(read, bad, len(data), 4096) == bad + len(victim)
    assert walk_to(read, 0, bad + 3, len(data), 4096) == ("damaged", bad, bad + len(victim))


def test_recovery_checks_the_whole_active_segment_and_keeps_what_follows_damage(tmp_path, caplog):
    with PartitionLog(tmp_path, CONFIG) as log:
        offsets = fill(log)
        end = log.log_end_offset
    flip_byte(tmp_path / segment_name(0), offsets[2] + HEADER_SIZE + 3)  # flushed, before the checkpoint
    with PartitionLog(tmp_path, CONFIG) as log:
        (report,) = log.recovery_reports
        assert report.kept and report.truncated_bytes == 0
        assert (report.start_offset, report.end_offset) == (offsets[2], offsets[3])
        assert "found" in caplog.text and f"[{offsets[2]}, {offsets[3]})" in caplog.text
        assert log.log_end_offset == end  # nothing cut
        from raylog.metrics import PartitionMetrics

        metrics = PartitionMetrics("c", "t", 0, log)  # the partition actor's metrics (no Ray needed to build)
        assert metrics.snapshot()["recovery_damaged_bytes"] == offsets[3] - offsets[2]
        with pytest.raises(CorruptMessageError) as err:
            read_from(log, offsets[2])
        assert err.value.next_offset == offsets[3]
        assert read_from(log, offsets[3]) == [b"value-%03d" % i * 4 for i in range(3, 20)]
        log.append(one(b"new"))  # the log goes on
        log.flush()
        assert read_from(log, offsets[3])[-1] == b"new"


def test_mend_writes_a_replicas_copy_of_the_damaged_range_back(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for name in ("a", "b"):  # two replicas: the same bytes at the same offsets
        with PartitionLog(tmp_path / name, CONFIG) as log:
            offsets = fill(log)
    flip_byte(tmp_path / "a" / segment_name(0), offsets[4] + HEADER_SIZE + 2)
    with PartitionLog(tmp_path / "a", CONFIG) as log, PartitionLog(tmp_path / "b", CONFIG) as copy:
        (report,) = log.recovery_reports
        start, end = report.start_offset, report.end_offset
        good = copy.read(start, end - start).tobytes()
        with pytest.raises(CorruptMessageError):  # damaged bytes are never written back
            log.mend(start, good[:-1] + bytes([good[-1] ^ 1]))
        with pytest.raises(InvalidOffsetError):  # nor beyond what was flushed
            log.mend(log.high_watermark - 1, good)
        log.mend(start, good)
        assert read_from(log, 0) == [b"value-%03d" % i * 4 for i in range(20)]
    with PartitionLog(tmp_path / "a", CONFIG) as log:  # and it lasts
        assert log.recovery_reports == []


def test_a_message_stored_before_max_message_bytes_was_lowered_is_served_not_called_corrupt(tmp_path):
    with PartitionLog(tmp_path, CONFIG) as log:
        big = log.append(one(b"b" * 3000))
        log.append(one(b"small"))
    with PartitionLog(tmp_path, CONFIG.replace(max_message_bytes=1024)) as log:
        chunk = log.read(big, 100)
        assert chunk.length >= 3000 and read_from(log, 0) == [b"b" * 3000, b"small"]
