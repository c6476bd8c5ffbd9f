"""The connection side of the data server: accepting (bounded, shedding idle
connections when full), one thread per connection reading frames into a
buffer, authentication, replies and failures (a mixin of
:class:`~raylog.transfer.server.DataServer`; see :mod:`raylog.transfer.server`)."""

from __future__ import annotations

import logging
import socket
import threading
import time

from raylog.config import KiB, MiB
from raylog.errors import (
    AuthenticationError,
    FrameTooLargeError,
    ProtocolError,
    RaylogError,
    TooManyConnectionsError,
)
from raylog.transfer.handshake import client_proof, new_nonce, proven, server_proof
from raylog.transfer.protocol import AUTH_HELLO, NO_CORRELATION, PRE_AUTH_MAX_FRAME_BYTES, REQUEST_HEADER, SIZE
from raylog.transfer.replies import encode_auth_hello_reply, encode_auth_reply, encode_error
from raylog.transfer.requests import (
    AuthRequest,
    CountRequest,
    FetchRequest,
    OffsetsForTimeRequest,
    ProduceRequest,
    check_frame_size,
    decode_request,
)
from raylog.transfer.socket_io import set_timeout

# one logger for the whole data server, as before it was split in modules
log = logging.getLogger("raylog.transfer.server")


#: first size of a connection's receive buffer; it grows (up to one maximum
#: frame) when reads fill it or a larger frame arrives
INITIAL_BUFFER_BYTES = 256 * KiB


#: after an error that ends a connection, read and drop at most this much
#: (and for at most this long) of what the peer still sends
LINGER_S = 0.5


LINGER_BYTES = 4 * MiB


