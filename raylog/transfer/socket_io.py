"""Blocking socket I/O of a client connection: sends (gathered when large),
buffered reads of whole frames, receive timeouts per request, a pipelined
producer's unacknowledged replies, and closing on failure (a mixin of
:class:`~raylog.transfer.connection.BrokerConnection`); and ``set_timeout``,
shared with the data server."""

from __future__ import annotations

import contextlib
import socket
import struct
import time

from raylog.errors import BrokerUnavailableError, ClosedError, RaylogError, RequestTimeoutError


#: a stream of acks=0 produces looks for an error reply at most this often
UNACKED_CHECK_S = 0.001


#: a correlation id no request has: what arrives for it is unsolicited
_NO_REQUEST = -2


_TIMEVAL = struct.Struct("@ll")


def set_timeout(sock: socket.socket, option: int, seconds: float) -> None:
    whole = int(seconds)
    sock.setsockopt(socket.SOL_SOCKET, option, _TIMEVAL.pack(whole, int((seconds - whole) * 1_000_000)))


class SocketIO:
    """Socket I/O of :class:`~raylog.transfer.connection.BrokerConnection`
    (one thread at a time, as the connection)."""

    def _before_request(self, replies: bool = True) -> None:
        """Connect if needed; after acks=0 produces, check whether the server
        answered one with an error. A request that reads replies checks every
        time; an acks=0 produce at most every :data:`UNACKED_CHECK_S`, so that
        a stream of them does not pay a system call each."""
        if self._sock is None:
            self.connect()
        elif self._unacked is not None:
            if not replies:
                now = time.monotonic()
                if now < self._next_check:
                    return
                self._next_check = now + UNACKED_CHECK_S
            self._check_unacked()

    def _check_unacked(self) -> None:
        """After acks=0 produces: has the server answered one with an error
        (and closed)? One non-blocking receive, no wait."""
        sock = self._live()
        if self._rstart == self._rend:
            self._rstart = self._rend = 0
        if self._rend == len(self._rbuf):
            return  # unread bytes fill the buffer; the next reply read sees them
        try:
            n = sock.recv_into(self._rview[self._rend :], 0, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError as err:
            raise self._failed(f"connection to {self.host}:{self.port} failed: {err}") from err
        if n == 0:
            raise self._failed(
                f"{self.host}:{self.port} closed the connection after acks=0 produce(s) (last correlation id "
                f"{self._unacked}); some of them may be lost"
            )
        self._rend += n
        # Nothing answers an acks=0 produce but its error: this raises it
        # (or a ProtocolError for anything else) and drops the connection.
        self._read_reply(_NO_REQUEST, 0)

    def _expect_wait(self, max_wait_ms: int) -> None:
        timeout = self.timeout_s + max_wait_ms / 1000.0
        if timeout != self._recv_timeout:
            try:
                set_timeout(self._live(), socket.SO_RCVTIMEO, timeout)
            except OSError as err:
                raise self._failed(f"connection to {self.host}:{self.port} failed: {err}") from err
            self._recv_timeout = timeout

    @contextlib.contextmanager
    def _socket_errors(self, doing: str, timed_out: str):
        """Socket errors as raylog errors (the connection is closed): a
        timeout says ``timed_out``, any other error ``<doing> host:port failed``."""
        try:
            yield
        except BlockingIOError:
            raise self._failed(f"{timed_out}; the connection was closed", timeout=True) from None
        except OSError as err:
            raise self._failed(f"{doing} {self.host}:{self.port} failed: {err}") from err

    def _sending(self):
        return self._socket_errors(
            "sending to", f"sending to {self.host}:{self.port} timed out after {self.timeout_s}s"
        )

    def _send(self, data) -> None:
        sock = self._live()
        with self._sending():
            sock.sendall(data)

    def _send_gather(self, parts: list) -> None:
        sock = self._live()
        views = [memoryview(p).cast("B") for p in parts]
        with self._sending():
            while views:
                sent = sock.sendmsg(views)
                while views and sent >= len(views[0]):
                    sent -= len(views[0])
                    views.pop(0)
                if views and sent:
                    views[0] = views[0][sent:]

    def _fill(self, n: int) -> None:
        """Make ``n`` bytes from ``_rstart`` on available in the read buffer."""
        if self._rend - self._rstart >= n:
            return
        if self._rstart + n > len(self._rbuf):
            remaining = self._rend - self._rstart
            if n > len(self._rbuf):  # n was checked against max_frame_bytes
                grown = bytearray(max(n, 2 * len(self._rbuf)))
                grown[:remaining] = self._rview[self._rstart : self._rend]
                self._rbuf, self._rview = grown, memoryview(grown)
            else:
                self._rview[:remaining] = self._rview[self._rstart : self._rend]
            self._rstart, self._rend = 0, remaining
        while self._rend - self._rstart < n:
            self._rend += self._recv(self._rview[self._rend :])

    def _recv_exactly(self, view: memoryview) -> None:
        got, total = 0, len(view)
        while got < total:
            got += self._recv(view[got:])

    def _recv(self, view: memoryview) -> int:
        sock = self._live()
        with self._socket_errors("receiving from", f"no reply from {self.host}:{self.port} within {self._recv_timeout}s"):
            n = sock.recv_into(view)
        if n == 0:
            raise self._failed(
                f"{self.host}:{self.port} closed the connection before its reply was complete; "
                "the endpoint may be restarting"
            )
        return n

    def _live(self) -> socket.socket:
        """The connected socket, or the error of a connection that is gone."""
        sock = self._sock
        if sock is None:
            raise self._failed(f"the connection to {self.host}:{self.port} was dropped")
        return sock

    def _failed(self, message: str, timeout: bool = False) -> RaylogError:
        """Drop the connection; the error to raise for ``message``."""
        self._drop()
        if self._closed:  # close() from another thread ended the call
            return ClosedError("connection was closed while a call was in progress; create a new BrokerConnection")
        if timeout:
            return RequestTimeoutError(message)
        return BrokerUnavailableError(message, host=self.host, port=self.port)

    def _drop(self) -> None:
        sock, self._sock = self._sock, None
        self._rstart = self._rend = 0
        self._unacked = None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a call blocked on it in another thread
            except OSError:
                pass
            try:
                sock.close()
            except OSError:
                pass
