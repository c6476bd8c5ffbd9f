"""The data channel's challenge–response, over real sockets: both ends prove
the token, a peer without it is refused, a forged endpoint learns nothing of
the token, and a stranger costs the server a few hundred bytes whatever it
announces."""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import threading
import time
import tracemalloc

import pytest

from raylog.errors import AuthenticationError, RequestTimeoutError
from raylog.storage.decoding import decode_messages
from raylog.storage.message import encode_message_set
from raylog.transfer import handshake
from raylog.transfer import protocol as p
from raylog.transfer import requests as req
from raylog.transfer.connection import BrokerConnection
from raylog.transfer.handshake import authenticate_socket

from tests.transfer.conftest import TOPIC

TOKEN = b"cluster-token-" + b"7" * 50


def _derived_forms(token: bytes) -> list[bytes]:
    """The token and every single hash or encoding of it a careless client might send."""
    forms = [token, base64.b64encode(token), token.hex().encode()]
    for name in ("md5", "sha1", "sha256", "sha512", "blake2b"):
        digest = hashlib.new(name, token).digest()
        forms += [digest, digest.hex().encode(), base64.b64encode(digest)]
    return forms


class ForgedEndpoint:
    """A listener of the test's own: records every byte it receives and
    answers each connection's first frame with ``answer`` (or nothing)."""

    def __init__(self, answer=None):
        self.answer = answer
        self.received = bytearray()
        self.connections = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = self._listener.getsockname()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._talk, args=(sock,), daemon=True).start()

    def _talk(self, sock):
        with sock:
            sock.settimeout(10)
            answered = False
            try:
                while True:
                    data = sock.recv(65536)
                    if not data:
                        return
                    self.received += data
                    if self.answer is not None and not answered and len(self.received) >= 4:
                        answered = True
                        (correlation_id,) = p.REQUEST_HEADER.unpack_from(bytes(self.received).ljust(12, b"\0"))[3:]
                        sock.sendall(self.answer(correlation_id))
            except OSError:
                return

    def close(self):
        self._listener.close()


@pytest.fixture
def forged():
    endpoints = []

    def make(answer=None) -> ForgedEndpoint:
        endpoint = ForgedEndpoint(answer)
        endpoints.append(endpoint)
        return endpoint

    yield make
    for endpoint in endpoints:
        endpoint.close()


def _random_hello_reply(correlation_id: int) -> bytes:
    from raylog.transfer.replies import encode_auth_hello_reply

    return encode_auth_hello_reply(correlation_id, os.urandom(32), os.urandom(32))


def _ok_reply(correlation_id: int) -> bytes:
    # what the old plaintext AUTH expected: an empty success reply
    return p.REPLY_HEADER.pack(p.REPLY_HEADER_BODY, correlation_id, 0)


@pytest.mark.parametrize("answer", [_random_hello_reply, _ok_reply], ids=["wrong-proof", "plain-ok"])
def test_a_forged_endpoint_receives_nothing_that_reveals_the_token(forged, answer):
    endpoint = forged(answer)
    conn = BrokerConnection(*endpoint.address, token=TOKEN, timeout_s=10)
    try:
        with pytest.raises(AuthenticationError, match="did not prove that it holds the cluster's token"):
            conn.produce(TOPIC, 0, encode_message_set([b"secret data"]), acks=1)
        assert not conn.connected
    finally:
        conn.close()
    deadline = time.monotonic() + 10
    while len(endpoint.received) < p.SIZE.size + 41 and time.monotonic() < deadline:
        time.sleep(0.01)
    received = bytes(endpoint.received)
    # the HELLO alone: a header and a nonce; no proof, no request, no data
    assert len(received) == p.SIZE.size + 41
    assert req.decode_request(received, 0, 41).step == p.AUTH_HELLO
    for form in _derived_forms(TOKEN):
        assert form not in received
    assert b"secret data" not in received


def test_the_handshake_proves_both_ends_and_the_channel_works(make_server, plog):
    server = make_server({(TOPIC, 0): plog}, token=TOKEN)
    with BrokerConnection(*server.address, token=TOKEN) as conn:
        base = conn.produce(TOPIC, 0, encode_message_set([b"after the handshake"]), acks=1)
        plog.flush()
        records, _ = decode_messages(conn.fetch(TOPIC, 0, base, 4096).data, base)
    assert [r[3] for r in records] == [b"after the handshake"]


def test_a_client_with_another_token_is_refused_and_writes_nothing(make_server, plog):
    server = make_server({(TOPIC, 0): plog}, token=TOKEN)
    with BrokerConnection(*server.address, token=b"another-token", timeout_s=10) as conn:
        # the server's proof does not match this client's token: the client refuses first
        with pytest.raises(AuthenticationError, match="did not prove"):
            conn.produce(TOPIC, 0, encode_message_set([b"x"]), acks=1)
    assert plog.log_end_offset == 0
    assert server.stats()["requests"] <= 1  # the HELLO, nothing after it


