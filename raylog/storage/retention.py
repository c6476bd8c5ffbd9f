"""Segment rolls and retention of a partition log: a new segment when the
active one is full or older than ``segment_ms``, and deletion of whole old
segments by time and size (a mixin of :class:`~raylog.storage.log.PartitionLog`;
see :mod:`raylog.storage.log`)."""

from __future__ import annotations

import logging

from raylog.errors import DiskFullError, StorageError
from raylog.storage import faults as _faults
from raylog.storage.fileops import _sync_directory, is_disk_full
from raylog.storage.segment import LogSegment

log = logging.getLogger(__name__)


class LogRetention:
    """Rolls and retention of :class:`~raylog.storage.log.PartitionLog`
    (writer side: they take the writer's lock)."""

    def _roll(self) -> LogSegment:
        """Start a new segment at the log end (writer lock held)."""
        old = self._active
        try:
            _faults.check("roll", self._dir)
            old.flush()  # so that only the last segment can ever hold unsynced bytes
            new = LogSegment.open(self._dir, self._leo)
            _sync_directory(self._dir)
        except OSError as err:
            if is_disk_full(err):  # the old segment stays active; nothing changed
                raise self._now_disk_full(err, self._dir) from err
            self._fail(err)
            raise StorageError(f"cannot roll the log in {self._dir}: {err}") from err
        bases, segments = self._view
        self._view = ([*bases, new.base_offset], [*segments, new])
        self._active = new
        self._active_since = None
        return new

    def maybe_roll(self, now: float | None = None) -> bool:
        """Roll the active segment if its first message came more than
        ``segment_ms`` ago (timer hook; an empty segment never rolls).
        Returns whether it rolled."""
        since = self._active_since
        if since is None or self._closed:
            return False
        if now is None:
            now = self._clock()
        if (now - since) * 1000.0 < self._config.segment_ms:
            return False
        with self._lock:
            if self._closed or self._failed is not None or not self._active.size or self._active_since is None:
                return False
            try:
                self._roll()
            except DiskFullError:
                return False  # rolled by a later tick, once there is room
            return True

    def delete_old_segments(self, now_ms: int | None = None) -> list[tuple[int, int]]:
        """Retention: delete whole old segments, never the active one.

        Oldest first, segments modified more than ``retention_ms`` before
        ``now_ms``, then while the log is larger than ``retention_bytes``
        (when that is not -1). Only flushed segments go. Returns ``(base
        offset, bytes)`` of each deleted segment; the log start moves forward.
        """
        with self._lock:
            if self._closed:
                return []
            if now_ms is None:
                now_ms = int(self._clock() * 1000)
            bases, segments = self._view
            hw = self._hw
            retention_ms = self._config.retention_ms
            retention_bytes = self._config.retention_bytes
            candidates = [s for s in segments[:-1] if s.end_offset <= hw]
            dead = 0
            while dead < len(candidates) and now_ms - candidates[dead].mtime_ms() > retention_ms:
                dead += 1
            if retention_bytes >= 0:
                total = sum(s.size for s in segments[dead:])
                while dead < len(candidates) and total > retention_bytes:
                    total -= candidates[dead].size
                    dead += 1
            if not dead:
                return []
            gone = segments[:dead]
            self._view = (bases[dead:], segments[dead:])
        # Unlinking large files takes a while: outside the lock, so appends go on.
        try:
            _faults.check("retention", self._dir)
            for segment in gone:  # oldest first: the rest stays contiguous on a crash
                segment.delete()
        except OSError as err:
            self._fail(err)
            raise StorageError(f"cannot delete old segments in {self._dir}: {err}") from err
        deleted = [(s.base_offset, s.size) for s in gone]
        log.info("retention deleted %d segment(s) of %s: %s", len(deleted), self._dir, deleted)
        return deleted
