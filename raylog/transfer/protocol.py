"""The data channel's wire protocol: framed requests and replies over TCP.

Every integer is big-endian. Strings (topics, error messages) are a u16
byte length followed by that many bytes of UTF-8. A connection carries a
stream of request frames from the client and reply frames from the server;
replies come in request order and carry the request's correlation id.

Request frame
-------------

1. size            u32  number of bytes that follow this field
2. api key         i16  0 PRODUCE, 1 FETCH, 2 OFFSETS, 3 AUTH, 4 OFFSETS_FOR_TIME
3. version         i16  0; PRODUCE also 1 (idempotence and acks=-1, below)
4. correlation id  i32  chosen by the client, echoed in the reply

then the body of the api:

AUTH (must be the first frame when the server has a token)
    5. token length   u16
    6. token          bytes

PRODUCE, version 0
    5. topic length   u16
    6. topic          UTF-8
    7. partition      i32
    8. acks           i8   0: no reply at all (the paper's default); 1: reply
                           with the base offset once the log has the set
    9. set length     i32  must equal the bytes left in the frame
    10. message set   bytes, whole messages in the format of DESIGN §2

PRODUCE, version 1 (idempotent producers and acks=-1)
    5. topic length   u16
    6. topic          UTF-8
    7. partition      i32
    8. acks           i8   0: no reply; 1: reply once appended to the log;
                           -1 ("all"): reply once the set is flushed
                           (fsynced) and below the high watermark, so that
                           a FETCH right after the reply sees it (with
                           replication later: on every in-sync replica)
    9. producer id    i64  -1: not idempotent (then sequence must be -1);
                           else a non-negative id the producer chose at random
    10. producer epoch i16 0 for now (reserved for fencing)
    11. sequence      i32  number of this set among all sets this producer id
                           sent to this topic-partition: 0, 1, 2, ...
                           (-1 when not idempotent)
    12. set length    i32  must equal the bytes left in the frame
    13. message set   bytes, as in version 0

    The partition remembers, per producer id, the last
    ``PRODUCER_SEQUENCES_REMEMBERED`` (32) sequences and their base
    offsets, kept with the log (:mod:`raylog.storage.producer_state`):
    the next sequence (last + 1), or any sequence of a producer id it does
    not know, is appended; a remembered one is a duplicate, answered with
    the base offset at which the set was stored the first time, and nothing
    is appended; an older one gets DuplicateSequenceError, a gap
    (sequence > last + 1) OutOfOrderSequenceError; both are not retriable.

FETCH
    5. topic length   u16
    6. topic          UTF-8
    7. partition      i32
    8. offset         i64  byte offset of the first message wanted
    9. max bytes      i32  how much log to send (at least one whole message)
    10. max wait ms   i32  when nothing is there yet, wait up to this long
                           for data (long poll); 0 replies at once

OFFSETS
    5. topic length   u16
    6. topic          UTF-8
    7. partition      i32

OFFSETS_FOR_TIME
    5. topic length   u16
    6. topic          UTF-8
    7. partition      i32
    8. timestamp      i64  ms since the epoch

Reply frame
-----------

1. size            u32  number of bytes that follow this field
2. correlation id  i32  of the request; -1 for an error about the connection
                        itself (e.g. a frame too large to read its header)
3. error code      i16  0 for none, else the ``code`` of a raylog error class

If the error code is not 0 the body is the error, whatever the api:

    4. message length u16
    5. message        UTF-8
    6. details length u16
    7. details        a UTF-8 JSON object of the error's details (for
                      OffsetOutOfRangeError: offset, earliest, latest)

and :func:`decode_error` rebuilds the same typed error class from it.
Otherwise the body depends on the api of the request:

AUTH      nothing
PRODUCE   4. base offset i64  (acks 1 and -1; acks=0 gets no reply); for a
             duplicate (version 1) the offset of the first store
FETCH     4. high watermark i64, 5. log start offset i64,
          6. data length i32, 7. data: the raw log bytes from the request's
          offset, whole messages and possibly a partial last one; sent by
          the server with ``os.sendfile`` straight from the segment file
OFFSETS   4. log start offset i64, 5. high watermark i64
OFFSETS_FOR_TIME
          4. offset i64: of the first message (below the high watermark)
             whose timestamp is at or after the request's, found with the
             segments' time indexes (:mod:`raylog.storage.timeindex`); for a
             compressed set, its wrapper; the high watermark when there is none

Errors and the connection
-------------------------

* A frame whose size exceeds the endpoint's maximum (default
  :data:`DEFAULT_MAX_FRAME_BYTES`, the default ``max_message_bytes`` plus
  64 KiB of header room) is refused before anything of that size is
  allocated: FrameTooLargeError, then the connection is closed.
* A malformed frame (unknown api key or version, lengths that do not add
  up, a truncated frame) gets a ProtocolError reply where possible, then
  the connection is closed.
* A failing acks=0 produce cannot be answered in place: the server sends the
  error reply (with that produce's correlation id) and closes the
  connection, so that the producer learns of it on its next call.
* Any other error (the log refused the set, the offset is out of range, the
  partition lives elsewhere ...) is answered and the connection stays open.
* Bounds of the server (:mod:`raylog.transfer.server`): the AUTH frame must
  come within a deadline (AuthenticationError, then close); a connection
  idle for long is closed; a FETCH's max wait ms is capped; at its
  connection limit the server closes the longest-idle connection or answers
  a new one with TooManyConnectionsError (correlation id -1) and closes it.
"""

