"""Format 2, the record batch: Kafka's RecordBatch v2 byte for byte, with raylog's offsets (docs/design.md §2).

A batch at byte position ``p`` of a partition log, big-endian throughout
(byte ranges relative to ``p``)::

      field                 type    bytes     meaning
   1. baseOffset            i64     0..8      set at append: ``p``, the batch's position (its offset)
   2. batchLength           i32     8..12     bytes after this field; the batch is 12 + batchLength bytes
   3. partitionLeaderEpoch  i32     12..16    set at append: the leader epoch that appended it (-1 before)
   4. magic                 i8      16        2 (MAGIC)
   5. crc                   u32     17..21    CRC32C (Castagnoli) of bytes 21 .. 12 + batchLength
                                              (attributes to the end; fields 1-4 lie outside it)
   6. attributes            i16     21..23    bits 0-2: codec of the records section, Kafka's numbers
                                              (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd); bit 3:
                                              timestamp type (0 CreateTime, 1 LogAppendTime); bit 4:
                                              transactional; bit 5: control; bits 6-15: 0
   7. lastOffsetDelta       i32     23..27    raylog's: 12 + batchLength - 1, so that
                                              baseOffset + lastOffsetDelta + 1 is the next batch's
                                              position (a Kafka client writes count - 1: rewritten,
                                              with the crc, at append, see :func:`stamp`)
   8. baseTimestamp         i64     27..35    the first record's timestamp, ms
   9. maxTimestamp          i64     35..43    the largest record timestamp (for LogAppendTime: the
                                              append time, which every record then reports)
  10. producerId            i64     43..51    the idempotent/transactional producer's id, -1 for none
  11. producerEpoch         i16     51..53    its epoch, -1 for none
  12. baseSequence          i32     53..57    the first record's sequence number, -1 for none
  13. count                 i32     57..61    number of records (at least 1; 0 only in an empty batch,
                                              below)
  14. records               bytes   61..      ``count`` records back to back; with a codec, the
                                              whole section is one stream of the codec

``HEADER_SIZE`` (61) bytes are fixed. Each record (Kafka's varints are
zigzag-encoded signed base-128 varints, least significant group first; a
*varint* holds an i32 in at most 5 bytes, a *varlong* an i64 in at most 10)::

      field            type      meaning
   1. length           varint    bytes of the record after this field
   2. attributes       i8        0 (unused by Kafka)
   3. timestampDelta   varlong   record timestamp - baseTimestamp
   4. offsetDelta      varint    i, the record's index in the batch (its offset is baseOffset + i)
   5. keyLength        varint    -1 for a null key, else the key's length
   6. key              bytes     keyLength bytes
   7. valueLength      varint    -1 for a null value (a tombstone), else the value's length
   8. value            bytes     valueLength bytes
   9. headers count    varint    number of headers (>= 0), in order, duplicates allowed
      each header:
  10. keyLength        varint    the key's length (>= 0; a header key is never null)
  11. key              bytes     UTF-8
  12. valueLength      varint    -1 for a null value, else its length
  13. value            bytes     valueLength bytes

**Offsets.** Record ``i`` of the batch at ``p`` has offset ``p + i``. For that
a batch is never shorter than its count (``12 + batchLength >= count``).
:func:`encode_batch` stores a compressed batch that would be shorter
uncompressed instead (it does not split: one batch in, one batch out, which
keeps the producer's sequence numbers and transactions whole), and
:func:`reencode_uncompressed` does the same for a client's batch at append.
An uncompressed batch always satisfies the rule: every record is at least 7
bytes (one byte each for fields 1, 3, 4, 5, 7, 9 and the i8 of field 2), so
``12 + batchLength = 61 + sum(record sizes) >= 61 + 7 * count > count``.

**Empty batches.** A batch with count 0, no records (batchLength 49) and
lastOffsetDelta >= 0 is what the log's cleaner keeps of a producer's last
batch when it removes every record of that batch from some index ``j`` on
(Kafka's cleaner keeps such a batch too): baseOffset = the batch's
baseOffset + ``j``, lastOffsetDelta = count - 1 - ``j`` (it spans the
removed records' offsets), baseSequence = the batch's baseSequence + ``j``,
the producer id, epoch, timestamps and attributes as they were. Its last
sequence is ``baseSequence + lastOffsetDelta`` (Kafka's rule), the
producer's last sequence when that batch was written, so that the
producer's state rebuilt from a cleaned log is what it was. Readers pass
over it (no record; the next offset is ``baseOffset + lastOffsetDelta +
1``, as after any batch); only a stored batch may be empty:
:func:`validate_batch` refuses one at append.

**Which format is at a position.** Format 1's magic (u8 = 1) is byte 8 of a
message; here byte 8 is the high byte of batchLength, which is 0 for every
batch under 16 MiB (``max_message_bytes`` is far below; its default is 1 MiB)
and byte 16 is the magic 2. So byte 8 tells the formats apart
(:func:`format_at`): 1 is format 1, 0 with byte 16 = 2 is format 2; anything
else is neither. For the rule to be exact, batchLength is bounded by
:data:`MAX_BATCH_LENGTH` (16 MiB - 1) whatever ``max_message_bytes`` says:
:func:`validate_batch` refuses a longer batch (:class:`MessageTooLargeError`),
and a re-encoded batch (:func:`reencode_uncompressed`) longer than that is
refused by the log that would store it. Segments hold one format each (the storage layer records it
per segment), which readers use first; :func:`format_at` is the check of the
bytes themselves.

Modules: this one defines the format, encodes, validates, stamps and decodes
batches; codecs come from :mod:`raylog.storage.compression`; the errors are
those of :mod:`raylog.errors` that format 1 raises (with ``offset`` naming the
batch), so readers handle both formats alike.

All functions are pure and thread-safe (:func:`stamp_into` writes only the
buffer it is given).

Fast path: :mod:`raylog.storage._speedups` encodes uncompressed batches
(``batch_encode``) and the records to compress (``batch_records``) and validates and decodes records
sections, uncompressed or once decompressed (``batch_validate``,
``batch_decode``); the Python code here is the reference and gives the same
results and the same errors (on any doubt the fast path returns ``None`` and
the Python code runs). :data:`ACCELERATED` tells whether it is in use;
``RAYLOG_PURE_PYTHON=1`` forces the Python code.
"""

