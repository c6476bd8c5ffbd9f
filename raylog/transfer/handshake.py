"""The data channel's challenge–response: both ends prove that they hold the
cluster token without either sending it (AUTH version 1 of
:mod:`raylog.transfer.protocol`).

::

    client                                         server
    HELLO  client nonce (32 random bytes)  ──►
                                           ◄──     server nonce (32 random bytes),
                                                   server proof
    (checks the server proof; on a mismatch it closes and sends nothing more)
    PROOF  client proof                    ──►
                                           ◄──     ok (or AuthenticationError, then close)

    server proof = HMAC-SHA256(token, "raylog-auth-server\\0" + client nonce + server nonce)
    client proof = HMAC-SHA256(token, "raylog-auth-client\\0" + client nonce + server nonce)

Why: a client never sends the token, nor anything computed from it, to a peer
that has not first proven it holds the token; an endpoint forged in
ZooKeeper learns only a random nonce. Fresh nonces from both sides make
every proof good for one connection only (a recorded exchange cannot be
replayed to either side), and the two labels keep a proof of one side from
being reflected as the other's. Proofs are compared in constant time.
The channel is not encrypted: the handshake proves who is at the other end,
it does not hide the data that follows.

Thread-safety: the functions are pure (or read only their socket) and may be
called from any thread.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket

from raylog.errors import AuthenticationError, ProtocolError
from raylog.transfer.protocol import (
    AUTH_HELLO_REPLY,
    AUTH_HELLO_REPLY_FIELDS,
    NONCE_BYTES,
    REPLY_HEADER,
    REPLY_HEADER_BODY,
    SIZE,
)
from raylog.transfer.replies import decode_error
from raylog.transfer.requests import encode_auth_hello, encode_auth_proof

SERVER_LABEL = b"raylog-auth-server\x00"
CLIENT_LABEL = b"raylog-auth-client\x00"


def new_nonce() -> bytes:
    """:data:`~raylog.transfer.protocol.NONCE_BYTES` fresh random bytes."""
    return secrets.token_bytes(NONCE_BYTES)


def server_proof(token: bytes, client_nonce: bytes, server_nonce: bytes) -> bytes:
    return hmac.new(token, SERVER_LABEL + client_nonce + server_nonce, hashlib.sha256).digest()


def client_proof(token: bytes, client_nonce: bytes, server_nonce: bytes) -> bytes:
    return hmac.new(token, CLIENT_LABEL + client_nonce + server_nonce, hashlib.sha256).digest()


def proven(expected: bytes, presented: bytes) -> bool:
    """Whether ``presented`` is ``expected`` (constant time)."""
    return hmac.compare_digest(expected, bytes(presented))


def unproven_peer(where: str, why: str) -> AuthenticationError:
    """The error of a client whose peer failed to prove it holds the token."""
    return AuthenticationError(
        f"the data endpoint {where} {why}: it did not prove that it holds the cluster's token, so nothing "
        f"derived from the token was sent to it; check that the endpoint registered in ZooKeeper is the "
        f"partition's (a forged or stale endpoint), and that this client has the cluster's token",
        endpoint=where,
    )


def check_hello_reply(token: bytes, client_nonce: bytes, body, where: str) -> bytes:
    """The client proof to send, after checking the HELLO reply's ``body``
    (server nonce and server proof); AuthenticationError if it is wrong."""
    if len(body) != AUTH_HELLO_REPLY_FIELDS.size:
        raise unproven_peer(where, f"answered the AUTH HELLO with {len(body)} bytes")
    server_nonce, proof = AUTH_HELLO_REPLY_FIELDS.unpack(bytes(body))
    if not proven(server_proof(token, client_nonce, server_nonce), proof):
        raise unproven_peer(where, "answered the AUTH HELLO with a wrong proof")
    return client_proof(token, client_nonce, server_nonce)


def authenticate_socket(sock: socket.socket, token: bytes, correlation_id: int = 0) -> None:
    """Run the client side of the handshake on a plain blocking socket (for
    tools and tests that speak the protocol by hand); raises
    AuthenticationError (peer unproven or token refused) or ProtocolError."""
    where = "%s:%s" % sock.getpeername()[:2]
    nonce = new_nonce()
    sock.sendall(encode_auth_hello(correlation_id, nonce))
    size, code, body = _read_reply(sock)
    if code:
        raise decode_error(code, body)
    if size != AUTH_HELLO_REPLY.size - SIZE.size:
        raise unproven_peer(where, f"answered the AUTH HELLO with a reply of {size} bytes")
    proof = check_hello_reply(token, nonce, body, where)
    sock.sendall(encode_auth_proof(correlation_id + 1, proof))
    size, code, body = _read_reply(sock)
    if code:
        raise decode_error(code, body)
    if size != REPLY_HEADER_BODY:
        raise ProtocolError(f"AUTH PROOF reply of {size} bytes from {where}, expected {REPLY_HEADER_BODY}")


def _read_reply(sock: socket.socket) -> tuple[int, int, bytes]:
    header = _recv_exactly(sock, REPLY_HEADER.size)
    size, _, code = REPLY_HEADER.unpack(header)
    if not REPLY_HEADER_BODY <= size <= REPLY_HEADER_BODY + 64 * 1024:
        raise ProtocolError(f"AUTH reply of {size} bytes; the peer is out of step")
    return size, code, _recv_exactly(sock, size - REPLY_HEADER_BODY)


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ProtocolError(f"the peer closed the connection inside an AUTH reply ({len(data)} of {n} bytes)")
        data += chunk
    return bytes(data)