from __future__ import annotations

import json
import struct
from typing import NamedTuple

from raylog.config import KiB, TopicConfig
from raylog.errors import FrameTooLargeError, ProtocolError, RaylogError, error_for_code

API_PRODUCE = 0
API_FETCH = 1
API_OFFSETS = 2
API_AUTH = 3
API_OFFSETS_FOR_TIME = 4
API_NAMES = {
    API_PRODUCE: "PRODUCE",
    API_FETCH: "FETCH",
    API_OFFSETS: "OFFSETS",
    API_AUTH: "AUTH",
    API_OFFSETS_FOR_TIME: "OFFSETS_FOR_TIME",
}

VERSION = 0
#: PRODUCE version 1: producer id, epoch and sequence, and acks=-1
PRODUCE_VERSION_IDEMPOTENT = 1

#: acks levels of a PRODUCE
ACKS_NONE = 0
ACKS_LEADER = 1
ACKS_ALL = -1
#: producer id and sequence of a set that is not idempotent
NO_PRODUCER_ID = -1
NO_SEQUENCE = -1
#: sequences (with their base offsets) a partition remembers per producer id
PRODUCER_SEQUENCES_REMEMBERED = 32
#: the most sets a producer keeps unacknowledged per partition (below the
#: sequences remembered, so a retry of all of them is always recognised)
MAX_IN_FLIGHT_PER_PARTITION = 16

#: correlation id of an error reply about the connection rather than a request
NO_CORRELATION = -1

#: header room on top of the largest message set
FRAME_OVERHEAD_BYTES = 64 * KiB
#: the largest frame (value of its size field) an endpoint accepts by default
DEFAULT_MAX_FRAME_BYTES = TopicConfig().max_message_bytes + FRAME_OVERHEAD_BYTES

MAX_STRING_BYTES = 0xFFFF

# -- precompiled headers -----------------------------------------------------

#: size field alone
SIZE = struct.Struct(">I")
#: size, api key, version, correlation id
REQUEST_HEADER = struct.Struct(">Ihhi")
#: bytes of the request header after the size field
REQUEST_HEADER_BODY = REQUEST_HEADER.size - SIZE.size
#: a string's length prefix
STRING_LENGTH = struct.Struct(">H")
#: PRODUCE after the topic: partition, acks, set length
PRODUCE_FIELDS = struct.Struct(">ibi")
#: PRODUCE version 1 after the topic: partition, acks, producer id,
#: producer epoch, sequence, set length
PRODUCE_V1_FIELDS = struct.Struct(">ibqhii")
#: FETCH after the topic: partition, offset, max bytes, max wait ms
FETCH_FIELDS = struct.Struct(">iqii")
#: OFFSETS after the topic: partition
OFFSETS_FIELDS = struct.Struct(">i")

