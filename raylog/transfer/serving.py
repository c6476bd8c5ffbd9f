"""One connection of the data server, on its own thread: kernel timeouts,
frames read into a reusable buffer, authentication, each request handed to
the :class:`~raylog.transfer.handlers.RequestHandlers`, replies and failures
(see :mod:`raylog.transfer.server`)."""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Callable, NoReturn

from raylog.config import KiB, MiB
from raylog.errors import (
    AuthenticationError,
    FrameTooLargeError,
    ProtocolError,
    RaylogError,
)
from raylog.transfer.connections import CloseConnection, ServedConnection
from raylog.transfer.handlers import RequestHandlers
from raylog.transfer.handshake import client_proof, new_nonce, proven, server_proof
from raylog.transfer.protocol import AUTH_HELLO, NO_CORRELATION, PRE_AUTH_MAX_FRAME_BYTES, REQUEST_HEADER, SIZE
from raylog.transfer.replies import encode_auth_hello_reply, encode_auth_reply, encode_error
from raylog.transfer.requests import (
    AuthRequest,
    CountRequest,
    FetchRequest,
    LocateRequest,
    OffsetsForTimeRequest,
    ProduceRequest,
    ReplicaFetchRequest,
    check_frame_size,
    decode_request,
)
from raylog.transfer.socket_io import set_timeout

# one logger for the whole data server
log = logging.getLogger("raylog.transfer.server")


#: first size of a connection's receive buffer; it grows (up to one maximum
#: frame) when reads fill it or a larger frame arrives
INITIAL_BUFFER_BYTES = 256 * KiB


#: after an error that ends a connection, read and drop at most this much
#: (and for at most this long) of what the peer still sends
LINGER_S = 0.5


LINGER_BYTES = 4 * MiB


def send(conn: ServedConnection, data: bytes) -> None:
    """Send ``data`` on ``conn`` (counted in its ``bytes_out``)."""
    conn.sock.sendall(data)
    conn.bytes_out += len(data)


def fail(conn: ServedConnection, err: RaylogError, correlation_id: int = NO_CORRELATION, out=None, *,
         stopping: threading.Event) -> NoReturn:
    """Reply ``err`` after whatever is pending in ``out``, then close (raises
    ``CloseConnection``); the lingering close ends early once ``stopping`` is set."""
    conn.count_error(err)
    data = (b"".join(out) if out else b"") + encode_error(correlation_id, err)
    if out:
        out.clear()
    sock = conn.sock
    try:
        send(conn, data)
        # Lingering close: send FIN, then read and drop what the peer still
        # sends for a short while. Closing with unread bytes would reset
        # the connection and could destroy the reply before it is read.
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(LINGER_S)
        deadline = time.monotonic() + LINGER_S
        drained = 0
        scratch = bytearray(64 * KiB if conn.authenticated else PRE_AUTH_MAX_FRAME_BYTES)
        while drained < LINGER_BYTES and time.monotonic() < deadline and not stopping.is_set():
            n = sock.recv_into(scratch)
            if not n:
                break
            drained += n
    except OSError:
        pass
    raise CloseConnection()


class _State:
    """Per-connection state of the frame loop: authenticated yet, and the
    nonces of an AUTH HELLO answered and waiting for its PROOF."""

    __slots__ = ("authenticated", "client_nonce", "server_nonce")

    def __init__(self, authenticated: bool):
        self.authenticated = authenticated
        self.client_nonce: bytes | None = None
        self.server_nonce: bytes | None = None


