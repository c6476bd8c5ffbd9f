"""Opening a partition log: the checkpoint (``recovery-point``,
:class:`Checkpoint`) and recovery of the segments past it and of the whole
active segment (:class:`LogRecovery`, run once by
:class:`~raylog.storage.log.PartitionLog`'s constructor; see
:mod:`raylog.storage.log`).

Damage past the checkpoint is a torn or corrupt tail: cut, with what
follows it. Damage before it (flushed, acknowledged data) is reported and
kept, with the next readable offset found by :mod:`raylog.storage.resync`
(a :class:`RecoveryReport` with ``kept``); checking goes on from there."""

from __future__ import annotations

import logging
import os
from typing import NamedTuple

from crc32c import crc32c

from raylog.errors import StorageError
from raylog.storage.fileops import sync_directory
from raylog.storage.owner_only import FILE_MODE
from raylog.storage.resync import next_readable
from raylog.storage.offsetindex import OffsetIndex, OffsetIndexError, scan_entries
from raylog.storage.record_batch import HEADER_SIZE, read_header
from raylog.storage.segment import LogSegment, SegmentFile, parse_segment_name, segment_name

log = logging.getLogger(__name__)

CHECKPOINT_NAME = "recovery-point"
#: the checkpoint record: 20 offset digits, a space, 8 hex digits of CRC32C, newline
_CHECKPOINT_SIZE = 30
#: recovery accepts stored messages up to this size even if ``max_message_bytes``
#: was lowered since they were written (it only cuts what is really damaged)
RECOVERY_MAX_MESSAGE_BYTES = 64 << 20


class RecoveryReport(NamedTuple):
    """Bytes cut off a segment by recovery: log offsets ``[start_offset,
    end_offset)``; or, with ``kept``, damaged flushed bytes found and left
    in place (``truncated_bytes`` 0): readers get ``CorruptMessageError``
    there, with ``end_offset`` as its ``next_offset``."""

    segment_base: int
    start_offset: int
    end_offset: int
    truncated_bytes: int
    reason: str
    kept: bool = False


class Checkpoint:
    """The ``recovery-point`` file of the partition log in ``directory``:
    the last flushed offset, one fixed-size record rewritten in place.

    Record (30 bytes, ASCII): the offset as 20 decimal digits, a space, the
    CRC32C of those 20 digits as 8 lowercase hex digits, a newline. A torn or
    damaged record reads as missing (recovery then checks the whole last
    segment).

    Thread-safety: the log's writer locks serialize ``write`` and ``close``.
    """

    def __init__(self, directory: str):
        self.directory = directory
        self.path = os.path.join(directory, CHECKPOINT_NAME)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        self.file = SegmentFile(fd, "r+")

    def write(self, offset: int) -> None:
        # No fsync of its own: it never claims more than the data just
        # synced, and a stale record only makes recovery check more.
        # (Not write-and-rename: ext4 flushes a file renamed over another,
        # which costs more than the rest of a flush.)
        digits = b"%020d" % offset
        record = b"%s %08x\n" % (digits, crc32c(digits))
        os.pwrite(self.file.fileno(), record, 0)

    def read(self) -> int | None:
        text = os.pread(self.file.fileno(), 64, 0)
        if not text:
            return None
        if len(text) == _CHECKPOINT_SIZE and text[20:21] == b" " and text[-1:] == b"\n":
            digits = text[:20]
            if digits.isdigit() and b"%08x" % crc32c(digits) == text[21:29]:
                return int(digits)
        log.warning("ignoring the damaged recovery point %r in %s", text[:40], self.directory)
        return None

    def close(self) -> None:
        self.file.close()


