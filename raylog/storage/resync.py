"""Finding the way past damaged bytes of a stored log: the next readable
message after a corrupt one, and whether an offset is a message boundary.

A corrupt message (a CRC that does not match, a size field that cannot be
one) hides where the next message starts. :func:`next_readable` finds it by
trying every byte position after the damage, cheapest test first:

1. the byte at ``p + 8`` is the magic (1) -- found with ``bytes.find``;
2. the size field is within ``[MIN_MESSAGE_SIZE, limit]`` and the message
   ends inside the searched range; the attributes name a known codec and no
   other bits; the key length fits the size;
3. the CRC32C over the message matches;
4. **confirmation**: the message ends exactly at the end of the range, or a
   message passing 1-3 starts right after it.

Step 4 rules out a false start inside a damaged message's value (a payload
that happens to hold bytes looking like a message would also need a valid
follower at the right place). When the damaged message's own size field
looks intact, the position it names is tried first. Messages never straddle
segments, so the search range ends at the segment's end (or the high
watermark): when nothing readable follows, the answer is the range's end.

Format 2 (record batches, docs/design.md §2; a segment holds one format,
passed as ``fmt``): the same steps with a batch's fields -- byte 8 is 0 and
byte 16 the magic 2 (found with ``bytes.find``), batchLength within
``[49, limit]``, known attributes, the CRC32C over attributes to the end,
and, since a stored batch is stamped with its position, a baseOffset equal
to the offset tried -- then the same confirmation.

All offsets are log offsets; ``read(offset, length)`` returns the stored
bytes (fewer at the end). Pure functions of the bytes read; any thread.
"""

from __future__ import annotations

from typing import Callable

from crc32c import crc32c

from raylog.storage.compression import CODEC_NAMES
from raylog.storage.message import HEADER_SIZE, LOG_OVERHEAD, MAGIC, MIN_MESSAGE_SIZE, CODEC_MASK
from raylog.storage.record_batch import HEADER_SIZE as BATCH_HEADER_SIZE
from raylog.storage.record_batch import KAFKA_CODECS, read_header
from raylog.storage.record_batch import LOG_OVERHEAD as BATCH_OVERHEAD
from raylog.storage.record_batch import MAGIC as BATCH_MAGIC

Reader = Callable[[int, int], bytes]

#: bytes read at a time while searching
SEARCH_CHUNK_BYTES = 1 << 20
#: position of the magic byte in a message (after size and crc)
_MAGIC_AT = 8
# format 2: the magic's position, the start of what the crc covers, the attribute bits known
_BATCH_MAGIC_AT = 16
_BATCH_CRC_FROM = 21
_BATCH_ATTRIBUTES = 0x3F


def batch_at(read: Reader, offset: int, end: int, limit: int) -> int | None:
    """The length (``12 + batchLength``) of a whole stored record batch at
    ``offset`` (ending at or before ``end``, batchLength at most ``limit``,
    attributes known, CRC matching, baseOffset = ``offset``), else None."""
    if end - offset < BATCH_HEADER_SIZE:
        return None
    head = read(offset, BATCH_HEADER_SIZE)
    if len(head) < BATCH_HEADER_SIZE or head[_MAGIC_AT] != 0 or head[_BATCH_MAGIC_AT] != BATCH_MAGIC:
        return None
    header = read_header(head)
    size = BATCH_OVERHEAD + header.batch_length
    if not BATCH_HEADER_SIZE - BATCH_OVERHEAD <= header.batch_length <= limit or offset + size > end:
        return None
    if header.base_offset != offset or header.attributes & ~_BATCH_ATTRIBUTES or header.codec not in KAFKA_CODECS:
        return None
    body = read(offset, size)
    if len(body) < size or crc32c(memoryview(body)[_BATCH_CRC_FROM:]) != header.crc:
        return None
    return size