#: size, correlation id, error code
REPLY_HEADER = struct.Struct(">Iih")
#: bytes of the reply header after the size field
REPLY_HEADER_BODY = REPLY_HEADER.size - SIZE.size
#: a PRODUCE reply: header and base offset
PRODUCE_REPLY = struct.Struct(">Iihq")
#: a FETCH reply header: header, high watermark, log start offset, data length
FETCH_REPLY = struct.Struct(">Iihqqi")
#: an OFFSETS reply: header, log start offset, high watermark
OFFSETS_REPLY = struct.Struct(">Iihqq")
#: the fixed fields of a FETCH reply after its reply header
FETCH_REPLY_FIELDS = struct.Struct(">qqi")
PRODUCE_REPLY_FIELDS = struct.Struct(">q")
OFFSETS_REPLY_FIELDS = struct.Struct(">qq")
#: OFFSETS_FOR_TIME after the topic: partition, timestamp
OFFSETS_FOR_TIME_FIELDS = struct.Struct(">iq")
#: an OFFSETS_FOR_TIME reply: header, offset
OFFSETS_FOR_TIME_REPLY = struct.Struct(">Iihq")
OFFSETS_FOR_TIME_REPLY_FIELDS = struct.Struct(">q")


# -- requests ------------------------------------------------------------------


class AuthRequest(NamedTuple):
    correlation_id: int
    token: bytes


class ProduceRequest(NamedTuple):
    correlation_id: int
    topic: str
    partition: int
    acks: int
    #: the message set, a view into the receive buffer (valid until it is reused)
    message_set: memoryview
    #: version 1 only (version 0 frames decode with these defaults)
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = 0
    sequence: int = NO_SEQUENCE


class FetchRequest(NamedTuple):
    correlation_id: int
    topic: str
    partition: int
    offset: int
    max_bytes: int
    max_wait_ms: int


class OffsetsRequest(NamedTuple):
    correlation_id: int
    topic: str
    partition: int


class OffsetsForTimeRequest(NamedTuple):
    correlation_id: int
    topic: str
    partition: int
    timestamp_ms: int


def encode_string(text: str) -> bytes:
    """A u16-length-prefixed UTF-8 string."""
    raw = text.encode("utf-8")
    if len(raw) > MAX_STRING_BYTES:
        raise ProtocolError(f"string of {len(raw)} bytes does not fit a u16 length; shorten it")
    return STRING_LENGTH.pack(len(raw)) + raw


def check_frame_size(size: int, max_frame_bytes: int) -> None:
    """Refuse a frame by its size field alone, before anything is allocated."""
    if size > max_frame_bytes:
        raise FrameTooLargeError(
            f"frame of {size} bytes exceeds the maximum of {max_frame_bytes} bytes",
            size=size,
            max_frame_bytes=max_frame_bytes,
        )


def _request_header(api_key: int, correlation_id: int, body_length: int) -> bytes:
    return REQUEST_HEADER.pack(REQUEST_HEADER_BODY + body_length, api_key, VERSION, correlation_id)


def encode_auth(correlation_id: int, token: bytes) -> bytes:
    if len(token) > MAX_STRING_BYTES:
        raise ProtocolError(f"token of {len(token)} bytes is longer than {MAX_STRING_BYTES}")
    body = STRING_LENGTH.pack(len(token)) + bytes(token)
    return _request_header(API_AUTH, correlation_id, len(body)) + body


def encode_produce_header(
    correlation_id: int, topic: bytes, partition: int, acks: int, set_length: int
) -> bytes:
    """Everything of a PRODUCE frame before its message set; ``topic`` is
    already encoded by :func:`encode_string` (clients cache it)."""
    body_length = len(topic) + PRODUCE_FIELDS.size + set_length
    return (
        _request_header(API_PRODUCE, correlation_id, body_length)
        + topic
        + PRODUCE_FIELDS.pack(partition, acks, set_length)
    )


