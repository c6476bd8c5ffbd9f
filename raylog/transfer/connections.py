"""The data server's connections as a bounded set: admitting a new one (or
making room by shedding the one idle longest, or refusing), the long-poll
slots of connections parked in a FETCH wait, and the counters of
:meth:`~raylog.transfer.server.DataServer.stats` (see
:mod:`raylog.transfer.server` for the bounds).

Thread-safety: every method may be called from any thread (one lock); a
:class:`ServedConnection`'s own counters are written by its thread only and moved
into the totals under the lock when it is released.
"""

from __future__ import annotations

import socket
import threading
import time

from raylog.errors import TooManyConnectionsError
from raylog.transfer.protocol import NO_CORRELATION
from raylog.transfer.replies import encode_error


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


class CloseConnection(Exception):
    """End this connection (its reply, if any, was sent)."""


class ServedConnection:
    """One client connection; its counters are written by its thread only."""

    __slots__ = (
        "sock", "peer", "thread", "requests", "bytes_in", "bytes_out", "message_sets_in", "errors",
        "waiting_since", "authenticated", "long_polling", "accepted_at",
    )

    def __init__(self, sock: socket.socket, peer):
        self.sock = sock
        self.peer = peer
        self.thread: threading.Thread | None = None
        #: monotonic time since when the thread waits for bytes (None: busy)
        #: monotonic time of the accept (the authentication deadline runs from it)
        self.accepted_at = time.monotonic()
        self.waiting_since: float | None = self.accepted_at
        self.authenticated = False
        #: holds a long-poll slot (under the table's lock)
        self.long_polling = False
        self.requests = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.message_sets_in = 0
        self.errors: dict[int, int] = {}

    def count_error(self, err) -> None:
        """Count an error reply (by its code) in :meth:`ConnectionTable.stats`."""
        self.errors[err.code] = self.errors.get(err.code, 0) + 1


class ConnectionTable:
    """The open connections of one data server, at most ``max_connections``
    outside long polls and ``max_long_polls`` parked in one; at the limit a
    connection waiting ``shed_idle_after_s`` for its next frame (or not yet
    authenticated) is closed to make room."""

    def __init__(self, *, max_connections: int, max_long_polls: int, shed_idle_after_s: float):
        self.max_connections = max_connections
        self.max_long_polls = max_long_polls
        self.shed_idle_after_s = shed_idle_after_s
        self._lock = threading.Lock()
        self._connections: set[ServedConnection] = set()
        self._closed = False
        # totals of released connections (under _lock)
        self._totals = {"requests": 0, "bytes_in": 0, "bytes_out": 0, "message_sets_in": 0}
        self._errors: dict[int, int] = {}
        self._accepted = 0
        self._refused = 0
        self._shed = 0
        self._long_polls = 0  # connections parked in a long poll now
        self._long_polls_refused = 0  # FETCH waits answered after a short pause, every slot taken

    def admit(self, sock: socket.socket, peer) -> ServedConnection | None:
        """The new connection's entry, or ``None`` when it was refused
        (answered TooManyConnectionsError and closed) or the table is closed."""
        with self._lock:
            if self._closed:
                sock.close()
                return None
            # parked long polls have slots of their own (see park)
            busy = len(self._connections) - self._long_polls
            if busy >= self.max_connections and not self._shed_one():
                self._refused += 1
                conn = None
            else:
                self._accepted += 1
                conn = ServedConnection(sock, peer)
                self._connections.add(conn)
        if conn is None:
            self._refuse(sock)
        return conn

    def close(self) -> list[ServedConnection]:
        """Admit nothing more; the connections open now (for the caller to
        shut down and join)."""
        with self._lock:
            self._closed = True
            return list(self._connections)

    def release(self, conn: ServedConnection) -> None:
        """``conn`` has ended: give its slots back, add its counters to the totals."""
        with self._lock:
            self._unpark_locked(conn)
            self._connections.discard(conn)
            self._totals["requests"] += conn.requests
            self._totals["bytes_in"] += conn.bytes_in
            self._totals["bytes_out"] += conn.bytes_out
            self._totals["message_sets_in"] += conn.message_sets_in
            for code, n in conn.errors.items():
                self._errors[code] = self._errors.get(code, 0) + n

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

    # -- long-poll slots ----------------------------------------------------------

    def park(self, conn: ServedConnection) -> bool:
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

    def unpark(self, conn: ServedConnection) -> None:
        """Give the long-poll slot of ``conn`` back (if it still holds it)."""
        with self._lock:
            self._unpark_locked(conn)

    def _unpark_locked(self, conn: ServedConnection) -> None:
        if conn.long_polling:
            conn.long_polling = False
            self._long_polls -= 1

    def stats(self) -> dict:
        """The counters of :meth:`~raylog.transfer.server.DataServer.stats`."""
        with self._lock:  # a closing connection moves its counts under it
            totals = dict(self._totals)
            errors = dict(self._errors)
            for conn in self._connections:
                totals["requests"] += conn.requests
                totals["bytes_in"] += conn.bytes_in
                totals["bytes_out"] += conn.bytes_out
                totals["message_sets_in"] += conn.message_sets_in
                for code, n in list(conn.errors.items()):
                    errors[code] = errors.get(code, 0) + n
            return {
                "connections": len(self._connections),
                "connections_accepted": self._accepted,
                "connections_refused": self._refused,
                "connections_shed": self._shed,
                "long_polls": self._long_polls,
                "long_polls_refused": self._long_polls_refused,
                **totals,
                "errors": errors,
            }
