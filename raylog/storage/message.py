"""The message format: the same bytes on disk and on the wire (DESIGN §2).

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
wrappers themselves. When decoded, every inner message reports the
*wrapper's* offset, so a consumer can only commit (and resume) at wrapper
boundaries: after a restart it re-reads the whole wrapper (at-least-once).

Checks:

* :func:`decode_messages` (consumer side) checks every CRC, magic, attributes
  and key length, inner messages of wrappers included.
* :func:`validate_message_set` (append side) checks the same for every outer
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

from raylog.errors import ConfigError, CorruptMessageError, InvalidMessageError, MessageTooLargeError
from raylog.storage.compression import (
    CODEC_GZIP,
    CODEC_LZ4,
    CODEC_NAMES,
    CODEC_NONE,
    CODEC_ZSTD,
    codec_id,
    compress,
    decompress,
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
    "decode_messages",
    "validate_message_set",
    "scan_message_set",
    "message_size_at",
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

_CODEC_MASK = 0x07

# The 22 fixed bytes (fields 1-6), with magic and attributes read as one u16:
# 0x0100 is magic 1 and no codec, the common case, tested with one comparison.
_HEADER_FAST = struct.Struct(">IIHqi")
# ... and without the timestamp, for validation, which does not need it.
_HEADER_CHECK = struct.Struct(">IIH8xi")
_PLAIN = MAGIC << 8
# The hot loops spell these as literals (a local constant is cheaper than a global).
assert (HEADER_SIZE, MIN_MESSAGE_SIZE, _PLAIN) == (22, 18, 256)
_PREFIX = struct.Struct(">II")  # size, crc
_BODY_HEAD = struct.Struct(">BBqi")  # magic, attributes, timestamp, key_length
_SIZE = struct.Struct(">I")


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
_STOP_HEADER = 3
assert _speedups is None or _speedups.STATUS_HEADER == _STOP_HEADER


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
        return _PREFIX.pack(MIN_MESSAGE_SIZE + len(value), crc32c(value, crc32c(head))) + head + value
    head = _BODY_HEAD.pack(MAGIC, codec, ts, len(key))
    crc = crc32c(value, crc32c(key, crc32c(head)))
    return b"".join((_PREFIX.pack(MIN_MESSAGE_SIZE + len(key) + len(value), crc), head, key, value))


def encode_message_set(
    values: Sequence[bytes],
    keys: Sequence[bytes | None] | None = None,
    timestamp_ms: int | Sequence[int] | None = None,
    compression: str | None = None,
) -> bytes:
    """A message set of ``values`` (with ``keys`` and timestamps, when given).

    ``timestamp_ms`` is one time for every message (now when ``None``) or one
    per message. With ``compression`` the whole set becomes the value of one
    wrapper message (timestamp: the latest of the set, no key).
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
            return encode_message(compress(codec, inner), None, wrapper_ts, codec)
    parts: list[bytes] = []
    append = parts.append
    prefix = _PREFIX.pack
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
            head_pack = _BODY_HEAD.pack
            for value, key in zip(values, keys):
                if key is None:
                    append(prefix(MIN_MESSAGE_SIZE + len(value), crc32c(value, plain_crc)))
                    append(plain)
                else:
                    head = head_pack(MAGIC, 0, timestamp_ms, len(key))
                    append(prefix(MIN_MESSAGE_SIZE + len(key) + len(value), crc32c(value, crc32c(key, crc32c(head)))))
                    append(head)
                    append(key)
                append(value)
    else:
        if len(timestamp_ms) != count:
            raise ConfigError(f"got {count} values but {len(timestamp_ms)} timestamps")
        wrapper_ts = max(timestamp_ms, default=0)
        head_pack = _BODY_HEAD.pack
        for value, key, ts in zip(values, keys if keys is not None else (None,) * count, timestamp_ms):
            if key is None:
                head = head_pack(MAGIC, 0, ts, -1)
                append(prefix(MIN_MESSAGE_SIZE + len(value), crc32c(value, crc32c(head))))
                append(head)
            else:
                head = head_pack(MAGIC, 0, ts, len(key))
                append(prefix(MIN_MESSAGE_SIZE + len(key) + len(value), crc32c(value, crc32c(key, crc32c(head)))))
                append(head)
                append(key)
            append(value)
    inner = b"".join(parts)
    if codec == CODEC_NONE or not inner:
        return inner
    return encode_message(compress(codec, inner), None, wrapper_ts, codec)