def encode_produce(correlation_id: int, topic: str, partition: int, acks: int, message_set: bytes) -> bytes:
    header = encode_produce_header(correlation_id, encode_string(topic), partition, acks, len(message_set))
    return header + bytes(message_set)


def produce_v1_header_struct(topic: bytes) -> struct.Struct:
    """A precompiled struct of a whole version-1 PRODUCE header for one
    encoded topic: pack it with ``(size, API_PRODUCE,
    PRODUCE_VERSION_IDEMPOTENT, correlation id, topic, partition, acks,
    producer id, producer epoch, sequence, set length)``; ``size`` is
    ``struct.size - 4 + set length``. :func:`encode_produce_v1_header` uses it."""
    return struct.Struct(f">Ihhi{len(topic)}sibqhii")


def _check_produce_v1(acks: int, producer_id: int, sequence: int) -> None:
    if acks not in (ACKS_NONE, ACKS_LEADER, ACKS_ALL):
        raise ProtocolError(f"acks must be 0, 1 or -1, got {acks}")
    if producer_id == NO_PRODUCER_ID:
        if sequence != NO_SEQUENCE:
            raise ProtocolError(f"a set without producer id must have sequence -1, got {sequence}")
    elif producer_id < 0 or sequence < 0:
        raise ProtocolError(
            f"producer id {producer_id} and sequence {sequence} must be non-negative (or both -1)"
        )


def encode_produce_v1_header(
    correlation_id: int,
    topic: bytes,
    partition: int,
    acks: int,
    producer_id: int,
    producer_epoch: int,
    sequence: int,
    set_length: int,
) -> bytes:
    """Everything of a version-1 PRODUCE frame before its message set;
    ``topic`` is already encoded by :func:`encode_string`. Raises
    :class:`ProtocolError` for acks outside {0, 1, -1} or a producer id and
    sequence that do not go together."""
    _check_produce_v1(acks, producer_id, sequence)
    fields = PRODUCE_V1_FIELDS.pack(partition, acks, producer_id, producer_epoch, sequence, set_length)
    body_length = len(topic) + len(fields) + set_length
    return (
        REQUEST_HEADER.pack(REQUEST_HEADER_BODY + body_length, API_PRODUCE, PRODUCE_VERSION_IDEMPOTENT, correlation_id)
        + topic
        + fields
    )


def encode_produce_v1(
    correlation_id: int,
    topic: str,
    partition: int,
    acks: int,
    message_set: bytes,
    *,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = 0,
    sequence: int = NO_SEQUENCE,
) -> bytes:
    """A whole version-1 PRODUCE frame."""
    header = encode_produce_v1_header(
        correlation_id, encode_string(topic), partition, acks, producer_id, producer_epoch, sequence, len(message_set)
    )
    return header + bytes(message_set)


def encode_fetch(
    correlation_id: int, topic: str | bytes, partition: int, offset: int, max_bytes: int, max_wait_ms: int = 0
) -> bytes:
    topic = encode_string(topic) if isinstance(topic, str) else topic
    fields = FETCH_FIELDS.pack(partition, offset, max_bytes, max_wait_ms)
    return _request_header(API_FETCH, correlation_id, len(topic) + len(fields)) + topic + fields


def encode_offsets(correlation_id: int, topic: str | bytes, partition: int) -> bytes:
    topic = encode_string(topic) if isinstance(topic, str) else topic
    fields = OFFSETS_FIELDS.pack(partition)
    return _request_header(API_OFFSETS, correlation_id, len(topic) + len(fields)) + topic + fields


def encode_offsets_for_time(correlation_id: int, topic: str | bytes, partition: int, timestamp_ms: int) -> bytes:
    topic = encode_string(topic) if isinstance(topic, str) else topic
    fields = OFFSETS_FOR_TIME_FIELDS.pack(partition, timestamp_ms)
    return _request_header(API_OFFSETS_FOR_TIME, correlation_id, len(topic) + len(fields)) + topic + fields


