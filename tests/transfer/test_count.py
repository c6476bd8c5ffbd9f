"""The COUNT request: a partition counts the messages of a range on its own
node, checking each, and sends the number only. Real logs (file and
in-memory) and a real server on 127.0.0.1 (conftest)."""

from __future__ import annotations

import pytest

from raylog.errors import CorruptMessageError, InvalidOffsetError, OffsetOutOfRangeError, ProtocolError
from raylog.storage.decoding import decode_messages
from raylog.storage.message import encode_message_set
from raylog.transfer import protocol as p
from raylog.transfer import requests as req

from tests.transfer.test_server import TOPIC, produced, raw_socket, read_reply

COMPRESSIONS = [None, "gzip", "zstd", "lz4"]


def sets() -> list[bytes]:
    out = []
    for i in range(12):
        values = [b"value-%d-%d" % (i, j) * (1 + j % 3) for j in range(5 + i)]
        keys = [b"key-%d" % j if j % 3 else None for j in range(len(values))]
        out.append(encode_message_set(values, keys, compression=COMPRESSIONS[i % 4]))
    return out


def read_count(conn, start: int, end: int) -> int:
    """What a full read of [start, end) returns: every message, fetched and decoded."""
    total, pos = 0, start
    while pos < end:
        fetched = conn.fetch(TOPIC, 0, pos, min(4096, end - pos))
        records, consumed = decode_messages(bytes(fetched.data)[: end - pos], pos)
        total, pos = total + len(records), pos + consumed
    return total


def test_count_equals_a_full_read_with_compressed_sets(conn, plog):
    bases = produced(conn, plog, sets())
    end = plog.high_watermark
    expected = read_count(conn, 0, end)
    assert expected > len(bases)  # compressed sets count their inner messages
    assert conn.count(TOPIC, 0, 0, end, 1 << 30) == (expected, end)
    # a sub-range from one set's offset to another's
    assert conn.count(TOPIC, 0, bases[3], bases[9], 1 << 30) == (read_count(conn, bases[3], bases[9]), bases[9])
    assert conn.count(TOPIC, 0, bases[5], bases[5], 1 << 30) == (0, bases[5])
    assert conn.count(TOPIC, 0, end, end, 1 << 30) == (0, end)


def test_count_is_bounded_by_max_bytes_and_resumes_where_it_stopped(conn, plog):
    produced(conn, plog, sets())
    end = plog.high_watermark
    pos = total = requests = 0
    while pos < end:
        messages, pos_next = conn.count(TOPIC, 0, pos, end, 300)
        assert pos < pos_next <= end
        pos, total, requests = pos_next, total + messages, requests + 1
    assert total == read_count(conn, 0, end) and requests > 3


def test_count_version_1_stops_after_n_messages_inside_a_wrapper_and_goes_on_from_there(conn, plog):
    """COUNT version 1 on the wire: at most n messages from any record
    offset; the next offset is the next record's (inside a wrapper too)."""
    produced(conn, plog, sets())
    end = plog.high_watermark
    fetched = conn.fetch(TOPIC, 0, 0, end)
    records, _ = decode_messages(bytes(fetched.data)[:end], 0)
    offsets = [r[0] for r in records]
    pos = seen = 0
    while pos < end:
        messages, pos = conn.count(TOPIC, 0, pos, end, 1 << 30, 7)
        assert 0 < messages <= 7
        seen += messages
        assert pos == (offsets[seen] if seen < len(offsets) else end)
    assert seen == len(offsets)
    assert conn.count(TOPIC, 0, offsets[3], end, 1 << 30, -1) == (len(offsets) - 3, end)
    assert conn.count(TOPIC, 0, offsets[3], end, 1 << 30, 0) == (0, offsets[3])


def test_count_outside_the_log_raises_out_of_range(conn, plog):
    produced(conn, plog, sets()[:2])
    hw = plog.high_watermark
    with pytest.raises(OffsetOutOfRangeError) as info:
        conn.count(TOPIC, 0, 0, hw + 1, 1 << 20)
    assert (info.value.offset, info.value.earliest, info.value.latest) == (hw + 1, 0, hw)
    with pytest.raises(OffsetOutOfRangeError):
        conn.count(TOPIC, 0, hw, 0, 1 << 20)
    assert conn.count(TOPIC, 0, 0, hw, 1 << 20)[1] == hw  # the connection goes on


def test_count_off_a_message_boundary_raises_invalid_offset(conn, plog):
    bases = produced(conn, plog, [encode_message_set([b"first" * 10, b"second" * 10])] * 2)
    hw = plog.high_watermark
    with pytest.raises(InvalidOffsetError):
        conn.count(TOPIC, 0, 3, hw, 1 << 20)
    with pytest.raises(InvalidOffsetError) as info:
        conn.count(TOPIC, 0, 0, bases[1] + 7, 1 << 20)
    assert info.value.offset == bases[1] + 7


@pytest.mark.file_log_only  # the damage is done to the segment file
def test_a_flipped_byte_on_disk_fails_the_count_instead_of_changing_it(conn, plog, tmp_path):
    bases = produced(conn, plog, sets())
    hw = plog.high_watermark
    segment = tmp_path / f"{TOPIC}-0" / ("0" * 20 + ".log")
    for target in (bases[4] + 60, bases[5] + 30):  # inside a plain set, inside a gzip wrapper
        flip(segment, target)
        with pytest.raises(CorruptMessageError):
            conn.count(TOPIC, 0, 0, hw, 1 << 30)
        flip(segment, target)  # restored: counted again
    assert conn.count(TOPIC, 0, 0, hw, 1 << 30)[1] == hw


def flip(path, position: int) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)[0]
        f.seek(position)
        f.write(bytes([byte ^ 0x20]))


def test_malformed_count_frame_gets_a_protocol_error(server):
    frame = req.encode_count(9, TOPIC, 0, 0, 0, 100)
    bad = bytearray(frame)
    bad[-4:] = (-1).to_bytes(4, "big", signed=True)  # negative max bytes
    sock = raw_socket(server)
    try:
        sock.sendall(bytes(bad))
        correlation_id, code, _body = read_reply(sock)
        assert (correlation_id, code) == (9, ProtocolError.code)
    finally:
        sock.close()
    assert p.API_NAMES[p.API_COUNT] == "COUNT"
