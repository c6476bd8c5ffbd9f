"""Frames of a client connection: correlation ids, per-topic produce headers,
and reading replies (matching ids, decoding errors into raylog errors) (a
mixin of :class:`~raylog.transfer.connection.BrokerConnection`)."""

from __future__ import annotations

from raylog.errors import AuthenticationError, FrameTooLargeError, ProtocolError, RaylogError
from raylog.transfer.protocol import (
    PRODUCE_REPLY_FIELDS,
    REPLY_HEADER,
    REPLY_HEADER_BODY,
    SIZE,
)
from raylog.transfer.replies import decode_error
from raylog.transfer.requests import ProduceHeader


#: errors after which the server closes the connection
_CONNECTION_ERRORS = (ProtocolError, AuthenticationError)


_MAX_CORRELATION = 0x7FFFFFFF


def _wrap(correlation_id: int) -> int:
    return correlation_id if correlation_id <= _MAX_CORRELATION else 1


class ReplyReader:
    """Request headers and reply reading of
    :class:`~raylog.transfer.connection.BrokerConnection`."""

    def _next_correlation(self) -> int:
        self._correlation = _wrap(self._correlation + 1)
        return self._correlation

    def _topic(self, topic: str) -> ProduceHeader:
        """The encoded topic and its precompiled PRODUCE headers (kept per
        topic): ``pack`` writes version 0 for a plain acks 0/1 request,
        version 1 when idempotent or with acks=-1, and refuses a frame over
        ``max_frame_bytes`` before anything is sent."""
        header = self._topics.get(topic)
        if header is None:
            header = self._topics[topic] = ProduceHeader(topic)
        return header

    def _read_produce_reply(self, correlation_id: int) -> int:
        pos = self._read_reply(correlation_id, REPLY_HEADER_BODY + PRODUCE_REPLY_FIELDS.size)
        (base,) = PRODUCE_REPLY_FIELDS.unpack_from(self._rbuf, pos)
        self._consume_reply()
        return base

    def _read_reply(self, correlation_id: int, expected: int, whole: bool = True) -> int:
        """Read the next reply's header, raise its error if it has one, and
        return where its body starts in the read buffer. With ``whole`` the
        reply must be exactly ``expected`` bytes (after the size field) and is
        read completely; otherwise at least ``expected`` bytes are read."""
        self._fill(REPLY_HEADER.size)
        size, got_id, code = REPLY_HEADER.unpack_from(self._rbuf, self._rstart)
        if size > self.max_frame_bytes or size < REPLY_HEADER_BODY:
            self._drop()
            raise (FrameTooLargeError if size > self.max_frame_bytes else ProtocolError)(
                f"reply of {size} bytes from {self.host}:{self.port} is outside [{REPLY_HEADER_BODY}, "
                f"{self.max_frame_bytes}]; the connection is out of step and was closed"
            )
        self._reply_start = self._rstart
        self._reply_size = size
        if code:
            self._fill(SIZE.size + size)
            body = self._rview[self._rstart + REPLY_HEADER.size : self._rstart + SIZE.size + size]
            error = decode_error(code, body)
            self._consume_reply()
            raise self._reply_error(error, got_id, correlation_id)
        if got_id != correlation_id:
            self._drop()
            raise ProtocolError(
                f"reply for correlation id {got_id} while waiting for {correlation_id}; "
                "the connection is out of step and was closed"
            )
        if whole and size != expected:
            self._drop()
            raise ProtocolError(f"reply of {size} bytes, expected {expected}; the connection was closed")
        # The server handles frames in order and closes after a failed acks=0
        # produce: a good reply means every earlier produce was taken.
        self._unacked = None
        self._fill(SIZE.size + (size if whole else expected))
        return self._rstart + REPLY_HEADER.size

    def _reply_error(self, error: RaylogError, got_id: int, correlation_id: int) -> RaylogError:
        if got_id == correlation_id and not isinstance(error, _CONNECTION_ERRORS):
            return error  # a request's own error: the connection stays
        # An error about the connection itself or about an earlier acks=0
        # produce: the server closes the connection after it.
        self._drop()
        if got_id != correlation_id and got_id >= 0:
            error = type(error)(
                f"an earlier acks=0 produce (correlation id {got_id}) failed: {error}", **error.details
            )
        return error

    def _consume_reply(self) -> None:
        """Move past the reply whose header :meth:`_read_reply` read."""
        self._rstart = self._reply_start + SIZE.size + self._reply_size
        if self._rstart == self._rend:
            self._rstart = self._rend = 0