# --------------------------------------------------------------------------
# errors (built off the hot paths)


def _corrupt(data, pos: int, offset: int) -> CorruptMessageError:
    size, stored = _PREFIX.unpack_from(data, pos)
    actual = crc32c(memoryview(data)[pos + 8 : pos + 4 + size])
    return CorruptMessageError(
        f"message at offset {offset} fails its CRC32C check (stored {stored:#010x}, "
        f"computed {actual:#010x}): its bytes were damaged on disk or in transit",
        offset=offset,
        stored_crc=stored,
        computed_crc=actual,
    )


def _bad_header(magic: int, attrs: int, klen: int, size: int, offset: int) -> InvalidMessageError | None:
    """The error for a message whose magic, attributes or key length is wrong."""
    if magic != MAGIC:
        return InvalidMessageError(
            f"message at offset {offset} has magic {magic}, expected {MAGIC}", offset=offset
        )
    if attrs & ~_CODEC_MASK or (attrs & _CODEC_MASK) not in CODEC_NAMES:
        return InvalidMessageError(
            f"message at offset {offset} has unknown attributes {attrs:#04x}", offset=offset
        )
    if klen < -1 or klen > size - MIN_MESSAGE_SIZE:
        return InvalidMessageError(
            f"message at offset {offset} has key_length {klen}, which does not fit its size {size}",
            offset=offset,
        )
    return None


def _tail_error(data, pos: int, n: int, max_message_bytes: int, offset: int) -> InvalidMessageError:
    """The error for the bytes at ``pos`` that the fast loop stopped at."""
    if n - pos >= LOG_OVERHEAD:
        (size,) = _SIZE.unpack_from(data, pos)
        if size > max_message_bytes:
            return MessageTooLargeError(
                f"message at offset {offset} claims {size} bytes, more than the limit of "
                f"{max_message_bytes}; raise max_message_bytes or send smaller messages",
                offset=offset,
                size=size,
                limit=max_message_bytes,
            )
        if size < MIN_MESSAGE_SIZE:
            return InvalidMessageError(
                f"message at offset {offset} claims size {size}, less than the minimum "
                f"{MIN_MESSAGE_SIZE}",
                offset=offset,
                size=size,
            )
    return InvalidMessageError(
        f"message at offset {offset} is incomplete: {n - pos} bytes where the message "
        f"needs more (a torn or cut message set)",
        offset=offset,
        partial=True,
    )


def _nested(offset: int) -> InvalidMessageError:
    return InvalidMessageError(
        f"message at offset {offset} is a wrapper inside a wrapper; compressed sets may not nest",
        offset=offset,
    )


def _in_wrapper(err: InvalidMessageError, codec: int, offset: int) -> InvalidMessageError:
    return type(err)(
        f"in the {CODEC_NAMES[codec]} wrapper message at offset {offset}: {err}",
        **{**err.details, "offset": offset, "inner_offset": err.details.get("offset")},
    )


def _inflated_limit(max_message_bytes: int, max_inflated_bytes: int | None) -> int:
    return INNER_SET_FACTOR * max_message_bytes if not max_inflated_bytes else max_inflated_bytes


def _inner_set(
    data, pos: int, end: int, attrs: int, klen: int, max_message_bytes: int, offset: int, max_inflated_bytes=None
) -> bytes:
    codec = attrs & _CODEC_MASK
    start = pos + HEADER_SIZE + max(klen, 0)
    try:
        return decompress(codec, memoryview(data)[start:end], _inflated_limit(max_message_bytes, max_inflated_bytes))
    except InvalidMessageError as err:
        raise _in_wrapper(err, codec, offset) from None


# --------------------------------------------------------------------------
# validation (append and recovery side)


