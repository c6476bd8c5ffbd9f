"""The LOCATE request: a partition says where a FETCH's whole record batches
lie in its segment file (path, position, length, the file's device and
inode), for a reader on its machine that sends them with ``sendfile``.
Real logs (file and in-memory) and a real server on 127.0.0.1 (conftest)."""

from __future__ import annotations

import os

import pytest

from raylog.errors import OffsetOutOfRangeError, ProtocolError
from raylog.storage.message import encode_message_set
from raylog.storage.record_batch import encode_batch, iter_batches
from raylog.transfer import protocol as p
from raylog.transfer import requests as req

from tests.transfer.test_server import TOPIC, produced, raw_socket, read_reply


def _batches(n: int = 6) -> list[bytes]:
    return [encode_batch([b"value-%d-%d" % (i, j) for j in range(3 + i)], [None] * (3 + i)) for i in range(n)]


def _range(located) -> bytes:
    with open(located.path, "rb") as f:
        assert (os.fstat(f.fileno()).st_dev, os.fstat(f.fileno()).st_ino) == (located.device, located.inode)
        return os.pread(f.fileno(), located.length, located.position)


@pytest.mark.file_log_only
def test_locate_names_the_whole_batches_a_fetch_returns_within_max_bytes(conn, plog):
    bases = produced(conn, plog, _batches())
    hw = plog.high_watermark
    stored = bytes(conn.fetch(TOPIC, 0, 0, 1 << 20).data)
    located = conn.locate(TOPIC, 0, 0, 1 << 20)
    assert located.kind == p.LOCATED_BATCHES
    assert (located.high_watermark, located.log_start_offset, located.next_offset) == (hw, 0, hw)
    assert os.path.isabs(located.path) and _range(located) == stored
    # cut at whole batches within max bytes: the first three fit, the fourth does not
    within = bases[3] + 10
    located = conn.locate(TOPIC, 0, 0, within)
    assert (located.position, located.length, located.next_offset) == (0, bases[3], bases[3])
    assert [pos for pos, _ in iter_batches(_range(located))] == bases[:3]
    # the first batch whole even when larger than max bytes
    located = conn.locate(TOPIC, 0, bases[1], 1)
    assert (located.position, located.length, located.next_offset) == (bases[1], bases[2] - bases[1], bases[2])


@pytest.mark.file_log_only
def test_locate_from_a_record_inside_a_batch_and_past_its_records(conn, plog):
    bases = produced(conn, plog, _batches())
    # a record of the batch at bases[2] (it holds 5): that batch is located
    located = conn.locate(TOPIC, 0, bases[2] + 4, 1 << 20)
    assert located.position == bases[2] and located.next_offset == plog.high_watermark
    # an offset inside the batch's bytes but past its records: the next batch on
    located = conn.locate(TOPIC, 0, bases[2] + 5, 1 << 20)
    assert located.position == bases[3]


def test_locate_at_the_high_watermark_is_an_empty_range(conn, plog):
    produced(conn, plog, _batches(2))
    hw = plog.high_watermark
    located = conn.locate(TOPIC, 0, hw, 1 << 20)
    assert (located.length, located.next_offset, located.high_watermark) == (0, hw, hw)


def test_locate_out_of_range_is_the_fetch_error_and_the_connection_stays(conn, plog):
    produced(conn, plog, _batches(2))
    hw = plog.high_watermark
    with pytest.raises(OffsetOutOfRangeError) as info:
        conn.locate(TOPIC, 0, hw + 100, 1 << 20)
    assert (info.value.earliest, info.value.latest) == (0, hw)
    assert conn.locate(TOPIC, 0, 0, 1 << 20).high_watermark == hw


def test_format_1_messages_and_logs_in_memory_are_not_locatable(conn, plog):
    produced(conn, plog, [encode_message_set([b"a", b"b"]), encode_message_set([b"c"])])
    located = conn.locate(TOPIC, 0, 0, 1 << 20)
    assert (located.kind, located.length, located.path) == (p.NOT_LOCATABLE, 0, "")
    assert conn.fetch(TOPIC, 0, 0, 1 << 20).data  # FETCH serves them


def test_a_log_in_memory_with_batches_is_not_locatable(conn, plog, log_kind):
    produced(conn, plog, _batches(2))
    located = conn.locate(TOPIC, 0, 0, 1 << 20)
    assert located.kind == (p.LOCATED_BATCHES if log_kind == "file" else p.NOT_LOCATABLE)


def test_a_malformed_locate_frame_is_refused_and_closes_the_connection(server, plog):
    frame = req.encode_locate(7, TOPIC, 0, 0, 100)
    bad = p.SIZE.pack(len(frame) - 4 + 1) + frame[4:] + b"\0"  # a byte too many after the fields
    sock = raw_socket(server)
    try:
        sock.sendall(bad)
        correlation_id, code, body = read_reply(sock)
        assert correlation_id == 7 and code == ProtocolError.code
        assert b"LOCATE" in body
    finally:
        sock.close()


def test_locate_round_trips_through_the_codec():
    frame = req.encode_locate(9, TOPIC, 3, 12345, 4096)
    request = req.decode_request(memoryview(frame), 0, len(frame) - 4)
    assert request == req.LocateRequest(9, TOPIC, 3, 12345, 4096)


@pytest.mark.file_log_only
def test_a_locate_sent_ahead_is_read_later_and_the_connection_stays_in_step(conn, plog):
    """send_locate / read_locate (the Kafka listener's read-ahead): the
    reply waits on the connection; read, the next request is answered."""
    bases = produced(conn, plog, _batches())
    correlation = conn.send_locate(TOPIC, 0, bases[2], 1 << 20)
    located = conn.read_locate(correlation)
    assert (located.position, located.next_offset) == (bases[2], plog.high_watermark)
    assert conn.offsets(TOPIC, 0) == (0, plog.high_watermark)


@pytest.mark.file_log_only
def test_locate_walks_the_headers_where_they_lie_and_reads_no_records(conn, plog, monkeypatch):
    """The walk reads only the batches' headers from the segment file, not
    a copy of the range it locates (what the server reads is counted; the
    log's read checks the first batch, the one at the offset, whole)."""
    values = [os.urandom(40_000) for _ in range(5)]  # incompressible: each batch is ~200 KB
    bases = produced(conn, plog, [encode_batch(values, [None] * 5) for _ in range(4)])
    read = []
    pread = os.pread

    def counted(fd, length, position):
        data = pread(fd, length, position)
        read.append(len(data))
        return data

    monkeypatch.setattr(os, "pread", counted)
    located = conn.locate(TOPIC, 0, 0, 1 << 20)
    monkeypatch.setattr(os, "pread", pread)
    assert (located.position, located.length, located.next_offset) == (0, plog.high_watermark, plog.high_watermark)
    assert [pos for pos, _ in iter_batches(_range(located))] == bases
    assert sum(read) <= bases[1] + len(bases) * 128, read  # then the headers (61 bytes each), no records