class FrameLoop:
    """Serves one connection at a time per call of :meth:`serve` (one thread
    per connection; the loop keeps no state of its own between frames but
    the settings given here).

    ``handlers`` answers the requests; ``release(conn)`` is called once when
    a connection ends; ``token`` (or ``None``: no AUTH) must be proven first;
    ``max_frame_bytes`` bounds a frame; ``auth_timeout_s`` and
    ``idle_timeout_s`` are the kernel receive timeouts before and after
    AUTH (``idle_timeout_s`` the send timeout too); ``socket_buffer_bytes``
    sets SO_RCVBUF/SO_SNDBUF (``None``: the kernel's); ``stopping`` is set by
    the server's ``stop()``.
    """

    def __init__(
        self,
        handlers: RequestHandlers,
        release: Callable[[ServedConnection], None],
        *,
        token: bytes | None,
        max_frame_bytes: int,
        auth_timeout_s: float,
        idle_timeout_s: float,
        socket_buffer_bytes: int | None,
        stopping: threading.Event,
    ):
        self._handlers = handlers
        self._release = release
        self._token = token
        self.max_frame_bytes = max_frame_bytes
        self.auth_timeout_s = auth_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self._socket_buffer_bytes = socket_buffer_bytes
        self._stopping = stopping

    def _fail(self, conn: ServedConnection, err: RaylogError, correlation_id: int = NO_CORRELATION, out=None) -> NoReturn:
        fail(conn, err, correlation_id, out, stopping=self._stopping)

    def serve(self, conn: ServedConnection) -> None:
        """Run ``conn`` to its end (its thread's target)."""
        sock = conn.sock
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # Kernel timeouts on the blocking socket (no poll() per recv): the
            # token must come within auth_timeout_s; then nothing to read, or
            # a peer that stops reading, for idle_timeout_s ends the connection.
            set_timeout(sock, socket.SO_RCVTIMEO, self.auth_timeout_s if self._token is not None else self.idle_timeout_s)
            set_timeout(sock, socket.SO_SNDTIMEO, self.idle_timeout_s)
            if self._socket_buffer_bytes:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._socket_buffer_bytes)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._socket_buffer_bytes)
            self._read_loop(conn)
        except CloseConnection:
            pass
        except OSError as err:  # the peer went away or stop() shut us down
            if not self._stopping.is_set():
                log.debug("data server connection %s: %s", conn.peer, err)
        except Exception as err:  # noqa: BLE001 - a bug must cost one connection only
            log.exception("data server connection %s failed", conn.peer)
            internal = RaylogError(f"internal error in the data server: {err!r}")
            conn.count_error(internal)
            try:
                sock.sendall(encode_error(NO_CORRELATION, internal))
            except OSError:
                pass
        finally:
            try:
                sock.close()
            finally:
                self._release(conn)

    def _read_loop(self, conn: ServedConnection) -> None:
        sock = conn.sock
        max_frame = self.max_frame_bytes
        state = _State(authenticated=self._token is None)
        conn.authenticated = state.authenticated
        # Before AUTH completes, a buffer for one small frame: what a stranger
        # announces is never allocated. It grows once the peer has proven itself.
        limit = SIZE.size + (max_frame if state.authenticated else PRE_AUTH_MAX_FRAME_BYTES)
        buf = bytearray(min(INITIAL_BUFFER_BYTES, limit))
        view = memoryview(buf)
        end = 0  # bytes in buf; a partial frame is always kept at buf[0:end]
        monotonic = time.monotonic
        # The token must come within auth_timeout_s of the accept, whatever
        # arrives before it: the receive timeout is cut to what is left of
        # that deadline after each read (a HELLO every few seconds does not
        # restart it). Nothing of this runs once the peer is authenticated.
        auth_deadline = conn.accepted_at + self.auth_timeout_s
        while True:
            conn.waiting_since = monotonic()
            if not state.authenticated:
                left = auth_deadline - conn.waiting_since
                if left <= 0:
                    self._auth_late(conn)
                set_timeout(sock, socket.SO_RCVTIMEO, max(left, 0.001))
            try:
                n = sock.recv_into(view[end:])
            except BlockingIOError:  # SO_RCVTIMEO: the auth deadline or the idle timeout passed
                if not state.authenticated:
                    self._auth_late(conn)
                log.debug("data server connection %s idle for %.0f s; closing", conn.peer, self.idle_timeout_s)
                return
            conn.waiting_since = None
            if n == 0:
                if end:
                    self._fail(conn, ProtocolError(f"connection closed inside a frame ({end} bytes of it received)"))
                return
            conn.bytes_in += n
            filled = end + n == len(buf)
            end += n
            pos, need = self._handle_frames(conn, state, view, end)
            remaining = end - pos
            if state.authenticated and limit < SIZE.size + max_frame:
                limit = SIZE.size + max_frame
                need = max(need, min(INITIAL_BUFFER_BYTES, limit))
            if need > len(buf) or (filled and len(buf) < limit):
                # Grow: a frame larger than the buffer is coming (its size was
                # checked against max_frame_bytes), or reads fill the buffer.
                grown = bytearray(min(limit, max(need, 2 * len(buf))))
                grown[:remaining] = view[pos:end]
                buf, view = grown, memoryview(grown)
            elif remaining and pos:
                view[:remaining] = view[pos:end]
            end = remaining

    def _auth_late(self, conn: ServedConnection) -> NoReturn:
        self._fail(conn, AuthenticationError(
            f"no AUTH frame within {self.auth_timeout_s:g} s of connecting; pass the cluster's token"
        ))

    def _handle_frames(self, conn: ServedConnection, state: "_State", view: memoryview, end: int) -> tuple[int, int]:
        """Handle every whole frame in ``view[:end]``; return where the first
        incomplete frame starts and how many bytes the buffer needs to hold it."""
        pos = 0
        out: list[bytes] = []
        group: list[ProduceRequest] = []
        handlers = self._handlers
        max_frame = self.max_frame_bytes if state.authenticated else PRE_AUTH_MAX_FRAME_BYTES
        need = 0
        try:
            while end - pos >= SIZE.size:
                (size,) = SIZE.unpack_from(view, pos)
                if size > max_frame and not state.authenticated:
                    self._fail(conn, AuthenticationError(
                        f"a frame of {size} bytes before authenticating (at most {PRE_AUTH_MAX_FRAME_BYTES} "
                        f"are read before AUTH completes); the first frames must be AUTH: pass the cluster's token"
                    ), NO_CORRELATION, out)
                if size > max_frame:
                    corr = NO_CORRELATION
                    if end - pos >= REQUEST_HEADER.size:
                        corr = REQUEST_HEADER.unpack_from(view, pos)[3]
                    if group:
                        handlers.produce(conn, group, out)
                    try:
                        check_frame_size(size, max_frame)
                    except FrameTooLargeError as err:
                        self._fail(conn, err, corr, out)
                if end - pos < SIZE.size + size:
                    need = SIZE.size + size
                    break
                try:
                    request = decode_request(view, pos, size)
                except ProtocolError as err:
                    if group:
                        handlers.produce(conn, group, out)
                    self._fail(conn, err, err.details.get("correlation_id", NO_CORRELATION), out)
                pos += SIZE.size + size
                conn.requests += 1
                kind = type(request)
                if not state.authenticated or kind is AuthRequest:
                    if group:
                        handlers.produce(conn, group, out)
                    self._authenticate(conn, state, request, out)
                    max_frame = self.max_frame_bytes if state.authenticated else PRE_AUTH_MAX_FRAME_BYTES
                    continue
                if kind is ProduceRequest:
                    if group and (request.partition != group[0].partition or request.topic != group[0].topic):
                        handlers.produce(conn, group, out)
                    group.append(request)
                    continue
                if group:
                    handlers.produce(conn, group, out)
                if kind is FetchRequest:
                    handlers.fetch(conn, request, out)
                elif kind is OffsetsForTimeRequest:
                    handlers.offsets_for_time(conn, request, out)
                elif kind is CountRequest:
                    handlers.count(conn, request, out)
                elif kind is LocateRequest:
                    handlers.locate(conn, request, out)
                elif kind is ReplicaFetchRequest:
                    handlers.replica_fetch(conn, request, out)
                else:
                    handlers.offsets(conn, request, out)
            if group:
                handlers.produce(conn, group, out)
        finally:
            # replies of what was handled go out even when the connection ends
            if out:
                send(conn, b"".join(out))
        return pos, need

    def _authenticate(self, conn, state: "_State", request, out: list) -> None:
        """One step of the challenge–response (:mod:`raylog.transfer.handshake`):
        a HELLO gets this end's nonce and proof, a PROOF is checked in
        constant time; anything else before AUTH completes closes the connection."""
        if type(request) is not AuthRequest:
            why = "no AUTH frame first"
        elif self._token is None:
            why = "an AUTH frame, but this endpoint has no token and cannot prove one (connect without a token)"
        elif request.step == AUTH_HELLO:
            state.client_nonce, state.server_nonce = request.data, new_nonce()
            proof = server_proof(self._token, state.client_nonce, state.server_nonce)
            out.append(encode_auth_hello_reply(request.correlation_id, state.server_nonce, proof))
            return
        elif state.client_nonce is None:
            why = "an AUTH PROOF without a HELLO before it"
        else:
            expected = client_proof(self._token, state.client_nonce, state.server_nonce)
            state.client_nonce = state.server_nonce = None  # one proof per HELLO
            if proven(expected, request.data):
                if not state.authenticated:
                    state.authenticated = conn.authenticated = True
                    set_timeout(conn.sock, socket.SO_RCVTIMEO, self.idle_timeout_s)
                out.append(encode_auth_reply(request.correlation_id))
                return
            why = "a wrong AUTH proof (not the cluster's token)"
        self._fail(
            conn,
            AuthenticationError(f"connection presented {why}; pass the cluster's token"),
            request.correlation_id,
            out,
        )
