"""Kafka record batches (message format v2) to raylog message sets and back.

Produce: each Kafka batch of a request is read with kafka-python's
:class:`kafka.record.default_records.DefaultRecordBatch` (its header; CRC32C
checked), its records section decompressed (gzip / lz4 / zstd, through
:func:`raylog.storage.compression.decompress`: bounded as it runs by the
partition's limit, MESSAGE_TOO_LARGE past it) and its
records read by the compiled ``_kafkarecords.parse`` (where it is built;
else record by record through kafka-python), and written as one raylog wrapper
(docs/design.md section 2) of the batch's codec, so that the i-th record of
a batch stored at ``w`` gets the Kafka offset ``w + i`` -- the offset a
Kafka producer reports for it (base offset + i). An uncompressed batch of
several records is stored in an lz4 wrapper for that reason (a run of plain
messages would give its records byte offsets that are not ``base + i``); a
batch of one record is stored as one plain message.
What raylog's format cannot carry is refused, never dropped: record headers,
transactional and control batches, and snappy (raylog has no snappy codec;
the batch is refused with UNSUPPORTED_COMPRESSION_TYPE). A null value is
stored as an empty value (raylog's format has no null).

Fetch: raylog records ``(offset, timestamp, key, value)`` become one
uncompressed Kafka batch (:func:`encode_batch`; its records section by the
compiled ``_kafkarecords.encode`` where it is built). Its layout, big-endian:

====  ======================  =====  =========================================
 #    field                   type   value written here
====  ======================  =====  =========================================
 1    baseOffset              i64    offset of the first record
 2    batchLength             i32    bytes after this field
 3    partitionLeaderEpoch    i32    -1
 4    magic                   i8     2
 5    crc                     u32    CRC32C of every byte from field 6 on
 6    attributes              i16    0 (no compression, create time)
 7    lastOffsetDelta         i32    ``end - 1 - baseOffset`` (see below)
 8    firstTimestamp          i64    first record's timestamp
 9    maxTimestamp            i64    largest record timestamp
10    producerId              i64    -1
11    producerEpoch           i16    -1
12    baseSequence            i32    -1
13    recordCount             i32    number of records
14    records                        each: length varint, attributes i8 (0),
                                     timestampDelta varlong, offsetDelta
                                     varint, key length varint (-1: null),
                                     key, value length varint, value,
                                     header count varint (0)
====  ======================  =====  =========================================

Kafka offsets are raylog byte offsets, so they have gaps (as on a compacted
Kafka topic). ``lastOffsetDelta`` names the last byte of the last raylog
message the batch covers (``end - 1``, ``end`` being the offset of the next
message): clients continue at ``lastOffset + 1`` (both librdkafka and
kafka-python do for format v2), which is then the next message's offset
rather than an offset inside the message just read.
"""

from __future__ import annotations

import struct
import time

from crc32c import crc32c
from kafka.errors import CorruptRecordError, UnsupportedCodecError
from kafka.record.default_records import DefaultRecordBatch

from raylog.config import INFLATED_FACTOR, TopicConfig
from raylog.errors import InflatedSizeTooLargeError, InvalidMessageError
from raylog.storage.compression import CODEC_GZIP, CODEC_LZ4, CODEC_ZSTD, codec_id, decompress
from raylog.storage.message import encode_message_set

try:  # the per-record loops in C (raylog/kafka/_kafkarecords.c); this module's own are the reference
    from raylog.kafka import _kafkarecords
except ImportError:  # a build without a compiler
    _kafkarecords = None

#: Kafka batch codec -> raylog's compression name (docs/design.md section 2)
KAFKA_CODECS = {0: None, 1: "gzip", 3: "lz4", 4: "zstd"}
#: the wrapper codec of an uncompressed Kafka batch of several records
UNCOMPRESSED_BATCH_CODEC = "lz4"
_CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}

# fields 1 and 2; fields 3 to 13
_PREFIX = struct.Struct(">qi")
_HEADER_TAIL = struct.Struct(">ibIhiqqqhii")
_HEADER_SIZE = _PREFIX.size + _HEADER_TAIL.size  # 61
_CRC_AT = 17  # offset of field 5
_AFTER_CRC = 21  # offset of field 6