def scan_message_set(
    buf,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    *,
    base_offset: int = 0,
    check_inner: bool = True,
    max_inflated_bytes: int | None = None,
    _allow_wrappers: bool = True,
) -> tuple[int, int, InvalidMessageError | None]:
    """Check the whole messages at the start of ``buf`` without raising.

    Returns ``(valid_bytes, count, error)``: the length of the run of valid
    messages from the start, how many (outer) messages it holds, and the
    error that describes the bytes at ``valid_bytes`` (``None`` when the
    whole buffer is valid). A message cut off by the end of ``buf`` gives an
    :class:`InvalidMessageError` with ``partial=True``. Errors name log
    offsets (``base_offset`` + position). With ``check_inner`` wrappers are
    decompressed (at most ``max_inflated_bytes``, default
    ``INNER_SET_FACTOR * max_message_bytes``) and their inner sets checked too.
    """
    mv = memoryview(buf)
    if mv.ndim != 1 or mv.itemsize != 1:
        mv = mv.cast("B")
    fast = _speedups
    if fast is None:
        return _scan(mv, max_message_bytes, base_offset, check_inner, _allow_wrappers, max_inflated_bytes)
    pos = count = 0
    while True:
        valid, more, status = fast.scan(mv[pos:] if pos else mv, max_message_bytes)
        pos += valid
        count += more
        if not status:
            return pos, count, None
        if status != _STOP_HEADER:
            # a bad CRC, a cut or oversized message, or arguments the fast
            # path leaves alone: the reference takes over from here
            valid, more, err = _scan(
                mv[pos:], max_message_bytes, base_offset + pos, check_inner, _allow_wrappers, max_inflated_bytes
            )
            return pos + valid, count + more, err
        # a wrapper, or a bad header: the reference judges this one message
        end = pos + 4 + _SIZE.unpack_from(mv, pos)[0]
        _valid, _one, err = _scan(
            mv[pos:end], max_message_bytes, base_offset + pos, check_inner, _allow_wrappers, max_inflated_bytes
        )
        if err is not None:
            return pos, count, err
        pos = end
        count += 1


def _scan(mv, max_message_bytes: int, base_offset: int, check_inner: bool, _allow_wrappers: bool, max_inflated_bytes=None):
    """The reference of :func:`scan_message_set` (``mv``: a memoryview of bytes)."""
    n = len(mv)
    unpack = _HEADER_CHECK.unpack_from
    pos = 0
    count = 0
    last = n - 22
    while pos <= last:
        size, crc, magic_attrs, klen = unpack(mv, pos)
        end = pos + 4 + size
        if end > n or size > max_message_bytes or size < 18:
            break
        if crc32c(mv[pos + 8 : end]) != crc:
            return pos, count, _corrupt(mv, pos, base_offset + pos)
        if magic_attrs != 256 or klen < -1 or klen > size - 18:
            magic, attrs = magic_attrs >> 8, magic_attrs & 0xFF
            err = _bad_header(magic, attrs, klen, size, base_offset + pos)
            if err is None and not _allow_wrappers:
                err = _nested(base_offset + pos)
            if err is None and check_inner:
                try:
                    inner = _inner_set(
                        mv, pos, end, attrs, klen, max_message_bytes, base_offset + pos, max_inflated_bytes
                    )
                    _ok, _count, err = scan_message_set(inner, max_message_bytes, _allow_wrappers=False)
                except InvalidMessageError as raised:
                    err = raised
                else:
                    if err is not None:
                        err = _in_wrapper(err, attrs & _CODEC_MASK, base_offset + pos)
            if err is not None:
                return pos, count, err
        pos = end
        count += 1
    if pos < n:
        return pos, count, _tail_error(mv, pos, n, max_message_bytes, base_offset + pos)
    return pos, count, None


def validate_message_set(
    buf, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, max_inflated_bytes: int | None = None
) -> int:
    """Check a message set before it is appended; return its number of (outer) messages.

    Every message must be whole (no partial tail), with a matching CRC,
    magic 1, known attributes, a key length that fits and a size within
    ``[18, max_message_bytes]``. Wrappers are decompressed (refused with
    :class:`InflatedSizeTooLargeError` past ``max_inflated_bytes``) and each inner
    message is checked the same way (nested wrappers are refused). Raises
    :class:`CorruptMessageError`, :class:`MessageTooLargeError` or
    :class:`InvalidMessageError` with ``offset`` = the position in ``buf`` of
    the (outer) message at fault.
    """
    _valid, count, err = scan_message_set(buf, max_message_bytes, max_inflated_bytes=max_inflated_bytes)
    if err is not None:
        raise err
    return count


