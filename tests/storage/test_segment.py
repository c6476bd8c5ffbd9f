"""One segment file: names, appends, the recovery scan, lifetime of the file."""

import os

import pytest

from raylog.storage import segment as segment_module
from raylog.storage.message import encode_message_set
from raylog.storage.segment import LogSegment, parse_segment_name, segment_name


def test_names_are_20_digit_base_offsets():
    assert segment_name(0) == "00000000000000000000.log"
    assert segment_name(12345) == "00000000000000012345.log"
    assert parse_segment_name(segment_name(987654321)) == 987654321
    for bad in ("0.log", "00000000000000000000.log.tmp", "0000000000000000000x.log", "recovery-point"):
        assert parse_segment_name(bad) is None


def test_scan_stops_at_damage_and_at_a_torn_tail(tmp_path):
    seg = LogSegment.open(str(tmp_path), 1000)
    good = encode_message_set([b"a" * 30, b"b" * 30], timestamp_ms=0)
    seg.append(good)
    assert seg.scan(0, 1 << 20) == (len(good), None)
    seg.append(good[:10])
    end, err = seg.scan(0, 1 << 20)
    assert end == len(good) and err.partial and err.offset == 1000 + len(good)
    seg.truncate(len(good))
    assert seg.size == len(good) == os.path.getsize(seg.path)


def test_scan_crosses_chunk_boundaries(tmp_path, monkeypatch):
    monkeypatch.setattr(segment_module, "SCAN_CHUNK_BYTES", 100)
    seg = LogSegment.open(str(tmp_path), 0)
    data = b"".join(encode_message_set([bytes([i]) * (i * 7 % 250)], timestamp_ms=i) for i in range(60))
    seg.append(data)
    assert seg.scan(0, 1 << 20) == (len(data), None)
    seg.append(encode_message_set([b"z" * 250], timestamp_ms=0)[:-1])  # torn, spans chunks
    end, err = seg.scan(0, 1 << 20)
    assert end == len(data) and err.partial


def test_deleted_segment_stays_readable_through_its_file(tmp_path):
    seg = LogSegment.open(str(tmp_path), 0)
    seg.append(b"x" * 100)
    held = seg.file
    seg.delete()
    seg.delete()  # twice is fine
    assert not os.path.exists(seg.path)
    assert os.pread(held.fileno(), 100, 0) == b"x" * 100
    fd = held.fileno()
    del seg, held
    with pytest.raises(OSError):
        os.fstat(fd)  # closed with the last reference, quietly