from __future__ import annotations

import os
import struct
import time
from typing import Iterator, NamedTuple, Sequence

import zstandard
from crc32c import crc32c

from raylog.errors import (
    ConfigError,
    CorruptMessageError,
    InvalidMessageError,
    MessageTooLargeError,
)
from raylog.storage import compression as _compression
from raylog.storage.message import DEFAULT_MAX_MESSAGE_BYTES, INNER_SET_FACTOR

__all__ = [
    "ACCELERATED",
    "MAGIC",
    "HEADER_SIZE",
    "LOG_OVERHEAD",
    "MIN_RECORD_SIZE",
    "MAX_BATCH_LENGTH",
    "KAFKA_CODECS",
    "TIMESTAMP_LOG_APPEND",
    "BatchHeader",
    "Record",
    "DecodedBatch",
    "encode_batch",
    "with_producer",
    "encode_records",
    "read_header",
    "format_at",
    "iter_batches",
    "validate_batch",
    "check_frame",
    "reencode_uncompressed",
    "stamp",
    "stamp_into",
    "decode_batch",
    "decode_batch_as",
    "decode_batches_as",
]

MAGIC = 2
HEADER_SIZE = 61
#: baseOffset and batchLength, which batchLength does not count
LOG_OVERHEAD = 12
#: the smallest record: seven one-byte fields (see the module's docstring)
MIN_RECORD_SIZE = 7
#: the largest batchLength of a stored batch: its top byte (byte 8 of the
#: batch) stays 0, which tells format 2 from format 1 ("Which format is at a position")
MAX_BATCH_LENGTH = (1 << 24) - 1

CODEC_NONE, CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD = 0, 1, 2, 3, 4
#: Kafka's codec ids (attributes bits 0-2) -> name
KAFKA_CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
_CODEC_BY_NAME = {None: 0, **{name: cid for cid, name in KAFKA_CODECS.items()}}
_CODEC_MASK = 0x07
TIMESTAMP_LOG_APPEND = 0x08
_TRANSACTIONAL = 0x10
_CONTROL = 0x20
_KNOWN_ATTRIBUTES = 0x3F

_HEADER = struct.Struct(">qiibIhiqqqhii")
assert _HEADER.size == HEADER_SIZE
# attributes .. count: the part of the header the crc covers
_CRC_HEAD = struct.Struct(">hiqqqhii")
_PREFIX = struct.Struct(">qiib")  # baseOffset, batchLength, partitionLeaderEpoch, magic
_LENGTH = struct.Struct(">i")
_CRC = struct.Struct(">I")
_CRC_AT = 17
_ATTRIBUTES_AT = 21
_MAX_TIMESTAMP_AT = 35
_LAST_OFFSET_DELTA_AT = 23
_LEADER_EPOCH_AT = 12
_MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD
#: the bytes :func:`format_at` reads at a position (up to the magic, byte 16)
FORMAT_PREFIX = 17

if os.environ.get("RAYLOG_PURE_PYTHON", "") in ("", "0"):
    try:
        from raylog.storage import _speedups

        if not hasattr(_speedups, "batch_records"):  # an older build without format 2
            _speedups = None
    except ImportError:
        _speedups = None
else:
    _speedups = None
#: whether the compiled fast path is in use for format 2
ACCELERATED = _speedups is not None


class BatchHeader(NamedTuple):
    """The 61 fixed bytes of a batch, read without touching its records."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    count: int

    @property
    def size(self) -> int:
        """The whole batch: 12 + batchLength bytes."""
        return LOG_OVERHEAD + self.batch_length

    @property
    def next_offset(self) -> int:
        """baseOffset + lastOffsetDelta + 1: the next batch's position once stamped."""
        return self.base_offset + self.last_offset_delta + 1

    @property
    def codec(self) -> int:
        return self.attributes & _CODEC_MASK

    @property
    def log_append_time(self) -> bool:
        return bool(self.attributes & TIMESTAMP_LOG_APPEND)

    @property
    def transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL)

    @property
    def control(self) -> bool:
        return bool(self.attributes & _CONTROL)

    @property
    def last_sequence(self) -> int:
        """The last record's sequence number (-1 without a producer)."""
        if self.base_sequence < 0:
            return -1
        if self.count == 0:  # an empty batch (module docstring, "Empty batches"): Kafka's rule
            return (self.base_sequence + self.last_offset_delta) & 0x7FFFFFFF
        return (self.base_sequence + self.count - 1) & 0x7FFFFFFF

    @property
    def empty(self) -> bool:
        """An empty batch: what the cleaner keeps of a producer's last batch
        whose records it all removed (module docstring, "Empty batches")."""
        return self.count == 0