def _malformed(api_key: int, correlation_id: int, what: str) -> ProtocolError:
    name = API_NAMES.get(api_key, str(api_key))
    return ProtocolError(f"malformed {name} frame: {what}", correlation_id=correlation_id)


def _topic(buf, pos: int, end: int, api_key: int, correlation_id: int) -> tuple[str, int]:
    if end - pos < STRING_LENGTH.size:
        raise _malformed(api_key, correlation_id, "truncated before the topic length")
    (length,) = STRING_LENGTH.unpack_from(buf, pos)
    pos += STRING_LENGTH.size
    if end - pos < length:
        raise _malformed(api_key, correlation_id, f"topic length {length} runs past the frame")
    try:
        topic = str(buf[pos : pos + length], "utf-8")
    except UnicodeDecodeError:
        raise _malformed(api_key, correlation_id, "topic is not UTF-8") from None
    return topic, pos + length


#: request header and the length of the string that follows it
_HEADER_AND_STRING = struct.Struct(">IhhiH")
#: the smallest body of a PRODUCE frame (empty topic, empty set)
_PRODUCE_MIN_BODY = REQUEST_HEADER_BODY + STRING_LENGTH.size + PRODUCE_FIELDS.size
_tuple_new = tuple.__new__


def decode_request(buf, pos: int, size: int):
    """Decode the request frame whose size field is at ``buf[pos]`` and whose
    whole ``4 + size`` bytes are in ``buf`` (a bytearray or memoryview).

    Returns one of the request tuples; a PRODUCE's message set is a view into
    ``buf``. Raises :class:`ProtocolError` (with ``correlation_id`` in its
    details when known) for a malformed frame.
    """
    end = pos + SIZE.size + size
    if size >= _PRODUCE_MIN_BODY:
        # The hot path: a well-formed PRODUCE, parsed with two unpacks.
        _, api_key, version, correlation_id, length = _HEADER_AND_STRING.unpack_from(buf, pos)
        if api_key == API_PRODUCE and version == VERSION:
            start = pos + _HEADER_AND_STRING.size
            fields = start + length
            data = fields + PRODUCE_FIELDS.size
            if data <= end:
                partition, acks, set_length = PRODUCE_FIELDS.unpack_from(buf, fields)
                if set_length == end - data and (acks == 0 or acks == 1):
                    view = buf if type(buf) is memoryview else memoryview(buf)
                    try:
                        topic = str(view[start:fields], "utf-8")
                    except UnicodeDecodeError:
                        raise _malformed(api_key, correlation_id, "topic is not UTF-8") from None
                    return _tuple_new(ProduceRequest, (correlation_id, topic, partition, acks, view[data:end], -1, 0, -1))
        elif api_key == API_PRODUCE and version == PRODUCE_VERSION_IDEMPOTENT:
            start = pos + _HEADER_AND_STRING.size
            fields = start + length
            data = fields + PRODUCE_V1_FIELDS.size
            if data <= end:
                partition, acks, producer_id, epoch, sequence, set_length = PRODUCE_V1_FIELDS.unpack_from(buf, fields)
                if set_length == end - data and -1 <= acks <= 1 and (
                    (producer_id >= 0 and sequence >= 0) or (producer_id == -1 and sequence == -1)
                ):
                    view = buf if type(buf) is memoryview else memoryview(buf)
                    try:
                        topic = str(view[start:fields], "utf-8")
                    except UnicodeDecodeError:
                        raise _malformed(api_key, correlation_id, "topic is not UTF-8") from None
                    return _tuple_new(
                        ProduceRequest,
                        (correlation_id, topic, partition, acks, view[data:end], producer_id, epoch, sequence),
                    )
    # Every other request, and a PRODUCE that is not right (to say why).
    if size < REQUEST_HEADER_BODY:
        raise ProtocolError(
            f"frame of {size} bytes is shorter than a request header", correlation_id=NO_CORRELATION
        )
    _, api_key, version, correlation_id = REQUEST_HEADER.unpack_from(buf, pos)
    pos += REQUEST_HEADER.size
    if api_key == API_PRODUCE and version == PRODUCE_VERSION_IDEMPOTENT:
        return _decode_produce_v1(buf, pos, end, correlation_id)
    if version != VERSION:
        raise ProtocolError(
            f"unsupported version {version} of api {api_key}; this endpoint speaks version {VERSION}",
            correlation_id=correlation_id,
        )
    if api_key == API_PRODUCE:
        topic, pos = _topic(buf, pos, end, api_key, correlation_id)
        if end - pos < PRODUCE_FIELDS.size:
            raise _malformed(api_key, correlation_id, "truncated before the message set")
        partition, acks, set_length = PRODUCE_FIELDS.unpack_from(buf, pos)
        pos += PRODUCE_FIELDS.size
        if set_length != end - pos:
            raise _malformed(
                api_key, correlation_id, f"set length {set_length} but {end - pos} bytes left in the frame"
            )
        if acks not in (0, 1):
            raise _malformed(api_key, correlation_id, f"acks must be 0 or 1, got {acks}")
        return ProduceRequest(correlation_id, topic, partition, acks, memoryview(buf)[pos:end], NO_PRODUCER_ID, 0, NO_SEQUENCE)
    if api_key == API_FETCH:
        topic, pos = _topic(buf, pos, end, api_key, correlation_id)
        if end - pos != FETCH_FIELDS.size:
            what = f"{end - pos} bytes after the topic, expected {FETCH_FIELDS.size}"
            raise _malformed(api_key, correlation_id, what)
        partition, offset, max_bytes, max_wait_ms = FETCH_FIELDS.unpack_from(buf, pos)
        if max_bytes < 0 or max_wait_ms < 0:
            raise _malformed(api_key, correlation_id, f"negative max bytes ({max_bytes}) or max wait ({max_wait_ms})")
        return FetchRequest(correlation_id, topic, partition, offset, max_bytes, max_wait_ms)
    if api_key == API_OFFSETS:
        topic, pos = _topic(buf, pos, end, api_key, correlation_id)
        if end - pos != OFFSETS_FIELDS.size:
            what = f"{end - pos} bytes after the topic, expected {OFFSETS_FIELDS.size}"
            raise _malformed(api_key, correlation_id, what)
        (partition,) = OFFSETS_FIELDS.unpack_from(buf, pos)
        return OffsetsRequest(correlation_id, topic, partition)
    if api_key == API_OFFSETS_FOR_TIME:
        topic, pos = _topic(buf, pos, end, api_key, correlation_id)
        if end - pos != OFFSETS_FOR_TIME_FIELDS.size:
            what = f"{end - pos} bytes after the topic, expected {OFFSETS_FOR_TIME_FIELDS.size}"
            raise _malformed(api_key, correlation_id, what)
        partition, timestamp_ms = OFFSETS_FOR_TIME_FIELDS.unpack_from(buf, pos)
        return OffsetsForTimeRequest(correlation_id, topic, partition, timestamp_ms)
    if api_key == API_AUTH:
        if end - pos < STRING_LENGTH.size:
            raise _malformed(api_key, correlation_id, "truncated before the token length")
        (length,) = STRING_LENGTH.unpack_from(buf, pos)
        pos += STRING_LENGTH.size
        if length != end - pos:
            raise _malformed(api_key, correlation_id, f"token length {length} but {end - pos} bytes left")
        return AuthRequest(correlation_id, bytes(buf[pos:end]))
    raise ProtocolError(f"unknown api key {api_key}", correlation_id=correlation_id)


