"""Produce requests read, and their responses written, directly: the
listener's hot path, without kafka-python's generic schema codec (which
:mod:`raylog.kafka.frames` uses for every other API). Versions 3 to 9 are
served; 9 is *flexible* (below). Every integer is big-endian; a string is
an i16 length then UTF-8 bytes (nullable: length -1 for null), bytes an
i32 length then the bytes (nullable: -1), an array an i32 count then its
items.

Request frame payload (the size field already taken off):

=====================  ================  ====================================
field                  type              notes
=====================  ================  ====================================
api_key                i16               0 (Produce)
api_version            i16               3..9
correlation_id         i32               echoed in the response
client_id              nullable string   (an i16 length in every version)
header tagged fields   tagged fields     version 9: skipped
transactional_id       nullable string
acks                   i16               0, 1 or -1 (checked by the handler)
timeout_ms             i32               (raylog's own bounds apply)
topic_data             array of:
  name                 string
  partition_data       array of:
    index              i32
    records            nullable bytes    record batches (raylog.kafka.records)
    tagged fields      tagged fields     version 9: skipped
  tagged fields        tagged fields     version 9: skipped
tagged fields          tagged fields     version 9: skipped
=====================  ================  ====================================

Version 9 is Kafka's first flexible Produce: in the body, strings, bytes
and arrays are *compact* (an unsigned varint of length + 1 or count + 1, 0
for null), and the header and each struct end with tagged fields (an
unsigned varint count, then each field's unsigned varint tag, unsigned
varint size and bytes), which raylog reads past. Nothing may follow the
last field. A frame that does not hold exactly this (a count or length
beyond the bytes left, a string that is not UTF-8, a varint longer than 5
bytes) is a :class:`~raylog.kafka.frames.BadFrame`; no count is trusted
before the bytes it claims are there.

Response frame: ``size i32``, ``correlation_id i32`` (version 9: then
empty tagged fields, one 0 byte), then

=====================  ================  ====================================
responses              array of:
  name                 string
  partition_responses  array of:
    index              i32
    error_code         i16
    base_offset        i64               -1 when not stored
    log_append_time_ms i64               -1 (create time)
    log_start_offset   i64               version 5 and later; -1
    record_errors      array             version 8 and later; always empty
    error_message      nullable string   version 8 and later
    tagged fields                        version 9: none
  tagged fields                          version 9: none
throttle_time_ms       i32               0
tagged fields                            version 9: none
=====================  ================  ====================================

(compact forms in version 9, as in the request).
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from raylog.kafka.frames import BadFrame, Request, uvarint

PRODUCE = 0
LOWEST, HIGHEST = 3, 9
#: the first flexible version
FLEXIBLE = 9

_HEAD = struct.Struct(">hhih")  # api_key, api_version, correlation_id, client_id length
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_ACKS = struct.Struct(">hi")  # acks, timeout_ms
_PARTITION = struct.Struct(">ii")  # index, records length
_ANSWER = struct.Struct(">ihqq")  # index, error_code, base_offset, log_append_time_ms
_I64 = struct.Struct(">q")
_NO_ERRORS = _I32.pack(0)
_NULL_STRING = _I16.pack(-1)
_NO_THROTTLE = _I32.pack(0)


class PartitionData(NamedTuple):
    index: int
    records: bytes | None


class TopicData(NamedTuple):
    name: str
    partition_data: list


class ProduceBody(NamedTuple):
    transactional_id: str | None
    acks: int
    timeout_ms: int
    topic_data: list


def _string(frame: bytes, pos: int, nullable: bool) -> tuple[str | None, int]:
    (size,) = _I16.unpack_from(frame, pos)
    pos += 2
    if size < 0:
        if size != -1 or not nullable:
            raise BadFrame(f"a Produce request holds a string of length {size}")
        return None, pos
    return _text(frame, pos, size)


def _text(frame: bytes, pos: int, size: int) -> tuple[str, int]:
    if pos + size > len(frame):
        raise BadFrame("a Produce request's string runs past its frame")
    try:
        return frame[pos:pos + size].decode("utf-8"), pos + size
    except UnicodeDecodeError:
        raise BadFrame("a Produce request holds a string that is not UTF-8") from None


def _uvarint(frame: bytes, pos: int) -> tuple[int, int]:
    """An unsigned varint (at most 5 bytes, as Kafka's)."""
    value = shift = 0
    for i in range(5):
        if pos >= len(frame):
            raise BadFrame("a Produce request cut short in a varint")
        byte = frame[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise BadFrame("a Produce request holds a varint longer than 5 bytes")


def _compact_string(frame: bytes, pos: int, nullable: bool) -> tuple[str | None, int]:
    size, pos = _uvarint(frame, pos)
    if size == 0:
        if not nullable:
            raise BadFrame("a Produce request holds a null where a string must be")
        return None, pos
    return _text(frame, pos, size - 1)


def _skip_tags(frame: bytes, pos: int) -> int:
    """Read past tagged fields (none of Produce's are raylog's to use)."""
    count, pos = _uvarint(frame, pos)
    if count > len(frame) - pos:
        raise BadFrame(f"a Produce request claims {count} tagged fields where its frame holds fewer")
    for _ in range(count):
        _tag, pos = _uvarint(frame, pos)
        size, pos = _uvarint(frame, pos)
        if pos + size > len(frame):
            raise BadFrame("a Produce request's tagged field runs past its frame")
        pos += size
    return pos


def _count(frame: bytes, pos: int, least: int, compact: bool = False) -> tuple[int, int]:
    """An array's count, refused when its items (``least`` bytes each at
    the least) could not fit in what is left of the frame."""
    if compact:
        count, pos = _uvarint(frame, pos)
        count -= 1  # (0: a null array, refused below)
    else:
        (count,) = _I32.unpack_from(frame, pos)
        pos += 4
    if count < 0 or count * least > len(frame) - pos:
        raise BadFrame(f"a Produce request claims {count} items where its frame holds fewer")
    return count, pos


def decode_produce(frame: bytes) -> Request:
    """The :class:`~raylog.kafka.frames.Request` of a Produce request frame
    payload (the layout above); raises :class:`BadFrame`."""
    try:
        api_key, version, correlation_id, _ = _HEAD.unpack_from(frame)
        if api_key != PRODUCE or not LOWEST <= version <= HIGHEST:
            raise BadFrame(f"api key {api_key} version {version} is not a Produce request served "
                           f"(versions {LOWEST}..{HIGHEST})")
        client_id, pos = _string(frame, 8, True)
        if version >= FLEXIBLE:
            pos = _skip_tags(frame, pos)
            body = _flexible_body(frame, pos)
        else:
            body = _body(frame, pos)
    except struct.error:
        raise BadFrame("a Produce request cut short") from None
    return Request(api_key, version, correlation_id, client_id, body)


def _body(frame: bytes, pos: int) -> ProduceBody:
    transactional_id, pos = _string(frame, pos, True)
    acks, timeout_ms = _ACKS.unpack_from(frame, pos)
    pos += _ACKS.size
    topics, pos = _count(frame, pos, 2 + 4)
    topic_data = []
    for _ in range(topics):
        name, pos = _string(frame, pos, False)
        partitions, pos = _count(frame, pos, _PARTITION.size)
        partition_data = []
        for _ in range(partitions):
            index, size = _PARTITION.unpack_from(frame, pos)
            pos += _PARTITION.size
            if size < -1 or pos + size > len(frame):
                raise BadFrame(f"a Produce request's records of {size} bytes run past its frame")
            if size == -1:
                partition_data.append(PartitionData(index, None))
            else:
                partition_data.append(PartitionData(index, frame[pos:pos + size]))
                pos += size
        topic_data.append(TopicData(name, partition_data))
    _check_end(frame, pos)
    return ProduceBody(transactional_id, acks, timeout_ms, topic_data)


def _flexible_body(frame: bytes, pos: int) -> ProduceBody:
    transactional_id, pos = _compact_string(frame, pos, True)
    acks, timeout_ms = _ACKS.unpack_from(frame, pos)
    pos += _ACKS.size
    topics, pos = _count(frame, pos, 1 + 1 + 1, compact=True)
    topic_data = []
    for _ in range(topics):
        name, pos = _compact_string(frame, pos, False)
        partitions, pos = _count(frame, pos, 4 + 1 + 1, compact=True)
        partition_data = []
        for _ in range(partitions):
            (index,) = _I32.unpack_from(frame, pos)
            size, pos = _uvarint(frame, pos + 4)
            if size == 0:
                partition_data.append(PartitionData(index, None))
            else:
                size -= 1
                if pos + size > len(frame):
                    raise BadFrame(f"a Produce request's records of {size} bytes run past its frame")
                partition_data.append(PartitionData(index, frame[pos:pos + size]))
                pos += size
            pos = _skip_tags(frame, pos)
        topic_data.append(TopicData(name, partition_data))
        pos = _skip_tags(frame, pos)
    pos = _skip_tags(frame, pos)
    _check_end(frame, pos)
    return ProduceBody(transactional_id, acks, timeout_ms, topic_data)


def _check_end(frame: bytes, pos: int) -> None:
    if pos != len(frame):
        raise BadFrame(f"a Produce request with {len(frame) - pos} bytes after its last field")


def _put_string(out: bytearray, text: str | None) -> None:
    if text is None:
        out += _NULL_STRING
        return
    data = text.encode("utf-8")
    out += _I16.pack(len(data))
    out += data


def _put_compact_string(out: bytearray, text: str | None) -> None:
    if text is None:
        out.append(0)
        return
    data = text.encode("utf-8")
    out += uvarint(len(data) + 1)
    out += data


def encode_produce_response(version: int, correlation_id: int, topics) -> bytes:
    """The response frame (size included) of a Produce request of
    ``version``; ``topics`` holds ``(name, [(index, error_code, base_offset,
    error_message), ...])``."""
    if version >= FLEXIBLE:
        return _encode_flexible(correlation_id, topics)
    out = bytearray(8)  # size and correlation id, filled in below
    out += _I32.pack(len(topics))
    for name, partitions in topics:
        _put_string(out, name)
        out += _I32.pack(len(partitions))
        for index, code, base, message in partitions:
            out += _ANSWER.pack(index, code, base, -1)
            if version >= 5:
                out += _I64.pack(-1)
            if version >= 8:
                out += _NO_ERRORS
                _put_string(out, message)
    out += _NO_THROTTLE
    struct.pack_into(">ii", out, 0, len(out) - 4, correlation_id)
    return bytes(out)


def _encode_flexible(correlation_id: int, topics) -> bytes:
    out = bytearray(9)  # size, correlation id and the header's (empty) tagged fields
    out += uvarint(len(topics) + 1)
    for name, partitions in topics:
        _put_compact_string(out, name)
        out += uvarint(len(partitions) + 1)
        for index, code, base, message in partitions:
            out += _ANSWER.pack(index, code, base, -1)
            out += _I64.pack(-1)  # log_start_offset
            out.append(1)  # record_errors: an empty compact array
            _put_compact_string(out, message)
            out.append(0)  # tagged fields
        out.append(0)
    out += _NO_THROTTLE
    out.append(0)
    struct.pack_into(">ii", out, 0, len(out) - 4, correlation_id)
    return bytes(out)
