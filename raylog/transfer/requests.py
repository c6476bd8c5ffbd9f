"""Requests of the data channel: their records, encoders (client side) and the
decoder (server side); the frames are defined field by field in
:mod:`raylog.transfer.protocol`."""

from __future__ import annotations

import struct
from typing import NamedTuple

from raylog.errors import ConfigError, FrameTooLargeError, ProtocolError
from raylog.transfer.protocol import (
    API_PRODUCE,
    API_FETCH,
    API_OFFSETS,
    API_AUTH,
    AUTH_FIELDS,
    AUTH_HELLO,
    AUTH_PROOF,
    AUTH_VERSION,
    NONCE_BYTES,
    API_OFFSETS_FOR_TIME,
    API_COUNT,
    API_LOCATE,
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
    FETCH_V1_FIELDS,
    LOCATE_V1_FIELDS,
    LOCATE_VERSION_ISOLATION,
    FETCH_VERSION_ISOLATION,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    OFFSETS_FIELDS,
    OFFSETS_FOR_TIME_FIELDS,
    COUNT_FIELDS,
    COUNT_V1_FIELDS,
    COUNT_VERSION_BOUNDED,
    LOCATE_FIELDS,
    API_REPLICA_FETCH,
    REPLICA_FETCH_FIELDS,
    REPLICA_FETCH_PARTITION,
)


class AuthRequest(NamedTuple):
    correlation_id: int
    #: AUTH_HELLO (``data`` is the client nonce) or AUTH_PROOF (the client proof)
    step: int
    data: bytes


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
    #: version 1: READ_UNCOMMITTED or READ_COMMITTED; None for version 0
    #: (answered with a version 0 reply)
    isolation: int | None = None


class OffsetsRequest(NamedTuple):
    correlation_id: int
    topic: str
    partition: int


class OffsetsForTimeRequest(NamedTuple):
    correlation_id: int
    topic: str
    partition: int
    timestamp_ms: int


class CountRequest(NamedTuple):
    correlation_id: int
    topic: str
    partition: int
    start: int
    end: int
    max_bytes: int
    #: version 1: the most messages to count (-1: no bound); None for version 0
    max_messages: int | None = None


class LocateRequest(NamedTuple):
    correlation_id: int
    topic: str
    partition: int
    offset: int
    max_bytes: int
    #: version 1: READ_UNCOMMITTED or READ_COMMITTED; None for version 0
    isolation: int | None = None


class ReplicaFetchRequest(NamedTuple):
    correlation_id: int
    topic: str
    partition: int
    #: the follower's replica id (its disk node)
    replica: str
    leader_epoch: int
    #: the follower holds every byte below it; the answer starts there
    log_end: int
    #: the follower's fsynced end (<= log_end)
    flushed: int
    max_bytes: int
    max_wait_ms: int


def encode_string(text: str) -> bytes:
    """A u16-length-prefixed UTF-8 string."""
    raw = text.encode("utf-8")
    if len(raw) > MAX_STRING_BYTES:
        raise ProtocolError(f"string of {len(raw)} bytes does not fit a u16 length; shorten it")
    return STRING_LENGTH.pack(len(raw)) + raw


def check_frame_size(size: int, max_frame_bytes: int) -> None:
    """Refuse a frame by its size field alone, before anything is allocated
    (the server's reading of requests and the client's writing of them)."""
    if size > max_frame_bytes:
        raise FrameTooLargeError(
            f"frame of {size} bytes exceeds the maximum of {max_frame_bytes} bytes; send smaller message sets",
            size=size,
            max_frame_bytes=max_frame_bytes,
        )


def _request_header(api_key: int, correlation_id: int, body_length: int) -> bytes:
    return REQUEST_HEADER.pack(REQUEST_HEADER_BODY + body_length, api_key, VERSION, correlation_id)


def _encode_auth(correlation_id: int, step: int, data: bytes) -> bytes:
    if len(data) != NONCE_BYTES:
        raise ProtocolError(f"an AUTH nonce or proof has {NONCE_BYTES} bytes, not {len(data)}")
    return (
        REQUEST_HEADER.pack(REQUEST_HEADER_BODY + AUTH_FIELDS.size, API_AUTH, AUTH_VERSION, correlation_id)
        + AUTH_FIELDS.pack(step, bytes(data))
    )


