"""The record counts of a segment: how many records a read from the
segment's start up to a position returns, kept sparsely in memory, so that
a COUNT of a long range (a consumer's lag, a Spark trigger's backlog) costs
a short walk instead of a walk of the whole range.

A :class:`SegmentCounts` lives with its :class:`~raylog.storage.segment.LogSegment`
(``segment.counts``) and holds checkpoints ``(position, records)``: a
message boundary in the segment and the records a reader gets from the
segment's base offset up to it, as :func:`raylog.storage.counting.count_range`
counts them (a compressed wrapper counts its inner messages, a control
batch none, offsets the log cleaner removed nothing). The first checkpoint
is ``(base offset, 0)``.

Checkpoints are learnt, never guessed: :func:`raylog.storage.counting.count_between`
walks from the last checkpoint at or before a position to it with
:func:`~raylog.storage.counting.count_range` (every size, header and CRC32C
checked, wrappers inflated), and keeps one checkpoint every
:data:`CHECKPOINT_BYTES` of log it walks (never two closer than
:data:`MIN_SPACING_BYTES`), and one at the segment's end once the segment is
closed. So the bytes of a segment are walked and checked
once, by the first count that reaches them; a later count of any range
walks at most about one interval at each of its ends. A range whose first
walk finds a damaged message raises as a walk always did, and no checkpoint
is kept past the damage.

The counts are in memory only: a partition opened again (a restart, a new
leader) learns them by the first count that walks each segment. They follow
the segment's life: the cleaner's rewrite of a segment is a new segment
object with none; a truncation (:meth:`SegmentCounts.truncate`, from
:meth:`LogSegment.truncate <raylog.storage.segment.LogSegment.truncate>`
and a mend of damaged bytes) drops those past the cut.

Thread-safety: every method takes the object's lock; a walk that extends
the checkpoints holds :attr:`SegmentCounts.walk_lock`, so two counts of one
segment do not walk the same bytes twice.
"""

from __future__ import annotations

import bisect
import threading
from array import array

#: log bytes walked between two checkpoints of a segment
CHECKPOINT_BYTES = 1 << 20

#: the least distance between two checkpoints (a count that walks less,
#: bounded by its request, keeps none): the memory of a segment's counts is
#: bounded by its size, whatever clients ask
MIN_SPACING_BYTES = CHECKPOINT_BYTES // 4


class SegmentCounts:
    """The sparse record counts of one segment (see the module docstring)."""

    __slots__ = ("_lock", "walk_lock", "_positions", "_records")

    def __init__(self, base_offset: int):
        self._lock = threading.Lock()
        #: held by a count while it walks the segment and adds checkpoints
        self.walk_lock = threading.Lock()
        # 8 bytes an entry each (a segment of 1 GiB walked: about 16 KiB)
        self._positions = array("q", [base_offset])
        self._records = array("q", [0])

    def __len__(self) -> int:
        return len(self._positions)

    def floor(self, position: int) -> tuple[int, int]:
        """The last checkpoint at or before ``position``: ``(position, records)``."""
        with self._lock:
            i = bisect.bisect_right(self._positions, position) - 1
            return self._positions[max(i, 0)], self._records[max(i, 0)]

    def add(self, position: int, records: int, *, end: bool = False) -> None:
        """Keep a checkpoint at least :data:`MIN_SPACING_BYTES` after the
        last one, or at the segment's ``end`` (others are ignored: short
        walks of small counts, a walk that raced a truncation, or known
        already), so a segment holds at most one per
        :data:`MIN_SPACING_BYTES` whatever its counts ask."""
        with self._lock:
            last = self._positions[-1]
            if (position >= last + MIN_SPACING_BYTES or (end and position > last)) and records >= self._records[-1]:
                self._positions.append(position)
                self._records.append(records)

    def truncate(self, end: int) -> None:
        """Forget the checkpoints past ``end`` (the segment was cut there,
        or the bytes after it were rewritten)."""
        with self._lock:
            keep = max(1, bisect.bisect_right(self._positions, end))
            del self._positions[keep:], self._records[keep:]

    def checkpoints(self) -> list[tuple[int, int]]:
        """Every checkpoint ``(position, records)``, in position order (a copy)."""
        with self._lock:
            return list(zip(self._positions, self._records))
