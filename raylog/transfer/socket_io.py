"""The socket of a client connection and the replies read from it: sends
(gathered when large), a read buffer of whole frames, receive timeouts per
request, reply headers checked against the request's correlation id and
errors decoded into raylog errors, a pipelined producer's unacknowledged
replies, and dropping the socket on failure. :class:`FrameChannel` is the
part of :class:`~raylog.transfer.connection.BrokerConnection` that owns the
socket; ``set_timeout`` is shared with the data server."""

from __future__ import annotations

import socket
import struct
import time

from raylog.errors import (
    AuthenticationError,
    BrokerUnavailableError,
    ClosedError,
    FrameTooLargeError,
    ProtocolError,
    RaylogError,
    RequestTimeoutError,
)
from raylog.transfer.protocol import PRODUCE_REPLY_FIELDS, REPLY_HEADER, REPLY_HEADER_BODY, SIZE
from raylog.transfer.replies import decode_error


#: a stream of acks=0 produces looks for an error reply at most this often
UNACKED_CHECK_S = 0.001


#: a correlation id no request has: what arrives for it is unsolicited
_NO_REQUEST = -2


#: errors after which the server closes the connection
_CONNECTION_ERRORS = (ProtocolError, AuthenticationError)


_TIMEVAL = struct.Struct("@ll")


def set_timeout(sock: socket.socket, option: int, seconds: float) -> None:
    whole = int(seconds)
    sock.setsockopt(socket.SOL_SOCKET, option, _TIMEVAL.pack(whole, int((seconds - whole) * 1_000_000)))