def encode_auth_hello(correlation_id: int, client_nonce: bytes) -> bytes:
    """AUTH HELLO: the client's fresh nonce (:mod:`raylog.transfer.handshake`)."""
    return _encode_auth(correlation_id, AUTH_HELLO, client_nonce)


def encode_auth_proof(correlation_id: int, proof: bytes) -> bytes:
    """AUTH PROOF: the client proof, sent only after the server proved itself."""
    return _encode_auth(correlation_id, AUTH_PROOF, proof)


def _produce_fields_wrong(acks: int, producer_id: int, sequence: int) -> str | None:
    """Why acks, producer id and sequence of a PRODUCE do not go together
    (``None`` when they do)."""
    if acks not in (ACKS_NONE, ACKS_LEADER, ACKS_ALL):
        return f"acks must be 0, 1 or -1, got {acks}"
    if producer_id == NO_PRODUCER_ID:
        if sequence != NO_SEQUENCE:
            return f"a set without producer id must have sequence -1, got {sequence}"
    elif producer_id < 0 or sequence < 0:
        return f"producer id {producer_id} and sequence {sequence} must be non-negative (or both -1)"
    return None


class ProduceHeader:
    """Everything of a PRODUCE frame before its message set, for one topic:
    the topic is encoded and the whole header of each version precompiled
    once (a client keeps one per topic). The one PRODUCE encoder, used by
    :class:`~raylog.transfer.connection.BrokerConnection` and by
    :func:`encode_produce`.

    :meth:`pack` writes version 0 for a plain set with acks 0 or 1 and
    version 1 (producer id, epoch, sequence) for an idempotent set or
    acks=-1, unless ``version`` says which.

    Thread-safety: immutable once built.
    """

    __slots__ = ("encoded_topic", "_v0", "_v1")

    def __init__(self, topic: str):
        #: the topic as a u16-length-prefixed string
        self.encoded_topic = encode_string(topic)
        prefix = REQUEST_HEADER.format + f"{len(self.encoded_topic)}s"
        self._v0 = struct.Struct(prefix + PRODUCE_FIELDS.format.lstrip(">"))
        self._v1 = struct.Struct(prefix + PRODUCE_V1_FIELDS.format.lstrip(">"))

    def pack(
        self,
        correlation_id: int,
        partition: int,
        acks: int,
        set_length: int,
        producer_id: int = NO_PRODUCER_ID,
        sequence: int = NO_SEQUENCE,
        *,
        producer_epoch: int = 0,
        version: int | None = None,
        max_frame_bytes: int | None = None,
    ) -> bytes:
        """The header of a frame carrying a set of ``set_length`` bytes.

        Raises :class:`ConfigError` for acks outside {0, 1, -1}, a producer
        id and sequence that do not go together or fields version 0 cannot
        carry, and :class:`FrameTooLargeError` when the frame would exceed
        ``max_frame_bytes``."""
        plain = producer_id == NO_PRODUCER_ID and sequence == NO_SEQUENCE and (acks == 0 or acks == 1)
        if not plain:
            wrong = _produce_fields_wrong(acks, producer_id, sequence)
            if wrong:
                raise ConfigError(wrong)
        if version is None:
            version = VERSION if plain else PRODUCE_VERSION_IDEMPOTENT
        elif version == VERSION and not plain:
            raise ConfigError("a PRODUCE version 0 carries no producer id, sequence or acks=-1; use version 1")
        header = self._v0 if version == VERSION else self._v1
        size = header.size - SIZE.size + set_length
        if max_frame_bytes is not None and size > max_frame_bytes:
            check_frame_size(size, max_frame_bytes)
        if version == VERSION:
            return header.pack(size, API_PRODUCE, VERSION, correlation_id, self.encoded_topic, partition, acks, set_length)
        return header.pack(
            size, API_PRODUCE, PRODUCE_VERSION_IDEMPOTENT, correlation_id, self.encoded_topic,
            partition, acks, producer_id, producer_epoch, sequence, set_length,
        )