class RecordsRefused(Exception):
    """A produced batch raylog will not store; ``code`` is the Kafka error
    code answered for its partition, ``message`` the reason given."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


#: Kafka error codes used here
CORRUPT_MESSAGE = 2
MESSAGE_TOO_LARGE = 10
UNSUPPORTED_COMPRESSION_TYPE = 76
INVALID_RECORD = 87


def _batches(data: bytes):
    pos, total = 0, len(data)
    while pos < total:
        if total - pos < _HEADER_SIZE:
            raise RecordsRefused(CORRUPT_MESSAGE, f"a record batch is cut off after {total - pos} bytes")
        _, length = _PREFIX.unpack_from(data, pos)
        end = pos + _PREFIX.size + length
        if length < _HEADER_SIZE - _PREFIX.size or end > total:
            raise RecordsRefused(CORRUPT_MESSAGE, f"a record batch claims {length} bytes; {total - pos - 12} follow")
        magic = data[pos + 16]
        if magic != 2:
            raise RecordsRefused(INVALID_RECORD, f"record batches of magic {magic} are not accepted; use magic 2 "
                                                 f"(Produce version 3 or later)")
        raw = data[pos:end]
        yield raw, DefaultRecordBatch(raw)
        pos = end


#: a compressed records section's codec (Kafka's id) -> raylog's codec id (the same stream formats)
_CODEC_IDS = {1: CODEC_GZIP, 3: CODEC_LZ4, 4: CODEC_ZSTD}


def _inflate(section, codec: int, max_bytes: int) -> bytes:
    """The records section of a batch of Kafka codec ``codec``, inflated
    with :func:`raylog.storage.compression.decompress` (which stops past
    ``max_bytes``, never holding more); raises :class:`RecordsRefused`:
    MESSAGE_TOO_LARGE past the bound, CORRUPT_MESSAGE for a broken stream."""
    try:
        return decompress(_CODEC_IDS[codec], section, max_bytes, sized_only=False)
    except InflatedSizeTooLargeError as err:
        raise RecordsRefused(MESSAGE_TOO_LARGE, f"a record batch {str(err).splitlines()[0]}") from None
    except InvalidMessageError as err:
        raise RecordsRefused(CORRUPT_MESSAGE, f"a record batch cannot be read: {err}") from None
_RECORD_COUNT = struct.Struct(">i")  # field 13, at byte 57
_FIRST_TIMESTAMP = struct.Struct(">q")  # field 8, at byte 27


def _records(raw, batch, now: int, max_bytes: int):
    """``(keys, values, timestamps)`` of one batch (its CRC, codec and kind
    checked by the caller; its records section inflated to at most
    ``max_bytes``); raises :class:`RecordsRefused`."""
    codec = batch.compression_type
    section = memoryview(raw)[_HEADER_SIZE:]
    if codec:
        section = _inflate(section, codec, max_bytes)
    if _kafkarecords is None:
        return _records_reference(batch, now)
    try:
        parsed = _kafkarecords.parse(section, _RECORD_COUNT.unpack_from(raw, 57)[0])
    except (UnsupportedCodecError, ValueError, OSError, EOFError, RuntimeError) as err:
        raise RecordsRefused(CORRUPT_MESSAGE, f"a record batch cannot be read: {err}") from None
    if parsed is None:
        raise RecordsRefused(INVALID_RECORD, _NO_HEADERS)
    keys, values, deltas = parsed
    values = [b"" if v is None else v for v in values]
    if batch.timestamp_type == 1:
        return keys, values, [now] * len(values)
    first = _FIRST_TIMESTAMP.unpack_from(raw, 27)[0]
    return keys, values, [first + d if first + d >= 0 else now for d in deltas]


_NO_HEADERS = "raylog's message format carries no record headers; send records without headers"


def _records_reference(batch, now: int):
    """:func:`_records` through kafka-python's reader, record by record
    (which inflates the section again: the caller has bounded it first)."""
    keys, values, times = [], [], []
    try:
        for record in batch:
            if record.headers:
                raise RecordsRefused(INVALID_RECORD, _NO_HEADERS)
            keys.append(record.key)
            values.append(b"" if record.value is None else bytes(record.value))
            ts = record.timestamp
            times.append(now if ts is None or ts < 0 or batch.timestamp_type == 1 else ts)
    except (CorruptRecordError, UnsupportedCodecError, ValueError, OSError, EOFError) as err:
        raise RecordsRefused(CORRUPT_MESSAGE, f"a record batch cannot be read: {err}") from None
    return [None if k is None else bytes(k) for k in keys], values, times


#: the bound of :func:`to_message_set` on an inflated records section when none is given (a topic's default)
DEFAULT_MAX_INFLATED_BYTES = INFLATED_FACTOR * TopicConfig.max_message_bytes


def to_message_set(data: bytes, max_inflated_bytes: int = DEFAULT_MAX_INFLATED_BYTES) -> tuple[bytes, int]:
    """``(raylog message set, record count)`` of the Kafka batches in
    ``data``; raises :class:`RecordsRefused`. A compressed batch's records
    section may inflate to at most ``max_inflated_bytes`` (the partition's
    bound on a decompressed set, ``TopicConfig.max_inflated_limit``: what
    raylog would store); its decompression stops past it and the batch is
    refused with MESSAGE_TOO_LARGE."""
    parts, count = [], 0
    now = time.time_ns() // 1_000_000
    for raw, batch in _batches(data):
        if not batch.validate_crc():
            raise RecordsRefused(CORRUPT_MESSAGE, "a record batch fails its CRC32C check")
        if batch.is_transactional or batch.is_control_batch:
            raise RecordsRefused(INVALID_RECORD, "transactional and control batches are not supported by raylog")
        codec = batch.compression_type
        if codec not in KAFKA_CODECS:
            raise RecordsRefused(
                UNSUPPORTED_COMPRESSION_TYPE,
                f"compression {_CODEC_NAMES.get(codec, codec)} is not supported; use gzip, lz4, zstd or none",
            )
        keys, values, times = _records(raw, batch, now, max_inflated_bytes)
        if not values:
            continue
        compression = KAFKA_CODECS[codec]
        if compression is None and len(values) > 1:
            compression = UNCOMPRESSED_BATCH_CODEC  # record i at base + i (see the module docstring)
        codec_id(compression)  # known to raylog (a ConfigError otherwise)
        parts.append(encode_message_set(values, keys, times, compression=compression))
        count += len(values)
    return b"".join(parts), count


def _varint(value: int) -> bytes:
    """Kafka's zigzag varint (varlong) of ``value``."""
    z = (value << 1) ^ (value >> 63)
    if z < 0x80:
        return _SMALL_VARINTS[z]
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


