"""Errors of the message format, built off the hot paths: a corrupt message,
a bad header, a cut tail, a nested or oversized wrapper (used by
:mod:`raylog.storage.validation` and :mod:`raylog.storage.decoding`)."""

from __future__ import annotations

from crc32c import crc32c

from raylog.errors import CorruptMessageError, InvalidMessageError, InvalidOffsetError, MessageTooLargeError
from raylog.storage.compression import CODEC_NAMES, decompress
from raylog.storage.message import MAGIC, LOG_OVERHEAD, HEADER_SIZE, MIN_MESSAGE_SIZE, INNER_SET_FACTOR, CODEC_MASK, SIZE_AND_CRC, SIZE_FIELD


def corrupt_message(data, pos: int, offset: int) -> CorruptMessageError:
    size, stored = SIZE_AND_CRC.unpack_from(data, pos)
    actual = crc32c(memoryview(data)[pos + 8 : pos + 4 + size])
    return CorruptMessageError(
        f"message at offset {offset} fails its CRC32C check (stored {stored:#010x}, "
        f"computed {actual:#010x}): its bytes were damaged on disk or in transit",
        offset=offset,
        stored_crc=stored,
        computed_crc=actual,
    )


def bad_header(magic: int, attrs: int, klen: int, size: int, offset: int) -> InvalidMessageError | None:
    """The error for a message whose magic, attributes or key length is wrong."""
    if magic != MAGIC:
        return InvalidMessageError(
            f"message at offset {offset} has magic {magic}, expected {MAGIC}", offset=offset
        )
    if attrs & ~CODEC_MASK or (attrs & CODEC_MASK) not in CODEC_NAMES:
        return InvalidMessageError(
            f"message at offset {offset} has unknown attributes {attrs:#04x}", offset=offset
        )
    if klen < -1 or klen > size - MIN_MESSAGE_SIZE:
        return InvalidMessageError(
            f"message at offset {offset} has key_length {klen}, which does not fit its size {size}",
            offset=offset,
        )
    return None


def tail_error(data, pos: int, n: int, max_message_bytes: int, offset: int) -> InvalidMessageError:
    """The error for the bytes at ``pos`` that the fast loop stopped at."""
    if n - pos >= LOG_OVERHEAD:
        (size,) = SIZE_FIELD.unpack_from(data, pos)
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


def nested_wrapper(offset: int) -> InvalidMessageError:
    return InvalidMessageError(
        f"message at offset {offset} is a wrapper inside a wrapper; compressed sets may not nest",
        offset=offset,
    )


def in_wrapper(err: InvalidMessageError, codec: int, offset: int) -> InvalidMessageError:
    return type(err)(
        f"in the {CODEC_NAMES[codec]} wrapper message at offset {offset}: {err}",
        **{**err.details, "offset": offset, "inner_offset": err.details.get("offset")},
    )


def _inflated_limit(max_message_bytes: int, max_inflated_bytes: int | None) -> int:
    return INNER_SET_FACTOR * max_message_bytes if not max_inflated_bytes else max_inflated_bytes


def inner_set(
    data, pos: int, end: int, attrs: int, klen: int, max_message_bytes: int, offset: int, max_inflated_bytes=None
) -> bytes:
    codec = attrs & CODEC_MASK
    start = pos + HEADER_SIZE + max(klen, 0)
    try:
        return decompress(codec, memoryview(data)[start:end], _inflated_limit(max_message_bytes, max_inflated_bytes))
    except InvalidMessageError as err:
        raise in_wrapper(err, codec, offset) from None


def inside_wrapper(offset: int, low: int, high: int) -> InvalidOffsetError:
    """The answer to a read at ``offset``, inside the compressed wrapper
    ``[low, high)`` (a record offset of one of its inner messages, docs/design.md
    §2): an :class:`InvalidOffsetError` whose ``wrapper_offset`` tells the reader
    to read from ``low`` and skip the inner messages before ``offset``
    (:meth:`raylog.transfer.connection.BrokerConnection.fetch` does it)."""
    return InvalidOffsetError(
        f"offset {offset} lies inside the compressed message set [{low}, {high}); read from its start {low} "
        f"and skip the messages before {offset}",
        offset=offset,
        message_offset=low,
        next_offset=high,
        wrapper_offset=low,
    )