def _decode_produce_v1(buf, pos: int, end: int, correlation_id: int) -> ProduceRequest:
    topic, pos = _topic(buf, pos, end, API_PRODUCE, correlation_id)
    if end - pos < PRODUCE_V1_FIELDS.size:
        raise _malformed(API_PRODUCE, correlation_id, "truncated before the message set")
    partition, acks, producer_id, epoch, sequence, set_length = PRODUCE_V1_FIELDS.unpack_from(buf, pos)
    pos += PRODUCE_V1_FIELDS.size
    if set_length != end - pos:
        raise _malformed(
            API_PRODUCE, correlation_id, f"set length {set_length} but {end - pos} bytes left in the frame"
        )
    try:
        _check_produce_v1(acks, producer_id, sequence)
    except ProtocolError as err:
        raise _malformed(API_PRODUCE, correlation_id, str(err)) from None
    view = buf if type(buf) is memoryview else memoryview(buf)
    return _tuple_new(
        ProduceRequest, (correlation_id, topic, partition, acks, view[pos:end], producer_id, epoch, sequence)
    )


# -- replies -------------------------------------------------------------------


def encode_auth_reply(correlation_id: int) -> bytes:
    return REPLY_HEADER.pack(REPLY_HEADER_BODY, correlation_id, 0)