def message_at(read: Reader, offset: int, end: int, limit: int) -> int | None:
    """The length (``4 + size``) of a whole valid message at ``offset``
    (ending at or before ``end``, size at most ``limit``, CRC matching), else None;
    for a record batch there, :func:`batch_at`'s answer."""
    if end - offset < HEADER_SIZE:
        return None
    head = read(offset, HEADER_SIZE)
    if len(head) < HEADER_SIZE:
        return None
    if head[_MAGIC_AT] != MAGIC:
        return batch_at(read, offset, end, limit) if head[_MAGIC_AT] == 0 else None
    size = int.from_bytes(head[:4], "big")
    attrs = head[9]
    key_length = int.from_bytes(head[18:22], "big", signed=True)
    if not MIN_MESSAGE_SIZE <= size <= limit or offset + LOG_OVERHEAD + size > end:
        return None
    if attrs & ~CODEC_MASK or (attrs & CODEC_MASK) not in CODEC_NAMES:
        return None
    if not -1 <= key_length <= size - MIN_MESSAGE_SIZE:
        return None
    body = read(offset, LOG_OVERHEAD + size)
    if len(body) < LOG_OVERHEAD + size or crc32c(memoryview(body)[8:]) != int.from_bytes(body[4:8], "big"):
        return None
    return LOG_OVERHEAD + size


def _confirmed(read: Reader, offset: int, end: int, limit: int) -> bool:
    length = message_at(read, offset, end, limit)
    if length is None:
        return False
    following = offset + length
    return following == end or message_at(read, following, end, limit) is not None


def _layout(fmt: int) -> tuple[int, int, bytes, int]:
    """``(size field's end, header size, magic byte, magic position)`` of a format."""
    if fmt == 2:
        return BATCH_OVERHEAD, BATCH_HEADER_SIZE, bytes([BATCH_MAGIC]), _BATCH_MAGIC_AT
    return LOG_OVERHEAD, HEADER_SIZE, b"\x01", _MAGIC_AT


def _frame_length(head: bytes, fmt: int) -> int:
    """The whole length its size field gives the message or batch whose first bytes are ``head``."""
    if fmt == 2:
        return BATCH_OVERHEAD + int.from_bytes(head[8:12], "big", signed=True)
    return LOG_OVERHEAD + int.from_bytes(head[:4], "big")


def next_readable(read: Reader, bad: int, end: int, limit: int, fmt: int = 1) -> int:
    """The offset of the first confirmed readable message (batch, for
    ``fmt`` 2) after the damaged one at ``bad`` (see the module docstring),
    or ``end`` when none is found before ``end``."""
    overhead, header_size, magic, magic_at = _layout(fmt)
    head = read(bad, overhead)
    if len(head) == overhead:
        hint = bad + _frame_length(head, fmt)
        if bad < hint < end and _confirmed(read, hint, end, limit):
            return hint
    pos = bad + 1
    while end - pos >= header_size:
        chunk = read(pos, min(SEARCH_CHUNK_BYTES, end - pos))
        if len(chunk) < header_size:
            break
        i = chunk.find(magic, magic_at)
        while i != -1 and pos + i - magic_at + header_size <= end:
            candidate = pos + i - magic_at
            if _confirmed(read, candidate, end, limit):
                return candidate
            i = chunk.find(magic, i + 1)
        # every magic position of this chunk is tried: the next chunk's
        # first candidate is the one whose magic is this chunk's end
        pos += len(chunk) - magic_at
    return end


def walk_to(read: Reader, start: int, target: int, end: int, limit: int, fmt: int = 1) -> tuple[str, int, int]:
    """Walk the size fields from ``start`` (a known boundary) towards ``target``.

    Returns ``("boundary", target, target)`` when a message starts at
    ``target``, ``("inside", before, after)`` when ``target`` lies inside
    the message ``[before, after)`` (not a boundary), or ``("damaged",
    bad, next)`` when ``target`` lies in damaged bytes ``[bad, next)`` that
    the walk met (``next``: :func:`next_readable` after them). Damage met
    before ``target`` is stepped over with :func:`next_readable`.
    """
    overhead, header_size, _magic, _at = _layout(fmt)
    smallest = MIN_MESSAGE_SIZE if fmt != 2 else header_size - overhead
    pos = start
    while pos < target:
        head = read(pos, overhead)
        size = _frame_length(head, fmt) - overhead if len(head) == overhead else 0
        following = pos + overhead + size
        if not smallest <= size <= limit or following > end:
            resumed = next_readable(read, pos, end, limit, fmt)
            if resumed > target:
                return "damaged", pos, resumed
            pos = resumed
            continue
        if following > target:
            return "inside", pos, following
        pos = following
    return "boundary", target, target