_SMALL_VARINTS = [bytes([z]) for z in range(0x80)]
_NULL = _varint(-1)


def encode_batch(records, end: int) -> bytes:
    """One Kafka batch (the layout in the module docstring) of raylog
    ``records`` ``(offset, timestamp_ms, key, value)``, offsets increasing;
    ``end`` is the offset after the last message the records came from."""
    base = records[0][0]
    first_ts = records[0][1]
    if _kafkarecords is not None:
        body, max_ts = _kafkarecords.encode(records, first_ts, base)
    else:
        body, max_ts = _encode_records(records, first_ts, base)
    tail = _HEADER_TAIL.pack(-1, 2, 0, 0, end - 1 - base, first_ts, max_ts, -1, -1, -1, len(records))
    out = bytearray(_PREFIX.pack(base, _HEADER_SIZE - _PREFIX.size + len(body)))
    out += tail
    out += body
    struct.pack_into(">I", out, _CRC_AT, crc32c(memoryview(out)[_AFTER_CRC:]))
    return bytes(out)


def _encode_records(records, first_ts: int, base: int) -> tuple[bytes, int]:
    """The records section of :func:`encode_batch` and the largest
    timestamp, record by record (the reference of ``_kafkarecords.encode``)."""
    max_ts = first_ts
    parts = []
    append = parts.append
    varint = _varint
    for offset, ts, key, value in records:
        if ts > max_ts:
            max_ts = ts
        head = b"\x00" + varint(ts - first_ts) + varint(offset - base)
        key_part = _NULL if key is None else varint(len(key)) + key
        value_head = varint(len(value))
        size = len(head) + len(key_part) + len(value_head) + len(value) + 1
        append(varint(size))
        append(head)
        append(key_part)
        append(value_head)
        append(value)
        append(b"\x00")  # no headers
    return b"".join(parts), max_ts
