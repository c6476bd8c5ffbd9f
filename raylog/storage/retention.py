"""Retention of a partition log: which whole old segments go, by time and
by size, and deleting them (:class:`Retention`, owned by
:class:`~raylog.storage.log.PartitionLog`, whose
:meth:`~raylog.storage.log.PartitionLog.delete_old_segments` takes them out
of the log under its writer lock and calls :meth:`Retention.delete` outside
it; see :mod:`raylog.storage.log`)."""

from __future__ import annotations

from raylog.storage import faults as _faults
from raylog.storage.segment import LogSegment


class Retention:
    """The retention of the log in ``directory``: segments modified more
    than ``retention_ms`` ago go, then the oldest while the log holds more
    than ``retention_bytes`` (-1: no bound by size). Never the active
    segment, never one with bytes at or past the high watermark. Keeps no
    state (any thread)."""

    def __init__(self, directory: str, retention_ms: int, retention_bytes: int):
        self._dir = directory
        self._retention_ms = retention_ms
        self._retention_bytes = retention_bytes

    def expired(self, segments: list[LogSegment], hw: int, now_ms: int, start: int = 0) -> int:
        """How many of the oldest ``segments`` (the log's, oldest first, the
        active one last) retention deletes at ``now_ms``: those wholly below
        the log start ``start`` (:meth:`below_start`) whatever their age,
        then by time and size."""
        candidates = [s for s in segments[:-1] if s.end_offset <= hw]
        dead = self.below_start(segments, start)
        while dead < len(candidates) and now_ms - candidates[dead].mtime_ms() > self._retention_ms:
            dead += 1
        if self._retention_bytes >= 0:
            total = sum(s.size for s in segments[dead:])
            while dead < len(candidates) and total > self._retention_bytes:
                total -= candidates[dead].size
                dead += 1
        return dead

    @staticmethod
    def below_start(segments: list[LogSegment], start: int) -> int:
        """How many of the oldest ``segments`` lie wholly below the log
        start ``start`` (a deletion of records moved it there,
        :meth:`~raylog.storage.log.PartitionLog.delete_records_before`):
        closed ones whose end is at or before it; never the active segment."""
        dead = 0
        while dead < len(segments) - 1 and segments[dead].end_offset <= start:
            dead += 1
        return dead

    def delete(self, gone: list[LogSegment]) -> None:
        """Unlink ``gone`` (already out of the log), oldest first: the rest
        stays contiguous on a crash. Raises the first ``OSError``."""
        _faults.check("retention", self._dir)
        for segment in gone:
            segment.delete()
