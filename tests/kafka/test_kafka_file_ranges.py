"""File ranges of located batches (raylog.kafka.file_ranges): opened only
when the file at the path is the one located and holds the range, sent by
sendfile, a file cut under the send reported (real files, a real socket
pair; no cluster)."""

from __future__ import annotations

import os
import socket

import pytest

from raylog.kafka.file_ranges import FileRange, RangeCut, open_located
from raylog.transfer.connection import Located


def _located(path, position: int, length: int) -> Located:
    stat = os.stat(path)
    return Located(100, 0, 0, position + length, position, length, stat.st_dev, stat.st_ino, str(path))


def _received(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk
        data += chunk
    return data


def test_a_located_range_is_sent_by_sendfile_and_its_file_closed(tmp_path):
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(bytes(range(256)) * 40)
    found = open_located(_located(path, 1000, 5000))
    assert isinstance(found, FileRange) and len(found) == 5000
    a, b = socket.socketpair()
    with a, b:
        a.settimeout(10)
        found.send_to(a)
        assert _received(b, 5000) == path.read_bytes()[1000:6000]
    assert found.file.closed


def test_a_deleted_segment_is_not_opened(tmp_path):
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(b"x" * 100)
    located = _located(path, 0, 100)
    path.unlink()
    assert open_located(located) is None


def test_a_replaced_segment_is_not_opened(tmp_path):
    """A file of the same name but another inode (compaction, or the same
    path on another machine) is not the one located."""
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(b"x" * 100)
    located = _located(path, 0, 100)
    other = tmp_path / "replacement"
    other.write_bytes(b"y" * 100)
    os.replace(other, path)
    assert open_located(located) is None


def test_a_segment_shorter_than_the_range_is_not_opened(tmp_path):
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(b"x" * 100)
    assert open_located(_located(path, 50, 51)) is None
    assert open_located(_located(path, 50, 50)) is not None


def test_a_file_cut_under_the_send_raises_range_cut(tmp_path):
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(b"z" * 4096)
    found = open_located(_located(path, 0, 4096))
    os.truncate(path, 1000)
    a, b = socket.socketpair()
    with a, b:
        a.settimeout(10)
        with pytest.raises(RangeCut, match="1000 of the 4096"):
            found.send_to(a)
        assert _received(b, 1000) == b"z" * 1000
    assert found.file.closed


def test_a_range_larger_than_the_socket_buffers_waits_for_room_and_arrives_whole(tmp_path):
    import threading

    path = tmp_path / "00000000000000000000.log"
    data = os.urandom(1 << 16) * 64  # 4 MiB
    path.write_bytes(data)
    found = open_located(_located(path, 0, len(data)))
    a, b = socket.socketpair()
    with a, b:
        a.settimeout(30)  # non-blocking underneath: sendfile meets a full buffer and waits
        got = []
        reader = threading.Thread(target=lambda: got.append(_received(b, len(data))))
        reader.start()
        found.send_to(a)
        reader.join(60)
    assert got == [data]


def test_a_peer_that_takes_nothing_times_out_and_the_file_is_closed(tmp_path):
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(b"q" * (8 << 20))
    found = open_located(_located(path, 0, 8 << 20))
    a, b = socket.socketpair()
    with a, b:
        a.settimeout(0.5)
        with pytest.raises(TimeoutError):
            found.send_to(a)
    assert found.file.closed
