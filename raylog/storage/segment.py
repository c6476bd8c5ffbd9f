"""One segment file of a partition log: ``<base offset, 20 digits>.log``.

A segment holds whole messages back to back (:mod:`raylog.storage.message`),
or whole record batches (:mod:`raylog.storage.record_batch`): one format per
segment (docs/design.md §2), :attr:`LogSegment.format`, read from its first
bytes when it is opened (:func:`~raylog.storage.record_batch.format_at`'s
byte-8 rule) and set by its first append; ``None`` while it is empty.
The log offset of the byte at position ``p`` of the file is ``base_offset + p``.
Writes go to the end of the file only (``O_APPEND``); readers use
``os.pread`` or ``os.sendfile`` with an explicit position on
``segment.file.fileno()``, which never moves the file position, so readers and
the writer share one open file.

Lifetime: a segment's file stays open as long as anything refers to it (the
log, or a :class:`~raylog.storage.log.FileSlice` handed to a reader). When
retention deletes a segment the path is unlinked at once, but the file object
is closed only by garbage collection of its last reference, so a reader in the
middle of ``os.sendfile`` never sees its descriptor closed or reused.

A segment the cleaner rewrote (docs/design.md §3, :mod:`raylog.storage.cleaner`)
keeps only some batches, each at its own offset: its file positions are no
longer ``offset - base_offset``. It carries an offset index
(:mod:`raylog.storage.offsetindex`, :attr:`LogSegment.offsets`; None for a
segment never cleaned) that maps offsets to positions and gives its
:attr:`~LogSegment.end_offset`; it is never written to again and has no time
index file (lookups by time walk its batch headers). An index that cannot be
trusted leaves :attr:`LogSegment.offsets` None and
:attr:`LogSegment.index_damaged` set: recovery rebuilds it from the batches
(:meth:`LogSegment.rebuild_offsets`) with the next segment's base offset.

Thread-safety: only the owning log's writer calls the mutating methods
(:meth:`append`, :meth:`truncate`, :meth:`flush`, :meth:`delete`); readers
may read ``size`` (a plain int, replaced atomically) and the file at any time.
"""

from __future__ import annotations

import io
import os
import re

from raylog.storage.batch_validation import batch_size_at, scan_batches
from raylog.storage.countindex import SegmentCounts
from raylog.storage.message import LOG_OVERHEAD
from raylog.storage.owner_only import private_opener as _private_opener
from raylog.storage.record_batch import LOG_OVERHEAD as BATCH_OVERHEAD
from raylog.storage.record_batch import format_at
from raylog.storage.offsetindex import OffsetIndex, OffsetIndexError, index_name, scan_entries
from raylog.storage.timeindex import TimeIndex
from raylog.storage.validation import message_size_at, scan_message_set

#: bytes at a segment's start that tell its format (format_at)
_FORMAT_PEEK = 17

SUFFIX = ".log"
_NAME = re.compile(r"^(\d{20})\.log$")

#: bytes read at a time when a segment is checked on recovery
SCAN_CHUNK_BYTES = 4 << 20


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}{SUFFIX}"


def parse_segment_name(name: str) -> int | None:
    """The base offset of a segment file name, or ``None`` if it is not one."""
    match = _NAME.match(name)
    return int(match.group(1)) if match else None


class SegmentFile(io.FileIO):
    """An unbuffered file that closes itself quietly when the last reference goes."""

    def __del__(self):
        try:
            self.close()
        except OSError:
            pass