def peer_closed(sock: socket.socket) -> bool:
    """Whether the peer has closed (or reset) ``sock``, without waiting and
    without taking any byte it sent: a connection parked in a long poll
    checks this while it waits, since its thread reads nothing then."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False  # nothing to read: still there
    except OSError:
        return True  # reset, or shut down by stop()


class _Close(Exception):
    """End this connection (its reply, if any, was sent)."""


class _Connection:
    """One client connection; its counters are written by its thread only."""

    __slots__ = (
        "sock", "peer", "thread", "requests", "bytes_in", "bytes_out", "message_sets_in", "errors",
        "waiting_since", "authenticated", "long_polling",
    )

    def __init__(self, sock: socket.socket, peer):
        self.sock = sock
        self.peer = peer
        self.thread: threading.Thread | None = None
        #: monotonic time since when the thread waits for bytes (None: busy)
        self.waiting_since: float | None = time.monotonic()
        self.authenticated = False
        #: holds a long-poll slot (under the server's _lock)
        self.long_polling = False
        self.requests = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.message_sets_in = 0
        self.errors: dict[int, int] = {}


class _State:
    """Per-connection state of the frame loop: authenticated yet, and the
    nonces of an AUTH HELLO answered and waiting for its PROOF."""

    __slots__ = ("authenticated", "client_nonce", "server_nonce")

    def __init__(self, authenticated: bool):
        self.authenticated = authenticated
        self.client_nonce: bytes | None = None
        self.server_nonce: bytes | None = None


class ConnectionLoop:
    """Accept, read, authenticate and answer on the connections of a
    :class:`~raylog.transfer.server.DataServer` (its thread-safety notes hold)."""

    def _accept_loop(self) -> None:
        listener = self._listener
        while not self._stopping.is_set():
            try:
                sock, peer = listener.accept()
            except OSError as err:
                if self._stopping.is_set():
                    return
                log.warning("data server %s: accept failed: %s", self._address, err)
                time.sleep(0.05)  # e.g. out of file descriptors: do not spin
                continue
            with self._lock:
                if self._stopping.is_set():
                    sock.close()
                    return
                # parked long polls have slots of their own (see _park)
                busy = len(self._connections) - self._long_polls
                if busy >= self.max_connections and not self._shed_one():
                    self._refused += 1
                    refuse = True
                else:
                    refuse = False
                    self._accepted += 1
                    conn = _Connection(sock, peer)
                    self._connections.add(conn)
            if refuse:
                self._refuse(sock)
                continue
            conn.thread = threading.Thread(
                target=self._serve, args=(conn,), name=f"raylog-conn-{peer[0]}:{peer[1]}", daemon=True
            )
            conn.thread.start()

    def _shed_one(self) -> bool:
        """At the limit (``_lock`` held): close the connection that has waited
        longest for its next frame, if it waited at least
        ``shed_idle_after_s`` or never authenticated. Its thread ends on its
        own; it leaves the count at once."""
        now = time.monotonic()
        victim, oldest = None, None
        for conn in self._connections:
            since = conn.waiting_since
            if since is None or conn.long_polling:
                continue
            if not conn.authenticated:
                since -= self.shed_idle_after_s  # strangers go first
            if now - since >= self.shed_idle_after_s and (oldest is None or since < oldest):
                victim, oldest = conn, since
        if victim is None:
            return False
        self._connections.discard(victim)
        self._shed += 1
        try:
            victim.sock.shutdown(socket.SHUT_RDWR)  # wakes its recv(); the thread closes it
        except OSError:
            pass
        return True

    # -- long-poll slots ----------------------------------------------------------

    def _park(self, conn: _Connection) -> bool:
        """Take a long-poll slot for ``conn`` (about to wait in a FETCH);
        False when every slot is taken by a peer still there (a parked
        connection whose peer has closed gives its slot up here)."""
        with self._lock:
            if self._long_polls >= self.max_long_polls:
                for other in self._connections:
                    if other.long_polling and peer_closed(other.sock):
                        self._unpark_locked(other)
                        try:
                            other.sock.shutdown(socket.SHUT_RDWR)  # its thread ends on its own
                        except OSError:
                            pass
                        break
            if self._long_polls >= self.max_long_polls:
                self._long_polls_refused += 1
                return False
            self._long_polls += 1
            conn.long_polling = True
            return True

    def _unpark(self, conn: _Connection) -> None:
        """Give the long-poll slot of ``conn`` back (if it still holds it)."""
        with self._lock:
            self._unpark_locked(conn)

    def _unpark_locked(self, conn: _Connection) -> None:
        if conn.long_polling:
            conn.long_polling = False
            self._long_polls -= 1

    def _refuse(self, sock: socket.socket) -> None:
        try:
            sock.settimeout(1.0)
            error = TooManyConnectionsError(
                f"the endpoint serves {self.max_connections} busy connections already; retry later",
                max_connections=self.max_connections,
            )
            sock.sendall(encode_error(NO_CORRELATION, error))
        except OSError:
            pass
        finally:
            sock.close()

    def _serve(self, conn: _Connection) -> None:
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
        except _Close:
            pass
        except OSError as err:  # the peer went away or stop() shut us down
            if not self._stopping.is_set():
                log.debug("data server connection %s: %s", conn.peer, err)
        except Exception as err:  # noqa: BLE001 - a bug must cost one connection only
            log.exception("data server connection %s failed", conn.peer)
            internal = RaylogError(f"internal error in the data server: {err!r}")
            self._count_error(conn, internal)
            try:
                sock.sendall(encode_error(NO_CORRELATION, internal))
            except OSError:
                pass
        finally:
            try:
                sock.close()
            finally:
                with self._lock:
                    self._unpark_locked(conn)
                    self._connections.discard(conn)
                    self._totals["requests"] += conn.requests
                    self._totals["bytes_in"] += conn.bytes_in
                    self._totals["bytes_out"] += conn.bytes_out
                    self._totals["message_sets_in"] += conn.message_sets_in
                    for code, n in conn.errors.items():
                        self._errors[code] = self._errors.get(code, 0) + n

    def _read_loop(self, conn: _Connection) -> None:
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
        while True:
            conn.waiting_since = monotonic()
            try:
                n = sock.recv_into(view[end:])
            except BlockingIOError:  # SO_RCVTIMEO: the auth deadline or the idle timeout passed
                if not state.authenticated:
                    self._fail(conn, AuthenticationError(
                        f"no AUTH frame within {self.auth_timeout_s:g} s; pass the cluster's token"
                    ))
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

    def _handle_frames(self, conn: _Connection, state: "_State", view: memoryview, end: int) -> tuple[int, int]:
        """Handle every whole frame in ``view[:end]``; return where the first
        incomplete frame starts and how many bytes the buffer needs to hold it."""
        pos = 0
        out: list[bytes] = []
        group: list[ProduceRequest] = []
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
                        self._produce(conn, group, out)
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
                        self._produce(conn, group, out)
                    self._fail(conn, err, err.details.get("correlation_id", NO_CORRELATION), out)
                pos += SIZE.size + size
                conn.requests += 1
                kind = type(request)
                if not state.authenticated or kind is AuthRequest:
                    if group:
                        self._produce(conn, group, out)
                    self._authenticate(conn, state, request, out)
                    max_frame = self.max_frame_bytes if state.authenticated else PRE_AUTH_MAX_FRAME_BYTES
                    continue
                if kind is ProduceRequest:
                    if group and (request.partition != group[0].partition or request.topic != group[0].topic):
                        self._produce(conn, group, out)
                    group.append(request)
                    continue
                if group:
                    self._produce(conn, group, out)
                if kind is FetchRequest:
                    self._fetch(conn, request, out)
                elif kind is OffsetsForTimeRequest:
                    self._offsets_for_time(conn, request, out)
                elif kind is CountRequest:
                    self._count(conn, request, out)
                else:
                    self._offsets(conn, request, out)
            if group:
                self._produce(conn, group, out)
        finally:
            # replies of what was handled go out even when the connection ends
            if out:
                self._send(conn, b"".join(out))
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

    def _send(self, conn: _Connection, data: bytes) -> None:
        conn.sock.sendall(data)
        conn.bytes_out += len(data)

    @staticmethod
    def _count_error(conn: _Connection, err: RaylogError) -> None:
        conn.errors[err.code] = conn.errors.get(err.code, 0) + 1

    def _fail(self, conn: _Connection, err: RaylogError, correlation_id: int = NO_CORRELATION, out=None):
        """Reply ``err`` after whatever is pending in ``out``, then close."""
        self._count_error(conn, err)
        data = (b"".join(out) if out else b"") + encode_error(correlation_id, err)
        if out:
            out.clear()
        sock = conn.sock
        try:
            self._send(conn, data)
            # Lingering close: send FIN, then read and drop what the peer still
            # sends for a short while. Closing with unread bytes would reset
            # the connection and could destroy the reply before it is read.
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(LINGER_S)
            deadline = time.monotonic() + LINGER_S
            drained = 0
            scratch = bytearray(64 * KiB if conn.authenticated else PRE_AUTH_MAX_FRAME_BYTES)
            while drained < LINGER_BYTES and time.monotonic() < deadline and not self._stopping.is_set():
                n = sock.recv_into(scratch)
                if not n:
                    break
                drained += n
        except OSError:
            pass
        raise _Close()