class Record(NamedTuple):
    """One decoded record. ``key``/``value`` are ``None`` when null, ``b""`` when empty."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


class DecodedBatch(NamedTuple):
    """A decoded batch: its header and its records (those from the asked offset on)."""

    header: BatchHeader
    records: list[Record]

    @property
    def control(self) -> bool:
        """A control batch (a transaction marker): its records are not for consumers."""
        return self.header.control

    @property
    def next_offset(self) -> int:
        return self.header.next_offset


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _codec_of(compression) -> int:
    if isinstance(compression, int) and compression in KAFKA_CODECS:
        return compression
    try:
        return _CODEC_BY_NAME[compression]
    except (KeyError, TypeError):
        raise ConfigError(
            f"unknown compression {compression!r}; use one of None, 'gzip', 'snappy', 'lz4', 'zstd'"
        ) from None


# --------------------------------------------------------------------------
# varints (Kafka's: zigzag, base 128, least significant group first)


def _zigzag_bytes(n: int, bits: int) -> bytes:
    u = ((n << 1) ^ (n >> (bits - 1))) & ((1 << bits) - 1)
    out = bytearray()
    while u >= 0x80:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)
    return bytes(out)


# Small varints are the common case: precomputed for -1 .. 16383.
_SMALL = {n: _zigzag_bytes(n, 32) for n in range(-1, 1 << 14)}


def _varint(n: int) -> bytes:
    b = _SMALL.get(n)
    return b if b is not None else _zigzag_bytes(n, 32)


def _varlong(n: int) -> bytes:
    b = _SMALL.get(n)
    return b if b is not None else _zigzag_bytes(n, 64)


class _BadRecord(Exception):
    """Raised inside the record walk; turned into an InvalidMessageError naming the batch."""


def _read_varint(buf, pos: int, end: int, max_bytes: int) -> tuple[int, int]:
    """(value, next position) of the varint at ``pos``; at most ``max_bytes`` bytes (5 or 10)."""
    shift = 0
    u = 0
    for i in range(max_bytes):
        if pos >= end:
            raise _BadRecord("a varint runs past the end of its record")
        b = buf[pos]
        pos += 1
        u |= (b & 0x7F) << shift
        if not b & 0x80:
            if u >> (32 if max_bytes == 5 else 64):
                raise _BadRecord("a varint is out of range")
            return (u >> 1) ^ -(u & 1), pos
        shift += 7
    raise _BadRecord(f"a varint is longer than {max_bytes} bytes")


# --------------------------------------------------------------------------
# encoding


def _record_bytes(i: int, ts_delta: int, key, value, headers) -> bytes:
    parts = [b"\x00", _varlong(ts_delta), _varint(i)]
    if key is None:
        parts.append(b"\x01")
    else:
        parts.append(_varint(len(key)))
        parts.append(key)
    if value is None:
        parts.append(b"\x01")
    else:
        parts.append(_varint(len(value)))
        parts.append(value)
    if not headers:
        parts.append(b"\x00")
    else:
        parts.append(_varint(len(headers)))
        for hkey, hvalue in headers:
            hk = hkey.encode("utf-8") if isinstance(hkey, str) else bytes(hkey)
            parts.append(_varint(len(hk)))
            parts.append(hk)
            if hvalue is None:
                parts.append(b"\x01")
            else:
                parts.append(_varint(len(hvalue)))
                parts.append(hvalue)
    body = b"".join(parts)
    return _varint(len(body)) + body


def _assemble(
    attributes: int,
    base_ts: int,
    max_ts: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    count: int,
    section: bytes,
    last_offset_delta: int | None = None,
) -> bytes:
    """Header + records section, with raylog's lastOffsetDelta unless given; baseOffset 0, epoch -1."""
    batch_length = _MIN_BATCH_LENGTH + len(section)
    lod = LOG_OVERHEAD + batch_length - 1 if last_offset_delta is None else last_offset_delta
    head = _CRC_HEAD.pack(attributes, lod, base_ts, max_ts, producer_id, producer_epoch, base_sequence, count)
    crc = crc32c(section, crc32c(head))
    return _PREFIX.pack(0, batch_length, -1, MAGIC) + _CRC.pack(crc) + head + section


def encode_batch(
    values: Sequence[bytes | None],
    keys: Sequence[bytes | None] | None = None,
    headers: Sequence[Sequence[tuple[str, bytes | None]] | None] | None = None,
    timestamp_ms: int | Sequence[int] | None = None,
    compression: str | int | None = None,
    *,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
    control: bool = False,
    log_append_time: bool = False,
) -> bytes:
    """One batch of ``len(values)`` records (at least one), ready to append.

    ``keys``/``headers`` are one per value (``None``: no key, no headers);
    ``timestamp_ms`` is one time for all (now when ``None``) or one per record.
    ``compression`` is a Kafka codec name or id. lastOffsetDelta is raylog's
    (12 + batchLength - 1), so the crc is final; baseOffset is 0 and
    partitionLeaderEpoch -1 until :func:`stamp`. A compressed batch shorter
    than its count is returned uncompressed (module docstring, "Offsets").
    """
    codec = _codec_of(compression)
    count = len(values)
    if count == 0:
        raise ConfigError("a record batch needs at least one record")
    if keys is not None and len(keys) != count:
        raise ConfigError(f"got {count} values but {len(keys)} keys; pass one key (or None) per value")
    if headers is not None and len(headers) != count:
        raise ConfigError(f"got {count} values but {len(headers)} header lists; pass one (or None) per value")
    if timestamp_ms is None:
        timestamp_ms = _now_ms()
    if isinstance(timestamp_ms, int):
        base_ts = max_ts = timestamp_ms
        deltas = None
    else:
        if len(timestamp_ms) != count:
            raise ConfigError(f"got {count} values but {len(timestamp_ms)} timestamps")
        base_ts = timestamp_ms[0]
        max_ts = max(timestamp_ms)
        deltas = [t - base_ts for t in timestamp_ms]
    if not (-1 <= producer_id < 1 << 63 and -1 <= producer_epoch < 1 << 15 and -1 <= base_sequence < 1 << 31):
        raise ConfigError(
            f"producer id {producer_id}, epoch {producer_epoch} or base sequence {base_sequence} is out of range "
            f"(an i64, i16 and i32 each, -1 for none)"
        )
    if not -(1 << 63) <= min(base_ts, max_ts) <= max(base_ts, max_ts) < 1 << 63:
        raise ConfigError(f"timestamps must fit an i64 of milliseconds (got {base_ts} .. {max_ts})")
    attributes = (
        (TIMESTAMP_LOG_APPEND if log_append_time else 0)
        | (_TRANSACTIONAL if transactional else 0)
        | (_CONTROL if control else 0)
    )
    section = None
    if _speedups is not None and deltas is None and headers is None:
        if codec == CODEC_NONE:
            batch = _speedups.batch_encode(values, keys, base_ts, attributes, producer_id, producer_epoch, base_sequence)
            if batch is not None:
                return batch
        section = _speedups.batch_records(values, keys)  # None: the code below builds it
    if section is None:
        no_keys = (None,) * count if keys is None else keys
        no_headers = (None,) * count if headers is None else headers
        section = b"".join(
            [
                _record_bytes(i, 0 if deltas is None else deltas[i], no_keys[i], values[i], no_headers[i])
                for i in range(count)
            ]
        )
    header_args = (base_ts, max_ts, producer_id, producer_epoch, base_sequence, count)
    if codec != CODEC_NONE:
        compressed = _compress(codec, section)
        if HEADER_SIZE + len(compressed) >= count:
            return _assemble(attributes | codec, *header_args, compressed)
    return _assemble(attributes, *header_args, section)


