"""Kafka record batches in and out of the listener.

Produce (:func:`to_stored`): a Kafka batch *is* raylog's format 2
(docs/design.md section 2; :mod:`raylog.storage.record_batch` defines it
field by field), so a client's batches are stored as they came. Each is
checked here first with :func:`~raylog.storage.record_batch.validate_batch`
(sizes, magic, CRC32C, attributes, every record; a compressed section --
gzip, snappy, lz4 or zstd -- inflated within the partition's bound,
MESSAGE_TOO_LARGE past it), so a bad batch is answered by the listener and
never crosses the data channel; the partition checks it again before it
appends (its own rule, whoever sends). Headers, null values (tombstones)
and empty values are kept as sent. One field may be set here, as a Kafka
broker sets it before it appends: a create-time batch whose maxTimestamp
is below its records' largest timestamp (sarama before 1.26 sends -1) gets
that largest timestamp, and its CRC again
(:func:`~raylog.storage.record_batch.with_max_timestamp_raised`); the
partition's own check refuses such a batch from anyone else. A compressed batch shorter than its
record count (many tiny records compressed well: its records could not
have offsets of their own, docs/design.md section 2) is re-encoded
uncompressed here (:func:`~raylog.storage.record_batch.reencode_uncompressed`:
same records, producer fields and flags), and refused with
MESSAGE_TOO_LARGE when that is longer than ``max_message_bytes``; it is
never split (one batch in, one batch out keeps an idempotent producer's
sequence numbers whole). So the bytes sent are the bytes stored, and the
partition answers the stored batch's position: the base offset a Kafka
client adds record indexes to. Refused (nothing stored): record batches of
magic 0 or 1 (a MessageSet of Produce versions before 3, which raylog does
not serve), control batches (a transaction's markers: only the transaction
coordinator writes them), an unknown codec. Transactional batches (attributes
bit 4) are stored as they came: the partition tracks their transaction
(:mod:`raylog.storage.transactions`) until the coordinator's marker ends it
(:mod:`raylog.kafka.transactions`).

Fetch of format 1 (:func:`encode_batch`): stored format-2 batches go to a
client as they are (:mod:`raylog.kafka.handlers`); the paper's format-1
messages are converted: raylog records ``(offset, timestamp, key, value)``
become one uncompressed Kafka batch (its records section by the compiled
``_kafkarecords.encode`` where it is built). Its layout, big-endian:

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
message): clients continue at ``lastOffset + 1`` (librdkafka, kafka-python
and aiokafka do for format v2), which is then the next message's offset
rather than an offset inside the message just read -- as a stored format-2
batch's own lastOffsetDelta does.

Pure functions; any thread.
"""

from __future__ import annotations

import struct

from crc32c import crc32c

from raylog.config import INFLATED_FACTOR, TopicConfig
from raylog.errors import InvalidMessageError, MessageTooLargeError
from raylog.storage import record_batch
from raylog.storage.record_batch import HEADER_SIZE, LOG_OVERHEAD, MAX_BATCH_LENGTH

try:  # the per-record loops in C (raylog/kafka/_kafkarecords.c); this module's own are the reference
    from raylog.kafka import _kafkarecords
except ImportError:  # a build without a compiler
    _kafkarecords = None

#: Kafka batch codecs accepted in a Produce (docs/design.md section 2)
KAFKA_CODECS = record_batch.KAFKA_CODECS

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


#: the bound of :func:`to_stored` on an inflated records section when none is given (a topic's default)
DEFAULT_MAX_INFLATED_BYTES = INFLATED_FACTOR * TopicConfig.max_message_bytes
#: attributes bit 5: a control batch (a transaction's marker)
_CONTROL = 0x20
_CODEC_MASK = 0x07


