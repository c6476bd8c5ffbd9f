"""The data server: produce requests in, fetch replies out with ``os.sendfile``.

One :class:`DataServer` per partition actor (or one for several partitions:
``resolve`` maps a topic and partition to the :class:`PartitionLog` served
here, or ``None`` when this endpoint does not serve it). It speaks the frame
protocol of :mod:`raylog.transfer.protocol` over plain blocking TCP sockets:
an accept loop in a daemon thread and one daemon thread per connection.

The produce path reads from the socket into a large reusable buffer
(``recv_into``) and handles every whole frame found there before reading
again, so many small frames (batch size 1, acks=0) cost few system calls.
Consecutive PRODUCE frames for the same partition found in one read are
appended to the log as one joined message set; each acks=1 frame is answered
with its own base offset, and the replies of one read go out in one send.
The log validates every message (CRC and format) on append; the server does
no per-message work of its own.

The fetch path reads a slice of the log; if it is empty and the request
allows a wait, it long-polls on the log's condition (no busy loop), then sends
the reply header and the slice straight from the segment file with
``os.sendfile``.

Bounds: at most ``max_connections`` connections; at the limit a new one
makes room by closing the connection that has waited longest for its next
frame (at least ``shed_idle_after_s``; unauthenticated ones first), else it
is answered with TooManyConnectionsError and closed. A connection must
authenticate within ``auth_timeout_s`` and is closed after
``idle_timeout_s`` with nothing to read (also inside a frame) or with a
reply the peer does not read (kernel SO_RCVTIMEO/SO_SNDTIMEO, no cost per
call). A long poll waits at most ``max_wait_ms_cap`` whatever it asks.

Failure handling: a frame larger than ``max_frame_bytes`` is refused from
its size field alone (nothing of the claimed size is allocated); malformed
frames get a ProtocolError reply, a failed authentication an
AuthenticationError reply, a failed acks=0 produce its error reply, and each
of these closes that connection only. Errors of a request (out of range,
corrupt set, not the owner ...) are answered and the connection stays.

Thread-safety: ``start``, ``stop`` and ``stats`` may be called from any
thread. Each connection's state is confined to its thread; the logs are
shared by every connection thread (:class:`PartitionLog` serializes its
writers and lets readers run concurrently).
"""

from __future__ import annotations

import hmac
import logging
import os
import socket
import struct
import threading
import time
from typing import Callable

from raylog.config import KiB, MiB
from raylog.errors import (
    AuthenticationError,
    BrokerUnavailableError,
    ClosedError,
    FrameTooLargeError,
    NotOwnerError,
    ProtocolError,
    RaylogError,
    TooManyConnectionsError,
)
from raylog.transfer.protocol import (
    ACKS_ALL,
    DEFAULT_MAX_FRAME_BYTES,
    FETCH_REPLY,
    NO_CORRELATION,
    REQUEST_HEADER,
    SIZE,
)
from raylog.transfer.replies import (
    encode_auth_reply,
    encode_error,
    encode_fetch_reply_header,
    encode_offsets_for_time_reply,
    encode_offsets_reply,
    encode_produce_reply,
)
from raylog.transfer.requests import (
    AuthRequest,
    FetchRequest,
    OffsetsForTimeRequest,
    OffsetsRequest,
    ProduceRequest,
    decode_request,
)

log = logging.getLogger(__name__)

#: first size of a connection's receive buffer; it grows (up to one maximum
#: frame) when reads fill it or a larger frame arrives
INITIAL_BUFFER_BYTES = 256 * KiB
#: joined produce sets stay below this when the log does not say its limit
DEFAULT_JOIN_LIMIT = 1 * MiB
#: a long poll re-checks for ``stop()`` this often while it waits
LONG_POLL_SLICE_S = 0.5
#: after an error that ends a connection, read and drop at most this much
#: (and for at most this long) of what the peer still sends
LINGER_S = 0.5
LINGER_BYTES = 4 * MiB
#: how long ``stop()`` waits for the connection threads in all
STOP_TIMEOUT_S = 5.0
#: the most connections one server keeps open
DEFAULT_MAX_CONNECTIONS = 256
#: a connection must present the token (AUTH frame) within this long
DEFAULT_AUTH_TIMEOUT_S = 10.0
#: a connection with nothing to read (or a frame that stops arriving, or a
#: peer that stops reading a reply) for this long is closed
DEFAULT_IDLE_TIMEOUT_S = 300.0
#: a long poll (FETCH max_wait_ms) waits at most this long, whatever it asks
DEFAULT_MAX_WAIT_MS_CAP = 30_000
#: at the connection limit, a connection waiting for its next frame this long
#: (or not yet authenticated) is closed to make room for a new one
DEFAULT_SHED_IDLE_AFTER_S = 0.5