def encode_records(records: Sequence[tuple], compression=None, **kwargs) -> bytes:
    """:func:`encode_batch` of ``(key, value, headers, timestamp_ms)`` tuples."""
    return encode_batch(
        [r[1] for r in records],
        [r[0] for r in records],
        [r[2] for r in records],
        [r[3] for r in records],
        compression,
        **kwargs,
    )


def _compress(codec: int, data: bytes) -> bytes:
    if codec == CODEC_GZIP:
        return _compression.compress(_compression.CODEC_GZIP, data)
    if codec == CODEC_SNAPPY:
        return _compression.snappy_compress(data)
    if codec == CODEC_LZ4:
        return _compression.lz4_compress_kafka(data)
    if codec == CODEC_ZSTD:
        return _compression.compress(_compression.CODEC_ZSTD, data)
    return bytes(data)


def _zstd_unsized(data) -> bool:
    """Whether ``data`` opens with a zstd frame that does not declare its content size."""
    try:
        return zstandard.frame_content_size(data) == -1
    except zstandard.ZstdError:
        return False  # not zstd: the bounded decompress names the error


def _decompress(codec: int, data, max_bytes: int) -> bytes:
    if codec == CODEC_SNAPPY:
        return _compression.snappy_decompress(data, max_bytes)
    if codec == CODEC_ZSTD and _zstd_unsized(data):
        return _compression.zstd_decompress_unsized(data, max_bytes)
    internal = {CODEC_GZIP: _compression.CODEC_GZIP, CODEC_LZ4: _compression.CODEC_LZ4, CODEC_ZSTD: _compression.CODEC_ZSTD}
    return _compression.decompress(internal[codec], data, max_bytes)


# --------------------------------------------------------------------------
# headers and positions


def read_header(data, pos: int = 0) -> BatchHeader:
    """The header of the batch at ``pos`` (61 bytes must be there; nothing is checked)."""
    return BatchHeader._make(_HEADER.unpack_from(data, pos))


def format_at(data, pos: int = 0) -> int | None:
    """1 or 2: the format of the message or batch at ``pos``; ``None`` when neither
    (or fewer than 17 bytes are there). See "Which format is at a position"."""
    if len(data) - pos < FORMAT_PREFIX:
        return None
    b8 = data[pos + 8]
    if b8 == 1:
        return 1
    if b8 == 0 and data[pos + 16] == MAGIC:
        return 2
    return None


def iter_batches(data, pos: int = 0, end: int | None = None) -> Iterator[tuple[int, BatchHeader]]:
    """``(position in data, header)`` of each whole batch back to back in ``data[pos:end]``.

    Stops before a cut last batch (a fetch's last batch may be partial);
    raises :class:`InvalidMessageError` at bytes that are not a format-2 batch.
    Checks only the header's length and magic: :func:`validate_batch` checks the rest.
    """
    end = len(data) if end is None else end
    while end - pos >= HEADER_SIZE:
        header = read_header(data, pos)
        if header.magic != MAGIC or header.batch_length < _MIN_BATCH_LENGTH:
            raise _bad_header(header, pos)
        if pos + header.size > end:
            return
        yield pos, header
        pos += header.size


def next_offset_after(data, end: int) -> int | None:
    """The next offset after the whole batches back to back in ``data[:end]``
    (the last one's baseOffset + lastOffsetDelta + 1), None when there is
    none. Where a read continues after them: in a segment the cleaner
    rewrote (docs/design.md §3) bytes and offsets differ, and only the
    batches' own fields say where the next offset is."""
    pos, found = 0, None
    while end - pos >= HEADER_SIZE:
        base, length = struct.unpack_from(">qi", data, pos)
        (lod,) = _LENGTH.unpack_from(data, pos + _LAST_OFFSET_DELTA_AT)
        if pos + LOG_OVERHEAD + length > end:
            break
        found = base + lod + 1
        pos += LOG_OVERHEAD + length
    return found


