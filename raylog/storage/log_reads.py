"""Reading a partition log: slices for ``os.sendfile``, message boundaries
and lookups by time, over one view of the log's segments and its high
watermark (:class:`LogReader`, owned by :class:`~raylog.storage.log.PartitionLog`;
see :mod:`raylog.storage.log`)."""

from __future__ import annotations

import bisect
import os
import struct
from typing import Any, NamedTuple

from crc32c import crc32c

from raylog.errors import CorruptMessageError, InvalidOffsetError, OffsetOutOfRangeError
from raylog.storage.message import CODEC_MASK, HEADER_SIZE, MAGIC, MIN_MESSAGE_SIZE
from raylog.storage.message_errors import inside_wrapper
from raylog.storage.recovery import RECOVERY_MAX_MESSAGE_BYTES
from raylog.storage.resync import batch_at, message_at, next_readable, walk_to
from raylog.storage.segment import LogSegment

#: bytes read to check the message at the start of a read
_PEEK_BYTES = 4096
#: bytes read at a time when :meth:`PartitionLog.message_boundaries` walks size fields
BOUNDARY_BLOCK_BYTES = 1 << 20
_SIZE_FIELD = struct.Struct(">I")
#: the smallest batchLength of a record batch (format 2: its 61-byte header less 12)
_BATCH_MIN_LENGTH = 49
#: where a record batch's maxTimestamp lies (format 2: after baseTimestamp)
_BATCH_MAX_TS_AT = 35

_u32 = int.from_bytes


class FileSlice(NamedTuple):
    """Bytes of a segment file to send: ``os.sendfile(out, file.fileno(), position, length)``.

    ``offset`` is the log offset of the first byte. The slice keeps the segment
    file open (even if retention deletes the segment meanwhile). Read it only
    with ``os.pread``/``os.sendfile`` at an explicit position: the file object
    is shared with the log's writer.
    """

    file: Any
    position: int
    length: int
    offset: int
    #: the bytes come from a segment the cleaner rewrote: the next offset
    #: after them is the last whole batch's (baseOffset + lastOffsetDelta +
    #: 1, :func:`~raylog.storage.record_batch.next_offset_after`), not
    #: ``offset`` + their length
    cleaned: bool = False

    def send_to(self, sock, length: int) -> int:
        """``os.sendfile`` the first ``length`` bytes to ``sock``, zero-copy
        from the page cache; fewer are sent only when the segment is shorter
        than the slice (deleted and cut under the reader)."""
        out_fd, in_fd = sock.fileno(), self.file.fileno()
        position, left = self.position, length
        while left:
            sent = os.sendfile(out_fd, in_fd, position, left)
            if sent == 0:
                break
            position += sent
            left -= sent
        return length - left

    def tobytes(self) -> bytes:
        return os.pread(self.file.fileno(), self.length, self.position)


def _reader(segment: LogSegment):
    """``read(log offset, length)`` over one segment (for :mod:`raylog.storage.resync`)."""
    base, read_at = segment.base_offset, segment.read_at
    return lambda offset, length: read_at(offset - base, length)


#: what a reader is given of the log: ``(base offsets, segments)``, as the
#: writer last replaced it (never changed in place)
View = tuple[list[int], list[LogSegment]]


