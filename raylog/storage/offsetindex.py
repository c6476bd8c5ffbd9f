"""The offset index of a cleaned segment (docs/design.md §3): ``<base offset, 20 digits>.index``.

In a segment the cleaner never rewrote, the log offset of the byte at file
position ``p`` is ``base + p`` (offsets are byte positions, §2). A cleaned
segment keeps only some batches, each with its ``baseOffset`` and
``lastOffsetDelta`` as they were, so its file positions no longer equal
offsets: this index maps each kept batch's offset to its file position. It
is written once, by the cleaner, beside the cleaned segment (both as
``.cleaned`` files first, see :mod:`raylog.storage.cleaner`), and never
changes afterwards; its presence is what marks a segment as cleaned.

The file, big-endian::

     field           type  bytes      meaning
  header (16 bytes)
  1. magic           4     0..4       b"RLOI"
  2. version         u16   4..6       1
  3. reserved        u16   6..8       0
  4. base offset     i64   8..16      the segment's base offset (its file name)
  entries (16 bytes each, one per kept batch, in offset order, dense)
  5. offset          i64   +0..+8     the batch's baseOffset (its offset in the log)
  6. span            u32   +8..+12    lastOffsetDelta + 1: the batch covers the
                                      offsets [offset, offset + span)
  7. position        u32   +12..+16   the batch's position in the segment file
  trailer (24 bytes)
  8. count           u32   0..4       the number of entries
  9. end offset      i64   4..12      where the segment's offsets end (the next
                                      segment's base offset), past the last
                                      kept batch when the cleaner removed
                                      batches at the end
 10. dirty from      i64   12..20     the records from this offset on were not
                                      in the cleaner's map when it wrote the
                                      segment (its map filled up there); the
                                      end offset when the whole segment is clean
 11. crc             u32   20..24     CRC32C of every byte before this field

Offsets grow strictly and each batch's range ends at or before the next
one's offset; positions grow by each batch's size and the last batch ends at
the end of the segment file; a cleaned segment file stays below 4 GiB (the
cleaner groups segments only up to that). A file that is torn, fails its
CRC or breaks these rules is not trusted: :meth:`OffsetIndex.load` raises
:class:`OffsetIndexError`, and the log rebuilds the index by scanning the
segment's batch headers (:func:`scan_entries`) with the end offset it knows
from the next segment's name.

A lookup (:meth:`OffsetIndex.locate`) of an offset gives the kept batch that
holds it, or else the first kept batch after it: a reader at an offset the
cleaner removed starts at the next kept batch (readers see gaps).

Thread-safety: an :class:`OffsetIndex` is immutable once built; any thread.
"""

from __future__ import annotations

import bisect
import os
import struct
from typing import NamedTuple

from crc32c import crc32c

from raylog.errors import StorageError
from raylog.storage.owner_only import private_opener as _private_opener

SUFFIX = ".index"
MAGIC = b"RLOI"
VERSION = 1
HEADER = struct.Struct(">4sHHq")
ENTRY = struct.Struct(">qII")
TRAILER = struct.Struct(">IqqI")
#: the largest cleaned segment file (positions are u32)
MAX_SEGMENT_BYTES = (1 << 32) - 1

# format 2's batch header: baseOffset i64 at 0, batchLength i32 at 8, lastOffsetDelta i32 at 23
_BATCH_HEAD = struct.Struct(">qi")
_LAST_OFFSET_DELTA = struct.Struct(">i")
_LAST_OFFSET_DELTA_AT = 23
_BATCH_MIN = 61


class OffsetIndexError(StorageError):
    """An offset index that cannot be trusted (torn, wrong CRC, entries out of
    order): the log rebuilds it from its segment."""

    retriable = False


class Entry(NamedTuple):
    """One kept batch: its offsets ``[offset, offset + span)`` and its file ``position``."""

    offset: int
    span: int
    position: int

    @property
    def next_offset(self) -> int:
        return self.offset + self.span


def index_name(base_offset: int) -> str:
    return f"{base_offset:020d}{SUFFIX}"


