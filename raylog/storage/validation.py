"""Validation of message sets, append and recovery side: every CRC, header
and size, wrappers decompressed (bounded) and their inner messages checked
(the format: :mod:`raylog.storage.message`; the compiled fast path checks
runs of plain messages, the code here is the reference)."""

from __future__ import annotations

from crc32c import crc32c

from raylog.errors import MessageTooLargeError, InvalidMessageError
from raylog.storage import message as _format
from raylog.storage.message import (
    LOG_OVERHEAD,
    DEFAULT_MAX_MESSAGE_BYTES,
    CODEC_MASK,
    HEADER_CHECK,
    SIZE_FIELD,
    STOP_HEADER,
)
from raylog.storage.message_errors import corrupt_message, bad_header, tail_error, nested_wrapper, in_wrapper, inner_set

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
    fast = _format._speedups  # looked up per call: tests swap the fast path
    if fast is None:
        return scan_set(mv, max_message_bytes, base_offset, check_inner, _allow_wrappers, max_inflated_bytes)
    pos = count = 0
    while True:
        valid, more, status = fast.scan(mv[pos:] if pos else mv, max_message_bytes)
        pos += valid
        count += more
        if not status:
            return pos, count, None
        if status != STOP_HEADER:
            # a bad CRC, a cut or oversized message, or arguments the fast
            # path leaves alone: the reference takes over from here
            valid, more, err = scan_set(
                mv[pos:], max_message_bytes, base_offset + pos, check_inner, _allow_wrappers, max_inflated_bytes
            )
            return pos + valid, count + more, err
        # a wrapper, or a bad header: the reference judges this one message
        end = pos + 4 + SIZE_FIELD.unpack_from(mv, pos)[0]
        _valid, _one, err = scan_set(
            mv[pos:end], max_message_bytes, base_offset + pos, check_inner, _allow_wrappers, max_inflated_bytes
        )
        if err is not None:
            return pos, count, err
        pos = end
        count += 1


def scan_set(mv, max_message_bytes: int, base_offset: int, check_inner: bool, _allow_wrappers: bool, max_inflated_bytes=None):
    """The reference of :func:`scan_message_set` (``mv``: a memoryview of bytes)."""
    n = len(mv)
    unpack = HEADER_CHECK.unpack_from
    pos = 0
    count = 0
    last = n - 22
    while pos <= last:
        size, crc, magic_attrs, klen = unpack(mv, pos)
        end = pos + 4 + size
        if end > n or size > max_message_bytes or size < 18:
            break
        if crc32c(mv[pos + 8 : end]) != crc:
            return pos, count, corrupt_message(mv, pos, base_offset + pos)
        if magic_attrs != 256 or klen < -1 or klen > size - 18:
            magic, attrs = magic_attrs >> 8, magic_attrs & 0xFF
            err = bad_header(magic, attrs, klen, size, base_offset + pos)
            if err is None and not _allow_wrappers:
                err = nested_wrapper(base_offset + pos)
            if err is None and check_inner:
                try:
                    inner = inner_set(
                        mv, pos, end, attrs, klen, max_message_bytes, base_offset + pos, max_inflated_bytes
                    )
                    _ok, _count, err = scan_message_set(inner, max_message_bytes, _allow_wrappers=False)
                except InvalidMessageError as raised:
                    err = raised
                else:
                    if err is not None:
                        err = in_wrapper(err, attrs & CODEC_MASK, base_offset + pos)
            if err is not None:
                return pos, count, err
        pos = end
        count += 1
    if pos < n:
        return pos, count, tail_error(mv, pos, n, max_message_bytes, base_offset + pos)
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
    return LOG_OVERHEAD + SIZE_FIELD.unpack_from(buf, pos)[0]


def validate_append(message_set, max_message_bytes: int, max_inflated_bytes: int | None = None) -> int:
    """A log's check before an append: the set's size against
    ``max_message_bytes`` (:class:`MessageTooLargeError`), then
    :func:`validate_message_set`; returns its number of (outer) messages."""
    size = len(message_set)
    if size > max_message_bytes:
        raise MessageTooLargeError(
            f"message set of {size} bytes is larger than max_message_bytes ({max_message_bytes}); "
            f"send smaller batches or raise max_message_bytes on the topic",
            size=size,
            limit=max_message_bytes,
        )
    return validate_message_set(message_set, max_message_bytes, max_inflated_bytes)
