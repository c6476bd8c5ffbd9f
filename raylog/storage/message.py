"""The message format: the same bytes on disk and on the wire (docs/design.md §2).

A message at byte offset ``o`` of a partition log, big-endian throughout::

     field        type   bytes       meaning
  1. size         u32    o+0..4      number of bytes that follow this field
  2. crc          u32    o+4..8      CRC32C (Castagnoli) of every byte after this field,
                                     i.e. of bytes o+8 .. o+4+size
  3. magic        u8     o+8         format version, always 1 (MAGIC)
  4. attributes   u8     o+9         bits 0-2: codec of ``value`` (0 none, 1 gzip,
                                     2 zstd, 3 lz4); bits 3-7 are 0
  5. timestamp    i64    o+10..18    producer's create time, ms since the epoch
  6. key_length   i32    o+18..22    -1 when there is no key, else the key's length
  7. key          bytes  o+22..      key_length bytes (none when key_length is -1)
  8. value        bytes  ..o+4+size  the rest of the message

``LOG_OVERHEAD`` (4, the size field) plus ``size`` is the whole message; the
fixed part (fields 1-6) is ``HEADER_SIZE`` (22) bytes, so ``size`` is at least
18. The **offset** of a message is the byte position of its size field in the
log and the next message starts at ``o + 4 + size``; there is no other id.

A **message set** is a run of whole messages back to back. A compressed set
is one *wrapper* message whose attributes carry the codec and whose value is
the compressed bytes of the inner, uncompressed set. Inner messages may not be
wrappers themselves. A wrapper's fields::

  3. magic        1
  4. attributes   the codec (1 gzip, 2 zstd, 3 lz4)
  5. timestamp    the latest timestamp of the inner set
  6. key_length   -1, or the length of the padding (below)
  7. key          padding: key_length zero bytes, which readers skip unread
  8. value        the compressed inner set (one stream of the codec)

**Record offsets.** When decoded, the i-th inner message (from 0) of a
wrapper at offset ``w`` reports the offset ``w + i``, so every message has an
offset of its own and offsets only grow. For that a wrapper is never shorter
than the number of messages it holds: :func:`encode_message_set` pads a
wrapper whose ``4 + size`` would be below its count with a key of zero bytes
(readers ignore a wrapper's key: the decoders, validation, counting, the
compiled fast path, which stops at every wrapper, and the Spark reader all
skip it and decompress the value). The consumer's position after inner message
``i`` is ``w + i + 1`` while messages remain in the wrapper and the wrapper's
end after the last one; a fetch from an offset inside a wrapper is answered
from the wrapper (:mod:`raylog.storage.log_reads`) and the reader skips the
inner messages before the offset. A wrapper written before the padding may be
shorter than its count: its offsets are clamped to its last byte (``min(w +
i, end - 1)``, see :func:`inner_offset`), so they never reach the next
message; the messages sharing ``end - 1`` are delivered again after a resume
there (at-least-once, the old behaviour for that tail).

Modules: this one defines the format and encodes;
:mod:`raylog.storage.validation` (``validate_message_set``,
``scan_message_set``, ``message_size_at``) checks sets before they are
stored; :mod:`raylog.storage.decoding` (``decode_messages``) decodes them.

Checks:

* :func:`~raylog.storage.decoding.decode_messages` (consumer side) checks every CRC, magic, attributes
  and key length, inner messages of wrappers included.
* :func:`~raylog.storage.validation.validate_message_set` (append side) checks the same for every outer
  message and also decompresses each wrapper (with a bound) and checks every
  inner message, so that a partition never stores a batch its consumers cannot
  decode. The cost is one decompression per compressed batch at the broker.
* A size field larger than ``max_message_bytes`` is refused from the 4 size
  bytes alone, before anything of that size is allocated. A decompressed inner
  set may be at most ``max_inflated_bytes`` bytes (the topic's setting;
  ``INNER_SET_FACTOR * max_message_bytes`` when not given, the default of
  :attr:`raylog.TopicConfig.max_inflated_bytes`): a wrapper that inflates
  further raises :class:`InflatedSizeTooLargeError`, checked before it is
  inflated past the limit (:func:`~raylog.storage.compression.decompress`),
  at append and in every decode.

All functions are pure and thread-safe.

Fast path: the compiled module :mod:`raylog.storage._speedups` (built from
``_speedups.c`` when a compiler is at hand; optional) checks and decodes runs
of *plain* messages. It stops at the first message it does not fully handle
(a wrapper, a bad CRC or header, a cut or oversized message) and the Python
code here, the reference, carries on from that position: it raises the
errors (so they are the same either way) and unpacks the wrappers.
:data:`ACCELERATED` tells whether the fast path is in use; set the
environment variable ``RAYLOG_PURE_PYTHON=1`` to force the Python code.
"""