def whole_batches(data, offset: int, max_bytes: int) -> tuple[int, int, int, int]:
    """Where the whole format-2 batches at the start of ``data`` (a stored
    read from the batch holding ``offset``) that a reader from ``offset``
    wants lie, without touching their records: ``(first, end, next offset,
    walked)``, positions in ``data``. Batches whose records all lie before
    ``offset`` (the read starts at the batch holding ``offset``; its last
    record may be below it) are passed over; the rest are cut at whole
    batches within ``max_bytes`` (the first kept one whole even when
    larger, as a Kafka broker answers). The walk stops at a cut last batch
    or at bytes of another format. ``first == end`` when no batch is kept;
    the next offset is where the reader goes on: the last walked batch's
    ``baseOffset + lastOffsetDelta + 1`` (``offset`` when nothing was
    walked); ``walked`` is how many bytes of ``data`` were walked."""
    pos, total = 0, len(data)
    first = end = -1
    next_offset = offset
    while total - pos >= HEADER_SIZE and format_at(data, pos) == 2:
        header = read_header(data, pos)
        if header.batch_length < _MIN_BATCH_LENGTH or pos + header.size > total:
            break
        if first < 0 and header.base_offset + header.count - 1 < offset:
            pos += header.size  # no record at or after offset
            next_offset = max(next_offset, header.next_offset)
            continue
        if first >= 0 and pos + header.size - first > max_bytes:
            break
        if first < 0:
            first = pos
        pos += header.size
        end = pos
        next_offset = header.next_offset
    if first < 0:
        return pos, pos, next_offset, pos
    return first, end, next_offset, pos


#: what :func:`whole_batches_in_file` reads at once after a batch smaller than
#: :data:`_SMALL_BATCH` bytes (the next headers are near: one read walks many)
_WALK_WINDOW = 32 * 1024
_SMALL_BATCH = 1024
#: baseOffset, batchLength, magic, lastOffsetDelta: what a walk needs of a header
_WALKED = struct.Struct(">qi4xb4x2xi")
_COUNT_AT = 57


def whole_batches_in_file(fd: int, position: int, length: int, offset: int, max_bytes: int):
    """:func:`whole_batches` of the ``length`` bytes at ``position`` of the
    open file ``fd`` (a segment's; a stored read from the batch holding
    ``offset``), walked where they lie: only the batches' headers are read
    (``os.pread``), never a copy of the whole range. After a batch of
    :data:`_SMALL_BATCH` bytes or more the next read is the next header
    alone; after a smaller one it is a window of :data:`_WALK_WINDOW` bytes,
    which holds the next headers too (one read for many small batches).
    Positions in the answer are relative to ``position``. The walk stops
    where :func:`whole_batches` stops, and where the file ends before the
    range does (cut under the reader)."""
    pos = 0
    first = end = -1
    next_offset = offset
    buf, buf_end = b"", 0  # the bytes last read, and where they end in the range
    window = HEADER_SIZE
    walked, count_at, pread = _WALKED.unpack_from, _LENGTH.unpack_from, os.pread
    while length - pos >= HEADER_SIZE:
        if buf_end - pos < HEADER_SIZE:
            buf = pread(fd, window if length - pos > window else length - pos, position + pos)
            buf_end = pos + len(buf)
            if buf_end - pos < HEADER_SIZE:
                break
        at = pos - buf_end + len(buf)
        base_offset, batch_length, magic, last_offset_delta = walked(buf, at)
        # byte 8 (batchLength's top byte) 0 and magic 2: format 2 (format_at)
        if magic != MAGIC or not _MIN_BATCH_LENGTH <= batch_length <= MAX_BATCH_LENGTH:
            break
        size = LOG_OVERHEAD + batch_length
        if pos + size > length:
            break
        window = HEADER_SIZE if size >= _SMALL_BATCH else _WALK_WINDOW
        if first < 0:
            if base_offset + count_at(buf, at + _COUNT_AT)[0] - 1 < offset:
                pos += size  # no record at or after offset
                next_offset = max(next_offset, base_offset + last_offset_delta + 1)
                continue
            first = pos
        elif pos + size - first > max_bytes:
            break
        pos += size
        end = pos
        next_offset = base_offset + last_offset_delta + 1
    if first < 0:
        return pos, pos, next_offset, pos
    return first, end, next_offset, pos


def _offset_of(header: BatchHeader, pos: int) -> int:
    return header.base_offset if header.base_offset else pos


def _bad_header(header: BatchHeader, pos: int) -> InvalidMessageError:
    offset = _offset_of(header, pos)
    if header.magic != MAGIC:
        return InvalidMessageError(
            f"batch at offset {offset} has magic {header.magic}, expected {MAGIC}", offset=offset
        )
    return InvalidMessageError(
        f"batch at offset {offset} claims batchLength {header.batch_length}, less than the minimum "
        f"{_MIN_BATCH_LENGTH}",
        offset=offset,
        size=header.batch_length,
    )


# --------------------------------------------------------------------------
# validation (the append side) and decoding (the read side)


def _inflated_limit(max_message_bytes: int, max_inflated_bytes: int | None) -> int:
    return INNER_SET_FACTOR * max_message_bytes if not max_inflated_bytes else max_inflated_bytes