def to_stored(data, max_message_bytes: int = TopicConfig.max_message_bytes,
              max_inflated_bytes: int = DEFAULT_MAX_INFLATED_BYTES) -> tuple[bytes, int]:
    """``(format-2 bytes to store, record count)`` of the Kafka batches of one
    Produce partition (see the module docstring); raises
    :class:`RecordsRefused` and then nothing of ``data`` is to be stored."""
    pos, total, count = 0, len(data), 0
    parts = []
    while pos < total:
        if total - pos < HEADER_SIZE:
            raise RecordsRefused(CORRUPT_MESSAGE, f"a record batch is cut off after {total - pos} bytes")
        magic = data[pos + 16]
        if magic != record_batch.MAGIC:
            raise RecordsRefused(INVALID_RECORD, f"record batches of magic {magic} are not accepted; use magic 2 "
                                                 f"(Produce version 3 or later)")
        attributes = int.from_bytes(data[pos + 21:pos + 23], "big")
        codec = attributes & _CODEC_MASK
        if codec not in KAFKA_CODECS:
            raise RecordsRefused(UNSUPPORTED_COMPRESSION_TYPE,
                                 f"compression codec {codec} is not supported; use gzip, snappy, lz4, zstd or none")
        try:
            try:
                header = record_batch.validate_batch(data, pos, max_message_bytes, max_inflated_bytes)
            except InvalidMessageError:
                # a maxTimestamp below the records' is set as a Kafka broker sets it; anything else is refused
                raised = record_batch.with_max_timestamp_raised(data, pos, max_message_bytes, max_inflated_bytes)
                if raised is None:
                    raise
                size = record_batch.read_header(data, pos).size
                data = bytes(data[:pos]) + raised + bytes(data[pos + size:])
                total = len(data)
                header = record_batch.validate_batch(data, pos, max_message_bytes, max_inflated_bytes)
            if header.attributes & _CONTROL:
                raise RecordsRefused(INVALID_RECORD, "control batches are written by the transaction "
                                                     "coordinator only, never by a producer: send data batches "
                                                     "and end a transaction with EndTxn")
            batch = memoryview(data)[pos:pos + header.size]
            if record_batch.needs_reencode(header):
                batch = record_batch.reencode_uncompressed(data, pos, max_message_bytes, max_inflated_bytes)
                if len(batch) - LOG_OVERHEAD > min(max_message_bytes, MAX_BATCH_LENGTH):
                    raise RecordsRefused(
                        MESSAGE_TOO_LARGE,
                        f"a record batch holds {header.count} records in {header.size} compressed bytes; stored "
                        f"uncompressed (a batch is never shorter than its count) it takes {len(batch)} bytes, "
                        f"more than max_message_bytes ({max_message_bytes}): send smaller batches")
        except MessageTooLargeError as err:
            raise RecordsRefused(MESSAGE_TOO_LARGE, f"a record batch: {str(err).splitlines()[0]}") from None
        except InvalidMessageError as err:
            raise RecordsRefused(CORRUPT_MESSAGE, f"a record batch cannot be stored: {str(err).splitlines()[0]}") \
                from None
        parts.append(batch)
        count += header.count
        pos += header.size
    if len(parts) == 1:
        return bytes(parts[0]), count
    return b"".join(parts), count


def stored_batches(data, offset: int, max_bytes: int) -> tuple[memoryview, int, int]:
    """The whole format-2 batches at the start of ``data`` (a stored read)
    to send to a Kafka client fetching from ``offset``, without touching
    their records: ``(bytes, next offset, bytes of data walked)``, as
    :func:`~raylog.storage.record_batch.whole_batches` finds them (batches
    whose records all lie before ``offset`` passed over, the rest cut at
    whole batches within ``max_bytes``, the first kept one whole even when
    larger)."""
    first, end, next_offset, walked = record_batch.whole_batches(data, offset, max_bytes)
    return memoryview(data)[first:end], next_offset, walked


def zigzag_varint(value: int) -> bytes:
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
_NULL = zigzag_varint(-1)


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
    varint = zigzag_varint
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
