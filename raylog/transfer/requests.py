"""Requests of the data channel: their records, encoders (client side) and the
decoder (server side); the frames are defined field by field in
:mod:`raylog.transfer.protocol`."""

from __future__ import annotations

import struct
from typing import NamedTuple

from raylog.errors import FrameTooLargeError, ProtocolError
from raylog.transfer.protocol import (
    API_PRODUCE,
    API_FETCH,
    API_OFFSETS,
    API_AUTH,
    API_OFFSETS_FOR_TIME,
    API_NAMES,
    VERSION,
    PRODUCE_VERSION_IDEMPOTENT,
    ACKS_NONE,
    ACKS_LEADER,
    ACKS_ALL,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    NO_CORRELATION,
    MAX_STRING_BYTES,
    SIZE,
    REQUEST_HEADER,
    REQUEST_HEADER_BODY,
    STRING_LENGTH,
    PRODUCE_FIELDS,
    PRODUCE_V1_FIELDS,
    FETCH_FIELDS,
    OFFSETS_FIELDS,
    OFFSETS_FOR_TIME_FIELDS,
)


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
