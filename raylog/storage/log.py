"""The partition log (DESIGN §3): segments, append, flush, read, retention, recovery.

On disk a partition is a directory of segment files ``<base offset, 20
digits>.log`` (:mod:`raylog.storage.segment`) plus a small checkpoint file,
``recovery-point``, holding the last flushed offset (with a CRC32C of its own),
``producer-state``, the journal of idempotent producers' sequences
(:mod:`raylog.storage.producer_state`), and ``lock``, an empty file its owner
holds an exclusive ``fcntl.flock`` on while the log is open: a second owner
(another actor, of this cluster or another one pointed at the same
directory) fails to open it with :class:`LogDirectoryLockedError`. The log offset of a
message is its byte position in the concatenation of the segments; segment
``k + 1`` starts where segment ``k`` ends.

Life of a message set:

1. :meth:`PartitionLog.append` validates it (every CRC, see
   :func:`~raylog.storage.message.validate_message_set`; wrappers inflate to
   at most ``max_inflated_bytes``), rolls to a new
   segment if the set would take the active one past ``segment_bytes``, and
   writes it with one ``os.write``. It is not visible yet.
   :meth:`PartitionLog.append_sequenced` does the same for the sets of an
   idempotent producer, after judging their sequence numbers.
2. :meth:`PartitionLog.flush` syncs the segment, records the flushed offset
   in the checkpoint, then advances the **high watermark** and wakes readers
   blocked in :meth:`PartitionLog.wait_for_data`. It runs when called, from
   :meth:`PartitionLog.maybe_flush` (the owner's timer) once ``flush_ms``
   passed since the first unflushed append, and, started by ``append`` itself
   once ``flush_messages`` messages are unflushed or while a reader waits in
   ``wait_for_data`` (a long poll: it sees new data without waiting out
   ``flush_ms``), on a background thread: the appender does not wait for the
   disk, and appends made during a sync are covered by the next one (group
   commit: at most one sync at a time).
3. :meth:`PartitionLog.read` hands out a :class:`FileSlice` of bytes below the
   high watermark for ``os.sendfile``.
4. :meth:`PartitionLog.delete_old_segments` drops whole old segments
   (retention); the log start offset moves forward. :meth:`PartitionLog.maybe_roll`
   (the owner's timer) rolls an active segment older than ``segment_ms``,
   so that retention reaches the data of a quiet partition too.

Disk errors: the first failed write, sync, roll or delete makes the log
refuse every later write (:class:`StorageError`) and calls ``on_disk_error``
when one was given; the partition actor passes a function that ends its
process, so that Ray restarts it and recovery runs (never a wedged log).

Recovery on open checks every message past the checkpoint by CRC; a torn or
corrupt tail is cut off, and each cut is logged as a warning and listed in
:attr:`PartitionLog.recovery_reports`. Nothing is dropped silently.
"""

from __future__ import annotations

import bisect
import fcntl
import logging
import os
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, NamedTuple

from crc32c import crc32c

from raylog.config import TopicConfig
from raylog.errors import (
    ClosedError,
    CorruptMessageError,
    InvalidOffsetError,
    LogDirectoryLockedError,
    MessageTooLargeError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    StorageError,
)
from raylog.storage import faults as _faults
from raylog.storage.message import (
    HEADER_SIZE,
    MAGIC,
    MIN_MESSAGE_SIZE,
    validate_message_set,
)
from raylog.storage.producer_state import ProducerStateTable
from raylog.storage.segment import LogSegment, SegmentFile, parse_segment_name, segment_name

log = logging.getLogger(__name__)

CHECKPOINT_NAME = "recovery-point"
#: the file a log's owner holds an exclusive ``flock`` on while the log is open
LOCK_NAME = "lock"
#: the checkpoint record: 20 offset digits, a space, 8 hex digits of CRC32C, newline
_CHECKPOINT_SIZE = 30
#: recovery accepts stored messages up to this size even if ``max_message_bytes``
#: was lowered since they were written (it only cuts what is really damaged)
RECOVERY_MAX_MESSAGE_BYTES = 64 << 20
#: threads per process that run the flushes triggered by flush_messages
FLUSH_THREADS = 2
#: bytes read to check the message at the start of a read
_PEEK_BYTES = 4096
#: bytes read at a time when :meth:`PartitionLog.message_boundaries` walks size fields
BOUNDARY_BLOCK_BYTES = 1 << 20
_SIZE_FIELD = struct.Struct(">I")

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