def message_size_at(buf, pos: int = 0) -> int:
    """``LOG_OVERHEAD + size`` of the message whose size field is at ``pos``."""
    return LOG_OVERHEAD + _SIZE.unpack_from(buf, pos)[0]


# --------------------------------------------------------------------------
# decoding (consumer side)


def decode_messages(
    buf,
    base_offset: int,
    *,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    partial_tail_ok: bool = True,
    record_type: type | None = None,
    prefix: tuple = (),
    max_inflated_bytes: int | None = None,
) -> tuple[list[tuple[int, int, bytes | None, bytes]], int]:
    """Parse the whole messages of ``buf``, which starts at log offset ``base_offset``.

    Returns ``(records, consumed)``: each record is ``(offset, timestamp_ms,
    key, value)`` and ``consumed`` is the number of bytes of whole messages
    parsed, so the next fetch starts at ``base_offset + consumed``. Every CRC
    is checked (:class:`CorruptMessageError` with ``offset``), as are magic,
    attributes and key length (:class:`InvalidMessageError`) and the size
    bound (:class:`MessageTooLargeError`, before any allocation). A message
    cut off by the end of ``buf`` is left for the next fetch when
    ``partial_tail_ok`` (a fetch bounded by max_bytes ends like that), else
    it raises :class:`InvalidMessageError`. Wrappers are decompressed and
    every inner message reports the wrapper's offset; a wrapper that would
    inflate past ``max_inflated_bytes`` (pass the topic's
    ``TopicConfig.max_inflated_limit``; default ``INNER_SET_FACTOR *
    max_message_bytes``) raises :class:`InflatedSizeTooLargeError` before it
    is inflated past that bound.

    With ``record_type`` (a tuple subclass, such as :class:`raylog.Message`)
    and a two-field ``prefix`` (the consumer passes topic and partition) each
    record is built directly as ``record_type((*prefix, offset, timestamp_ms,
    key, value))``, sparing the consumer a second pass.
    """
    if record_type is not None and len(prefix) != 2:
        raise ConfigError(f"prefix must hold two fields (topic, partition), got {prefix!r}")
    fast = _speedups
    kind = type(buf)
    if fast is not None and (kind is bytes or kind is bytearray or kind is memoryview and buf.c_contiguous):
        # read in place, without the copy to bytes
        return _decode_fast(
            fast, buf, base_offset, max_message_bytes, partial_tail_ok, True, record_type, prefix, max_inflated_bytes
        )
    data = buf if type(buf) is bytes else bytes(buf)
    return _decode_set(data, base_offset, max_message_bytes, partial_tail_ok, True, record_type, prefix, max_inflated_bytes)


def _decode_set(
    data: bytes,
    base_offset: int,
    max_message_bytes: int,
    partial_tail_ok: bool,
    outer: bool,
    record_type: type | None = None,
    prefix: tuple = (),
    max_inflated_bytes: int | None = None,
):
    """:func:`_decode` by the fast path when there is one."""
    fast = _speedups
    if fast is None:
        return _decode(data, base_offset, max_message_bytes, partial_tail_ok, outer, record_type, prefix, max_inflated_bytes)
    return _decode_fast(
        fast, data, base_offset, max_message_bytes, partial_tail_ok, outer, record_type, prefix, max_inflated_bytes
    )