def _check_frame(data, pos: int, max_message_bytes: int) -> BatchHeader:
    """The header of the batch at ``pos`` after checking sizes, magic, crc and attributes."""
    n = len(data)
    if n - pos < LOG_OVERHEAD:
        raise InvalidMessageError(
            f"batch at offset {pos} is incomplete: {n - pos} bytes, fewer than its 12-byte prefix "
            f"(a torn or cut batch)",
            offset=pos,
            partial=True,
        )
    (batch_length,) = _LENGTH.unpack_from(data, pos + 8)
    if batch_length > min(max_message_bytes, MAX_BATCH_LENGTH):
        if batch_length > MAX_BATCH_LENGTH:
            raise MessageTooLargeError(
                f"batch at offset {pos} claims {batch_length} bytes, more than {MAX_BATCH_LENGTH}, the "
                f"largest batchLength of format 2 (16 MiB - 1, whatever max_message_bytes says); send "
                f"smaller batches",
                offset=pos,
                size=batch_length,
                limit=MAX_BATCH_LENGTH,
            )
        raise MessageTooLargeError(
            f"batch at offset {pos} claims {batch_length} bytes, more than the limit of "
            f"{max_message_bytes}; raise max_message_bytes or send smaller batches",
            offset=pos,
            size=batch_length,
            limit=max_message_bytes,
        )
    if batch_length < _MIN_BATCH_LENGTH:
        raise InvalidMessageError(
            f"batch at offset {pos} claims batchLength {batch_length}, less than the minimum {_MIN_BATCH_LENGTH}",
            offset=pos,
            size=batch_length,
        )
    if n - pos < LOG_OVERHEAD + batch_length:
        raise InvalidMessageError(
            f"batch at offset {pos} is incomplete: {n - pos} bytes where it needs "
            f"{LOG_OVERHEAD + batch_length} (a torn or cut batch)",
            offset=pos,
            partial=True,
        )
    header = read_header(data, pos)
    offset = _offset_of(header, pos)
    if header.magic != MAGIC:
        raise _bad_header(header, pos)
    end = pos + header.size
    actual = crc32c(memoryview(data)[pos + _ATTRIBUTES_AT : end])
    if actual != header.crc:
        raise CorruptMessageError(
            f"batch at offset {offset} fails its CRC32C check (stored {header.crc:#010x}, "
            f"computed {actual:#010x}): its bytes were damaged on disk or in transit",
            offset=offset,
            stored_crc=header.crc,
            computed_crc=actual,
        )
    attrs = header.attributes
    if attrs & ~_KNOWN_ATTRIBUTES or (attrs & _CODEC_MASK) not in KAFKA_CODECS:
        raise InvalidMessageError(f"batch at offset {offset} has unknown attributes {attrs:#06x}", offset=offset)
    if header.count == 0 and header.batch_length == _MIN_BATCH_LENGTH and header.last_offset_delta >= 0:
        return header  # an empty batch (module docstring, "Empty batches"): readers pass over it
    if header.count < 1:
        raise InvalidMessageError(
            f"batch at offset {offset} has record count {header.count}; a batch holds at least one record",
            offset=offset,
        )
    if header.last_offset_delta not in (header.count - 1, header.size - 1):
        raise InvalidMessageError(
            f"batch at offset {offset} has lastOffsetDelta {header.last_offset_delta}; expected "
            f"{header.size - 1} (12 + batchLength - 1) or {header.count - 1} (count - 1, a Kafka client's)",
            offset=offset,
        )
    return header