class RecoveryReport(NamedTuple):
    """Bytes cut off a segment by recovery: log offsets ``[start_offset, end_offset)``."""

    segment_base: int
    start_offset: int
    end_offset: int
    truncated_bytes: int
    reason: str


class PartitionLog:
    """The log of one partition, in ``directory``.

    Thread-safety: one writer at a time (``append``, ``flush``,
    ``maybe_flush``, ``delete_old_segments``, ``close`` serialize on internal
    locks and may be called from any thread) and any number of concurrent
    readers (``read``, ``wait_for_data`` and the properties), which never take
    the writer's lock. Readers see only bytes below the high watermark.
    A sync (fsync) runs outside the append lock, so appends continue while it
    runs; the sync that ``flush_messages`` triggers runs on a background thread
    (at most one pending per log), so the high watermark advances shortly after
    the append that triggered it returns. A failed sync is raised (as
    :class:`StorageError`) by every later call.

    Offsets are byte positions (DESIGN §2). ``flush_messages`` counts messages
    as appended: a compressed wrapper counts as one.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        config: TopicConfig = TopicConfig(),
        *,
        clock: Callable[[], float] = time.time,
        on_disk_error: Callable[[BaseException], None] | None = None,
    ):
        self._dir = os.fspath(directory)
        self._config = config
        self._clock = clock
        self._on_disk_error = on_disk_error
        self._max_inflated = config.max_inflated_limit
        self._lock = threading.Lock()  # appends, rolls, retention, segment list
        self._flush_lock = threading.Lock()  # one sync at a time; taken before _lock
        self._cond = threading.Condition(threading.Lock())  # high watermark waiters
        self._closed = False
        self._failed: BaseException | None = None
        self._reports: list[RecoveryReport] = []
        self._unflushed = 0
        self._messages_appended = 0  # since open (outer messages)
        self._first_unflushed_at: float | None = None
        self._flush_requested = False
        self._waiting = 0  # readers blocked in wait_for_data: they get a prompt flush
        try:
            os.makedirs(self._dir, exist_ok=True)
            self._lock_fd = _lock_directory(self._dir)
        except OSError as err:
            raise StorageError(f"cannot open the partition log in {self._dir}: {err}") from err
        try:
            segments = self._recover()
            self._producers = ProducerStateTable(self._dir, config.max_producer_ids)
            for note in self._producers.open(segments[-1].end_offset):
                log.warning("recovery of %s: %s", self._dir, note)
        except BaseException as err:
            os.close(self._lock_fd)
            if isinstance(err, OSError):
                raise StorageError(f"cannot open the partition log in {self._dir}: {err}") from err
            raise
        # Readers take (bases, segments) in one read; the writer replaces it.
        self._view: tuple[list[int], list[LogSegment]] = ([s.base_offset for s in segments], segments)
        self._active = segments[-1]
        #: when the active segment got its first message (segment_ms)
        self._active_since = self._active.mtime_ms() / 1000.0 if self._active.size else None
        self._leo = self._active.end_offset
        self._hw = self._leo

    # -- properties (any thread) ------------------------------------------------

    @property
    def directory(self) -> str:
        return self._dir

    @property
    def config(self) -> TopicConfig:
        return self._config

    @property
    def high_watermark(self) -> int:
        """Bytes below this offset are flushed and visible to readers."""
        return self._hw

    @property
    def log_start_offset(self) -> int:
        return self._view[0][0]

    @property
    def log_end_offset(self) -> int:
        """The offset the next append gets (unflushed bytes included)."""
        return self._leo

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self._view[1])

    @property
    def segment_bases(self) -> list[int]:
        return list(self._view[0])

    @property
    def recovery_reports(self) -> list[RecoveryReport]:
        """What recovery cut off when the log was opened (empty after a clean shutdown)."""
        return list(self._reports)

    @property
    def unflushed_messages(self) -> int:
        return self._unflushed


    @property
    def messages_appended(self) -> int:
        """Messages appended since the log was opened (a compressed set
        counts as one); a cheap running total for metrics."""
        return self._messages_appended

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        return (
            f"PartitionLog({self._dir!r}, start={self.log_start_offset}, hw={self._hw}, "
            f"end={self._leo}, segments={len(self._view[0])})"
        )

    # -- writer -------------------------------------------------------------------

    def append(self, message_set: bytes) -> int:
        """Append a message set; return the offset of its first byte.

        The set is validated first (nothing is written if any message is
        bad) and becomes visible at the next flush. Once ``flush_messages``
        messages are unflushed, this starts a flush on a background thread.
        """
        size = len(message_set)
        limit = self._config.max_message_bytes
        if size > limit:
            raise MessageTooLargeError(
                f"message set of {size} bytes is larger than max_message_bytes ({limit}); "
                f"send smaller batches or raise max_message_bytes on the topic",
                size=size,
                limit=limit,
            )
        count = validate_message_set(message_set, limit, self._max_inflated)
        with self._lock:
            self._check_writable()
            if not count:
                return self._leo
            return self._append_locked(message_set, size, count, None)

    def append_sequenced(
        self, message_set, producer_id: int, producer_epoch: int, first_sequence: int, lengths, *, name: str = ""
    ) -> int:
        """Append the sets of an idempotent producer, joined in
        ``message_set`` (``lengths``: the byte length of each, with
        sequences ``first_sequence``, ``first_sequence + 1``, ...). Returns
        the base offset of the first.

        One set (``len(lengths) == 1``) is judged by the rules of
        :meth:`ProducerStateTable.check`: a duplicate appends nothing and
        returns the base offset of its first store. Several sets are appended
        together only when all are new and in order; otherwise this raises
        :class:`OutOfOrderSequenceError` and the caller offers them one by
        one. ``name`` (``topic-partition``) goes into the errors.
        """
        size = len(message_set)
        limit = self._config.max_message_bytes
        if size > limit:
            raise MessageTooLargeError(
                f"message set of {size} bytes is larger than max_message_bytes ({limit}); "
                f"send smaller batches or raise max_message_bytes on the topic",
                size=size,
                limit=limit,
            )
        count = validate_message_set(message_set, limit, self._max_inflated)
        with self._lock:
            self._check_writable()
            producers = self._producers
            if len(lengths) == 1:
                stored = producers.check(producer_id, producer_epoch, first_sequence, topic_partition=name)
                if stored is not None:
                    return stored
            elif not producers.check_run(producer_id, first_sequence):
                raise OutOfOrderSequenceError(
                    f"{name}: the run of sets from sequence {first_sequence} is not all new and in order",
                    producer_id=producer_id,
                    sequence=first_sequence,
                )
            if not count:
                return self._leo
            return self._append_locked(message_set, size, count, (producer_id, producer_epoch, first_sequence, lengths))

    def _append_locked(self, message_set, size: int, count: int, sequenced) -> int:
        """Write a validated set at the log end (writer lock held)."""
        active = self._active
        if active.size and active.size + size > self._config.segment_bytes:
            active = self._roll()
        base = self._leo
        try:
            if sequenced is not None:
                # The journal first: a record whose set never reaches the
                # segment is dropped on recovery (it lies beyond the log end).
                producer_id, epoch, first_sequence, lengths = sequenced
                self._producers.journal(producer_id, epoch, first_sequence, base, lengths)
            active.append(message_set)
        except OSError as err:
            # The segment cut the partial write back, but the disk failed:
            # stop writing and let the owner recover the log.
            self._fail(err)
            raise StorageError(f"cannot append to {active.path}: {err}") from err
        if sequenced is not None:
            try:
                self._producers.remember(producer_id, epoch, first_sequence, base, lengths)
            except OSError as err:  # compacting the journal failed; the set is in the log
                self._fail(err)
        active.timeindex.on_append(active, message_set, base)
        if not active.size - size:
            self._active_since = self._clock()
        self._leo = base + size
        if not self._unflushed:
            self._first_unflushed_at = self._clock()
        self._unflushed += count
        self._messages_appended += count
        if (self._unflushed >= self._config.flush_messages or self._waiting) and not self._flush_requested:
            self._flush_requested = True
            _flusher().submit(self._flush_in_background)
        return base

    def _fail(self, err: BaseException) -> None:
        """Record a disk error: every later write refuses; tell the owner."""
        if self._failed is None:
            self._failed = err
        hook = self._on_disk_error
        if hook is not None:
            hook(err)

    def _flush_in_background(self) -> None:
        try:
            self.flush()
        except ClosedError:
            pass
        except StorageError:  # recorded in self._failed: the next call raises it
            log.exception("flush of %s failed", self._dir)
        finally:
            self._flush_requested = False
        # Appends made during the sync, with a reader still waiting or enough
        # of them to be due (flush_messages): once more.
        due = self._waiting or self._unflushed >= self._config.flush_messages
        if due and self._unflushed and not self._flush_requested and not self._closed and self._failed is None:
            self._flush_requested = True
            _flusher().submit(self._flush_in_background)

    def maybe_flush(self) -> bool:
        """Flush if ``flush_ms`` passed since the first unflushed append (timer hook)."""
        first = self._first_unflushed_at
        if first is None or self._closed:
            return False
        if (self._clock() - first) * 1000.0 < self._config.flush_ms:
            return False
        return self.flush()

    def flush(self) -> bool:
        """Sync appended bytes, record them in the checkpoint, advance the high
        watermark, wake waiting readers. Returns whether there was anything to flush."""
        with self._flush_lock:
            with self._lock:
                self._check_writable()
                target = self._leo
                active = self._active
                self._unflushed = 0
                self._first_unflushed_at = None
            if target == self._hw:
                return False
            try:
                _faults.check("fsync", self._dir)
                active.flush()  # earlier segments were synced when they were rolled
                self._producers.sync()
                self._write_checkpoint(target)
            except OSError as err:
                self._fail(err)
                raise StorageError(f"cannot sync {active.path}: {err}") from err
            with self._cond:
                self._hw = target
                self._cond.notify_all()
            return True

    def _roll(self) -> LogSegment:
        """Start a new segment at the log end (writer lock held)."""
        old = self._active
        try:
            _faults.check("roll", self._dir)
            old.flush()  # so that only the last segment can ever hold unsynced bytes
            new = LogSegment.open(self._dir, self._leo)
            _sync_directory(self._dir)
        except OSError as err:
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
            self._roll()
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

    def close(self) -> None:
        """Flush and close. Readers blocked in :meth:`wait_for_data` wake up.

        Segment files close once no :class:`FileSlice` refers to them.
        """
        if self._closed:
            return
        try:
            if self._failed is None:
                self.flush()
        finally:
            with self._flush_lock:  # no flush is writing the checkpoint any more
                with self._lock:
                    self._closed = True
                    self._producers.close()
                    for segment in self._view[1]:
                        segment.timeindex.close()
                self._checkpoint_file.close()
                os.close(self._lock_fd)  # another owner may open the directory now
            with self._cond:
                self._cond.notify_all()

    def __enter__(self) -> "PartitionLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_writable(self) -> None:
        if self._closed:
            raise ClosedError(f"the partition log in {self._dir} is closed; open it again")
        if self._failed is not None:
            raise StorageError(
                f"the partition log in {self._dir} had a disk error ({self._failed}); "
                f"reopen it to recover"
            )

    # -- readers ------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int) -> FileSlice:
        """The bytes from ``offset``: at most ``max_bytes`` (but at least the
        whole first message), below the high watermark, within one segment.

        ``offset == high_watermark`` gives an empty slice. The slice may end
        inside a message; parse it with ``decode_messages`` and continue at
        ``offset + consumed``. Raises :class:`OffsetOutOfRangeError` outside
        ``[log_start_offset, high_watermark]`` and :class:`InvalidOffsetError`
        for an offset that is not the start of a message.
        """
        if self._closed:
            raise ClosedError(f"the partition log in {self._dir} is closed")
        hw = self._hw
        bases, segments = self._view
        start = bases[0]
        if offset < start or offset > hw:
            raise OffsetOutOfRangeError(
                f"offset {offset} is outside the log [{start}, {hw}]; seek to the earliest "
                f"({start}) or latest ({hw}) offset",
                offset=offset,
                earliest=start,
                latest=hw,
            )
        segment = segments[bisect.bisect_right(bases, offset) - 1]
        position = offset - segment.base_offset
        available = min(hw, segment.base_offset + segment.size) - offset
        if available <= 0:
            return FileSlice(segment.file, position, 0, offset)
        first = self._check_boundary(segment, position, offset, available)
        return FileSlice(segment.file, position, max(first, min(max_bytes, available)), offset)

    def _check_boundary(self, segment: LogSegment, position: int, offset: int, available: int) -> int:
        """The length of the message at ``position``; InvalidOffsetError if none starts there."""
        head = segment.read_at(position, min(available, _PEEK_BYTES))
        if len(head) >= HEADER_SIZE:
            size = _u32(head[:4], "big")
            length = 4 + size
            if MIN_MESSAGE_SIZE <= size <= self._config.max_message_bytes and length <= available:
                body = head if length <= len(head) else segment.read_at(position, length)
                if len(body) >= length:
                    if crc32c(memoryview(body)[8:length]) == _u32(body[4:8], "big"):
                        return length
                    key_length = int.from_bytes(body[18:22], "big", signed=True)
                    if body[8] == MAGIC and body[9] < 8 and -1 <= key_length <= size - MIN_MESSAGE_SIZE:
                        # Everything but the CRC fits: a damaged message, not a bad offset.
                        raise CorruptMessageError(
                            f"message at offset {offset} fails its CRC32C check: the segment "
                            f"{segment.path} is damaged there",
                            offset=offset,
                        )
        raise InvalidOffsetError(
            f"offset {offset} is not the start of a message in the log; use an offset "
            f"returned by the log (a message's offset or a committed offset)",
            offset=offset,
        )

    def message_boundaries(self, start: int, end: int, targets) -> list[int]:
        """For each of ``targets``, the first message boundary at or after it,
        within ``[start, end]`` (a target below ``start`` gives ``start``, one
        at or past ``end`` gives ``end``).

        ``start`` must be a message boundary (the log start, a message's
        offset, a committed offset) and ``end`` one or the high watermark.
        The walk reads only the 4-byte size fields, in blocks of
        :data:`BOUNDARY_BLOCK_BYTES`, from the nearest known boundary before
        each target: ``start``, the previous answer, or the base of the
        target's segment (segments hold whole messages). No CRC is checked;
        a size field that cannot be one raises :class:`CorruptMessageError`.
        Used to split a large range of a partition into pieces that never
        cut a message (``raylog_spark.read_topic(min_partitions=...)``).
        """
        if self._closed:
            raise ClosedError(f"the partition log in {self._dir} is closed")
        hw = self._hw
        bases, segments = self._view
        if not bases[0] <= start <= end <= hw:
            raise OffsetOutOfRangeError(
                f"range [{start}, {end}) is not within the log [{bases[0]}, {hw}]",
                offset=start if start < bases[0] else end,
                earliest=bases[0],
                latest=hw,
            )
        if start < end:
            segment = segments[bisect.bisect_right(bases, start) - 1]
            available = min(hw, segment.base_offset + segment.size) - start
            if start != segment.base_offset and available > 0:
                self._check_boundary(segment, start - segment.base_offset, start, available)
        limit = max(self._config.max_message_bytes, RECOVERY_MAX_MESSAGE_BYTES)
        found: dict[int, int] = {}
        known = start
        for target in sorted(set(targets)):
            if target <= start or target >= end:
                found[target] = start if target <= start else end
                continue
            segment = segments[bisect.bisect_right(bases, target) - 1]
            seg_base = segment.base_offset
            seg_end = min(end, seg_base + segment.size)
            pos = max(known, seg_base)
            block, block_start = b"", pos
            while pos < target:
                rel = pos - block_start
                if rel + 4 > len(block):
                    block = segment.read_at(pos - seg_base, min(BOUNDARY_BLOCK_BYTES, seg_end - pos))
                    block_start, rel = pos, 0
                    if len(block) < 4:
                        raise CorruptMessageError(
                            f"the size field at offset {pos} of {self._dir} is cut short", offset=pos
                        )
                (size,) = _SIZE_FIELD.unpack_from(block, rel)
                if size < MIN_MESSAGE_SIZE or size > limit or pos + 4 + size > seg_end:
                    raise CorruptMessageError(
                        f"offset {pos} of {self._dir} holds a size field of {size}, which is not a "
                        f"message's (the walk from {max(known, seg_base)} lost the message boundaries)",
                        offset=pos,
                    )
                pos += 4 + size
            found[target] = known = pos
        return [found[t] for t in targets]

    def wait_for_data(self, offset: int, timeout_s: float) -> bool:
        """Block until the high watermark passes ``offset`` (or timeout, or close).
        Returns whether data at ``offset`` is readable."""
        with self._cond:
            if self._hw <= offset and not self._closed:
                # A waiting reader makes appends flush at once (group commit:
                # one sync at a time, appends during it go with the next) rather
                # than after flush_ms.
                self._waiting += 1
                try:
                    if self._unflushed and not self._flush_requested:
                        self._flush_requested = True
                        _flusher().submit(self._flush_in_background)
                    self._cond.wait_for(lambda: self._hw > offset or self._closed, max(0.0, timeout_s))
                finally:
                    self._waiting -= 1
            return self._hw > offset

    def offsets_before(self, timestamp_ms: int, max_offsets: int = 1) -> list[int]:
        """Offsets to start reading from for data written before ``timestamp_ms``.

        As Kafka 0.7's ``getOffsetsBefore``: the base offsets of segments last
        modified before ``timestamp_ms`` (newest first, at most
        ``max_offsets``); ``-1`` means latest (the high watermark) and ``-2``
        earliest (the log start).
        """
        bases, segments = self._view
        if timestamp_ms == -1:
            return [self._hw][:max_offsets]
        if timestamp_ms == -2:
            return [bases[0]][:max_offsets]
        found = [s.base_offset for s in segments if s.mtime_ms() < timestamp_ms]
        return found[::-1][:max_offsets]

    def offset_for_time(self, timestamp_ms: int) -> int:
        """The offset of the first message at or after ``timestamp_ms``
        (below the high watermark), found with the segments' time indexes
        (:mod:`raylog.storage.timeindex`); the high watermark when there is
        none. Any thread."""
        hw = self._hw
        _bases, segments = self._view
        for segment in segments:
            if segment.base_offset >= hw:
                break
            found = segment.timeindex.lookup(segment, timestamp_ms, min(segment.end_offset, hw))
            if found is not None:
                return found
        return hw

    # -- checkpoint and recovery ------------------------------------------------------

    def _checkpoint_path(self) -> str:
        return os.path.join(self._dir, CHECKPOINT_NAME)

    def _write_checkpoint(self, offset: int) -> None:
        # One fixed-size record rewritten in place, with its own CRC: a torn
        # record is detected and treated as missing (the whole last segment is
        # checked then). No fsync of its own: it never claims more than the
        # data just synced, and a stale record only makes recovery check more.
        # (Not write-and-rename: ext4 flushes a file renamed over another,
        # which costs more than the rest of a flush.)
        digits = b"%020d" % offset
        record = b"%s %08x\n" % (digits, crc32c(digits))
        os.pwrite(self._checkpoint_file.fileno(), record, 0)

    def _read_checkpoint(self) -> int | None:
        text = os.pread(self._checkpoint_file.fileno(), 64, 0)
        if not text:
            return None
        if len(text) == _CHECKPOINT_SIZE and text[20:21] == b" " and text[-1:] == b"\n":
            digits = text[:20]
            if digits.isdigit() and b"%08x" % crc32c(digits) == text[21:29]:
                return int(digits)
        log.warning("ignoring the damaged recovery point %r in %s", text[:40], self._dir)
        return None

    def _recover(self) -> list[LogSegment]:
        """Open the segments, check everything past the checkpoint, cut a bad tail."""
        fd = os.open(self._checkpoint_path(), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self._checkpoint_file = SegmentFile(fd, "r+")
        bases = []
        for name in os.listdir(self._dir):
            base = parse_segment_name(name)
            if base is not None:
                bases.append(base)
            elif name.endswith(".log"):
                log.warning("ignoring %s in %s: not a segment name", name, self._dir)
        if not bases:
            segment = LogSegment.open(self._dir, 0)
            _sync_directory(self._dir)
            self._write_checkpoint(0)
            return [segment]
        segments = [LogSegment.open(self._dir, base) for base in sorted(bases)]
        for prev, nxt in zip(segments, segments[1:]):
            if prev.end_offset != nxt.base_offset:
                raise StorageError(
                    f"segments of {self._dir} are not contiguous: {segment_name(prev.base_offset)} "
                    f"ends at {prev.end_offset} but the next starts at {nxt.base_offset}. "
                    f"The directory was changed by hand; move the stray segment away and reopen.",
                    directory=self._dir,
                )
        end = segments[-1].end_offset
        checkpoint = self._read_checkpoint()
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
            scan_from = max(checkpoint, segments[0].base_offset)
        limit = max(self._config.max_message_bytes, RECOVERY_MAX_MESSAGE_BYTES)
        for index, segment in enumerate(segments):
            if segment.end_offset <= scan_from and segment is not segments[-1]:
                continue
            start = max(scan_from - segment.base_offset, 0)
            valid_end, err = segment.scan(start, limit)
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
                _sync_directory(self._dir)
            what = "torn (incomplete) message" if err.details.get("partial") else str(err)
            self._report(segment.base_offset, cut_at, segment.end_offset, segment.size - valid_end, what)
            segment.truncate(valid_end)
            del segments[index + 1 :]
            break
        segments[-1].flush()
        self._write_checkpoint(segments[-1].end_offset)
        return segments

    def _report(self, segment_base: int, start: int, end: int, size: int, reason: str) -> None:
        report = RecoveryReport(segment_base, start, end, size, reason)
        self._reports.append(report)
        log.warning(
            "recovery of %s cut %d bytes, offsets [%d, %d) of segment %s: %s",
            self._dir, size, start, end, segment_name(segment_base), reason,
        )


_flush_pool: ThreadPoolExecutor | None = None
_flush_pool_lock = threading.Lock()


def _flusher() -> ThreadPoolExecutor:
    """The threads that run flushes triggered by ``flush_messages`` (shared by
    the logs of a process; a sync waits on the disk, not on the interpreter)."""
    global _flush_pool
    with _flush_pool_lock:
        if _flush_pool is None:
            _flush_pool = ThreadPoolExecutor(max_workers=FLUSH_THREADS, thread_name_prefix="raylog-flush")
        return _flush_pool


def _reset_flusher_after_fork() -> None:
    # A forked child has none of the parent's threads: start a new pool on demand.
    global _flush_pool, _flush_pool_lock
    _flush_pool = None
    _flush_pool_lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_flusher_after_fork)


def _lock_directory(directory: str) -> int:
    """Take the exclusive lock of a partition directory (``fcntl.flock`` on
    its file ``lock``, held until :meth:`PartitionLog.close` or the process
    ends); :class:`LogDirectoryLockedError` if another owner holds it."""
    fd = os.open(os.path.join(directory, LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise LogDirectoryLockedError(
            f"the partition directory {directory} is locked by another owner (a partition actor of "
            f"this or another cluster still runs on it); stop that owner, or give this cluster a "
            f"directory of its own",
            directory=directory,
        ) from None
    except OSError:
        os.close(fd)
        raise
    return fd


def _sync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