def encode_produce_reply(correlation_id: int, base_offset: int) -> bytes:
    return PRODUCE_REPLY.pack(PRODUCE_REPLY.size - SIZE.size, correlation_id, 0, base_offset)


def encode_fetch_reply_header(correlation_id: int, high_watermark: int, log_start_offset: int, length: int) -> bytes:
    """The FETCH reply up to its data; ``length`` bytes of log follow."""
    return FETCH_REPLY.pack(
        FETCH_REPLY.size - SIZE.size + length, correlation_id, 0, high_watermark, log_start_offset, length
    )


def encode_offsets_reply(correlation_id: int, log_start_offset: int, high_watermark: int) -> bytes:
    return OFFSETS_REPLY.pack(OFFSETS_REPLY.size - SIZE.size, correlation_id, 0, log_start_offset, high_watermark)


def encode_offsets_for_time_reply(correlation_id: int, offset: int) -> bytes:
    return OFFSETS_FOR_TIME_REPLY.pack(OFFSETS_FOR_TIME_REPLY.size - SIZE.size, correlation_id, 0, offset)


def _clip_utf8(raw: bytes, limit: int) -> bytes:
    if len(raw) <= limit:
        return raw
    return raw[:limit].decode("utf-8", "ignore").encode("utf-8")


def encode_error(correlation_id: int, error: BaseException) -> bytes:
    """An error reply carrying ``error``'s code, message and details."""
    if isinstance(error, RaylogError):
        code, details = error.code, dict(error.details)
    else:
        code, details = RaylogError.code, {}
    details.pop("correlation_id", None)
    message = _clip_utf8(str(error).encode("utf-8", "replace"), MAX_STRING_BYTES)
    raw = json.dumps(details, default=str, separators=(",", ":")).encode("utf-8")
    if len(raw) > MAX_STRING_BYTES:
        raw = b"{}"
    body = STRING_LENGTH.pack(len(message)) + message + STRING_LENGTH.pack(len(raw)) + raw
    return REPLY_HEADER.pack(REPLY_HEADER_BODY + len(body), correlation_id, code) + body


#: names a detail may not take: they would shadow the error's own attributes
_RESERVED_DETAILS = frozenset({"message", "code", "retriable", "details", "args"})


def decode_error(code: int, body) -> RaylogError:
    """Rebuild the typed raylog error from an error reply's body (the bytes
    after the reply header)."""
    body = memoryview(body)
    try:
        (length,) = STRING_LENGTH.unpack_from(body, 0)
        pos = STRING_LENGTH.size
        message = str(body[pos : pos + length], "utf-8", "replace")
        pos += length
        (length,) = STRING_LENGTH.unpack_from(body, pos)
        pos += STRING_LENGTH.size
        raw = bytes(body[pos : pos + length])
        details = json.loads(raw) if raw else {}
    except (struct.error, ValueError):
        return ProtocolError(f"malformed error reply (error code {code})", error_code=code)
    if not isinstance(details, dict):
        details = {}
    details = {str(k): v for k, v in details.items() if k not in _RESERVED_DETAILS}
    return error_for_code(code, message, **details)