class LogSegment:
    """An open segment file and its size (bytes written, flushed or not)."""

    __slots__ = ("base_offset", "path", "file", "fd", "size", "format", "timeindex", "offsets", "index_damaged",
                 "counts")

    def __init__(self, path: str, base_offset: int, file: SegmentFile):
        self.base_offset = base_offset
        self.path = path
        self.file = file
        self.fd = file.fileno()
        self.size = os.fstat(self.fd).st_size
        #: 1 or 2, the format of every message or batch in it; None while empty
        #: (bytes that are neither are taken as format 1, whose checks report them)
        self.format: int | None = None
        if self.size:
            self.format = 2 if format_at(os.pread(self.fd, _FORMAT_PEEK, 0)) == 2 else 1
        directory = os.path.dirname(path)
        #: a cleaned segment's offset index (raylog.storage.offsetindex); None when never cleaned
        self.offsets: OffsetIndex | None = None
        #: the segment has an offset index that cannot be trusted (recovery rebuilds it)
        self.index_damaged = False
        try:
            self.offsets = OffsetIndex.load(directory, base_offset, self.size)
        except OffsetIndexError:
            self.index_damaged = True
        #: the segment's time index (raylog.storage.timeindex), kept with it; none when cleaned
        self.timeindex = (TimeIndex.open(directory, base_offset, base_offset + self.size)
                          if self.offsets is None and not self.index_damaged else _NO_TIME_INDEX)
        #: its record counts, learnt by counts of its ranges (raylog.storage.countindex)
        self.counts = SegmentCounts(base_offset)

    @classmethod
    def open(cls, directory: str, base_offset: int) -> "LogSegment":
        """Open (creating if needed) the segment of ``base_offset`` in ``directory``."""
        path = os.path.join(directory, segment_name(base_offset))
        return cls(path, base_offset, SegmentFile(path, "a+", opener=_private_opener))

    def __repr__(self) -> str:
        return f"LogSegment({self.path!r}, size={self.size})"

    @property
    def end_offset(self) -> int:
        """Where the segment's offsets end (the next segment's base offset)."""
        offsets = self.offsets
        return self.base_offset + self.size if offsets is None else offsets.end_offset

    @property
    def cleaned(self) -> bool:
        return self.offsets is not None or self.index_damaged

    def rebuild_offsets(self, end_offset: int) -> OffsetIndex:
        """Rebuild a cleaned segment's offset index from its batch headers
        (its offsets end at ``end_offset``), write it and use it;
        :class:`~raylog.storage.offsetindex.OffsetIndexError` when the
        batches do not make one."""
        # which part was deduplicated is not known any more: all of it counts as dirty
        index = OffsetIndex(self.base_offset, end_offset, scan_entries(self.read_at, self.size), self.size,
                            self.base_offset)
        path = os.path.join(os.path.dirname(self.path), index_name(self.base_offset))
        tmp = path + ".rebuilt"
        index.write(tmp)
        os.replace(tmp, path)
        self.offsets, self.index_damaged = index, False
        return index

    def mtime_ms(self) -> int:
        return os.fstat(self.fd).st_mtime_ns // 1_000_000

    # -- writer ---------------------------------------------------------------

    def append(self, data, fmt: int = 1) -> None:
        """Write all of ``data`` (of format ``fmt``, the segment's, or its
        first) at the end. On an error nothing stays written (the file is cut
        back) and the ``OSError`` propagates."""
        fd = self.fd
        size = self.size
        length = len(data)
        try:
            written = os.write(fd, data)
            if written != length:
                view = memoryview(data)
                while written < length:
                    written += os.write(fd, view[written:])
        except OSError:
            try:
                os.ftruncate(fd, size)
            except OSError:
                pass
            raise
        self.size = size + length
        if self.format is None:
            self.format = fmt

    def flush(self) -> None:
        """Make everything written so far durable (data and the file's size)."""
        os.fdatasync(self.fd)

    def truncate(self, size: int) -> None:
        """Cut the file to ``size`` bytes and make that durable."""
        os.ftruncate(self.fd, size)
        os.fdatasync(self.fd)
        self.size = size
        if not size:
            self.format = None
        self.timeindex.truncate(self.base_offset + size)
        # (a cleaned segment's positions are not offsets: its counts are forgotten whole)
        self.counts.truncate(self.base_offset + (size if not self.cleaned else 0))

    def delete(self) -> None:
        """Unlink the file. The open file stays usable by whoever still holds it."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        self.timeindex.delete()
        if self.cleaned:
            try:
                os.unlink(os.path.join(os.path.dirname(self.path), index_name(self.base_offset)))
            except FileNotFoundError:
                pass

    # -- readers --------------------------------------------------------------

    def read_at(self, position: int, length: int) -> bytes:
        return os.pread(self.fd, length, position)

    def scan(self, start: int, max_message_bytes: int) -> tuple[int, Exception | None]:
        """Check the messages from file position ``start`` to the end.

        Returns ``(valid_end, error)``: the position after the last whole valid
        message, and ``None`` if that is the end of the file or else the error
        found there (a CRC mismatch, a bad header, or a message cut short by
        the end of the file, which has ``partial=True``).
        """
        pos = start
        size = os.fstat(self.fd).st_size
        if self.format == 2:
            scan, overhead, size_at = self._scan_batches, BATCH_OVERHEAD, batch_size_at
        else:
            scan, overhead, size_at = self._scan_messages, LOG_OVERHEAD, message_size_at
        while pos < size:
            want = min(SCAN_CHUNK_BYTES, size - pos)
            chunk = os.pread(self.fd, want, pos)
            if len(chunk) < want:  # the file shrank under us: treat the rest as cut
                size = pos + len(chunk)
            valid, err = scan(chunk, max_message_bytes, self.base_offset + pos)
            if err is None:
                pos += valid
                continue
            partial = err.details.get("partial") or False
            if not partial or pos + len(chunk) >= size:
                return pos + valid, err
            # A message straddles the chunk boundary: continue from it, reading
            # at least the whole message (its size is within the limit, or the
            # scan would have said so).
            pos += valid
            if valid == 0:
                need = size_at(chunk) if len(chunk) >= overhead else overhead
                if pos + need > size:
                    return pos, err
                chunk = os.pread(self.fd, need, pos)
                valid, err = scan(chunk, max_message_bytes, self.base_offset + pos)
                if err is not None:
                    return pos + valid, err
                pos += valid
        return pos, None

    @staticmethod
    def _scan_messages(chunk, max_message_bytes: int, offset: int):
        valid, _count, err = scan_message_set(chunk, max_message_bytes, base_offset=offset, check_inner=False)
        return valid, err

    @staticmethod
    def _scan_batches(chunk, max_message_bytes: int, offset: int):
        valid, _count, err = scan_batches(chunk, max_message_bytes, base_offset=offset)
        return valid, err


class _NoTimeIndex:
    """The time index of a cleaned segment: none (lookups walk the offset index)."""

    def on_append(self, *args) -> None:
        raise AssertionError("a cleaned segment is never appended to")

    def truncate(self, end: int) -> None:
        pass

    def delete(self) -> None:
        pass

    def close(self) -> None:
        pass


_NO_TIME_INDEX = _NoTimeIndex()