class LogReader:
    """The reads of the partition log in ``directory`` whose messages are at
    most ``max_message_bytes``. Each call is given the log's ``view`` and
    high watermark ``hw`` as read together by the caller, and reads only
    below ``hw``; it keeps no state (any thread, no lock)."""

    def __init__(self, directory: str, max_message_bytes: int):
        self._dir = directory
        self._max_message_bytes = max_message_bytes

    def read(self, view: View, hw: int, offset: int, max_bytes: int, *, start: int = 0) -> FileSlice:
        """The bytes from ``offset``: at most ``max_bytes`` (but at least the
        whole first message), below the high watermark, within one segment.

        ``offset == high_watermark`` gives an empty slice. The slice may end
        inside a message; parse it with ``decode_messages`` and continue at
        ``offset + consumed``. Raises :class:`OffsetOutOfRangeError` outside
        ``[log_start_offset, high_watermark]`` and :class:`InvalidOffsetError`
        for an offset that is not the start of a message; for one inside a
        compressed wrapper (an inner message's record offset) its
        ``wrapper_offset`` detail names the wrapper's start (:func:`inside_wrapper`).

        In a segment of format 2 an offset inside a batch (a record's) gives
        the slice of that batch: its ``offset`` is then the batch's, before
        the asked one, and the reader skips the records before it.

        ``start``: the log start offset when a deletion of records moved it
        past the first segment's base (:mod:`raylog.storage.log_start`): an
        offset below it is out of range; a read at it inside a batch gives
        that whole batch, whose records before it the reader skips, as
        Kafka's brokers serve it.
        """
        bases, segments = view
        start = max(bases[0], start)
        if offset < start or offset > hw:
            raise OffsetOutOfRangeError(
                f"offset {offset} is outside the log [{start}, {hw}]; seek to the earliest "
                f"({start}) or latest ({hw}) offset",
                offset=offset,
                earliest=start,
                latest=hw,
            )
        segment = segments[bisect.bisect_right(bases, offset) - 1]
        if segment.offsets is not None:
            return self._read_cleaned(view, hw, segment, offset, max_bytes)
        position = offset - segment.base_offset
        available = min(hw, segment.base_offset + segment.size) - offset
        if available <= 0:
            return FileSlice(segment.file, position, 0, offset)
        if segment.format == 2:
            # an offset inside a batch reads that batch (docs/design.md §2): the
            # slice starts at the batch, whose reader skips the records before offset
            start, first = self._batch_containing(segment, offset, available)
            available += offset - start
            position, offset = start - segment.base_offset, start
        else:
            first = self._check_boundary(segment, position, offset, available)
        return FileSlice(segment.file, position, max(first, min(max_bytes, available)), offset)

    def _read_cleaned(self, view: View, hw: int, segment: LogSegment, offset: int, max_bytes: int) -> FileSlice:
        """A read from a segment the cleaner rewrote (below the high
        watermark, whole): from the kept batch that holds ``offset``, or the
        next kept one (an offset the cleaner removed: readers see a gap),
        found in its offset index; from the next segment when nothing of
        this one lies at or after ``offset``. A bound ``hw`` inside the
        segment (a ``read_committed`` read's last stable offset, a batch's
        offset) ends the slice before the batch at it."""
        index = segment.offsets
        entry = index.locate(offset)
        if entry is None:
            return self.read(view, hw, max(offset, segment.end_offset), max_bytes)
        stop = index.file_size if hw >= index.end_offset else index.position_of(hw)
        available = stop - entry.position
        if available <= 0:
            return FileSlice(segment.file, entry.position, 0, entry.offset, True)
        first = index.size_of(entry)
        return FileSlice(segment.file, entry.position, max(first, min(max_bytes, available)), entry.offset, True)

    def _batch_containing(self, segment: LogSegment, offset: int, available: int) -> tuple[int, int]:
        """``(its offset, its length)`` of the record batch that holds ``offset``
        in a segment of format 2: the batch that starts there, or the one whose
        records ``offset`` names (record ``i`` of the batch at ``p`` is ``p + i``);
        :class:`CorruptMessageError` (with ``next_offset``) where the bytes are damaged."""
        end = offset + available
        limit = max(self._max_message_bytes, RECOVERY_MAX_MESSAGE_BYTES)
        read = _reader(segment)
        length = batch_at(read, offset, end, limit)
        if length is not None:
            return offset, length
        start = segment.timeindex.boundary_before(offset)
        if start != segment.base_offset and batch_at(read, start, end, limit) is None:
            start = segment.base_offset  # the index entry is no boundary: do not trust it
        kind, low, high = walk_to(read, start, offset, end, limit, fmt=2)
        if kind == "inside":
            length = batch_at(read, low, end, limit)
            if length is not None:
                return low, length
            low, kind = offset, "boundary"  # the batch holding offset is damaged
        if kind == "boundary":
            following = next_readable(read, low, end, limit, fmt=2)
            raise CorruptMessageError(
                f"the batch at offset {low} is damaged: the segment {segment.path} is damaged there; "
                f"the next readable batch is at {following} (consumer.skip_corrupt() skips "
                f"{following - low} bytes)",
                offset=offset,
                next_offset=following,
            )
        raise CorruptMessageError(
            f"offset {offset} lies in damaged bytes [{low}, {high}) of {segment.path}; the next "
            f"readable batch is at {high} (consumer.skip_corrupt() or seek there)",
            offset=offset, damaged_from=low, next_offset=high,
        )

    def _check_boundary(self, segment: LogSegment, position: int, offset: int, available: int) -> int:
        """The length of the message at ``position``: :class:`CorruptMessageError`
        (with ``next_offset``) if a damaged message starts there,
        :class:`InvalidOffsetError` if no message starts there."""
        head = segment.read_at(position, min(available, _PEEK_BYTES))
        damage = "has a damaged size field"  # what a damaged message at ``offset`` is said to have
        if len(head) >= HEADER_SIZE:
            size = _u32(head[:4], "big")
            length = 4 + size
            if MIN_MESSAGE_SIZE <= size <= self._max_message_bytes and length <= available:
                body = head if length <= len(head) else segment.read_at(position, length)
                if len(body) >= length:
                    if crc32c(memoryview(body)[8:length]) == _u32(body[4:8], "big"):
                        return length
                    key_length = int.from_bytes(body[18:22], "big", signed=True)
                    if body[8] == MAGIC and body[9] < 8 and -1 <= key_length <= size - MIN_MESSAGE_SIZE:
                        # Everything but the CRC fits: a damaged message -- or bytes inside a
                        # compressed wrapper that look like a header (an inner message's
                        # offset, w + 1 say, lands in the wrapper's own header): the walk
                        # below tells them apart.
                        damage = "fails its CRC32C check"
        # No readable message here: a damaged one (the walk of the size
        # fields from a known boundary lands here), or not a boundary at all.
        end = offset + available
        limit = max(self._max_message_bytes, RECOVERY_MAX_MESSAGE_BYTES)
        read = _reader(segment)
        length = message_at(read, offset, end, limit)
        if length is not None:  # a whole message stored before max_message_bytes was lowered
            return length
        start = segment.timeindex.boundary_before(offset)
        if start != segment.base_offset and message_at(read, start, end, limit) is None:
            start = segment.base_offset  # the index entry is no boundary: do not trust it
        kind, low, high = walk_to(read, start, offset, end, limit)
        if kind == "boundary":
            raise self._corrupt(segment, offset, offset, end, damage)
        if kind == "damaged":
            raise CorruptMessageError(
                f"offset {offset} lies in damaged bytes [{low}, {high}) of {segment.path}; the next "
                f"readable message is at {high} (consumer.skip_corrupt() or seek there)",
                offset=offset, damaged_from=low, next_offset=high,
            )
        head = read(low, HEADER_SIZE)
        if len(head) == HEADER_SIZE and head[9] & CODEC_MASK:
            raise inside_wrapper(offset, low, high)
        raise InvalidOffsetError(
            f"offset {offset} is not the start of a message in the log (it lies inside the message "
            f"[{low}, {high})); use an offset returned by the log (a message's offset or a committed offset)",
            offset=offset,
            message_offset=low,
            next_offset=high,
        )

    def _corrupt(self, segment: LogSegment, offset: int, bad: int, end: int, what: str) -> CorruptMessageError:
        """The error for the damaged message at ``bad``, with the next readable offset."""
        limit = max(self._max_message_bytes, RECOVERY_MAX_MESSAGE_BYTES)
        following = next_readable(_reader(segment), bad, end, limit)
        return CorruptMessageError(
            f"message at offset {offset} {what}: the segment {segment.path} is damaged there; "
            f"the next readable message is at {following} (consumer.skip_corrupt() skips "
            f"{following - bad} bytes)",
            offset=offset,
            next_offset=following,
        )

    def message_boundaries(self, view: View, hw: int, start: int, end: int, targets) -> list[int]:
        """For each of ``targets``, the first message boundary at or after it,
        within ``[start, end]`` (a target below ``start`` gives ``start``, one
        at or past ``end`` gives ``end``).

        ``start`` must be a message boundary (the log start, a message's
        offset, a committed offset) or lie inside a compressed wrapper (an
        inner message's offset: the first boundary after it is the
        wrapper's end), and ``end`` one or the high watermark.
        In a segment of format 2, a ``start`` inside a batch (a record's
        offset) gives the batch's end as the first boundary after it, and the
        walk reads batchLength fields.
        The walk reads only the 4-byte size fields, in blocks of
        :data:`BOUNDARY_BLOCK_BYTES`, from the nearest known boundary before
        each target: ``start``, the previous answer, or the base of the
        target's segment (segments hold whole messages). No CRC is checked;
        a size field that cannot be one raises :class:`CorruptMessageError`.
        Used to split a large range of a partition into pieces that never
        cut a message (``raylog_spark.read_topic(min_partitions=...)``).
        """
        bases, segments = view
        if not bases[0] <= start <= end <= hw:
            raise OffsetOutOfRangeError(
                f"range [{start}, {end}) is not within the log [{bases[0]}, {hw}]",
                offset=start if start < bases[0] else end,
                earliest=bases[0],
                latest=hw,
            )
        known = start
        if start < end:
            segment = segments[bisect.bisect_right(bases, start) - 1]
            available = min(hw, segment.base_offset + segment.size) - start
            if segment.offsets is not None:
                entry = segment.offsets.locate(start)
                if entry is not None and entry.offset < start:
                    known = min(entry.next_offset, end)  # start is inside a kept batch: its end is next
            elif start != segment.base_offset and available > 0 and segment.format == 2:
                low, length = self._batch_containing(segment, start, available)
                if low != start:
                    known = min(low + length, end)  # start is inside a batch: its end is next
            elif start != segment.base_offset and available > 0:
                try:
                    self._check_boundary(segment, start - segment.base_offset, start, available)
                except InvalidOffsetError as err:
                    if "wrapper_offset" not in err.details:
                        raise
                    known = min(err.details["next_offset"], end)  # start is inside a wrapper: its end is next
        limit = max(self._max_message_bytes, RECOVERY_MAX_MESSAGE_BYTES)
        found: dict[int, int] = {}
        for target in sorted(set(targets)):
            if target <= start or target >= end:
                found[target] = start if target <= start else end
                continue
            if target <= known:
                found[target] = known
                continue
            segment = segments[bisect.bisect_right(bases, target) - 1]
            if segment.offsets is not None:  # a cleaned segment: its index knows every batch
                entry = segment.offsets.locate(target)
                if entry is None:
                    found[target] = known = min(end, segment.end_offset)
                else:
                    found[target] = known = min(end, entry.offset if entry.offset >= target else entry.next_offset)
                continue
            seg_base = segment.base_offset
            seg_end = min(end, seg_base + segment.size)
            pos = max(known, seg_base)
            # format 1: a u32 size at 0..4; format 2: batchLength (i32) at 8..12
            field_at, overhead, smallest = (8, 12, _BATCH_MIN_LENGTH) if segment.format == 2 else (0, 4, MIN_MESSAGE_SIZE)
            block, block_start = b"", pos
            while pos < target:
                rel = pos - block_start
                if rel + overhead > len(block):
                    block = segment.read_at(pos - seg_base, min(BOUNDARY_BLOCK_BYTES, seg_end - pos))
                    block_start, rel = pos, 0
                    if len(block) < overhead:
                        raise CorruptMessageError(
                            f"the size field at offset {pos} of {self._dir} is cut short", offset=pos
                        )
                (size,) = _SIZE_FIELD.unpack_from(block, rel + field_at)
                if size < smallest or size > limit or pos + overhead + size > seg_end:
                    raise CorruptMessageError(
                        f"offset {pos} of {self._dir} holds a size field of {size}, which is not a "
                        f"message's (the walk from {max(known, seg_base)} lost the message boundaries)",
                        offset=pos,
                    )
                pos += overhead + size
            found[target] = known = pos
        return [found[t] for t in targets]

    def offsets_before(self, view: View, hw: int, timestamp_ms: int, max_offsets: int = 1) -> list[int]:
        """Offsets to start reading from for data written before ``timestamp_ms``.

        As Kafka 0.7's ``getOffsetsBefore``: the base offsets of segments last
        modified before ``timestamp_ms`` (newest first, at most
        ``max_offsets``); ``-1`` means latest (the high watermark) and ``-2``
        earliest (the log start).
        """
        bases, segments = view
        if timestamp_ms == -1:
            return [hw][:max_offsets]
        if timestamp_ms == -2:
            return [bases[0]][:max_offsets]
        found = [s.base_offset for s in segments if s.mtime_ms() < timestamp_ms]
        return found[::-1][:max_offsets]

    def offset_for_time(self, view: View, hw: int, timestamp_ms: int) -> int:
        """The offset of the first message at or after ``timestamp_ms``
        (below the high watermark), found with the segments' time indexes
        (:mod:`raylog.storage.timeindex`); the high watermark when there is
        none."""
        _bases, segments = view
        for segment in segments:
            if segment.base_offset >= hw:
                break
            if segment.offsets is not None:  # a cleaned segment: its batches' maxTimestamps, in order
                for entry in segment.offsets.entries():
                    if int.from_bytes(segment.read_at(entry.position + _BATCH_MAX_TS_AT, 8), "big",
                                      signed=True) >= timestamp_ms:
                        return entry.offset
                continue
            found = segment.timeindex.lookup(segment, timestamp_ms, min(segment.end_offset, hw))
            if found is not None:
                return found
        return hw