class FrameChannel:
    """The socket of one client connection to ``host``:``port`` (``None``
    until :meth:`attach`, again after a failure) and its read buffer of
    ``buffer_bytes`` (grown for larger replies, up to ``max_frame_bytes``).
    ``timeout_s`` is a request's receive timeout before its long-poll wait.

    The read buffer holds unread reply bytes at ``buf[start:end]``;
    :meth:`read_reply` leaves the reply it read there (its size in
    ``reply_size``) until :meth:`consume_reply`. ``unacked`` is the
    correlation id of the last acks=0 produce not yet known to be fine.

    Thread-safety: one thread at a time, except :meth:`close`, which may be
    called from another thread to end a blocked call.
    """

    def __init__(self, host: str, port: int, *, timeout_s: float, max_frame_bytes: int, buffer_bytes: int):
        self.host, self.port = host, port
        self.timeout_s = timeout_s
        self.max_frame_bytes = max_frame_bytes
        self.sock: socket.socket | None = None
        self.closed = False
        self.buf = bytearray(buffer_bytes)
        self.view = memoryview(self.buf)
        self.start = 0
        self.end = 0
        self.recv_timeout: float | None = None
        self.reply_start = 0
        self.reply_size = 0
        self.unacked: int | None = None
        self._next_check = 0.0

    def attach(self, sock: socket.socket) -> None:
        """Use ``sock`` (connected, its kernel timeouts set to ``timeout_s``)."""
        self.sock = sock
        self.recv_timeout = self.timeout_s
        self.start = self.end = 0
        self.unacked = None

    def close(self) -> None:
        """Close for good: a call blocked on the socket ends with ClosedError."""
        self.closed = True
        self.drop()

    def __del__(self):
        sock = getattr(self, "sock", None)
        if sock is not None:
            sock.close()

    def check_unacked(self, replies: bool = True) -> None:
        """After acks=0 produces, check whether the server answered one with
        an error. A request that reads replies checks every time; an acks=0
        produce at most every :data:`UNACKED_CHECK_S`, so that a stream of
        them does not pay a system call each."""
        if self.unacked is not None:
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
        if self.start == self.end:
            self.start = self.end = 0
        if self.end == len(self.buf):
            return  # unread bytes fill the buffer; the next reply read sees them
        try:
            n = sock.recv_into(self.view[self.end :], 0, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError as err:
            raise self._failed(f"connection to {self.host}:{self.port} failed: {err}") from err
        if n == 0:
            raise self._failed(
                f"{self.host}:{self.port} closed the connection after acks=0 produce(s) (last correlation id "
                f"{self.unacked}); some of them may be lost"
            )
        self.end += n
        # Nothing answers an acks=0 produce but its error: this raises it
        # (or a ProtocolError for anything else) and drops the connection.
        self.read_reply(_NO_REQUEST, 0)

    def expect_wait(self, max_wait_ms: int) -> None:
        timeout = self.timeout_s + max_wait_ms / 1000.0
        if timeout != self.recv_timeout:
            try:
                set_timeout(self._live(), socket.SO_RCVTIMEO, timeout)
            except OSError as err:
                raise self._failed(f"connection to {self.host}:{self.port} failed: {err}") from err
            self.recv_timeout = timeout

    def _socket_error(self, err: OSError, doing: str) -> RaylogError:
        """A socket error as a raylog error (the connection is closed): a
        timeout (the kernel's, as BlockingIOError) says so, any other error
        ``<doing> host:port failed``. (Called only on failure: the hot path
        is a bare ``try`` with nothing built per call.)"""
        if isinstance(err, BlockingIOError):
            if doing == "sending to":
                why = f"sending to {self.host}:{self.port} timed out after {self.timeout_s}s"
            else:
                why = f"no reply from {self.host}:{self.port} within {self.recv_timeout}s"
            return self._failed(f"{why}; the connection was closed", timeout=True)
        return self._failed(f"{doing} {self.host}:{self.port} failed: {err}")

    def send(self, data) -> None:
        sock = self._live()
        try:
            sock.sendall(data)
        except OSError as err:
            raise self._socket_error(err, "sending to") from (None if isinstance(err, BlockingIOError) else err)

    def send_gather(self, parts: list) -> None:
        sock = self._live()
        views = [memoryview(p).cast("B") for p in parts]
        try:
            while views:
                sent = sock.sendmsg(views)
                while views and sent >= len(views[0]):
                    sent -= len(views[0])
                    views.pop(0)
                if views and sent:
                    views[0] = views[0][sent:]
        except OSError as err:
            raise self._socket_error(err, "sending to") from (None if isinstance(err, BlockingIOError) else err)

    def fill(self, n: int) -> None:
        """Make ``n`` bytes from ``_rstart`` on available in the read buffer."""
        if self.end - self.start >= n:
            return
        if self.start + n > len(self.buf):
            remaining = self.end - self.start
            if n > len(self.buf):  # n was checked against max_frame_bytes
                grown = bytearray(max(n, 2 * len(self.buf)))
                grown[:remaining] = self.view[self.start : self.end]
                self.buf, self.view = grown, memoryview(grown)
            else:
                self.view[:remaining] = self.view[self.start : self.end]
            self.start, self.end = 0, remaining
        while self.end - self.start < n:
            self.end += self._recv(self.view[self.end :])

    def recv_exactly(self, view: memoryview) -> None:
        got, total = 0, len(view)
        while got < total:
            got += self._recv(view[got:])

    def _recv(self, view: memoryview) -> int:
        sock = self.sock
        if sock is None:
            sock = self._live()  # (raises)
        try:
            n = sock.recv_into(view)
        except OSError as err:
            raise self._socket_error(err, "receiving from") from (None if isinstance(err, BlockingIOError) else err)
        if n == 0:
            raise self._failed(
                f"{self.host}:{self.port} closed the connection before its reply was complete; "
                "the endpoint may be restarting"
            )
        return n

    def _live(self) -> socket.socket:
        """The connected socket, or the error of a connection that is gone."""
        sock = self.sock
        if sock is None:
            raise self._failed(f"the connection to {self.host}:{self.port} was dropped")
        return sock

    def _failed(self, message: str, timeout: bool = False) -> RaylogError:
        """Drop the connection; the error to raise for ``message``."""
        self.drop()
        if self.closed:  # close() from another thread ended the call
            return ClosedError("connection was closed while a call was in progress; create a new BrokerConnection")
        if timeout:
            return RequestTimeoutError(message)
        return BrokerUnavailableError(message, host=self.host, port=self.port)

    def drop(self) -> None:
        sock, self.sock = self.sock, None
        self.start = self.end = 0
        self.unacked = None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a call blocked on it in another thread
            except OSError:
                pass
            try:
                sock.close()
            except OSError:
                pass

    def take(self, start: int, length: int) -> bytearray:
        """The ``length`` bytes of a reply's data from ``start`` in the read
        buffer, in a buffer of their own (the caller keeps it): what was
        already read is copied once, the rest is received in place."""
        data = bytearray(length)
        have = min(length, self.end - start)
        if have:
            data[:have] = self.view[start : start + have]
        self.start = start + have
        if self.start == self.end:
            self.start = self.end = 0
        if have < length:
            self.recv_exactly(memoryview(data)[have:])
        return data

    def read_produce_reply(self, correlation_id: int) -> int:
        pos = self.read_reply(correlation_id, REPLY_HEADER_BODY + PRODUCE_REPLY_FIELDS.size)
        (base,) = PRODUCE_REPLY_FIELDS.unpack_from(self.buf, pos)
        self.consume_reply()
        return base

    def read_reply(self, correlation_id: int, expected: int, whole: bool = True) -> int:
        """Read the next reply's header, raise its error if it has one, and
        return where its body starts in the read buffer. With ``whole`` the
        reply must be exactly ``expected`` bytes (after the size field) and is
        read completely; otherwise at least ``expected`` bytes are read."""
        self.fill(REPLY_HEADER.size)
        size, got_id, code = REPLY_HEADER.unpack_from(self.buf, self.start)
        if size > self.max_frame_bytes or size < REPLY_HEADER_BODY:
            self.drop()
            raise (FrameTooLargeError if size > self.max_frame_bytes else ProtocolError)(
                f"reply of {size} bytes from {self.host}:{self.port} is outside [{REPLY_HEADER_BODY}, "
                f"{self.max_frame_bytes}]; the connection is out of step and was closed"
            )
        self.reply_start = self.start
        self.reply_size = size
        if code:
            self.fill(SIZE.size + size)
            body = self.view[self.start + REPLY_HEADER.size : self.start + SIZE.size + size]
            error = decode_error(code, body)
            self.consume_reply()
            raise self._reply_error(error, got_id, correlation_id)
        if got_id != correlation_id:
            self.drop()
            raise ProtocolError(
                f"reply for correlation id {got_id} while waiting for {correlation_id}; "
                "the connection is out of step and was closed"
            )
        if whole and size != expected:
            self.drop()
            raise ProtocolError(f"reply of {size} bytes, expected {expected}; the connection was closed")
        # The server handles frames in order and closes after a failed acks=0
        # produce: a good reply means every earlier produce was taken.
        self.unacked = None
        self.fill(SIZE.size + (size if whole else expected))
        return self.start + REPLY_HEADER.size

    def _reply_error(self, error: RaylogError, got_id: int, correlation_id: int) -> RaylogError:
        if got_id == correlation_id and not isinstance(error, _CONNECTION_ERRORS):
            return error  # a request's own error: the connection stays
        # An error about the connection itself or about an earlier acks=0
        # produce: the server closes the connection after it.
        self.drop()
        if got_id != correlation_id and got_id >= 0:
            error = type(error)(
                f"an earlier acks=0 produce (correlation id {got_id}) failed: {error}", **error.details
            )
        return error

    def consume_reply(self) -> None:
        """Move past the reply whose header :meth:`read_reply` read."""
        self.start = self.reply_start + SIZE.size + self.reply_size
        if self.start == self.end:
            self.start = self.end = 0