class LogRecovery:
    """Recovery of the segments in ``directory`` against its ``checkpoint``
    (rewritten at the end), accepting stored messages up to
    ``max_message_bytes`` (or :data:`RECOVERY_MAX_MESSAGE_BYTES`, the larger).
    :meth:`run` returns the segments to open the log with; ``reports`` lists
    what it cut or found damaged and kept."""

    def __init__(self, directory: str, checkpoint: Checkpoint, max_message_bytes: int):
        self._dir = directory
        self._checkpoint = checkpoint
        self._max_message_bytes = max_message_bytes
        self.reports: list[RecoveryReport] = []

    def run(self) -> list[LogSegment]:
        """Open the segments, check everything past the checkpoint, cut a bad tail."""
        bases = []
        for name in os.listdir(self._dir):
            base = parse_segment_name(name)
            if base is not None:
                bases.append(base)
            elif name.endswith(".log"):
                log.warning("ignoring %s in %s: not a segment name", name, self._dir)
        if not bases:
            segment = LogSegment.open(self._dir, 0)
            sync_directory(self._dir)
            self._checkpoint.write(0)
            return [segment]
        segments = [LogSegment.open(self._dir, base) for base in sorted(bases)]
        self._mend_offset_indexes(segments)
        if segments[-1].cleaned:
            segments.append(self._active_after_cleaned(segments[-1]))
        for prev, nxt in zip(segments, segments[1:]):
            if prev.end_offset != nxt.base_offset:
                raise StorageError(
                    f"segments of {self._dir} are not contiguous: {segment_name(prev.base_offset)} "
                    f"ends at {prev.end_offset} but the next starts at {nxt.base_offset}. "
                    f"The directory was changed by hand; move the stray segment away and reopen.",
                    directory=self._dir,
                )
        end = segments[-1].end_offset
        checkpoint = self._checkpoint.read()
        #: bytes below this were flushed (acknowledged as durable): damage
        #: there is reported and kept, never cut with what follows it
        flushed = None
        if checkpoint is None:
            log.warning("no recovery point in %s; checking the whole last segment", self._dir)
            scan_from = segments[-1].base_offset
        elif checkpoint > end:
            self._report(
                segments[-1].base_offset, end, checkpoint, 0,
                f"the recovery point says {checkpoint} was flushed but the log ends at {end}: "
                f"{checkpoint - end} flushed bytes are missing (the disk lost synced data)",
            )
            scan_from = segments[-1].base_offset
        else:
            flushed = checkpoint
            # the whole active segment is checked, flushed part included
            scan_from = max(min(checkpoint, segments[-1].base_offset), segments[0].base_offset)
        limit = max(self._max_message_bytes, RECOVERY_MAX_MESSAGE_BYTES)
        for index, segment in enumerate(segments):
            if (segment.end_offset <= scan_from or segment.cleaned) and segment is not segments[-1]:
                continue  # (a cleaned segment was synced whole before it replaced the old ones)
            start = max(scan_from - segment.base_offset, 0)
            while True:
                valid_end, err = segment.scan(start, limit)
                if err is None or flushed is None or segment.base_offset + valid_end >= flushed:
                    break
                start = self._report_damage(segment, valid_end, err, limit)
            if err is None:
                continue
            cut_at = segment.base_offset + valid_end
            # Later segments follow damaged data: drop them, newest first, so a
            # crash meanwhile leaves a contiguous log that recovers the same way.
            for later in reversed(segments[index + 1 :]):
                self._report(
                    later.base_offset, later.base_offset, later.end_offset, later.size,
                    f"the whole segment follows the damaged data at offset {cut_at}",
                )
                later.delete()
            if index + 1 < len(segments):
                sync_directory(self._dir)
            what = "torn (incomplete) message" if err.details.get("partial") else str(err)
            self._report(segment.base_offset, cut_at, segment.end_offset, segment.size - valid_end, what)
            segment.truncate(valid_end)
            del segments[index + 1 :]
            break
        segments[-1].flush()
        self._checkpoint.write(segments[-1].end_offset)
        return segments

    def _mend_offset_indexes(self, segments: list[LogSegment]) -> None:
        """Rebuild the offset index of a cleaned segment that lost it or
        whose index cannot be trusted (raylog.storage.offsetindex), from its
        batch headers and the next segment's base offset; logged, since the
        index is derived data nothing is lost."""
        for prev, nxt in zip(segments, segments[1:]):
            damaged = prev.index_damaged
            lost = prev.offsets is None and prev.format in (2, None) and prev.end_offset < nxt.base_offset
            if not (damaged or lost):
                continue
            try:
                prev.rebuild_offsets(nxt.base_offset)
            except (OffsetIndexError, OSError) as err:
                if damaged:
                    raise StorageError(
                        f"the offset index of the cleaned segment {prev.path} is damaged and cannot be rebuilt "
                        f"from the segment ({err}); restore the partition from a replica",
                        directory=self._dir,
                    ) from err
                continue  # not a cleaned segment: the contiguity check below says what is wrong
            log.warning("recovery of %s rebuilt the offset index of the cleaned segment %s", self._dir, prev.path)

    def _active_after_cleaned(self, segment: LogSegment) -> LogSegment:
        """The log ends with a cleaned segment: a replica's write of one, or
        its cut by a truncation (:meth:`PartitionLog.truncate_replica
        <raylog.storage.log.PartitionLog.truncate_replica>`), stopped before
        the new active segment was made. Finish it: the index is sound (else
        it is rebuilt from the batches, ending after the last); the file is
        cut after the index's last batch (a cut rewrites the index first);
        then the new empty active segment starts at the segment's end."""
        if segment.index_damaged:
            try:
                entries = scan_entries(segment.read_at, segment.size)
                segment.rebuild_offsets(entries[-1][0] + entries[-1][1] if entries else segment.base_offset)
            except (OffsetIndexError, OSError) as err:
                raise StorageError(
                    f"the offset index of the cleaned segment {segment.path} is damaged and cannot be rebuilt "
                    f"from the segment ({err}); restore the partition from a replica",
                    directory=self._dir,
                ) from err
        index = segment.offsets
        entries = index.entries()
        want = 0
        if entries:
            want = entries[-1].position + read_header(segment.read_at(entries[-1].position, HEADER_SIZE)).size
        if segment.size > want:
            log.warning("recovery of %s finished cutting the cleaned segment %s at %d (a replica's truncation)",
                        self._dir, segment.path, index.end_offset)
            segment.truncate(want)
            segment.offsets = OffsetIndex(segment.base_offset, index.end_offset, entries, want, index.dirty_from)
        active = LogSegment.open(self._dir, segment.end_offset)
        sync_directory(self._dir)
        return active

    def _report(self, segment_base: int, start: int, end: int, size: int, reason: str) -> None:
        report = RecoveryReport(segment_base, start, end, size, reason)
        self.reports.append(report)
        log.warning(
            "recovery of %s cut %d bytes, offsets [%d, %d) of segment %s: %s",
            self._dir, size, start, end, segment_name(segment_base), reason,
        )

    def _report_damage(self, segment: LogSegment, position: int, err: Exception, limit: int) -> int:
        """Report damaged flushed bytes at ``position`` of ``segment`` (kept:
        readers get :class:`CorruptMessageError` with the next readable
        offset); returns the position to go on checking from."""
        base = segment.base_offset
        following = next_readable(lambda offset, length: segment.read_at(offset - base, length),
                                  base + position, segment.end_offset, limit, segment.format or 1)
        report = RecoveryReport(base, base + position, following, 0, f"damaged flushed data kept: {err}", True)
        self.reports.append(report)
        log.warning(
            "recovery of %s found %d damaged bytes, offsets [%d, %d) of segment %s, and kept them (%s); "
            "readers get CorruptMessageError there and skip to %d with consumer.skip_corrupt()",
            self._dir, following - base - position, base + position, following, segment_name(base), err, following,
        )
        return following - base