def encode_produce(
    correlation_id: int,
    topic: str,
    partition: int,
    acks: int,
    message_set: bytes,
    *,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = 0,
    sequence: int = NO_SEQUENCE,
    version: int | None = None,
) -> bytes:
    """A whole PRODUCE frame (the version as :meth:`ProduceHeader.pack` chooses it)."""
    header = ProduceHeader(topic).pack(
        correlation_id, partition, acks, len(message_set), producer_id, sequence,
        producer_epoch=producer_epoch, version=version,
    )
    return header + bytes(message_set)


def encode_fetch(
    correlation_id: int, topic: str | bytes, partition: int, offset: int, max_bytes: int, max_wait_ms: int = 0,
    isolation: int | None = None,
) -> bytes:
    """A FETCH: version 0, or version 1 when ``isolation`` is given
    (READ_UNCOMMITTED or READ_COMMITTED)."""
    topic = encode_string(topic) if isinstance(topic, str) else topic
    if isolation is None:
        fields = FETCH_FIELDS.pack(partition, offset, max_bytes, max_wait_ms)
        return _request_header(API_FETCH, correlation_id, len(topic) + len(fields)) + topic + fields
    fields = FETCH_V1_FIELDS.pack(partition, offset, max_bytes, max_wait_ms, isolation)
    header = REQUEST_HEADER.pack(
        REQUEST_HEADER_BODY + len(topic) + len(fields), API_FETCH, FETCH_VERSION_ISOLATION, correlation_id
    )
    return header + topic + fields


def encode_offsets(correlation_id: int, topic: str | bytes, partition: int) -> bytes:
    topic = encode_string(topic) if isinstance(topic, str) else topic
    fields = OFFSETS_FIELDS.pack(partition)
    return _request_header(API_OFFSETS, correlation_id, len(topic) + len(fields)) + topic + fields


def encode_offsets_for_time(correlation_id: int, topic: str | bytes, partition: int, timestamp_ms: int) -> bytes:
    topic = encode_string(topic) if isinstance(topic, str) else topic
    fields = OFFSETS_FOR_TIME_FIELDS.pack(partition, timestamp_ms)
    return _request_header(API_OFFSETS_FOR_TIME, correlation_id, len(topic) + len(fields)) + topic + fields


def encode_count(
    correlation_id: int,
    topic: str | bytes,
    partition: int,
    start: int,
    end: int,
    max_bytes: int,
    max_messages: int | None = None,
) -> bytes:
    """A COUNT: version 0, or version 1 when ``max_messages`` is given (-1: no bound)."""
    topic = encode_string(topic) if isinstance(topic, str) else topic
    if max_messages is None:
        fields = COUNT_FIELDS.pack(partition, start, end, max_bytes)
        return _request_header(API_COUNT, correlation_id, len(topic) + len(fields)) + topic + fields
    fields = COUNT_V1_FIELDS.pack(partition, start, end, max_bytes, max_messages)
    header = REQUEST_HEADER.pack(
        REQUEST_HEADER_BODY + len(topic) + len(fields), API_COUNT, COUNT_VERSION_BOUNDED, correlation_id
    )
    return header + topic + fields


def encode_locate(correlation_id: int, topic: str | bytes, partition: int, offset: int, max_bytes: int,
                  isolation: int | None = None) -> bytes:
    """A LOCATE: version 0, or version 1 when ``isolation`` is given."""
    topic = encode_string(topic) if isinstance(topic, str) else topic
    if isolation is None:
        fields = LOCATE_FIELDS.pack(partition, offset, max_bytes)
        return _request_header(API_LOCATE, correlation_id, len(topic) + len(fields)) + topic + fields
    fields = LOCATE_V1_FIELDS.pack(partition, offset, max_bytes, isolation)
    header = REQUEST_HEADER.pack(
        REQUEST_HEADER_BODY + len(topic) + len(fields), API_LOCATE, LOCATE_VERSION_ISOLATION, correlation_id
    )
    return header + topic + fields