def _decode_fast(
    fast, buf, base_offset, max_message_bytes, partial_tail_ok, outer, record_type, prefix, max_inflated_bytes=None
):
    """:func:`_decode` of any contiguous buffer: the compiled loop for runs of
    plain messages, the reference for whatever it stops at."""
    p0, p1 = prefix if record_type is not None else (None, None)
    records, pos, status = fast.decode(buf, base_offset, max_message_bytes, record_type, p0, p1)
    if not status:
        return records, pos
    mv = memoryview(buf)
    if mv.ndim != 1 or mv.itemsize != 1:
        mv = mv.cast("B")
    while status == _STOP_HEADER:
        # a wrapper, or a bad header: the reference decodes (or refuses) this one message
        end = pos + 4 + _SIZE.unpack_from(mv, pos)[0]
        one = bytes(mv[pos:end])
        more, _used = _decode(
            one, base_offset + pos, max_message_bytes, False, outer, record_type, prefix, max_inflated_bytes
        )
        records += more
        pos = end
        more, used, status = fast.decode(mv[pos:], base_offset + pos, max_message_bytes, record_type, p0, p1)
        records += more
        pos += used
    if status:
        # a bad CRC, a cut or oversized message, or arguments the fast path
        # leaves alone: the reference takes over from here
        rest = buf if pos == 0 and type(buf) is bytes else bytes(mv[pos:])
        more, used = _decode(
            rest, base_offset + pos, max_message_bytes, partial_tail_ok, outer, record_type, prefix, max_inflated_bytes
        )
        records += more
        pos += used
    return records, pos


def _decode(
    data: bytes,
    base_offset: int,
    max_message_bytes: int,
    partial_tail_ok: bool,
    outer: bool,
    record_type: type | None = None,
    prefix: tuple = (),
    max_inflated_bytes: int | None = None,
):
    new = tuple.__new__
    typed = record_type is not None
    p0, p1 = prefix if typed else (None, None)
    mv = memoryview(data)
    n = len(data)
    records: list[tuple[int, int, bytes | None, bytes]] = []
    append = records.append
    unpack = _HEADER_FAST.unpack_from
    pos = 0
    last = n - 22
    # The CRC of a plain message without key covers 14 header bytes that depend
    # on the timestamp only (magic 1, attributes 0, key_length -1, all checked
    # from the unpacked fields): their CRC is computed once per run of equal
    # timestamps and continued over the value, which is sliced out anyway.
    # Every byte of every message is still covered by its CRC.
    run_ts = None
    run_crc = 0
    while pos <= last:
        size, crc, magic_attrs, ts, klen = unpack(data, pos)
        end = pos + 4 + size
        if end > n or size > max_message_bytes or size < 18:
            break
        if magic_attrs == 256 and klen == -1:
            value = data[pos + 22 : end]
            if ts != run_ts:
                run_ts = ts
                run_crc = crc32c(mv[pos + 8 : pos + 22])
            if crc32c(value, run_crc) != crc:
                raise _corrupt(data, pos, base_offset + pos)
            if typed:
                append(new(record_type, (p0, p1, base_offset + pos, ts, None, value)))
            else:
                append((base_offset + pos, ts, None, value))
        elif crc32c(mv[pos + 8 : end]) != crc:
            raise _corrupt(data, pos, base_offset + pos)
        elif magic_attrs != 256 or klen < -1 or klen > size - 18:
            magic, attrs = magic_attrs >> 8, magic_attrs & 0xFF
            err = _bad_header(magic, attrs, klen, size, base_offset + pos)
            if err is not None:
                raise err
            if not outer:
                raise _nested(base_offset + pos)
            offset = base_offset + pos
            inner = _inner_set(data, pos, end, attrs, klen, max_message_bytes, offset, max_inflated_bytes)
            try:
                inner_records, _consumed = _decode_set(inner, 0, max_message_bytes, False, False)
            except InvalidMessageError as err:
                raise _in_wrapper(err, attrs & _CODEC_MASK, offset) from None
            if typed:
                records.extend([new(record_type, (p0, p1, offset, its, key, value)) for _o, its, key, value in inner_records])
            else:
                records.extend([(offset, its, key, value) for _o, its, key, value in inner_records])
        else:
            kend = pos + 22 + klen
            if typed:
                append(new(record_type, (p0, p1, base_offset + pos, ts, data[pos + 22 : kend], data[kend:end])))
            else:
                append((base_offset + pos, ts, data[pos + 22 : kend], data[kend:end]))
        pos = end
    if pos < n:
        err = _tail_error(data, pos, n, max_message_bytes, base_offset + pos)
        if not partial_tail_ok or not err.details.get("partial"):
            raise err
    return records, pos