_TIMEVAL = struct.Struct("@ll")

_MSG_MORE = getattr(socket, "MSG_MORE", 0)


class _Close(Exception):
    """End this connection (its reply, if any, was sent)."""


class _Connection:
    """One client connection; its counters are written by its thread only."""

    __slots__ = (
        "sock", "peer", "thread", "requests", "bytes_in", "bytes_out", "message_sets_in", "errors",
        "waiting_since", "authenticated",
    )

    def __init__(self, sock: socket.socket, peer):
        self.sock = sock
        self.peer = peer
        self.thread: threading.Thread | None = None
        #: monotonic time since when the thread waits for bytes (None: busy)
        self.waiting_since: float | None = time.monotonic()
        self.authenticated = False
        self.requests = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.message_sets_in = 0
        self.errors: dict[int, int] = {}


class DataServer:
    """Serves partition logs on one TCP port (see the module docstring).

    ``resolve(topic, partition)`` returns the :class:`PartitionLog` to use or
    ``None`` (the client gets NotOwnerError and refreshes its endpoint).
    ``token``, when set, must be presented by an AUTH frame first on every
    connection. ``max_frame_bytes`` bounds every request frame (and so the
    largest message set and the memory one connection can make the server
    allocate); give it the topic's ``max_message_bytes`` plus
    :data:`~raylog.transfer.protocol.FRAME_OVERHEAD_BYTES` when that is
    raised. ``socket_buffer_bytes`` sets SO_SNDBUF/SO_RCVBUF of accepted
    connections (``None`` leaves the kernel's auto-tuning on).
    """

    def __init__(
        self,
        resolve: Callable[[str, int], object | None],
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        token: bytes | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        socket_buffer_bytes: int | None = None,
        auth_timeout_s: float = DEFAULT_AUTH_TIMEOUT_S,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
        max_wait_ms_cap: int = DEFAULT_MAX_WAIT_MS_CAP,
        shed_idle_after_s: float = DEFAULT_SHED_IDLE_AFTER_S,
    ):
        if max_frame_bytes < FETCH_REPLY.size + 64:
            raise ValueError(f"max_frame_bytes must be at least {FETCH_REPLY.size + 64}, got {max_frame_bytes}")
        self._resolve = resolve
        self._host = host
        self._port = port
        self._token = bytes(token) if token is not None else None
        self.max_frame_bytes = max_frame_bytes
        self.max_connections = max_connections
        self._socket_buffer_bytes = socket_buffer_bytes
        for name, value in (("auth_timeout_s", auth_timeout_s), ("idle_timeout_s", idle_timeout_s)):
            if not value > 0:
                raise ValueError(f"{name} must be positive, got {value}")
        self.auth_timeout_s = auth_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.max_wait_ms_cap = max_wait_ms_cap
        self.shed_idle_after_s = shed_idle_after_s
        #: the most log bytes one fetch reply carries (the reply must fit a frame)
        self._max_fetch_bytes = max_frame_bytes - (FETCH_REPLY.size - SIZE.size)

        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._connections: set[_Connection] = set()
        self._stopping = threading.Event()
        self._address: tuple[str, int] | None = None
        # totals of closed connections (under _lock)
        self._totals = {"requests": 0, "bytes_in": 0, "bytes_out": 0, "message_sets_in": 0}
        self._errors: dict[int, int] = {}
        self._accepted = 0
        self._refused = 0
        self._shed = 0

    # -- life cycle ------------------------------------------------------------

    @property
    def address(self) -> tuple[str, int] | None:
        """``(host, port)`` once started, else ``None``."""
        return self._address

    def start(self) -> tuple[str, int]:
        """Listen and start accepting; returns ``(host, port)`` (the port the
        OS chose when it was 0)."""
        with self._lock:
            if self._listener is not None:
                raise RuntimeError("DataServer already started")
            if self._stopping.is_set():
                raise RuntimeError("DataServer was stopped; create a new one")
            family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
            listener = socket.create_server((self._host, self._port), family=family, backlog=128)
            self._listener = listener
            self._address = tuple(listener.getsockname()[:2])
            self._accept_thread = threading.Thread(
                target=self._accept_loop, name=f"raylog-accept-{self._address[1]}", daemon=True
            )
            self._accept_thread.start()
        return self._address

    def stop(self) -> None:
        """Close the listener and every connection and join the threads
        (bounded: a thread still busy after ``STOP_TIMEOUT_S`` is left to end
        on its own; all of them are daemons)."""
        with self._lock:
            self._stopping.set()
            listener, self._listener = self._listener, None
            connections = list(self._connections)
        if listener is not None:
            try:
                listener.shutdown(socket.SHUT_RDWR)  # wakes accept() on Linux
            except OSError:
                pass
            listener.close()
        for conn in connections:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)  # wakes recv() and send()
            except OSError:
                pass
        deadline = time.monotonic() + STOP_TIMEOUT_S
        if self._accept_thread is not None:
            self._accept_thread.join(max(0.0, deadline - time.monotonic()))
        for conn in connections:
            if conn.thread is not None and conn.thread is not threading.current_thread():
                conn.thread.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> "DataServer":
        if self._listener is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stats(self) -> dict:
        """Counters since start: ``connections`` (open now),
        ``connections_accepted``, ``connections_refused`` (over
        ``max_connections``), ``requests``, ``bytes_in``, ``bytes_out``
        (replies and log data), ``message_sets_in`` (sets appended; the
        messages in them are not counted here, which would cost a pass over
        every message) and ``errors``: ``{error code: replies}``."""
        with self._lock:  # a closing connection moves its counts under it
            totals = dict(self._totals)
            errors = dict(self._errors)
            accepted, refused, shed = self._accepted, self._refused, self._shed
            live = len(self._connections)
            for conn in self._connections:
                totals["requests"] += conn.requests
                totals["bytes_in"] += conn.bytes_in
                totals["bytes_out"] += conn.bytes_out
                totals["message_sets_in"] += conn.message_sets_in
                for code, n in list(conn.errors.items()):
                    errors[code] = errors.get(code, 0) + n
        return {
            "connections": live,
            "connections_accepted": accepted,
            "connections_refused": refused,
            "connections_shed": shed,
            **totals,
            "errors": errors,
        }

    # -- accepting -------------------------------------------------------------

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
                if len(self._connections) >= self.max_connections and not self._shed_one():
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
            if since is None:
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

    # -- one connection ----------------------------------------------------------

    def _serve(self, conn: _Connection) -> None:
        sock = conn.sock
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # Kernel timeouts on the blocking socket (no poll() per recv): the
            # token must come within auth_timeout_s; then nothing to read, or
            # a peer that stops reading, for idle_timeout_s ends the connection.
            _set_timeout(sock, socket.SO_RCVTIMEO, self.auth_timeout_s if self._token is not None else self.idle_timeout_s)
            _set_timeout(sock, socket.SO_SNDTIMEO, self.idle_timeout_s)
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
            self._count_error(conn, err)
            try:
                sock.sendall(encode_error(NO_CORRELATION, RaylogError(f"internal error in the data server: {err!r}")))
            except OSError:
                pass
        finally:
            try:
                sock.close()
            finally:
                with self._lock:
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
        limit = SIZE.size + max_frame  # the largest buffer a frame can need
        buf = bytearray(min(INITIAL_BUFFER_BYTES, limit))
        view = memoryview(buf)
        end = 0  # bytes in buf; a partial frame is always kept at buf[0:end]
        state = _State(authenticated=self._token is None)
        conn.authenticated = state.authenticated
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
        max_frame = self.max_frame_bytes
        need = 0
        try:
            while end - pos >= SIZE.size:
                (size,) = SIZE.unpack_from(view, pos)
                if size > max_frame:
                    corr = NO_CORRELATION
                    if end - pos >= REQUEST_HEADER.size:
                        corr = REQUEST_HEADER.unpack_from(view, pos)[3]
                    if group:
                        self._produce(conn, group, out)
                    self._fail(
                        conn,
                        FrameTooLargeError(
                            f"frame of {size} bytes exceeds the maximum of {max_frame} bytes; "
                            "send smaller message sets",
                            size=size,
                            max_frame_bytes=max_frame,
                        ),
                        corr,
                        out,
                    )
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
                else:
                    self._offsets(conn, request, out)
            if group:
                self._produce(conn, group, out)
        finally:
            # replies of what was handled go out even when the connection ends
            if out:
                self._send(conn, b"".join(out))
        return pos, need

    # -- requests ----------------------------------------------------------------

    def _authenticate(self, conn, state: "_State", request, out: list) -> None:
        if type(request) is AuthRequest and (
            self._token is None or hmac.compare_digest(request.token, self._token)
        ):
            if not state.authenticated:
                state.authenticated = conn.authenticated = True
                _set_timeout(conn.sock, socket.SO_RCVTIMEO, self.idle_timeout_s)
            out.append(encode_auth_reply(request.correlation_id))
            return
        what = "a wrong token" if type(request) is AuthRequest else "no AUTH frame first"
        self._fail(
            conn,
            AuthenticationError(f"connection presented {what}; pass the cluster's token"),
            request.correlation_id,
            out,
        )

    def _lookup(self, topic: str, partition: int):
        owner = self._resolve(topic, partition)
        if owner is None:
            raise NotOwnerError(
                f"this endpoint does not serve {topic}-{partition}; refresh its endpoint from the registry",
                topic=topic,
                partition=partition,
            )
        return owner

    def _produce(self, conn: _Connection, group: list[ProduceRequest], out: list) -> None:
        """Append a run of PRODUCE frames for one partition (clears ``group``):
        joined into sets of at most the log's ``max_message_bytes``."""
        requests = list(group)
        group.clear()
        first = requests[0]
        try:
            partition_log = self._lookup(first.topic, first.partition)
        except RaylogError as err:
            for request in requests:
                self._produce_failed(conn, request, err, out)
            return
        config = getattr(partition_log, "config", None)
        limit = getattr(config, "max_message_bytes", DEFAULT_JOIN_LIMIT)
        run: list[ProduceRequest] = []
        run_bytes = 0
        run_pid = next_sequence = -1
        for request in requests:
            length = len(request.message_set)
            pid = request.producer_id
            # A run joins sets of one producer id (or of none), in sequence.
            if run and (
                run_bytes + length > limit or pid != run_pid or (pid >= 0 and request.sequence != next_sequence)
            ):
                self._append(conn, partition_log, run, out)
                run, run_bytes = [], 0
            if pid >= 0:
                next_sequence = request.sequence + 1
            run_pid = pid
            run.append(request)
            run_bytes += length
        self._append(conn, partition_log, run, out)

    def _append(self, conn: _Connection, partition_log, run: list[ProduceRequest], out: list) -> None:
        first = run[0]
        try:
            if len(run) == 1:
                data = bytes(first.message_set)
            else:
                data = b"".join([request.message_set for request in run])
            if first.producer_id < 0:
                base = partition_log.append(data)
            else:
                base = partition_log.append_sequenced(
                    data,
                    first.producer_id,
                    first.producer_epoch,
                    first.sequence,
                    [len(request.message_set) for request in run],
                    name=f"{first.topic}-{first.partition}",
                )
        except ClosedError:
            err = _closing(run[0].topic, run[0].partition)
            for request in run:
                self._produce_failed(conn, request, err, out)
            return
        except RaylogError as err:
            if len(run) == 1:
                self._produce_failed(conn, run[0], err, out)
                return
            # A set of the run was refused: append them one by one so that
            # each frame gets its own answer, as if they had come apart.
            for request in run:
                self._append(conn, partition_log, [request], out)
            return
        conn.message_sets_in += len(run)
        replies = []
        wait_for_sync = False
        end = base + len(data)
        for request in run:
            acks = request.acks
            if acks:
                replies.append(encode_produce_reply(request.correlation_id, base))
                if acks == ACKS_ALL:
                    wait_for_sync = True
            base += len(request.message_set)
        if wait_for_sync and partition_log.high_watermark < end:
            # acks=-1: reply once the sets are synced and below the high
            # watermark (a flush covers every append before it).
            try:
                partition_log.flush()
            except RaylogError as err:
                if isinstance(err, ClosedError):
                    err = _closing(first.topic, first.partition)
                for request in run:
                    self._produce_failed(conn, request, err, out)
                return
        out.extend(replies)

    def _produce_failed(self, conn: _Connection, request: ProduceRequest, err: RaylogError, out: list) -> None:
        if request.acks:
            self._count_error(conn, err)
            out.append(encode_error(request.correlation_id, err))
        else:
            # No reply is expected: answer anyway and close, so that the
            # producer learns of it on its next call instead of never.
            self._fail(conn, err, request.correlation_id, out)

    def _fetch(self, conn: _Connection, request: FetchRequest, out: list) -> None:
        max_bytes = min(request.max_bytes, self._max_fetch_bytes)
        try:
            partition_log = self._lookup(request.topic, request.partition)
            chunk = partition_log.read(request.offset, max_bytes)
            if chunk.length == 0 and request.max_wait_ms > 0:
                max_wait_ms = min(request.max_wait_ms, self.max_wait_ms_cap)
                if out:  # earlier replies do not wait for the long poll
                    self._send(conn, b"".join(out))
                    out.clear()
                deadline = time.monotonic() + max_wait_ms / 1000.0
                while not self._stopping.is_set():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    partition_log.wait_for_data(request.offset, min(left, LONG_POLL_SLICE_S))
                    # Read again after every wait, whatever it said: a closed
                    # log says so here (instead of returning at once forever).
                    chunk = partition_log.read(request.offset, max_bytes)
                    if chunk.length:
                        break
            high_watermark = partition_log.high_watermark
            log_start = partition_log.log_start_offset
        except ClosedError:
            err = _closing(request.topic, request.partition)
            self._count_error(conn, err)
            out.append(encode_error(request.correlation_id, err))
            return
        except RaylogError as err:
            self._count_error(conn, err)
            out.append(encode_error(request.correlation_id, err))
            return
        length = min(chunk.length, self._max_fetch_bytes)
        out.append(encode_fetch_reply_header(request.correlation_id, high_watermark, log_start, length))
        if not length:
            return
        data = b"".join(out)
        out.clear()
        sock = conn.sock
        sock.sendall(data, _MSG_MORE)  # the header leaves with the first data
        conn.bytes_out += len(data)
        fd = chunk.file if isinstance(chunk.file, int) else chunk.file.fileno()
        position = chunk.position
        left = length
        out_fd = sock.fileno()
        while left:
            sent = os.sendfile(out_fd, fd, position, left)
            if sent == 0:
                # The segment is shorter than the slice (deleted or truncated
                # under us); the reply cannot be completed.
                raise _Close()
            position += sent
            left -= sent
            conn.bytes_out += sent

    def _offsets(self, conn: _Connection, request: OffsetsRequest, out: list) -> None:
        try:
            partition_log = self._lookup(request.topic, request.partition)
            reply = encode_offsets_reply(
                request.correlation_id, partition_log.log_start_offset, partition_log.high_watermark
            )
        except RaylogError as err:
            self._count_error(conn, err)
            reply = encode_error(request.correlation_id, err)
        out.append(reply)

    def _offsets_for_time(self, conn: _Connection, request: OffsetsForTimeRequest, out: list) -> None:
        try:
            partition_log = self._lookup(request.topic, request.partition)
            reply = encode_offsets_for_time_reply(
                request.correlation_id, partition_log.offset_for_time(request.timestamp_ms)
            )
        except ClosedError:
            err = _closing(request.topic, request.partition)
            self._count_error(conn, err)
            reply = encode_error(request.correlation_id, err)
        except RaylogError as err:
            self._count_error(conn, err)
            reply = encode_error(request.correlation_id, err)
        out.append(reply)

    # -- replies ---------------------------------------------------------------

    def _send(self, conn: _Connection, data: bytes) -> None:
        conn.sock.sendall(data)
        conn.bytes_out += len(data)

    @staticmethod
    def _count_error(conn: _Connection, err: BaseException) -> None:
        code = getattr(err, "code", RaylogError.code)
        conn.errors[code] = conn.errors.get(code, 0) + 1

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
            scratch = bytearray(64 * KiB)
            while drained < LINGER_BYTES and time.monotonic() < deadline and not self._stopping.is_set():
                n = sock.recv_into(scratch)
                if not n:
                    break
                drained += n
        except OSError:
            pass
        raise _Close()


def _set_timeout(sock: socket.socket, option: int, seconds: float) -> None:
    whole = int(seconds)
    sock.setsockopt(socket.SOL_SOCKET, option, _TIMEVAL.pack(whole, int((seconds - whole) * 1_000_000)))


class _State:
    """Per-connection state of the frame loop."""

    __slots__ = ("authenticated",)

    def __init__(self, authenticated: bool):
        self.authenticated = authenticated


def _closing(topic: str, partition: int) -> NotOwnerError:
    """What a client hears when the log was closed under a request: the
    partition is going away here, so look up where it serves next."""
    return NotOwnerError(
        f"{topic}-{partition} is closing on this endpoint; refresh its endpoint from the registry",
        topic=topic,
        partition=partition,
    )