def encode_replica_fetch(
    correlation_id: int, topic: str | bytes, partition: int, replica: str | bytes, leader_epoch: int, log_end: int,
    flushed: int, max_bytes: int, max_wait_ms: int = 0,
) -> bytes:
    """A REPLICA_FETCH (a follower's; :mod:`raylog.transfer.protocol`)."""
    topic = encode_string(topic) if isinstance(topic, str) else topic
    replica = encode_string(replica) if isinstance(replica, str) else replica
    body = (topic + REPLICA_FETCH_PARTITION.pack(partition) + replica
            + REPLICA_FETCH_FIELDS.pack(leader_epoch, log_end, flushed, max_bytes, max_wait_ms))
    return _request_header(API_REPLICA_FETCH, correlation_id, len(body)) + body


def _malformed(api_key: int, correlation_id: int, what: str) -> ProtocolError:
    name = API_NAMES.get(api_key, str(api_key))
    return ProtocolError(f"malformed {name} frame: {what}", correlation_id=correlation_id)


def _topic(buf, pos: int, end: int, api_key: int, correlation_id: int, what: str = "topic") -> tuple[str, int]:
    """The string (a topic, or ``what``) at ``pos`` and where the frame goes on."""
    if end - pos < STRING_LENGTH.size:
        raise _malformed(api_key, correlation_id, f"truncated before the {what} length")
    (length,) = STRING_LENGTH.unpack_from(buf, pos)
    pos += STRING_LENGTH.size
    if end - pos < length:
        raise _malformed(api_key, correlation_id, f"{what} length {length} runs past the frame")
    try:
        topic = str(buf[pos : pos + length], "utf-8")
    except UnicodeDecodeError:
        raise _malformed(api_key, correlation_id, f"{what} is not UTF-8") from None
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
    if api_key == API_AUTH:
        if version != AUTH_VERSION:
            raise ProtocolError(
                f"AUTH version {version} is not accepted (version 0 sent the token in plain text); this endpoint "
                f"speaks the challenge–response of AUTH version {AUTH_VERSION}: upgrade the client",
                correlation_id=correlation_id,
            )
        if end - pos != AUTH_FIELDS.size:
            raise _malformed(api_key, correlation_id, f"{end - pos} bytes after the header, expected {AUTH_FIELDS.size}")
        step, data = AUTH_FIELDS.unpack_from(buf, pos)
        if step not in (AUTH_HELLO, AUTH_PROOF):
            raise _malformed(api_key, correlation_id, f"unknown AUTH step {step}")
        return AuthRequest(correlation_id, step, data)
    if api_key == API_COUNT and version == COUNT_VERSION_BOUNDED:
        topic, pos = _topic(buf, pos, end, api_key, correlation_id)
        if end - pos != COUNT_V1_FIELDS.size:
            what = f"{end - pos} bytes after the topic, expected {COUNT_V1_FIELDS.size}"
            raise _malformed(api_key, correlation_id, what)
        partition, start, stop, max_bytes, max_messages = COUNT_V1_FIELDS.unpack_from(buf, pos)
        if max_bytes < 0 or max_messages < -1:
            raise _malformed(api_key, correlation_id, f"negative max bytes ({max_bytes}) or max messages ({max_messages})")
        return CountRequest(correlation_id, topic, partition, start, stop, max_bytes, max_messages)
    if api_key == API_LOCATE and version == LOCATE_VERSION_ISOLATION:
        topic, pos = _topic(buf, pos, end, api_key, correlation_id)
        if end - pos != LOCATE_V1_FIELDS.size:
            what = f"{end - pos} bytes after the topic, expected {LOCATE_V1_FIELDS.size}"
            raise _malformed(api_key, correlation_id, what)
        partition, offset, max_bytes, isolation = LOCATE_V1_FIELDS.unpack_from(buf, pos)
        if max_bytes < 0:
            raise _malformed(api_key, correlation_id, f"negative max bytes ({max_bytes})")
        if isolation not in (READ_UNCOMMITTED, READ_COMMITTED):
            raise _malformed(api_key, correlation_id, f"unknown isolation level {isolation} (0 read_uncommitted, "
                                                      f"1 read_committed)")
        return LocateRequest(correlation_id, topic, partition, offset, max_bytes, isolation)
    if api_key == API_FETCH and version == FETCH_VERSION_ISOLATION:
        topic, pos = _topic(buf, pos, end, api_key, correlation_id)
        if end - pos != FETCH_V1_FIELDS.size:
            what = f"{end - pos} bytes after the topic, expected {FETCH_V1_FIELDS.size}"
            raise _malformed(api_key, correlation_id, what)
        partition, offset, max_bytes, max_wait_ms, isolation = FETCH_V1_FIELDS.unpack_from(buf, pos)
        if max_bytes < 0 or max_wait_ms < 0:
            raise _malformed(api_key, correlation_id, f"negative max bytes ({max_bytes}) or max wait ({max_wait_ms})")
        if isolation not in (READ_UNCOMMITTED, READ_COMMITTED):
            raise _malformed(api_key, correlation_id, f"unknown isolation level {isolation} (0 read_uncommitted, "
                                                      f"1 read_committed)")
        return FetchRequest(correlation_id, topic, partition, offset, max_bytes, max_wait_ms, isolation)
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
    if api_key == API_COUNT:
        topic, pos = _topic(buf, pos, end, api_key, correlation_id)
        if end - pos != COUNT_FIELDS.size:
            raise _malformed(api_key, correlation_id, f"{end - pos} bytes after the topic, expected {COUNT_FIELDS.size}")
        partition, start, stop, max_bytes = COUNT_FIELDS.unpack_from(buf, pos)
        if max_bytes < 0:
            raise _malformed(api_key, correlation_id, f"negative max bytes ({max_bytes})")
        return CountRequest(correlation_id, topic, partition, start, stop, max_bytes)
    if api_key == API_LOCATE:
        topic, pos = _topic(buf, pos, end, api_key, correlation_id)
        if end - pos != LOCATE_FIELDS.size:
            what = f"{end - pos} bytes after the topic, expected {LOCATE_FIELDS.size}"
            raise _malformed(api_key, correlation_id, what)
        partition, offset, max_bytes = LOCATE_FIELDS.unpack_from(buf, pos)
        if max_bytes < 0:
            raise _malformed(api_key, correlation_id, f"negative max bytes ({max_bytes})")
        return LocateRequest(correlation_id, topic, partition, offset, max_bytes)
    if api_key == API_REPLICA_FETCH:
        return _decode_replica_fetch(buf, pos, end, correlation_id)
    raise ProtocolError(f"unknown api key {api_key}", correlation_id=correlation_id)