def check_frame(data, pos: int = 0, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> BatchHeader:
    """The checks of :func:`validate_batch` short of the records: sizes, magic,
    crc (which covers the records), attributes, count, lastOffsetDelta; the
    header when they pass. What recovery checks of a stored batch."""
    return _check_frame(data, pos, max_message_bytes)


def _records_section(data, pos: int, header: BatchHeader, max_message_bytes, max_inflated_bytes) -> bytes:
    section = memoryview(data)[pos + HEADER_SIZE : pos + header.size]
    if header.codec == CODEC_NONE:
        return section
    try:
        return _decompress(header.codec, section, _inflated_limit(max_message_bytes, max_inflated_bytes))
    except InvalidMessageError as err:
        offset = _offset_of(header, pos)
        raise type(err)(
            f"in the {KAFKA_CODECS[header.codec]} batch at offset {offset}: {err}", **{**err.details, "offset": offset}
        ) from None


def _walk(section, header: BatchHeader, offset: int, skip_before: int, want: bool) -> list[Record]:
    """Check every record of ``section`` (and decode those with index >= ``skip_before`` when ``want``)."""
    count = header.count
    end = len(section)
    if count > end // MIN_RECORD_SIZE:
        raise InvalidMessageError(
            f"batch at offset {offset} claims {count} records, more than its {end} bytes of records can hold",
            offset=offset,
        )
    base_ts = header.base_timestamp
    max_ts = header.max_timestamp
    append_time = header.log_append_time
    out: list[Record] = []
    pos = 0
    i = 0
    try:
        for i in range(count):
            length, pos = _read_varint(section, pos, end, 5)
            if length < MIN_RECORD_SIZE - 1 or length > end - pos:
                raise _BadRecord(f"its length {length} does not fit the {end - pos} bytes left")
            rend = pos + length
            if section[pos] != 0:
                raise _BadRecord(f"its attributes are {section[pos]}, expected 0")
            ts_delta, p = _read_varint(section, pos + 1, rend, 10)
            offset_delta, p = _read_varint(section, p, rend, 5)
            if offset_delta != i:
                raise _BadRecord(f"its offsetDelta is {offset_delta}, expected {i}")
            ts = base_ts + ts_delta
            if not append_time and ts > max_ts:
                raise _BadRecord(f"its timestamp {ts} is later than the batch's maxTimestamp {max_ts}")
            klen, p = _read_varint(section, p, rend, 5)
            if klen < -1 or klen > rend - p:
                raise _BadRecord(f"its key length {klen} does not fit the record")
            key = None if klen < 0 else bytes(section[p : p + klen])
            p += max(klen, 0)
            vlen, p = _read_varint(section, p, rend, 5)
            if vlen < -1 or vlen > rend - p:
                raise _BadRecord(f"its value length {vlen} does not fit the record")
            value = None if vlen < 0 else bytes(section[p : p + vlen])
            p += max(vlen, 0)
            hcount, p = _read_varint(section, p, rend, 5)
            if hcount < 0 or hcount > rend - p:
                raise _BadRecord(f"its header count {hcount} does not fit the record")
            headers = []
            for _ in range(hcount):
                hklen, p = _read_varint(section, p, rend, 5)
                if hklen < 0 or hklen > rend - p:
                    raise _BadRecord(f"a header key length {hklen} does not fit the record")
                try:
                    hkey = bytes(section[p : p + hklen]).decode("utf-8")
                except UnicodeDecodeError:
                    raise _BadRecord("a header key is not UTF-8") from None
                p += hklen
                hvlen, p = _read_varint(section, p, rend, 5)
                if hvlen < -1 or hvlen > rend - p:
                    raise _BadRecord(f"a header value length {hvlen} does not fit the record")
                headers.append((hkey, None if hvlen < 0 else bytes(section[p : p + hvlen])))
                p += max(hvlen, 0)
            if p != rend:
                raise _BadRecord(f"its fields end {rend - p} bytes before its length says")
            pos = rend
            if want and i >= skip_before:
                out.append(Record(offset + i, max_ts if append_time else ts, key, value, headers))
        if pos != end:
            i = count
            raise _BadRecord(f"{end - pos} bytes follow the last of the {count} records")
    except _BadRecord as err:
        raise InvalidMessageError(f"batch at offset {offset}, record {i}: {err}", offset=offset, record=i) from None
    return out


def validate_batch(
    data, pos: int = 0, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, max_inflated_bytes: int | None = None,
    *, stored: bool = False,
) -> BatchHeader:
    """Check the batch at ``pos`` as a partition does before it appends it; its header when sound.

    Checked: batchLength against ``max_message_bytes`` from the 4 length bytes
    alone (before anything of that size is allocated), a whole batch present,
    magic, crc, attributes, count >= 1, lastOffsetDelta (raylog's or a Kafka
    client's), and every record (decompressed with the ``max_inflated_bytes``
    bound): varints, lengths, attributes, offsetDelta = i, timestamps, header
    keys in UTF-8, no bytes left over. Raises :class:`MessageTooLargeError`,
    :class:`InflatedSizeTooLargeError`, :class:`CorruptMessageError` or
    :class:`InvalidMessageError`, each naming the batch (``offset``) and what
    is wrong. A sound compressed batch shorter than its count is not an error:
    :func:`needs_reencode` tells, :func:`reencode_uncompressed` fixes it.
    An empty batch (module docstring, "Empty batches") is refused unless
    ``stored`` (a batch read from a log, which a cleaner may have left).
    """
    header = _check_frame(data, pos, max_message_bytes)
    if header.count == 0 and not stored:
        offset = _offset_of(header, pos)
        raise InvalidMessageError(
            f"batch at offset {offset} holds no records (count 0): a producer's batch holds at least one record "
            f"(an empty batch is only what a log's cleaner leaves of a producer's last batch)",
            offset=offset,
        )
    _records(data, pos, header, max_message_bytes, max_inflated_bytes, 0, False)
    return header


def with_max_timestamp_raised(
    data, pos: int = 0, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, max_inflated_bytes: int | None = None
) -> bytes | None:
    """The batch at ``pos`` with its maxTimestamp raised to its records'
    largest timestamp (and its crc computed again), when that alone kept it
    from :func:`validate_batch`: a create-time batch whose maxTimestamp is
    below a record's, as some producers write it (sarama before 1.26 sends
    -1). A Kafka broker sets maxTimestamp the same way before it appends.
    None when the batch is unsound for any other reason (or is sound)."""
    try:
        header = _check_frame(data, pos, max_message_bytes)
    except InvalidMessageError:
        return None
    if header.log_append_time or header.count < 1:
        return None
    lenient = header._replace(max_timestamp=(1 << 63) - 1)
    try:
        records = _records(data, pos, lenient, max_message_bytes, max_inflated_bytes, 0, True)
    except InvalidMessageError:
        return None
    largest = max(r.timestamp for r in records)
    if largest <= header.max_timestamp:
        return None
    batch = bytearray(memoryview(data)[pos : pos + header.size])
    struct.pack_into(">q", batch, _MAX_TIMESTAMP_AT, largest)
    struct.pack_into(">I", batch, _CRC_AT, crc32c(memoryview(batch)[_ATTRIBUTES_AT:]))
    return bytes(batch)


def needs_reencode(header: BatchHeader) -> bool:
    """Whether the batch is shorter than its count (only a compressed one can be)."""
    return header.size < header.count


def reencode_uncompressed(
    data, pos: int = 0, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, max_inflated_bytes: int | None = None
) -> bytes:
    """The batch at ``pos`` with its records stored uncompressed (same records,
    producer fields and flags; raylog's lastOffsetDelta; crc recomputed).

    For a compressed client batch shorter than its count (:func:`needs_reencode`);
    the result is never shorter than its count (module docstring, "Offsets").
    The batch is validated first. The result may exceed ``max_message_bytes``:
    the caller decides (it is at most ``max_inflated_bytes`` + 61 bytes).
    """
    header = validate_batch(data, pos, max_message_bytes, max_inflated_bytes)
    section = bytes(_records_section(data, pos, header, max_message_bytes, max_inflated_bytes))
    out = _assemble(
        header.attributes & ~_CODEC_MASK,
        header.base_timestamp,
        header.max_timestamp,
        header.producer_id,
        header.producer_epoch,
        header.base_sequence,
        header.count,
        section,
    )
    assert len(out) >= header.count
    return out


def stamp_into(buf: bytearray, pos: int, position: int, leader_epoch: int) -> None:
    """Set, in place, the fields of the batch at ``buf[pos:]`` that are *set at append*:
    baseOffset = ``position``, partitionLeaderEpoch = ``leader_epoch``; and, for a
    batch with a Kafka client's lastOffsetDelta, raylog's lastOffsetDelta and the crc.
    The batch must have been validated."""
    struct.pack_into(">q", buf, pos, position)
    struct.pack_into(">i", buf, pos + _LEADER_EPOCH_AT, leader_epoch)
    (batch_length,) = _LENGTH.unpack_from(buf, pos + 8)
    lod = LOG_OVERHEAD + batch_length - 1
    (current,) = _LENGTH.unpack_from(buf, pos + _LAST_OFFSET_DELTA_AT)
    if current != lod:
        struct.pack_into(">i", buf, pos + _LAST_OFFSET_DELTA_AT, lod)
        crc = crc32c(memoryview(buf)[pos + _ATTRIBUTES_AT : pos + LOG_OVERHEAD + batch_length])
        _CRC.pack_into(buf, pos + _CRC_AT, crc)


_PRODUCER_AT = 43  # producerId i64, producerEpoch i16, baseSequence i32
_PRODUCER_FIELDS = struct.Struct(">qhi")


def with_producer(batch, producer_id: int, producer_epoch: int, base_sequence: int) -> bytes:
    """A copy of the (one, whole) ``batch`` under another producer identity:
    producerId, producerEpoch and baseSequence set and the crc made again.
    A producer that moves to a fresh id after a gap numbers the batches it
    has not sent yet again with it."""
    buf = bytearray(batch)
    _PRODUCER_FIELDS.pack_into(buf, _PRODUCER_AT, producer_id, producer_epoch, base_sequence)
    _CRC.pack_into(buf, _CRC_AT, crc32c(memoryview(buf)[_ATTRIBUTES_AT:]))
    return bytes(buf)


def stamp(batch, position: int, leader_epoch: int = -1) -> bytes:
    """A copy of ``batch`` stamped at ``position`` (see :func:`stamp_into`)."""
    buf = bytearray(batch)
    stamp_into(buf, 0, position, leader_epoch)
    return bytes(buf)


def decode_batch(
    data,
    pos: int = 0,
    from_offset: int | None = None,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    max_inflated_bytes: int | None = None,
) -> DecodedBatch:
    """Decode the batch at ``pos`` (checked as :func:`validate_batch` does).

    Record ``i`` reports offset baseOffset + i (a batch not yet stamped,
    baseOffset 0, reports ``pos + i``); records before ``from_offset`` are
    skipped. A LogAppendTime batch reports maxTimestamp for every record. A
    control batch is decoded too: :attr:`DecodedBatch.control` tells the
    reader not to hand its records to consumers.
    """
    header = _check_frame(data, pos, max_message_bytes)
    offset = _offset_of(header, pos)
    skip = 0 if from_offset is None else max(0, from_offset - offset)
    return DecodedBatch(header, _records(data, pos, header, max_message_bytes, max_inflated_bytes, skip, True))


def decode_batch_as(
    data,
    pos: int,
    record_type: type,
    prefix: tuple,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    max_inflated_bytes: int | None = None,
) -> tuple[BatchHeader, list | None]:
    """The batch at ``pos`` checked as :func:`decode_batch` does, its records
    built directly as ``record_type`` instances of ``(*prefix, offset,
    timestamp, key, value)``, with the headers as a seventh item when a
    record has any (the consumer's messages, :mod:`raylog.consumer.record`):
    ``(header, rows)``. ``rows`` is None when the compiled fast path is off
    or declines (the caller then decodes with :func:`decode_batch`); a
    control batch gives ``[]``."""
    header = _check_frame(data, pos, max_message_bytes)
    if header.control:
        return header, []
    if _speedups is None:
        return header, None
    if header.codec == CODEC_NONE:
        section, start, end = data, pos + HEADER_SIZE, pos + header.size
    else:
        section = _records_section(data, pos, header, max_message_bytes, max_inflated_bytes)
        start, end = 0, len(section)
    rows = _speedups.batch_decode(section, start, end, header.count, header.base_timestamp, header.max_timestamp,
                                  header.log_append_time, _offset_of(header, pos), 0, record_type, prefix)
    return header, rows


def decode_batches_as(data, start: int, end: int, max_message_bytes: int, record_type: type, prefix: tuple,
                      last_type: type | None = None):
    """The run of uncompressed, non-control batches from ``start`` (before
    ``end``) decoded in one compiled pass into ``record_type`` instances as
    :func:`decode_batch_as` builds them: ``(rows, ends, stop)``, ``ends`` the
    ``(index in rows, next offset)`` of each batch's last record, ``stop``
    the position of the first batch not taken (``end``, a cut, compressed,
    control or faulty batch: decode it with :func:`decode_batch`, which
    raises the error of a faulty one). With ``last_type`` (a tuple subclass
    whose instances have a ``__dict__``) each batch's last record is built
    as a ``last_type`` with its next offset in ``_next_offset``, and ``ends``
    is empty. None when the compiled path is off."""
    if _speedups is None or not hasattr(_speedups, "batches_decode"):
        return None
    return _speedups.batches_decode(data, start, end, min(max_message_bytes, MAX_BATCH_LENGTH), record_type, prefix,
                                    last_type)


def _records(data, pos: int, header: BatchHeader, max_message_bytes, max_inflated_bytes, skip: int, want: bool):
    """Check the records of the (checked) batch at ``pos``; with ``want``, decode those from index ``skip``.
    The fast path walks the records section (decompressed first when compressed); the
    reference walks it when the fast path is off or declines, and raises the error."""
    if header.codec == CODEC_NONE:
        section, start, end = data, pos + HEADER_SIZE, pos + header.size
    else:
        section = _records_section(data, pos, header, max_message_bytes, max_inflated_bytes)
        start, end = 0, len(section)
    offset = _offset_of(header, pos)
    if _speedups is not None:
        args = (section, start, end, header.count, header.base_timestamp, header.max_timestamp,
                header.log_append_time)
        if not want:
            if _speedups.batch_validate(*args):
                return []
        else:
            rows = _speedups.batch_decode(*args, offset, skip, Record)
            if rows is not None:
                return rows
    return _walk(memoryview(section)[start:end], header, offset, skip, want)