class OffsetIndex:
    """The offset index of one cleaned segment (see the module docstring)."""

    __slots__ = ("base_offset", "end_offset", "dirty_from", "file_size", "_offsets", "_spans", "_positions")

    def __init__(self, base_offset: int, end_offset: int, entries, file_size: int, dirty_from: int | None = None):
        self.base_offset = base_offset
        self.end_offset = end_offset
        #: the first offset the cleaner has not deduplicated (field 10)
        self.dirty_from = end_offset if dirty_from is None else dirty_from
        self.file_size = file_size
        self._offsets = [e[0] for e in entries]
        self._spans = [e[1] for e in entries]
        self._positions = [e[2] for e in entries]
        _check(base_offset, end_offset, self._offsets, self._spans, self._positions, file_size)

    def __len__(self) -> int:
        return len(self._offsets)

    def __repr__(self) -> str:
        return f"OffsetIndex(base={self.base_offset}, end={self.end_offset}, batches={len(self)})"

    def entries(self) -> list[Entry]:
        return [Entry(*e) for e in zip(self._offsets, self._spans, self._positions)]

    def locate(self, offset: int) -> Entry | None:
        """The kept batch that holds ``offset``, else the first kept batch
        after it; None when no kept batch ends after ``offset``."""
        i = bisect.bisect_right(self._offsets, offset) - 1
        if i >= 0 and offset < self._offsets[i] + self._spans[i]:
            return self._entry(i)
        i += 1
        return self._entry(i) if i < len(self._offsets) else None

    def size_of(self, entry: Entry) -> int:
        """The bytes of the kept batch ``entry`` in the segment file."""
        i = bisect.bisect_right(self._positions, entry.position)
        return (self._positions[i] if i < len(self._positions) else self.file_size) - entry.position

    def position_of(self, offset: int) -> int:
        """The file position where a read from ``offset`` starts (the file's
        size when nothing kept lies at or after it)."""
        found = self.locate(offset)
        return self.file_size if found is None else found.position

    def offset_at(self, position: int) -> int:
        """The log offset of the batch starting at file ``position`` (the end
        offset for the file's size); :class:`KeyError` for a position that
        is not a batch start."""
        if position == self.file_size:
            return self.end_offset
        i = bisect.bisect_left(self._positions, position)
        if i == len(self._positions) or self._positions[i] != position:
            raise KeyError(position)
        return self._offsets[i]

    def batches_between(self, start: int, end: int) -> list[Entry]:
        """The kept batches whose offsets lie in ``[start, end)`` (by their base offset)."""
        lo = bisect.bisect_left(self._offsets, start)
        hi = bisect.bisect_left(self._offsets, end)
        return [self._entry(i) for i in range(lo, hi)]

    def _entry(self, i: int) -> Entry:
        return Entry(self._offsets[i], self._spans[i], self._positions[i])

    # -- the file ---------------------------------------------------------------

    def to_bytes(self) -> bytes:
        parts = [HEADER.pack(MAGIC, VERSION, 0, self.base_offset)]
        parts.extend(ENTRY.pack(*e) for e in zip(self._offsets, self._spans, self._positions))
        body = b"".join(parts)
        tail = TRAILER.pack(len(self._offsets), self.end_offset, self.dirty_from, 0)[:-4]
        return body + tail + struct.pack(">I", crc32c(tail, crc32c(body)))

    @classmethod
    def from_bytes(cls, data: bytes, base_offset: int, file_size: int) -> "OffsetIndex":
        """The index in ``data`` for the segment of ``base_offset`` whose file
        is ``file_size`` bytes; :class:`OffsetIndexError` if it cannot be trusted."""
        if len(data) < HEADER.size + TRAILER.size or (len(data) - HEADER.size - TRAILER.size) % ENTRY.size:
            raise OffsetIndexError(f"the offset index of segment {base_offset} is torn ({len(data)} bytes)")
        (crc,) = struct.unpack_from(">I", data, len(data) - 4)
        if crc32c(memoryview(data)[:-4]) != crc:
            raise OffsetIndexError(f"the offset index of segment {base_offset} fails its CRC32C check")
        magic, version, _reserved, base = HEADER.unpack_from(data, 0)
        if magic != MAGIC or version != VERSION or base != base_offset:
            raise OffsetIndexError(
                f"the offset index of segment {base_offset} has magic {magic!r}, version {version}, "
                f"base {base}: not this segment's index of version {VERSION}"
            )
        count, end_offset, dirty_from, _crc = TRAILER.unpack_from(data, len(data) - TRAILER.size)
        if count * ENTRY.size != len(data) - HEADER.size - TRAILER.size:
            raise OffsetIndexError(f"the offset index of segment {base_offset} says {count} entries but holds others")
        entries = list(ENTRY.iter_unpack(memoryview(data)[HEADER.size : len(data) - TRAILER.size]))
        if not base_offset <= dirty_from <= end_offset:
            raise OffsetIndexError(f"the offset index of segment {base_offset} is dirty from {dirty_from}, "
                                   f"outside [{base_offset}, {end_offset}]")
        return cls(base_offset, end_offset, entries, file_size, dirty_from)

    @classmethod
    def load(cls, directory: str, base_offset: int, file_size: int) -> "OffsetIndex | None":
        """The index of the segment of ``base_offset`` in ``directory``, None
        when the segment has none (it was never cleaned);
        :class:`OffsetIndexError` when the file cannot be trusted."""
        try:
            with open(os.path.join(directory, index_name(base_offset)), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        return cls.from_bytes(data, base_offset, file_size)

    def write(self, path: str) -> None:
        """Write the index to ``path`` and sync it (the cleaner's ``.cleaned`` file)."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            data = self.to_bytes()
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)


def _check(base: int, end: int, offsets, spans, positions, file_size: int) -> None:
    """The rules of the module docstring; :class:`OffsetIndexError` where one fails."""
    if not 0 <= file_size <= MAX_SEGMENT_BYTES:
        raise OffsetIndexError(f"a cleaned segment of {file_size} bytes is larger than an index can map")
    # positions: strictly growing, first at 0; the file holds the last batch whole
    for i, position in enumerate(positions):
        if (i == 0 and position != 0) or (i and position <= positions[i - 1]) or position >= max(file_size, 1):
            raise OffsetIndexError(f"the offset index of segment {base} has a bad position {position} at entry {i}")
    for i in range(1, len(offsets)):
        if offsets[i] < offsets[i - 1] + spans[i - 1] or spans[i] < 1:
            raise OffsetIndexError(f"the offset index of segment {base} is out of order at offset {offsets[i]}")
    if offsets and (offsets[0] < base or spans[0] < 1 or offsets[-1] + spans[-1] > end):
        raise OffsetIndexError(f"the offset index of segment {base} names offsets outside [{base}, {end})")
    if end < base or (not offsets and file_size):
        raise OffsetIndexError(f"the offset index of segment {base} does not cover its file")


def scan_entries(read, file_size: int) -> list[tuple[int, int, int]]:
    """Rebuild the entries of a cleaned segment from its batch headers:
    ``read(position, length) -> bytes`` reads the segment file of
    ``file_size`` bytes. Only the headers' baseOffset, batchLength and
    lastOffsetDelta are read (the CRCs are the readers' to check).
    :class:`OffsetIndexError` when the headers do not tile the file."""
    entries = []
    position = 0
    while position < file_size:
        head = read(position, _BATCH_MIN)
        if len(head) < _BATCH_MIN:
            raise OffsetIndexError(f"the cleaned segment is cut inside the batch header at position {position}")
        offset, length = _BATCH_HEAD.unpack_from(head, 0)
        (delta,) = _LAST_OFFSET_DELTA.unpack_from(head, _LAST_OFFSET_DELTA_AT)
        size = 12 + length
        if size < _BATCH_MIN or position + size > file_size or delta < 0:
            raise OffsetIndexError(f"the cleaned segment holds no whole batch at position {position}")
        entries.append((offset, delta + 1, position))
        position += size
    return entries