from __future__ import annotations

import os
import struct
import time
from typing import Sequence

from crc32c import crc32c

from raylog.errors import ConfigError
from raylog.storage.compression import (
    CODEC_GZIP,
    CODEC_LZ4,
    CODEC_NAMES,
    CODEC_NONE,
    CODEC_ZSTD,
    codec_id,
    compress,
)

__all__ = [
    "ACCELERATED",
    "MAGIC",
    "LOG_OVERHEAD",
    "HEADER_SIZE",
    "MIN_MESSAGE_SIZE",
    "CODEC_NONE",
    "CODEC_GZIP",
    "CODEC_ZSTD",
    "CODEC_LZ4",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "INNER_SET_FACTOR",
    "codec_id",
    "encode_message",
    "encode_message_set",
    "inner_offset",
]

MAGIC = 1
#: bytes of the size field, which ``size`` does not count
LOG_OVERHEAD = 4
#: bytes of the fixed part: size, crc, magic, attributes, timestamp, key_length
HEADER_SIZE = 22
#: the smallest legal value of the size field (no key, empty value)
MIN_MESSAGE_SIZE = HEADER_SIZE - LOG_OVERHEAD
DEFAULT_MAX_MESSAGE_BYTES = 1 << 20
#: by default a wrapper's decompressed inner set may be this many times
#: max_message_bytes (see ``max_inflated_bytes``)
INNER_SET_FACTOR = 8

CODEC_MASK = 0x07

# The 22 fixed bytes (fields 1-6), with magic and attributes read as one u16:
# 0x0100 is magic 1 and no codec, the common case, tested with one comparison.
HEADER_FAST = struct.Struct(">IIHqi")
# ... and without the timestamp, for validation, which does not need it.
HEADER_CHECK = struct.Struct(">IIH8xi")
_PLAIN = MAGIC << 8
# The hot loops spell these as literals (a local constant is cheaper than a global).
assert (HEADER_SIZE, MIN_MESSAGE_SIZE, _PLAIN) == (22, 18, 256)
SIZE_AND_CRC = struct.Struct(">II")  # size, crc
_BODY_HEAD = struct.Struct(">BBqi")  # magic, attributes, timestamp, key_length
SIZE_FIELD = struct.Struct(">I")


if os.environ.get("RAYLOG_PURE_PYTHON", "") in ("", "0"):
    try:
        from raylog.storage import _speedups
    except ImportError:  # not built: the Python code below does all the work
        _speedups = None
else:
    _speedups = None
#: whether the compiled fast path (``raylog.storage._speedups``) is in use
ACCELERATED = _speedups is not None
# The fast path's answer when it stopped at a message that the reference
# handles by itself: a wrapper, or a bad magic, attributes or key length.
STOP_HEADER = 3
assert _speedups is None or _speedups.STATUS_HEADER == STOP_HEADER


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


# --------------------------------------------------------------------------
# encoding


def encode_message(
    value: bytes,
    key: bytes | None = None,
    timestamp_ms: int | None = None,
    codec: int = CODEC_NONE,
) -> bytes:
    """One message. ``codec`` only sets the attributes (the caller compressed ``value``)."""
    if codec not in CODEC_NAMES:
        raise ConfigError(f"unknown codec id {codec!r}; use 0 (none), 1 (gzip), 2 (zstd) or 3 (lz4)")
    ts = _now_ms() if timestamp_ms is None else timestamp_ms
    if key is None:
        head = _BODY_HEAD.pack(MAGIC, codec, ts, -1)
        return SIZE_AND_CRC.pack(MIN_MESSAGE_SIZE + len(value), crc32c(value, crc32c(head))) + head + value
    head = _BODY_HEAD.pack(MAGIC, codec, ts, len(key))
    crc = crc32c(value, crc32c(key, crc32c(head)))
    return b"".join((SIZE_AND_CRC.pack(MIN_MESSAGE_SIZE + len(key) + len(value), crc), head, key, value))


