"""The data server: produce requests in, fetch replies out with ``os.sendfile``.

One :class:`DataServer` per partition actor (or one for several partitions:
``resolve`` maps a topic and partition to the log served here, any
:class:`~raylog.storage.base.Log` (a :class:`~raylog.storage.log.PartitionLog`
on disk, or a :class:`~raylog.storage.memory.MemoryLog`), or ``None`` when
this endpoint does not serve it). It speaks the frame
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

Bounds: at most ``max_connections`` connections outside long polls; at
the limit a new one makes room by closing the connection that has waited
longest for its next frame (at least ``shed_idle_after_s``; unauthenticated
ones first), else it is answered with TooManyConnectionsError and closed.
Long polls have limits of their own: a connection parked in a FETCH wait
holds one of ``max_long_polls`` slots instead, so that consumers waiting
for data never lock producers out (at most ``max_connections +
max_long_polls`` connections in all). With every slot taken, a FETCH that
would wait is answered after a short pause (``NO_SLOT_PAUSE_S`` of
:mod:`raylog.transfer.handlers`, holding no slot) with what there is then
(the consumer asks again, without spinning). A parked connection checks its socket while it waits: a peer that
closed it frees the slot within ``LONG_POLL_SLICE_S``, and at once when
another FETCH needs that slot. A connection must
authenticate within ``auth_timeout_s`` of its accept (a deadline that frames
before AUTH, such as HELLO after HELLO, do not restart) and is closed after
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

import functools
import logging
import socket
import threading
import time
from typing import Callable

from raylog.errors import ClosedError, ConfigError
from raylog.storage.base import Log
from raylog.transfer.connections import ConnectionTable
from raylog.transfer.handlers import RequestHandlers
from raylog.transfer.replica_source import ReplicaSource
from raylog.transfer.protocol import DEFAULT_MAX_FRAME_BYTES, FETCH_REPLY, SIZE
from raylog.transfer.serving import FrameLoop, fail, send

log = logging.getLogger(__name__)

#: how long ``stop()`` waits for the connection threads in all
STOP_TIMEOUT_S = 5.0
#: the most connections one server keeps open outside long polls
DEFAULT_MAX_CONNECTIONS = 256
#: the most connections parked in a long poll (FETCH waiting for data) at once
DEFAULT_MAX_LONG_POLLS = 256
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


class DataServer:
    """Serves partition logs on one TCP port (see the module docstring).

    Its parts: a :class:`~raylog.transfer.connections.ConnectionTable` (the
    bounded set of connections, long-poll slots, counters), the
    :class:`~raylog.transfer.handlers.RequestHandlers` (given ``resolve``,
    the send and fail of a connection, the long-poll slots and the stop
    event) and the :class:`~raylog.transfer.serving.FrameLoop` that runs each
    connection's thread (given the handlers, the table's release, the token,
    the frame bound and the timeouts). The server itself listens, accepts
    and stops.

    ``resolve(topic, partition)`` returns the :class:`~raylog.storage.base.Log` to use or
    ``None`` (the client gets NotOwnerError and refreshes its endpoint).
    ``token``, when set, must be presented by an AUTH frame first on every
    connection. ``max_frame_bytes`` bounds every request frame (and so the
    largest message set and the memory one connection can make the server
    allocate); give it the topic's ``max_message_bytes`` plus
    :data:`~raylog.transfer.protocol.FRAME_OVERHEAD_BYTES` when that is
    raised. ``resolve_replica(topic, partition)`` returns the partition's
    leader (a :class:`~raylog.transfer.replica_source.ReplicaSource`) that
    answers its followers' REPLICA_FETCH, or ``None`` (NotOwnerError).
    ``socket_buffer_bytes`` sets SO_SNDBUF/SO_RCVBUF of accepted
    connections (``None`` leaves the kernel's auto-tuning on).
    """

    def __init__(
        self,
        resolve: Callable[[str, int], Log | None],
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        token: bytes | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        max_long_polls: int = DEFAULT_MAX_LONG_POLLS,
        socket_buffer_bytes: int | None = None,
        auth_timeout_s: float = DEFAULT_AUTH_TIMEOUT_S,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
        max_wait_ms_cap: int = DEFAULT_MAX_WAIT_MS_CAP,
        shed_idle_after_s: float = DEFAULT_SHED_IDLE_AFTER_S,
        resolve_replica: Callable[[str, int], ReplicaSource | None] | None = None,
    ):
        if max_frame_bytes < FETCH_REPLY.size + 64:
            raise ConfigError(f"max_frame_bytes must be at least {FETCH_REPLY.size + 64}, got {max_frame_bytes}")
        self._host = host
        self._port = port
        self._token = bytes(token) if token is not None else None
        self.max_frame_bytes = max_frame_bytes
        self.max_connections = max_connections
        if not max_long_polls >= 0:
            raise ConfigError(f"max_long_polls must be 0 or more, got {max_long_polls}")
        self.max_long_polls = max_long_polls
        for name, value in (("auth_timeout_s", auth_timeout_s), ("idle_timeout_s", idle_timeout_s)):
            if not value > 0:
                raise ConfigError(f"{name} must be positive, got {value}")
        self.auth_timeout_s = auth_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.max_wait_ms_cap = max_wait_ms_cap
        self.shed_idle_after_s = shed_idle_after_s
        #: the most log bytes one fetch reply carries (the reply must fit a frame)
        self._max_fetch_bytes = max_frame_bytes - (FETCH_REPLY.size - SIZE.size)

        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._address: tuple[str, int] | None = None
        self._connections = ConnectionTable(
            max_connections=max_connections, max_long_polls=max_long_polls, shed_idle_after_s=shed_idle_after_s
        )
        handlers = RequestHandlers(
            resolve,
            max_fetch_bytes=self._max_fetch_bytes,
            max_wait_ms_cap=max_wait_ms_cap,
            send=send,
            fail=functools.partial(fail, stopping=self._stopping),
            park=self._connections.park,
            unpark=self._connections.unpark,
            stopping=self._stopping,
            resolve_replica=resolve_replica,
        )
        self._frames = FrameLoop(
            handlers,
            self._connections.release,
            token=self._token,
            max_frame_bytes=max_frame_bytes,
            auth_timeout_s=auth_timeout_s,
            idle_timeout_s=idle_timeout_s,
            socket_buffer_bytes=socket_buffer_bytes,
            stopping=self._stopping,
        )

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
                raise ConfigError("this DataServer is already started; start() runs once")
            if self._stopping.is_set():
                raise ClosedError("this DataServer was stopped; create a new one")
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
            connections = self._connections.close()
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
            if self._stopping.is_set():
                sock.close()
                return
            conn = self._connections.admit(sock, peer)
            if conn is None:
                continue
            conn.thread = threading.Thread(
                target=self._frames.serve, args=(conn,), name=f"raylog-conn-{peer[0]}:{peer[1]}", daemon=True
            )
            conn.thread.start()

    def __enter__(self) -> "DataServer":
        if self._listener is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stats(self) -> dict:
        """Counters since start: ``connections`` (open now),
        ``connections_accepted``, ``connections_refused`` (over
        ``max_connections``), ``connections_shed``, ``long_polls`` (parked
        now), ``long_polls_refused`` (waits answered after a short pause, every slot
        taken), ``requests``, ``bytes_in``, ``bytes_out``
        (replies and log data), ``message_sets_in`` (sets appended; the
        messages in them are not counted here, which would cost a pass over
        every message) and ``errors``: ``{error code: replies}``."""
        return self._connections.stats()
