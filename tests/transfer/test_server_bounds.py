"""The data server's bounds over real sockets: the auth-frame deadline, the
idle timeout, the cap on a long poll's wait, and the connection limit, which
sheds idle connections so that 300 idle ones do not lock a client out."""

from __future__ import annotations

import socket
import time

import pytest

from raylog.errors import AuthenticationError, BrokerUnavailableError
from raylog.retry import RetryPolicy
from raylog.storage.decoding import decode_messages
from raylog.storage.message import encode_message_set
from raylog.transfer import protocol as p
from raylog.transfer import replies as rep
from raylog.transfer import requests as req

from tests.transfer.conftest import authenticated_or_refused

TOPIC = "clicks"
TOKEN = b"cluster-token"




def read_reply(sock: socket.socket):
    data = b""
    while len(data) < 4:
        chunk = sock.recv(4 - len(data))
        if not chunk:
            return None
        data += chunk
    (size,) = p.SIZE.unpack(data)
    rest = b""
    while len(rest) < size:
        chunk = sock.recv(size - len(rest))
        if not chunk:
            return None
        rest += chunk
    correlation_id, code = p.REPLY_HEADER.unpack(data + rest[:6])[1:]
    return correlation_id, code, rest[6:]


def closed_within(sock: socket.socket, timeout_s: float) -> bool:
    sock.settimeout(timeout_s)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def no_connections_within(server, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while server.stats()["connections"] and time.monotonic() < deadline:
        time.sleep(0.05)
    return server.stats()["connections"] == 0


def test_a_connection_without_auth_frame_is_refused_after_the_deadline(make_server, plog):
    server = make_server({(TOPIC, 0): plog}, token=TOKEN, auth_timeout_s=0.3)
    sock = socket.create_connection(server.address)
    try:
        sock.settimeout(10)
        reply = read_reply(sock)
        assert reply is not None and reply[1] == AuthenticationError.code
        assert "no AUTH frame within" in str(rep.decode_error(reply[1], reply[2]))
        assert closed_within(sock, 10)
    finally:
        sock.close()
    assert no_connections_within(server, 10)


def test_an_idle_connection_is_closed_after_the_idle_timeout(make_server, make_conn, plog):
    server = make_server({(TOPIC, 0): plog}, token=TOKEN, idle_timeout_s=0.3)
    conn = make_conn(server, token=TOKEN)
    assert conn.offsets(TOPIC, 0) == (0, 0)
    assert no_connections_within(server, 10)
    # the client notices and reconnects on its next call
    with pytest.raises(BrokerUnavailableError):
        conn.offsets(TOPIC, 0)
    assert conn.offsets(TOPIC, 0) == (0, 0)


def test_a_frame_that_stops_arriving_is_timed_out_too(make_server, plog):
    server = make_server({(TOPIC, 0): plog}, idle_timeout_s=0.3)
    sock = socket.create_connection(server.address)
    try:
        sock.sendall(req.encode_offsets(1, TOPIC, 0)[:7])  # half a frame, then nothing
        assert closed_within(sock, 10)
    finally:
        sock.close()


def test_a_long_poll_waits_at_most_the_cap(make_server, make_conn, plog):
    server = make_server({(TOPIC, 0): plog}, max_wait_ms_cap=200)
    conn = make_conn(server, timeout_s=5)
    started = time.monotonic()
    result = conn.fetch(TOPIC, 0, 0, 4096, max_wait_ms=3_600_000)  # an hour asked
    assert len(result.data) == 0
    assert time.monotonic() - started < 60  # a hang is the failure, not a timing


@pytest.mark.parametrize("authenticated", [False, True], ids=["strangers", "idle-clients"])
def test_300_idle_connections_do_not_lock_a_new_client_out(make_server, make_conn, plog, authenticated):
    server = make_server({(TOPIC, 0): plog}, token=TOKEN)  # default limit: 256
    idle = []
    try:
        for i in range(300):
            sock = socket.create_connection(server.address)
            if authenticated:
                authenticated_or_refused(sock, TOKEN, 2 * i)
            idle.append(sock)
        conn = make_conn(server, token=TOKEN, timeout_s=5)

        def produce_and_fetch():
            try:
                base = conn.produce(TOPIC, 0, encode_message_set([b"still served"]), acks=1)
                plog.flush()
                return base, conn.fetch(TOPIC, 0, base, 4096)
            except BrokerUnavailableError:
                conn.close()  # refused or shed: a fresh connection next try
                conn.__init__(*server.address, token=TOKEN, timeout_s=5)
                raise

        base, result = RetryPolicy(max_tries=100, delay_s=0.1, max_delay_s=0.5, deadline_s=60).call(
            produce_and_fetch
        )
        records, _ = decode_messages(result.data, base)
        assert [r[3] for r in records] == [b"still served"]
        stats = server.stats()
        assert stats["connections"] <= server.max_connections
        # past the limit each newcomer made room (shed) or was refused
        assert stats["connections_shed"] + stats["connections_refused"] >= 300 - server.max_connections
    finally:
        for sock in idle:
            sock.close()
