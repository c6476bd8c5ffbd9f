"""A listener's server in this process, with an in-memory backend (SASL
and ApiVersions need nothing else): closing it closes every connection,
parked in the selector or being served, and ends its threads; a frame
started and left unfinished closes its connection at the frame timeout
while another client is served."""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

from raylog.kafka.listener import KafkaServer

API_VERSIONS_0 = struct.pack(">hhih", 18, 0, 7, -1)


class _Backend:
    """What a server needs of a backend to answer ApiVersions: no verifier
    (an open listener) and the fetch counters."""

    verifier = None

    def fetch_stats(self) -> dict:
        return {}


@pytest.fixture
def server():
    made = []

    def make(**kw) -> KafkaServer:
        made.append(KafkaServer(_Backend(), "127.0.0.1", 0, **kw))
        return made[-1]

    yield make
    for one in made:
        one.close()
        one.wait_served()


def _ask(sock: socket.socket) -> int:
    """Send ApiVersions v0; the correlation id of the answer."""
    sock.sendall(struct.pack(">i", len(API_VERSIONS_0)) + API_VERSIONS_0)
    head = b""
    while len(head) < 8:
        chunk = sock.recv(8 - len(head))
        assert chunk, "the server closed the connection"
        head += chunk
    size, correlation = struct.unpack(">ii", head)
    left = size - 4
    while left:
        left -= len(sock.recv(min(left, 65536)))
    return correlation


def _ended(sock: socket.socket, timeout_s: float) -> bool:
    sock.settimeout(timeout_s)
    try:
        while sock.recv(65536):
            pass
        return True
    except socket.timeout:
        return False
    except OSError:
        return True


def _threads_of(port: int) -> list[str]:
    return [t.name for t in threading.enumerate() if t.name in (f"kafka-listener-{port}", f"kafka-worker-{port}")]


def test_close_ends_every_connection_and_the_servers_threads(server):
    srv = server()
    parked = [socket.create_connection(("127.0.0.1", srv.port), timeout=10) for _ in range(100)]
    for sock in parked[::2]:  # served once, then parked again
        assert _ask(sock) == 7
    stalled = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    stalled.sendall(struct.pack(">i", 100) + b"\0" * 10)  # a frame begun
    deadline = time.monotonic() + 10
    while srv.connections < 101 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert srv.connections == 101 and _threads_of(srv.port)
    srv.close()
    assert srv.wait_served()
    assert all(_ended(sock, 5) for sock in parked + [stalled])
    deadline = time.monotonic() + 10
    while _threads_of(srv.port) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _threads_of(srv.port)
    for sock in parked + [stalled]:
        sock.close()


def test_a_frame_left_unfinished_closes_at_the_frame_timeout_while_others_are_served(server):
    srv = server(frame_timeout_s=1.0)
    stalled = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    other = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    try:
        started = time.monotonic()
        stalled.sendall(struct.pack(">i", 100) + b"\0" * 10)
        assert _ask(other) == 7
        assert _ended(stalled, 5)
        took = time.monotonic() - started
        assert 0.9 <= took <= 5.0, took  # (the frame timeout is 1 s; the default 30 s would fail this)
        assert _ask(other) == 7  # the other goes on
        assert srv.connections == 1
    finally:
        stalled.close()
        other.close()