def test_a_wrong_proof_is_refused_by_the_server(make_server, plog):
    server = make_server({(TOPIC, 0): plog}, token=TOKEN)
    with socket.create_connection(server.address, timeout=10) as sock:
        sock.sendall(req.encode_auth_hello(1, handshake.new_nonce()))
        header = sock.recv(p.AUTH_HELLO_REPLY.size, socket.MSG_WAITALL)
        assert p.AUTH_HELLO_REPLY.unpack(header)[2] == 0
        sock.sendall(req.encode_auth_proof(2, os.urandom(32)) + req.encode_offsets(3, TOPIC, 0))
        reply = sock.recv(4096)
        _, correlation_id, code = p.REPLY_HEADER.unpack_from(reply)
        assert (correlation_id, code) == (2, AuthenticationError.code)
        assert sock.recv(4096) == b""  # closed; the OFFSETS after it was never answered


def test_a_replayed_proof_is_refused(make_server, plog):
    """A proof is good for its own nonces only: one recorded from another
    connection does not open this one."""
    server = make_server({(TOPIC, 0): plog}, token=TOKEN)
    nonce = handshake.new_nonce()
    with socket.create_connection(server.address, timeout=10) as first:
        first.sendall(req.encode_auth_hello(1, nonce))
        _, _, _, server_nonce, _ = p.AUTH_HELLO_REPLY.unpack(first.recv(p.AUTH_HELLO_REPLY.size, socket.MSG_WAITALL))
    recorded = handshake.client_proof(TOKEN, nonce, server_nonce)
    with socket.create_connection(server.address, timeout=10) as second:
        second.sendall(req.encode_auth_hello(1, nonce))  # the same client nonce
        second.recv(p.AUTH_HELLO_REPLY.size, socket.MSG_WAITALL)
        second.sendall(req.encode_auth_proof(2, recorded))
        _, correlation_id, code = p.REPLY_HEADER.unpack_from(second.recv(4096))
        assert code == AuthenticationError.code


def test_a_server_without_a_token_cannot_prove_one(make_server, plog):
    server = make_server({(TOPIC, 0): plog})
    with BrokerConnection(*server.address, token=TOKEN, timeout_s=10) as conn:
        with pytest.raises(AuthenticationError, match="no token"):
            conn.offsets(TOPIC, 0)


def test_plain_sockets_can_run_the_handshake(make_server, plog):
    server = make_server({(TOPIC, 0): plog}, token=TOKEN)
    with socket.create_connection(server.address, timeout=10) as sock:
        authenticate_socket(sock, TOKEN, 10)
        sock.sendall(req.encode_offsets(12, TOPIC, 0))
        assert p.OFFSETS_REPLY.unpack(sock.recv(p.OFFSETS_REPLY.size, socket.MSG_WAITALL))[1:] == (12, 0, 0, 0)


# -- before AUTH: a small fixed header, nothing of what is announced ------------

STRANGERS = 120


def test_strangers_announcing_huge_frames_cost_no_memory_and_are_closed(make_server, plog):
    # the AUTH deadline is far: a stranger must be closed for what it sent, not for its silence
    server = make_server({(TOPIC, 0): plog}, token=TOKEN, auth_timeout_s=120)
    announced = server.max_frame_bytes  # the largest frame an authenticated client may send
    tracemalloc.start()
    socks = []
    try:
        before = tracemalloc.take_snapshot()
        for i in range(STRANGERS):
            sock = socket.create_connection(server.address, timeout=10)
            # a PRODUCE header announcing the largest frame, and a little of it
            sock.sendall(p.REQUEST_HEADER.pack(announced, p.API_PRODUCE, 1, i) + b"\0" * 64)
            socks.append(sock)
        closed = 0
        for sock in socks:
            data = b""
            while True:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                data += chunk
            _, _, code = p.REPLY_HEADER.unpack_from(data)
            assert code == AuthenticationError.code
            closed += 1
        assert closed == STRANGERS  # every stranger was answered and closed
        after = tracemalloc.take_snapshot()
        grown = sum(stat.size_diff for stat in after.compare_to(before, "filename") if stat.size_diff > 0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        for sock in socks:
            sock.close()
    # The old server allocated a 256 KiB buffer for each, then the whole
    # announced frame (> 1 MiB): over 150 MiB for these. The bound is generous
    # (the test's own sockets and threads count too).
    assert peak < STRANGERS * 64 * 1024, f"peak {peak} bytes traced for {STRANGERS} strangers"
    assert grown < STRANGERS * 16 * 1024
    stats = server.stats()
    assert stats["requests"] == 0
    assert plog.log_end_offset == 0


def test_a_silent_endpoint_ends_in_a_timeout_that_names_the_handshake(forged):
    endpoint = forged(answer=None)  # accepts, reads, never answers
    conn = BrokerConnection(*endpoint.address, token=TOKEN, timeout_s=1.0)
    try:
        with pytest.raises(RequestTimeoutError, match="did not answer the AUTH HELLO") as info:
            conn.offsets(TOPIC, 0)
        assert info.value.retriable
    finally:
        conn.close()
    received = bytes(endpoint.received)
    assert len(received) == p.SIZE.size + 41  # the HELLO, nothing else
    for form in _derived_forms(TOKEN):
        assert form not in received