def _decode_replica_fetch(buf, pos: int, end: int, correlation_id: int) -> ReplicaFetchRequest:
    topic, pos = _topic(buf, pos, end, API_REPLICA_FETCH, correlation_id)
    if end - pos < REPLICA_FETCH_PARTITION.size:
        raise _malformed(API_REPLICA_FETCH, correlation_id, "truncated before the partition")
    (partition,) = REPLICA_FETCH_PARTITION.unpack_from(buf, pos)
    replica, pos = _topic(buf, pos + REPLICA_FETCH_PARTITION.size, end, API_REPLICA_FETCH, correlation_id,
                          "replica id")
    if end - pos != REPLICA_FETCH_FIELDS.size:
        what = f"{end - pos} bytes after the replica id, expected {REPLICA_FETCH_FIELDS.size}"
        raise _malformed(API_REPLICA_FETCH, correlation_id, what)
    leader_epoch, log_end, flushed, max_bytes, max_wait_ms = REPLICA_FETCH_FIELDS.unpack_from(buf, pos)
    if max_bytes < 0 or max_wait_ms < 0:
        raise _malformed(API_REPLICA_FETCH, correlation_id,
                         f"negative max bytes ({max_bytes}) or max wait ({max_wait_ms})")
    if not 0 <= flushed <= log_end:
        raise _malformed(API_REPLICA_FETCH, correlation_id,
                         f"flushed {flushed} must lie in [0, log end {log_end}]")
    return ReplicaFetchRequest(correlation_id, topic, partition, replica, leader_epoch, log_end, flushed, max_bytes,
                               max_wait_ms)


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
    wrong = _produce_fields_wrong(acks, producer_id, sequence)
    if wrong:
        raise _malformed(API_PRODUCE, correlation_id, wrong)
    view = buf if type(buf) is memoryview else memoryview(buf)
    return _tuple_new(
        ProduceRequest, (correlation_id, topic, partition, acks, view[pos:end], producer_id, epoch, sequence)
    )