def inner_offset(wrapper_offset: int, wrapper_end: int, index: int) -> int:
    """The record offset of inner message ``index`` of the wrapper that spans
    ``[wrapper_offset, wrapper_end)``: ``wrapper_offset + index``, clamped to
    the wrapper's last byte for an old wrapper shorter than its count."""
    return min(wrapper_offset + index, wrapper_end - 1)


def _wrap(codec: int, inner: bytes, count: int, timestamp_ms: int) -> bytes:
    """The wrapper of an inner set of ``count`` messages, padded (its key) to
    at least ``count`` bytes so that each inner message has an offset of its own."""
    value = compress(codec, inner)
    short = count - (HEADER_SIZE + len(value))
    return encode_message(value, bytes(short) if short > 0 else None, timestamp_ms, codec)


def _append_message(append, value: bytes, key: bytes | None, timestamp_ms: int) -> None:
    """Append the parts of one uncompressed message (the reference encoder's
    step for a keyed message or one with its own timestamp)."""
    head = _BODY_HEAD.pack(MAGIC, 0, timestamp_ms, -1 if key is None else len(key))
    if key is None:
        append(SIZE_AND_CRC.pack(MIN_MESSAGE_SIZE + len(value), crc32c(value, crc32c(head))))
        append(head)
    else:
        append(SIZE_AND_CRC.pack(MIN_MESSAGE_SIZE + len(key) + len(value), crc32c(value, crc32c(key, crc32c(head)))))
        append(head)
        append(key)
    append(value)


def encode_message_set(
    values: Sequence[bytes],
    keys: Sequence[bytes | None] | None = None,
    timestamp_ms: int | Sequence[int] | None = None,
    compression: str | None = None,
) -> bytes:
    """A message set of ``values`` (with ``keys`` and timestamps, when given).

    ``timestamp_ms`` is one time for every message (now when ``None``) or one
    per message. With ``compression`` the whole set becomes the value of one
    wrapper message (timestamp: the latest of the set; no key, or zero bytes
    of padding so that the wrapper is at least ``len(values)`` bytes long).
    """
    codec = codec_id(compression)
    count = len(values)
    if keys is not None and len(keys) != count:
        raise ConfigError(f"got {count} values but {len(keys)} keys; pass one key (or None) per value")
    if timestamp_ms is None:
        timestamp_ms = _now_ms()
    if _speedups is not None and (isinstance(timestamp_ms, int) or len(timestamp_ms) == count):
        inner = _speedups.encode(values, keys, timestamp_ms)  # None: the code below builds it
        if inner is not None:
            if codec == CODEC_NONE or not inner:
                return inner
            wrapper_ts = timestamp_ms if isinstance(timestamp_ms, int) else max(timestamp_ms)
            return _wrap(codec, inner, count, wrapper_ts)
    parts: list[bytes] = []
    append = parts.append
    prefix = SIZE_AND_CRC.pack
    if isinstance(timestamp_ms, int):
        wrapper_ts = timestamp_ms
        plain = _BODY_HEAD.pack(MAGIC, 0, timestamp_ms, -1)
        plain_crc = crc32c(plain)
        if keys is None:
            for value in values:
                append(prefix(MIN_MESSAGE_SIZE + len(value), crc32c(value, plain_crc)))
                append(plain)
                append(value)
        else:
            for value, key in zip(values, keys):
                if key is None:
                    append(prefix(MIN_MESSAGE_SIZE + len(value), crc32c(value, plain_crc)))
                    append(plain)
                    append(value)
                else:
                    _append_message(append, value, key, timestamp_ms)
    else:
        if len(timestamp_ms) != count:
            raise ConfigError(f"got {count} values but {len(timestamp_ms)} timestamps")
        wrapper_ts = max(timestamp_ms, default=0)
        for value, key, ts in zip(values, keys if keys is not None else (None,) * count, timestamp_ms):
            _append_message(append, value, key, ts)
    inner = b"".join(parts)
    if codec == CODEC_NONE or not inner:
        return inner
    return _wrap(codec, inner, count, wrapper_ts)
