"""The partition log (docs/design.md §3): segments, append, flush, read, retention, recovery.

On disk a partition is a directory of segment files ``<base offset, 20
digits>.log`` (:mod:`raylog.storage.segment`) plus a small checkpoint file,
``recovery-point``, holding the last flushed offset (with a CRC32C of its own),
``producer-state``, the journal of idempotent producers' sequences
(:mod:`raylog.storage.producer_state`), ``log-start-offset``, the log start
when a deletion of records moved it past the first segment's base
(:mod:`raylog.storage.log_start`), ``<offset, 20 digits>.producers``,
snapshots of format 2's producer state written at segment rolls
(:mod:`raylog.storage.batch_producers`), ``format``, the version of each of
these kinds of file (:mod:`raylog.storage.format_file`: checked before
anything else is read; an unknown version is a
:class:`~raylog.errors.StorageFormatError`, nothing cut), and ``lock``, an empty file its owner
holds an exclusive ``fcntl.flock`` on while the log is open: a second owner
(another actor, of this cluster or another one pointed at the same
directory) fails to open it with :class:`LogDirectoryLockedError`. The log offset of a
message is its byte position in the concatenation of the segments; segment
``k + 1`` starts where segment ``k`` ends. A segment the cleaner rewrote,
or that a replica wrote in that form (a cleaned leader's batches, see
"Replica writes over cleaned ranges" below :meth:`PartitionLog.append_replica`),
keeps its batches at their own offsets and maps them to file positions with
an offset index (:mod:`raylog.storage.offsetindex`); its end offset is the
next segment's base.

Segments hold format 1's messages or format 2's record batches, one
format a segment (docs/design.md §2): :meth:`PartitionLog.append` takes
either, and the first append of the other format rolls a new segment.
Batches are stamped at append (baseOffset = their position, the leader
epoch given) and an idempotent batch is judged by its own producer fields
(no journal: the state is rebuilt from the batches' headers on open), so
it needs one flush, of the segment.

Life of a message set:

1. :meth:`PartitionLog.append` validates it (every CRC, see
   :func:`~raylog.storage.validation.validate_message_set`; wrappers inflate to
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
   (retention); the log start offset moves forward.
   :meth:`PartitionLog.delete_records_before` (Kafka's DeleteRecords) moves
   it to any offset up to the high watermark, inside a segment too, kept in
   ``log-start-offset``: reads, counts and lookups by time start there, and
   the segments wholly below it go (at once, or once closed by retention).
   :meth:`PartitionLog.maybe_roll` (the owner's timer) rolls an active
   segment older than ``segment_ms``, so that retention reaches the data of
   a quiet partition too.

Transactions (docs/design.md §6; :mod:`raylog.storage.transactions`): a
transactional batch opens its producer's transaction here, checked first
(an older epoch is fenced, a plain batch of a producer in a transaction is
refused, and with ``verify_transactions`` the first batch needs the guard
of :meth:`PartitionLog.start_transaction_verification`, KIP-890); only
:meth:`PartitionLog.append_marker`, the coordinator's way in, writes the
marker that ends it (a client's control batch is refused). An abort is
recorded in the segment's ``<base>.txnindex`` (:mod:`raylog.storage.txnindex`);
:attr:`PartitionLog.last_stable_offset` stops at the first open transaction,
and :meth:`PartitionLog.read_committed` reads below it with the aborted
transactions of the range. All of it is rebuilt on open with the producer
state (snapshots at rolls, then the batches after), and a lost or torn
index is restored from that replay.

Disk errors: the first failed write, sync, roll or delete makes the log
refuse every later write (:class:`StorageError`) and calls ``on_disk_error``
when one was given; the partition actor passes a function that ends its
process, so that Ray restarts it and recovery runs (never a wedged log).
``on_flush(seconds)``, when given, is called after every flush that synced
something, whoever asked for it (the timer, ``flush_messages``, a waiting
reader): the partition actor times its flushes with it.

A full disk is not such an error (a restart would not help): a write or
roll that fails with ``ENOSPC``/``EDQUOT`` leaves the log as it was (the
segment and the producer-state journal are cut back to where they were)
and raises :class:`DiskFullError` (retriable, naming ``node`` and the
path). The log is then **disk full**: appends are refused at once with
that error while reads, flushes of what was written before and retention
go on; every :data:`DISK_FULL_RETRY_S` one append tries the disk again, and
:meth:`PartitionLog.maybe_resume` (the owner's timer) ends the state as soon
as the file system has room for a message again. Both are logged once.

Recovery on open checks every message of the active segment and every
message past the checkpoint by CRC; a torn or corrupt tail past the
checkpoint is cut off, and each cut is logged as a warning and listed in
:attr:`PartitionLog.recovery_reports`. Damage in flushed data (before the
checkpoint) is not cut, since what follows it was acknowledged: it is reported
the same way (a report with ``kept``) with the next readable offset, which
readers get in :class:`CorruptMessageError`. Nothing is dropped silently.
"""

from __future__ import annotations

import bisect
import errno
import logging
import os
import socket
import threading
import time
from typing import Callable, NamedTuple

from raylog.config import TopicConfig
from raylog.errors import (
    ClosedError,
    CorruptMessageError,
    DiskFullError,
    InvalidMessageError,
    InvalidOffsetError,
    OffsetOutOfRangeError,
    StorageError,
)
from raylog.storage import faults as _faults
from raylog.storage import format_file
from raylog.storage import log_start as _log_start
from raylog.storage.base import LogBasics
from raylog.storage.fileops import (
    DISK_FULL_RETRY_S,
    LOCK_NAME,
    submit_flush,
    lock_directory,
    sync_directory,
    is_disk_full,
)
from raylog.storage.batch_producers import BatchProducerState
from raylog.storage.batch_validation import prepare_append, scan_batches, stamp_batches
from raylog.storage import cleaner as _cleaner
from raylog.storage.keyed import require_keys
from raylog.storage.log_reads import FileSlice, LogReader
from raylog.storage.owner_only import make_dirs as make_owner_only_dirs, tighten as tighten_to_owner
from raylog.storage.markers import decode_marker, encode_marker
from raylog.storage.record_batch import check_frame, format_at, iter_batches
from raylog.storage.producer_state import ProducerStateTable
from raylog.storage.recovery import (
    CHECKPOINT_NAME,
    RECOVERY_MAX_MESSAGE_BYTES,
    Checkpoint,
    LogRecovery,
    RecoveryReport,
)
from raylog.storage.retention import Retention
from raylog.storage.offsetindex import OffsetIndex, index_name
from raylog.storage.segment import LogSegment, segment_name
from raylog.storage.transactions import TXN_BITS, AbortedTxn, VerificationGuard
from raylog.storage.txnindex import TxnIndexes
from raylog.storage.validation import scan_message_set, validate_append

__all__ = ["CHECKPOINT_NAME", "LOCK_NAME", "CommittedRead", "FileSlice", "PartitionLog", "RecoveryReport"]

log = logging.getLogger(__name__)


class CommittedRead(NamedTuple):
    """A ``read_committed`` read (:meth:`PartitionLog.read_committed`): the
    bytes (below the last stable offset), the aborted transactions that
    overlap them (a reader drops a batch of ``producer_id`` at or after its
    ``first_offset`` up to its abort marker at ``last_offset``), and the last
    stable offset the read stopped at."""

    slice: FileSlice
    aborted: list[AbortedTxn]
    last_stable_offset: int


def _open_error(directory: str, err: OSError) -> StorageError:
    """The error of a log that cannot be opened; a read-only directory said plainly."""
    if err.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return StorageError(
            f"the partition directory {directory} is not writable ({err.strerror}: {err.filename}): raylog "
            f"writes its partition logs there; make the data directory writable (read-only mount? "
            f"permissions?) or give the cluster another data_dir",
            directory=directory,
            read_only=True,
        )
    if is_disk_full(err):
        return DiskFullError(
            f"cannot open the partition log in {directory}: the disk is full ({err.strerror}); free space on it",
            node=socket.gethostname(), path=err.filename or directory, directory=directory,
        )
    return StorageError(f"cannot open the partition log in {directory}: {err}", directory=directory)


#: the suffix of a cleaned segment's offset index being rewritten by a replica's truncation
_CUT = ".cut"


def _delete_segment(segment: LogSegment) -> None:
    """Delete a segment's files, a cleaned segment's offset index first (an
    index left without its segment would be taken for a new segment's)."""
    if segment.cleaned:
        try:
            os.unlink(os.path.join(os.path.dirname(segment.path), index_name(segment.base_offset)))
        except FileNotFoundError:
            pass
    segment.delete()


def _stored_batches(data, limit: int) -> list:
    """``(position, header)`` of each stored batch of ``data`` (a leader's,
    stamped: every frame and crc checked, offsets growing, no batch
    overlapping the one before); raises the error of the first bad one."""
    headers = []
    pos, n = 0, len(data)
    previous_end = None
    while pos < n:
        try:
            header = check_frame(data, pos, limit)
        except InvalidMessageError as err:
            details = dict(err.details)
            details.setdefault("offset", pos)
            raise type(err)(f"a replica's batch at byte {pos} of the fetched bytes: {err}", **details) from None
        if previous_end is not None and header.base_offset < previous_end:
            raise InvalidMessageError(
                f"the leader's batch at offset {header.base_offset} overlaps the one before it (which ends at "
                f"{previous_end}): not a stored log", offset=header.base_offset,
            )
        headers.append((pos, header))
        previous_end = header.next_offset
        pos += header.size
    return headers


class ReplicaLayout(NamedTuple):
    """Where a replica append's batches go (:func:`replica_layout`): each
    part ``(begin, stop, ...)`` is the bytes ``data[begin:stop]``;
    ``plain``/``after``: ``(begin, stop, [(offset, header)])`` appended to
    the active segment (before and after the cleaned part);
    ``cleaned``: ``(begin, stop, end offset, [(offset, span, position)],
    [(offset, header)])``, a segment in the cleaned form."""

    plain: tuple | None
    cleaned: tuple | None
    after: tuple | None


def replica_layout(headers, offset: int, size: int) -> ReplicaLayout:
    """The layout of a replica append at ``offset`` (the log end) of the
    batches ``headers`` (``(position, header)``, as :func:`_stored_batches`
    gives them; ``size`` bytes in all): see "Replica writes over cleaned
    ranges" in :class:`PartitionLog`. :class:`InvalidOffsetError` for a
    batch before ``offset`` (:class:`InvalidMessageError`)."""
    if headers and headers[0][1].base_offset < offset:
        raise InvalidMessageError(f"the leader's batch at {headers[0][1].base_offset} lies before this replica's "
                                  f"log end {offset}: not a batch to store here", offset=headers[0][1].base_offset)
    cursor, i = offset, 0
    while i < len(headers) and headers[i][1].base_offset == cursor and _plain_batch(headers[i][1]):
        cursor = headers[i][1].next_offset
        i += 1
    stop = headers[i][0] if i < len(headers) else size
    plain = (0, stop, [(h.base_offset, h) for _p, h in headers[:i]]) if i else None
    rest = headers[i:]
    if not rest:
        return ReplicaLayout(plain, None, None)
    contiguous = all(_plain_batch(h) for _p, h in rest) and all(
        b[1].base_offset == a[1].next_offset for a, b in zip(rest, rest[1:]))
    if contiguous:  # a gap, then the leader's log as appended: an empty cleaned segment over the gap
        first = rest[0][1].base_offset
        return ReplicaLayout(plain, (stop, stop, first, [], []),
                             (stop, size, [(h.base_offset, h) for _p, h in rest]))
    entries = [(h.base_offset, h.next_offset - h.base_offset, p - stop) for p, h in rest]
    return ReplicaLayout(plain, (stop, size, rest[-1][1].next_offset, entries, [(h.base_offset, h) for _p, h in rest]),
                         None)


def _plain_batch(header) -> bool:
    """A batch whose next offset is its position plus its size (as every
    batch is appended): it can lie in a segment whose offsets are positions."""
    return header.next_offset == header.base_offset + header.size


class PartitionLog(LogBasics):
    """The log of one partition, in ``directory``.

    It owns its writer state (segments, log end, high watermark, locks) and
    these parts, each given what it needs when the log opens: the
    :class:`~raylog.storage.recovery.Checkpoint` (the directory), the
    :class:`~raylog.storage.recovery.LogRecovery` run once at open (the
    directory, the checkpoint, ``max_message_bytes``), the
    :class:`~raylog.storage.log_reads.LogReader` (the directory,
    ``max_message_bytes``; each read is given the segments and high
    watermark of that moment), the
    :class:`~raylog.storage.retention.Retention` (the directory and the
    retention bounds) and the
    :class:`~raylog.storage.producer_state.ProducerStateTable`.

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

    Offsets are byte positions (docs/design.md §2), but in a cleaned segment
    (§3), where an offset index maps them. ``flush_messages`` counts messages
    as appended: a compressed wrapper counts as one.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        config: TopicConfig = TopicConfig(),
        *,
        clock: Callable[[], float] = time.time,
        on_disk_error: Callable[[BaseException], None] | None = None,
        on_flush: Callable[[float], None] | None = None,
        node: str | None = None,
        lock_wait_s: float = 0.0,
        verify_transactions: bool = False,
    ):
        # lock_wait_s: how long another owner's lock of the directory is
        # waited for before LogDirectoryLockedError (fileops.lock_directory)
        # verify_transactions: a transaction's first batch needs a guard of
        # start_transaction_verification (KIP-890; raylog.storage.transactions)
        self._dir = os.fspath(directory)
        #: the node named in a DiskFullError (the owner may set it; default the host name)
        self.node = node or socket.gethostname()
        self._disk_full: DiskFullError | None = None
        self._disk_full_retry_at = 0.0
        super().__init__(config)
        self._clock = clock
        self._on_disk_error = on_disk_error
        self._on_flush = on_flush
        self._max_inflated = config.max_inflated_limit
        self._lock = threading.Lock()  # appends, rolls, retention, segment list
        self._clean_lock = threading.Lock()  # one cleaning pass at a time; taken before _lock
        self._flush_lock = threading.Lock()  # one sync at a time; taken before _lock
        self._cond = threading.Condition(threading.Lock())  # high watermark waiters
        self._closed = False
        self._failed: BaseException | None = None
        self._reports: list[RecoveryReport] = []
        self._unflushed = 0
        self._messages_appended = 0  # since open (outer messages)
        self._first_unflushed_at: float | None = None
        #: set while appended bytes wait for their flush: the actor's timer
        #: sleeps on it when the log is idle (see :meth:`wait_for_appends`)
        self._has_unflushed = threading.Event()
        self._flush_requested = False
        self._waiting = 0  # readers blocked in wait_for_data: they get a prompt flush
        self._end_waiting = 0  # followers blocked in wait_for_end: woken by an append
        #: on a replicated partition, the replication role's committed offset
        #: (``() -> int``; the leader's, or the one a follower learnt): a
        #: cleaning pass never reaches past it (see :meth:`clean`)
        self.clean_limit: Callable[[], int] | None = None
        #: on a replicated partition, the offset below which every replica
        #: holds the log (``() -> int``; 0 on a follower): a tombstone is
        #: removed only below it, so that no replica that has not yet copied
        #: a tombstone keeps the older value it deleted (see :meth:`clean`)
        self.tombstone_limit: Callable[[], int] | None = None
        try:
            # the owner's only (raylog.storage.owner_only): made 0700, a kept one tightened
            make_owner_only_dirs(self._dir)
            tighten_to_owner(self._dir, "the log directory")
            self._lock_fd = lock_directory(self._dir, lock_wait_s)
        except OSError as err:
            raise _open_error(self._dir, err) from None
        checkpoint = None
        try:
            # before anything in the directory is read or created: a newer
            # format is refused whole, never taken for damage and cut
            self._formats = format_file.check_directory(self._dir)
            # a cleaning the process died in is finished or undone first (raylog.storage.cleaner)
            for note in _cleaner.finish_swaps(self._dir):
                log.warning("recovery of %s: %s", self._dir, note)
            checkpoint = Checkpoint(self._dir)
            recovery = LogRecovery(self._dir, checkpoint, config.max_message_bytes)
            segments = recovery.run()
            self._reports = recovery.reports
            self._producers = ProducerStateTable(self._dir, config.max_producer_ids)
            for note in self._producers.open(segments[-1].end_offset):
                log.warning("recovery of %s: %s", self._dir, note)
            if self._producers.partial_set_base is not None:
                self._cut_partial_set(segments, self._producers.partial_set_base)
            self._batch_producers = BatchProducerState(self._dir, config.max_producer_ids,
                                                       require_verification=verify_transactions)
            for note in self._batch_producers.rebuild(segments, segments[-1].end_offset):
                log.warning("recovery of %s: %s", self._dir, note)
            self._txns = self._batch_producers.transactions
            self._txn_indexes, notes = TxnIndexes.open(self._dir, segments[0].base_offset, segments[-1].end_offset)
            restored = self._txn_indexes.restore([s.base_offset for s in segments], self._txns.replayed)
            self._txns.replayed = []
            for note in notes + ([f"restored {restored} aborted transaction(s) to the transaction indexes"]
                                 if restored else []):
                log.warning("recovery of %s: %s", self._dir, note)
            # a deletion of records moved the start (raylog.storage.log_start), perhaps inside the first
            # segment: bounded to [first base, log end] (recovery may have cut the log shorter)
            recorded = _log_start.read(self._dir)
            start = segments[0].base_offset
            if recorded is not None:
                start = min(max(recorded, start), segments[-1].end_offset)
                if start != recorded:
                    log.warning("recovery of %s: the log start %d lies past the log end; it is now %d",
                                self._dir, recorded, start)
                    _log_start.write(self._dir, start)
        except BaseException as err:
            if checkpoint is not None:
                checkpoint.close()
            os.close(self._lock_fd)
            if isinstance(err, OSError):
                raise _open_error(self._dir, err) from None
            raise
        # Readers take (bases, segments) in one read; the writer replaces it.
        self._view: tuple[list[int], list[LogSegment]] = ([s.base_offset for s in segments], segments)
        #: the log start offset, at or past the first segment's base (the
        #: log_start_offset property takes the larger of the two): moved by
        #: delete_records_before and kept in raylog.storage.log_start's file
        self._start = start
        self._active = segments[-1]
        #: when the active segment got its first message (segment_ms)
        self._active_since = self._active.mtime_ms() / 1000.0 if self._active.size else None
        self._leo = self._active.end_offset
        self._hw = self._leo
        self._checkpoint = checkpoint
        self._reader = LogReader(self._dir, config.max_message_bytes)
        self._retention = Retention(self._dir, config.retention_ms, config.retention_bytes)

    def _cut_partial_set(self, segments: list[LogSegment], base: int) -> None:
        """Recovery: cut the log back to ``base``, the start of an idempotent
        producer's set of which only the first messages reached the segment
        before the process died (the producer resends the set whole)."""
        active = segments[-1]
        end = active.end_offset
        if not active.base_offset <= base < end:
            return  # a set lies in one segment; nothing else can be meant
        active.truncate(base - active.base_offset)
        report = RecoveryReport(active.base_offset, base, end, end - base,
                                "part of an idempotent producer's set (the producer resends it whole)")
        self._reports.append(report)
        log.warning("recovery of %s cut %d bytes, offsets [%d, %d): %s", self._dir, end - base, base, end,
                    report.reason)

    # -- properties (any thread) ------------------------------------------------

    @property
    def directory(self) -> str:
        return self._dir

    @property
    def log_start_offset(self) -> int:
        """The first offset kept: the first segment's base offset, or past
        it (inside the first segment) where :meth:`delete_records_before`
        moved it."""
        return max(self._start, self._view[0][0])

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

    @property
    def disk_full(self) -> bool:
        """Whether appends are refused because the disk is full (see the module docstring)."""
        return self._disk_full is not None

    @property
    def last_stable_offset(self) -> int:
        """The first offset of the earliest transaction still open (or whose
        marker is not below the high watermark yet), else the high
        watermark: ``read_committed`` readers read below it (docs/design.md §6)."""
        return max(self._txns.last_stable_offset(self._hw), self.log_start_offset)

    def ongoing_transactions(self) -> dict[int, int]:
        """``producer id -> first offset`` of the transactions open here."""
        return self._txns.ongoing()

    def active_producers(self) -> list[dict]:
        """The idempotent and transactional producers this log remembers
        (what Kafka's DescribeProducers shows): ``producer_id``, ``epoch``,
        ``last_sequence`` and ``transaction_start`` (the first offset of
        its open transaction here, -1: none), from the batches' producer
        state (format 2) and the sets' (format 1; a producer id in both
        shows format 2's)."""
        with self._lock:
            found = {pid: (epoch, last) for pid, epoch, last in self._producers.describe()}
            found.update((pid, (epoch, last)) for pid, epoch, last in self._batch_producers.describe())
            ongoing = self._txns.ongoing()
        return [{"producer_id": pid, "epoch": epoch, "last_sequence": last,
                 "transaction_start": ongoing.get(pid, -1)} for pid, (epoch, last) in sorted(found.items())]

    def __repr__(self) -> str:
        return (
            f"PartitionLog({self._dir!r}, start={self.log_start_offset}, hw={self._hw}, "
            f"end={self._leo}, segments={len(self._view[0])})"
        )

    # -- readers (any thread; they never take the writer's lock) -------------------

    def read(self, offset: int, max_bytes: int) -> FileSlice:
        """The bytes from ``offset``: at most ``max_bytes`` (but at least the
        whole first message), below the high watermark, within one segment.

        ``offset == high_watermark`` gives an empty slice. The slice may end
        inside a message; parse it with ``decode_messages`` and continue at
        ``offset + consumed``. Raises :class:`OffsetOutOfRangeError` outside
        ``[log_start_offset, high_watermark]`` and :class:`InvalidOffsetError`
        for an offset that is not the start of a message (see
        :meth:`LogReader.read <raylog.storage.log_reads.LogReader.read>`).

        In a segment of format 2 an offset inside a batch (a record's) gives
        the slice of that batch: its ``offset`` is then the batch's, before
        the asked one, and the reader skips the records before it.
        """
        if self._closed:
            raise ClosedError(f"the partition log in {self._dir} is closed")
        hw = self._hw  # before the view: a newer view only adds segments
        start = self._start
        return self._reader.read(self._view, hw, offset, max_bytes, start=start)

    def read_held(self, offset: int, max_bytes: int) -> FileSlice:
        """:meth:`read` from the first segment's base offset instead of the
        log start: the bytes a segment still holds below a start that
        :meth:`delete_records_before` moved inside it. For the log's own
        walks (the record counts of :mod:`raylog.storage.counting`, which
        count a segment from its base), never handed to readers."""
        if self._closed:
            raise ClosedError(f"the partition log in {self._dir} is closed")
        hw = self._hw  # before the view: a newer view only adds segments
        return self._reader.read(self._view, hw, offset, max_bytes)

    def read_committed(self, offset: int, max_bytes: int, high_watermark: int | None = None) -> CommittedRead:
        """:meth:`read` for a ``read_committed`` reader: the bytes from
        ``offset`` below the last stable offset (an empty slice at or past
        it, up to the high watermark; :class:`OffsetOutOfRangeError` past
        that), with the aborted transactions that overlap them
        (:meth:`aborted_transactions`): the reader drops the records of
        those, markers' records never reach it (docs/design.md §6).

        ``high_watermark`` (at most the log's own) is the one to count from
        instead of the log's: a replicated leader's committed offset, so
        that a marker not yet on the in-sync replicas leaves its
        transaction open to readers."""
        if self._closed:
            raise ClosedError(f"the partition log in {self._dir} is closed")
        hw = self._hw  # before the view: a newer view only adds segments
        if high_watermark is not None:
            hw = min(hw, high_watermark)
        start = self._start
        view = self._view
        lso = max(self._txns.last_stable_offset(hw), view[0][0], start)  # (retention may pass an open transaction)
        end = lso if offset <= lso else min(offset, hw)
        chunk = self._reader.read(view, end, offset, max_bytes, start=start)
        bases, segments = view
        segment = segments[bisect.bisect_right(bases, chunk.offset) - 1]
        upper = min(end, segment.end_offset)
        return CommittedRead(chunk, self.aborted_transactions(chunk.offset, upper), lso)

    def aborted_transactions(self, start: int, end: int) -> list[AbortedTxn]:
        """The aborted transactions overlapping ``[start, end)`` (their data
        lies there in part), in marker order, from the segments' transaction
        indexes (Kafka's collectAbortedTxns). Any thread."""
        return self._txn_indexes.aborted(start, end)

    def read_unflushed(self, offset: int, max_bytes: int) -> FileSlice:
        """:meth:`read` up to the log end instead of the high watermark:
        bytes appended, perhaps not synced yet (what a follower copies, so
        that its sync runs while the leader's does; the leader counts a set
        committed only once its own flush covers it too)."""
        if self._closed:
            raise ClosedError(f"the partition log in {self._dir} is closed")
        end = self._leo  # before the view: a newer view only adds segments
        return self._reader.read(self._view, end, offset, max_bytes)

    def wait_for_end(self, offset: int, timeout_s: float) -> bool:
        """:meth:`wait_for_data` on the log end: block until an append
        passes ``offset`` (or timeout, or close); whether bytes at
        ``offset`` can be read with :meth:`read_unflushed`. A waiter makes
        appends flush at once, as a reader in ``wait_for_data`` does."""
        with self._cond:
            if self._leo <= offset and not self._closed:
                self._end_waiting += 1
                self._waiting += 1
                try:
                    if self._unflushed and not self._flush_requested:
                        self._flush_requested = True
                        submit_flush(self._flush_in_background)
                    self._cond.wait_for(lambda: self._leo > offset or self._closed, max(0.0, timeout_s))
                finally:
                    self._end_waiting -= 1
                    self._waiting -= 1
            return self._leo > offset

    def message_boundaries(self, start: int, end: int, targets) -> list[int]:
        """For each of ``targets``, the first message boundary at or after it,
        within ``[start, end]`` (see :meth:`LogReader.message_boundaries
        <raylog.storage.log_reads.LogReader.message_boundaries>`)."""
        if self._closed:
            raise ClosedError(f"the partition log in {self._dir} is closed")
        hw = self._hw
        return self._reader.message_boundaries(self._view, hw, start, end, targets)

    def segment_spans(self, start: int, end: int) -> list[tuple[LogSegment, int, int]]:
        """The segments that hold ``[start, end)`` (within ``[log start, high
        watermark]``), oldest first, each with its part of the range:
        ``(segment, lo, hi)``, where ``hi`` is the next segment's base offset
        for every segment but the last. What a count by the segments' record
        counts (:func:`raylog.storage.counting.count_between`) walks. Any thread."""
        if self._closed:
            raise ClosedError(f"the partition log in {self._dir} is closed")
        first_kept = self.log_start_offset
        bases, segments = self._view
        start, end = max(start, bases[0], first_kept), min(end, self._hw)
        if end <= start:
            return []
        first = max(0, bisect.bisect_right(bases, start) - 1)
        last = max(0, bisect.bisect_left(bases, end) - 1)
        spans = []
        for i in range(first, last + 1):
            lo = max(start, bases[i])
            hi = end if i == last else bases[i + 1]
            spans.append((segments[i], lo, hi))
        return spans

    def offsets_before(self, timestamp_ms: int, max_offsets: int = 1) -> list[int]:
        """Offsets to start reading from for data written before ``timestamp_ms``
        (Kafka 0.7's ``getOffsetsBefore``; see :meth:`LogReader.offsets_before
        <raylog.storage.log_reads.LogReader.offsets_before>`)."""
        hw = self._hw
        start = self.log_start_offset
        found = self._reader.offsets_before(self._view, hw, timestamp_ms, max_offsets)
        kept = []
        for offset in found:  # the segments' bases below the log start answer the start itself
            offset = max(offset, start)
            if offset not in kept:
                kept.append(offset)
        return kept

    def offset_for_time(self, timestamp_ms: int) -> int:
        """The offset of the first message at or after ``timestamp_ms``
        (below the high watermark), found with the segments' time indexes
        (:mod:`raylog.storage.timeindex`); the high watermark when there is
        none. Any thread."""
        hw = self._hw
        start = self.log_start_offset
        return max(self._reader.offset_for_time(self._view, hw, timestamp_ms), min(start, hw))

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
                        submit_flush(self._flush_in_background)
                    self._cond.wait_for(lambda: self._hw > offset or self._closed, max(0.0, timeout_s))
                finally:
                    self._waiting -= 1
            return self._hw > offset

    # -- writer -------------------------------------------------------------------

    def append(self, message_set: bytes, *, leader_epoch: int = -1,
               verification: VerificationGuard | None = None) -> int:
        """Append a message set; return the offset of its first byte.

        The set is validated first (nothing is written if any message is
        bad) and becomes visible at the next flush. Once ``flush_messages``
        messages are unflushed, this starts a flush on a background thread.

        Record batches (format 2, told by :func:`~raylog.storage.record_batch.format_at`)
        go by :meth:`_append_batches`: stamped with their offsets and
        ``leader_epoch`` (the appending leader's epoch; the log does not know
        it, -1 when none), in a segment of format 2. A control batch is
        refused (:class:`~raylog.errors.ControlBatchError`: markers go by
        :meth:`append_marker`); transactional batches are checked against
        the producers' transactions (:mod:`raylog.storage.transactions`;
        ``verification``: the guard of :meth:`start_transaction_verification`
        when the log verifies transactions).
        """
        if format_at(message_set) == 2:
            return self._append_batches(message_set, leader_epoch, verification)
        size, count = len(message_set), self._validate(message_set)
        with self._lock:
            self._check_writable()
            if not count:
                return self._leo
            self._check_space()
            return self._append_locked(message_set, size, count, ())

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
        size, count = len(message_set), self._validate(message_set)
        with self._lock:
            self._check_writable()
            stored = self._producers.judge(
                producer_id, producer_epoch, first_sequence, len(lengths), topic_partition=name
            )
            if stored is not None:
                return stored
            if not count:
                return self._leo
            self._check_space()
            sequenced = ((producer_id, producer_epoch, first_sequence, 0, lengths),)
            return self._append_locked(message_set, size, count, sequenced)

    def _append_batches(self, data, leader_epoch: int, verification: VerificationGuard | None = None) -> int:
        """Append record batches (see :mod:`raylog.storage.batch_validation`):
        validated, re-encoded where shorter than their count, stamped at the
        log end; an idempotent batch is judged by its own producer fields
        (:class:`~raylog.storage.batch_producers.BatchProducerState`): a
        duplicate appends nothing and answers its first store's offset.
        ``flush_messages`` counts their records."""
        prepared = prepare_append(data, self._config.max_message_bytes, self._max_inflated)
        if self._config.compacted:
            require_keys(prepared.data, self._config.max_message_bytes, self._max_inflated, name=self._dir)
        with self._lock:
            self._check_writable()
            if not prepared.records:
                return self._leo
            self._txns.check_epochs(prepared.headers, name=self._dir)
            stored = self._batch_producers.judge(prepared.headers, name=self._dir, runs=prepared.runs)
            if stored is not None:
                return stored
            self._txns.check(prepared.headers, verification, name=self._dir)
            self._check_space()
            return self._append_locked(prepared, len(prepared.data), prepared.records, (), leader_epoch)

    def start_transaction_verification(self, producer_id: int, epoch: int) -> VerificationGuard | None:
        """KIP-890's first step, for a log that verifies transactions: None
        when the producer's transaction is open here already; else a guard
        to ask the coordinator with and then pass to :meth:`append` (a
        marker of the producer meanwhile voids it). Any thread."""
        with self._lock:
            return self._txns.start_verification(producer_id, epoch)

    def append_marker(self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int, *,
                      leader_epoch: int = -1, timestamp_ms: int | None = None) -> int:
        """Write the marker that ends ``producer_id``'s transaction here,
        committed or aborted (:mod:`raylog.storage.markers`): the transaction
        coordinator's way in (the leader's; clients cannot send markers).
        Returns its offset. An abort is recorded in the segment's
        transaction index; the last stable offset moves past the
        transaction once the marker is below the high watermark. Raises
        :class:`~raylog.errors.InvalidProducerEpochError` or
        :class:`~raylog.errors.TransactionCoordinatorFencedError` for a
        marker of an older producer or coordinator epoch (nothing written)."""
        batch = encode_marker(producer_id, producer_epoch, commit, coordinator_epoch, timestamp_ms)
        prepared = prepare_append(batch, self._config.max_message_bytes, allow_control=True)
        with self._lock:
            self._check_writable()
            self._txns.check_marker(producer_id, producer_epoch, coordinator_epoch, name=self._dir)
            self._check_space()
            return self._append_locked(prepared, len(prepared.data), 1, (), leader_epoch)

    def _validate(self, message_set) -> int:
        """Check a set (nothing is written yet); its number of (outer) messages.
        On a compacted topic every message needs a key (:mod:`raylog.storage.keyed`)."""
        count = validate_append(message_set, self._config.max_message_bytes, self._max_inflated)
        if self._config.compacted and count:
            require_keys(message_set, self._config.max_message_bytes, self._max_inflated, name=self._dir)
        return count

    def _append_locked(
        self, message_set, size: int, count: int, sequenced, leader_epoch: int | None = None, stamped=None
    ) -> int:
        """Write a validated set at the log end (writer lock held);
        ``sequenced``: the producers' sets in it, ``(producer id, epoch,
        first sequence, offset within message_set, lengths)`` each.
        ``message_set`` is format 1's bytes; or (``leader_epoch`` given)
        :class:`~raylog.storage.batch_validation.PreparedBatches`, stamped
        here; or (``stamped``: ``(offset, header)`` of each) record batches
        stamped already (a leader's, on a replica). A segment of the other
        format is rolled first (one format a segment, docs/design.md §2)."""
        fmt = 1 if leader_epoch is None and stamped is None else 2
        active = self._active
        if active.size and (active.size + size > self._config.segment_bytes or active.format != fmt):
            active = self._roll()
        base = self._leo
        batches, runs = stamped, None
        if fmt == 2 and stamped is None:
            batches = stamp_batches(message_set, base, leader_epoch)
            runs = message_set.runs
            message_set = message_set.data
        txn_bits = fmt == 2 and any(h[5] & TXN_BITS for _o, h in batches)
        try:
            # The journal first: a record whose set never reaches the
            # segment is dropped on recovery (it lies beyond the log end).
            for producer_id, epoch, first_sequence, at, lengths in sequenced:
                self._producers.journal(producer_id, epoch, first_sequence, -1 if at is None else base + at, lengths)
            if fmt == 2 and self._formats.segments < 2:  # older raylogs refuse the directory from now on
                self._formats = format_file.mark_segments(self._dir, self._formats, 2)
            if txn_bits and self._formats.segments < 3:
                # transactions (their markers and .txnindex files): older raylogs refuse the directory
                self._formats = format_file.mark_segments(self._dir, self._formats, 3)
            active.append(message_set, fmt)
        except OSError as err:
            # The segment (and the journal) cut the partial write back.
            if is_disk_full(err):
                raise self._now_disk_full(err, active.path) from err
            # The disk failed: stop writing and let the owner recover the log.
            self._fail(err)
            raise StorageError(f"cannot append to {active.path}: {err}") from err
        try:
            for producer_id, epoch, first_sequence, at, lengths in sequenced:
                self._producers.remember(producer_id, epoch, first_sequence, -1 if at is None else base + at,
                                         lengths)
        except OSError as err:  # compacting the journal failed; the set is in the log
            if is_disk_full(err):
                self._now_disk_full(err, self._dir)  # the journal stays long until there is room
            else:
                self._fail(err)
        if batches is not None:
            self._batch_producers.remember(batches, runs)
            if txn_bits or self._txns.tracking:
                self._apply_transactions(batches, message_set, base, active)
        if self._disk_full is not None:
            self._resume("a write succeeded")
        active.timeindex.on_append(active, message_set, base)
        if not active.size - size:
            self._active_since = self._clock()
        self._leo = base + size
        self._note_appended(count)
        return base

    def _note_appended(self, count: int) -> None:
        """``count`` messages were appended (writer lock held): wake a waiting
        follower, count them for the flush, start one when due."""
        if self._end_waiting:  # a follower waits for these bytes: it copies them while this log syncs
            with self._cond:
                self._cond.notify_all()
        if not self._unflushed:
            self._first_unflushed_at = self._clock()
            self._has_unflushed.set()
        self._unflushed += count
        self._messages_appended += count
        if (self._unflushed >= self._config.flush_messages or self._waiting) and not self._flush_requested:
            self._flush_requested = True
            submit_flush(self._flush_in_background)

    def _apply_transactions(self, batches, data, base: int, active: LogSegment) -> None:
        """The transactions of the batches just stored at ``base`` (writer
        lock held): ongoing ones noted, markers ending them, each abort
        recorded in the active segment's transaction index."""
        for offset, header in batches:
            marker = None
            if header[5] & 0x20:  # a control batch: its decision is in its record
                try:
                    marker = decode_marker(data, offset - base)
                except InvalidMessageError:  # a leader's control batch that is no marker: no decision
                    log.warning("%s: the control batch at %d is not a transaction marker; ignored", self._dir,
                                offset)
            completed = self._txns.apply(offset, header, marker, self._hw)
            if completed is not None and completed.aborted:
                self._txn_indexes.append(active.base_offset, completed.as_aborted())

    # -- rolls and retention (writer side: they take the writer's lock) ----------

    def _roll(self) -> LogSegment:
        """Start a new segment at the log end (writer lock held)."""
        old = self._active
        try:
            _faults.check("roll", self._dir)
            old.flush()  # so that only the last segment can ever hold unsynced bytes
            self._txn_indexes.sync(old.base_offset)  # durable before the snapshot (raylog.storage.txnindex)
            if old.format == 2 or len(self._batch_producers):  # format 2's producer state up to here
                self._batch_producers.snapshot(self._leo)
            new = LogSegment.open(self._dir, self._leo)
            sync_directory(self._dir)
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
        A topic whose ``cleanup_policy`` is ``compact`` alone deletes nothing
        by time or size (its cleaner keeps the latest record of each key,
        docs/design.md §3). Every topic's closed segments wholly below the
        log start (:meth:`delete_records_before`) go.
        """
        if not self._config.deletes_old_segments and self._start <= self._view[0][0]:
            return []
        if now_ms is None:
            now_ms = int(self._clock() * 1000)

        def dead(segments) -> int:
            if self._config.deletes_old_segments:
                return self._retention.expired(segments, self._hw, now_ms, self._start)
            return self._retention.below_start(segments, self._start)

        gone = self._delete_front(dead, "old segments")
        if not gone:
            return []
        deleted = [(s.base_offset, s.size) for s in gone]
        log.info("retention deleted %d segment(s) of %s: %s", len(deleted), self._dir, deleted)
        return deleted

    def delete_records_before(self, offset: int, high_watermark: int | None = None) -> int:
        """Delete the records before ``offset`` (Kafka's DeleteRecords): the
        log start offset moves to ``offset``, even inside the first segment,
        is kept in ``log-start-offset`` (:mod:`raylog.storage.log_start`,
        written whole and synced before this returns) and reads below it
        are out of range from now on (:class:`OffsetOutOfRangeError`, as
        below a segment retention deleted); segments wholly below it are
        deleted now, closed ones (the active segment stays while it is the last).
        Returns the new log start offset.

        ``offset`` -1 is the high watermark (everything readable goes);
        otherwise it must lie in ``[0, high watermark]`` (``high_watermark``,
        at most the log's own: a replicated leader's committed offset), else
        :class:`OffsetOutOfRangeError` naming the bounds and nothing changes.
        The start never moves backwards: an offset at or below it changes
        nothing and answers the start as it is.

        In a segment of format 2 the start may lie inside a batch: a read at
        it gets that batch whole and the reader skips the records before
        the start (as Kafka serves it). In a segment of format 1 it moves to
        the first message boundary at or after ``offset`` (a compressed
        wrapper holding ``offset`` goes whole), which is what is returned.
        Any thread: takes the writer's lock, as retention does (a cleaning
        pass in progress goes on; a segment it cleans that goes meanwhile is
        not swapped in)."""
        if self._closed:
            raise ClosedError(f"the partition log in {self._dir} is closed")
        hw = self._hw if high_watermark is None else min(self._hw, high_watermark)
        start = self.log_start_offset
        if offset == -1:
            offset = hw
        if not 0 <= offset <= hw:
            raise OffsetOutOfRangeError(
                f"cannot delete the records before offset {offset} of {self._dir}: it lies outside "
                f"[0, {hw}] (the high watermark {hw}; -1 means the high watermark); nothing was deleted",
                offset=offset, earliest=start, latest=hw,
            )
        if offset > start:
            # read outside the writer's lock (a walk of format 1's messages); the high watermark only grows
            offset = self._record_boundary(offset, hw)
        with self._lock:
            self._check_writable()
            start = self.log_start_offset
            if offset <= start:
                return start
            self._move_start(offset)
        self._drop_below_start()
        return self.log_start_offset

    def advance_log_start(self, offset: int) -> int:
        """A follower takes its leader's log start (the ``log_start_offset``
        of a replica fetch's answer): its own moves to ``offset`` when that
        is larger and within this log (at most its end: a start past it
        waits for the bytes), kept as :meth:`delete_records_before` keeps
        it, and segments wholly below it are deleted. Returns the log
        start. Any thread (the writer's lock)."""
        with self._lock:
            self._check_writable()
            offset = min(offset, self._leo)
            if offset <= self.log_start_offset:
                return self.log_start_offset
            self._move_start(offset)
        self._drop_below_start()
        return self.log_start_offset

    def _record_boundary(self, offset: int, hw: int) -> int:
        """Where a start at ``offset`` (below ``hw``, at or past the log
        start) lies: ``offset`` itself in a segment of format 2 or at a
        segment's base; in one of format 1 the first message boundary at or
        after it, walked from the time index's last entry before it (or the
        segment's base, where that entry is no boundary). A reader's call:
        no lock."""
        if offset >= hw:
            return offset
        view = self._view
        bases, segments = view
        segment = segments[bisect.bisect_right(bases, offset) - 1]
        if offset == segment.base_offset or segment.format == 2 or segment.offsets is not None:
            return offset
        try:
            begin = max(segment.timeindex.boundary_before(offset), segment.base_offset)
            return self._reader.message_boundaries(view, hw, begin, hw, [offset])[0]
        except InvalidOffsetError:  # the index entry is no boundary: walk from the segment's base
            return self._reader.message_boundaries(view, hw, segment.base_offset, hw, [offset])[0]

    def _move_start(self, offset: int) -> None:
        """Record ``offset`` as the log start (writer's lock held)."""
        try:
            _log_start.write(self._dir, offset)
        except OSError as err:
            if is_disk_full(err):
                raise self._now_disk_full(err, os.path.join(self._dir, _log_start.FILE_NAME)) from err
            self._fail(err)
            raise StorageError(f"cannot record the log start {offset} of {self._dir}: {err}") from err
        self._start = offset
        log.info("partition log %s starts at %d now (records before it deleted)", self._dir, offset)

    def _drop_below_start(self) -> None:
        """Delete the closed segments wholly below the log start (as
        retention deletes segments: :meth:`_delete_front`)."""
        gone = self._delete_front(lambda segments: self._retention.below_start(segments, self._start),
                                  "the segments below the log start")
        if gone:
            log.info("%s: deleted %d segment(s) below the log start %d", self._dir, len(gone), self._start)

    def _delete_front(self, dead, what: str) -> list[LogSegment]:
        """Delete the first ``dead(segments)`` segments of the log: out of the
        view under the writer's lock, their files after it (unlinking large
        files takes a while: appends go on meanwhile), then their transaction
        indexes (after the files: a crash between leaves only files the next
        open deletes). The segments deleted; none once the log is closed.
        ``what`` names them in the error of a failed delete."""
        with self._lock:
            if self._closed:
                return []
            bases, segments = self._view
            count = dead(segments)
            if not count:
                return []
            gone = segments[:count]
            self._view = (bases[count:], segments[count:])
        try:
            self._retention.delete(gone)
        except OSError as err:
            self._fail(err)
            raise StorageError(f"cannot delete {what} in {self._dir}: {err}") from err
        with self._lock:
            self._txn_indexes.delete_below(self._view[0][0])
        return gone

    def reconfigure(self, config: TopicConfig) -> None:
        """Take a live topic's changed config (:mod:`raylog.zk.live_config`)
        from the next append, flush check, roll, retention or cleaning
        pass on: retention (``retention_ms``, ``retention_bytes``),
        ``segment_bytes``, ``segment_ms``, ``flush_messages``, ``flush_ms``,
        ``cleanup_policy`` (turned to compact, appends without keys are
        refused from now on; retention deletes only under ``delete``) and
        the compaction settings. What the log fixed when it opened stays as
        it was: ``max_message_bytes`` and ``max_inflated_bytes`` (bounds of
        reads and recovery) and ``max_producer_ids`` (the producer tables);
        the config keeps the old values of those. Any thread."""
        with self._lock:
            kept = {name: getattr(self._config, name)
                    for name in ("partitions", "max_message_bytes", "max_inflated_bytes", "max_producer_ids")}
            self._config = config.replace(**kept)
            self._retention = Retention(self._dir, config.retention_ms, config.retention_bytes)

    def dirty_ratio(self, now_ms: int | None = None) -> float | None:
        """The share of the cleanable log (closed segments older than
        ``min_compaction_lag_ms``) that is dirty, written since its last
        cleaning: what the cleaner compares to ``min_cleanable_dirty_ratio``
        (0.0 when nothing is dirty); None when the topic is not compacted."""
        config = self._config
        if not config.compacted:
            return None
        if now_ms is None:
            now_ms = int(self._clock() * 1000)
        due = _cleaner.plan(self._view[1], self._hw, config.replace(min_cleanable_dirty_ratio=1e-9), now_ms)
        return 0.0 if due is None else due.ratio

    # -- compaction (raylog.storage.cleaner; the owner's cleaner thread) ----------

    def clean(self, now_ms: int | None = None, *, buffer_bytes: int = _cleaner.DEFAULT_BUFFER_BYTES,
              throttler: "_cleaner.Throttler | None" = None, force: bool = False) -> "_cleaner.Result | None":
        """One pass of the log cleaner on a compacted topic (docs/design.md
        §3; see :mod:`raylog.storage.cleaner`): None when the topic is not
        compacted or no pass is due (``force``: whenever a closed segment is
        dirty). The segments are read and the cleaned ones written outside
        the writer's lock (closed segments never change); each swap takes
        it. Readers and appends go on meanwhile. A full disk stops the pass
        (None; the groups swapped before stay so, the log serves on, the
        next pass tries again); any other disk error fails the log as every
        other does.

        A pass cleans only below the high watermark (and the last stable
        offset on a log that holds transactions: the records of committed
        transactions are cleaned, those of aborted ones removed) and, on a
        replicated partition, below :attr:`clean_limit` (the committed offset): a record
        that a leader change may still cut off never removes an older one,
        so that every replica, cleaning on its own, keeps the latest
        committed record of each key."""
        if not self._config.compacted:
            return None
        with self._clean_lock:
            if self._closed:
                raise ClosedError(f"the partition log in {self._dir} is closed")
            self._check_writable()
            if now_ms is None:
                now_ms = int(self._clock() * 1000)
            hw = self._hw  # before the view: a newer view only adds segments
            limit = self.clean_limit
            if limit is not None:
                hw = min(hw, limit())
            tombstones = self.tombstone_limit
            aborted = None
            if self._formats.segments >= 3:  # the log holds transactions: clean below the last stable offset
                hw = max(min(hw, self._txns.last_stable_offset(hw)), self._view[0][0])
                aborted = self.aborted_transactions
            try:
                return _cleaner.clean(self._view, hw, self._dir, self._config, now_ms, self._install_cleaned,
                                      buffer_bytes=buffer_bytes, throttler=throttler, force=force,
                                      tombstone_limit=None if tombstones is None else tombstones(),
                                      aborted=aborted)
            except OSError as err:
                if self._failed is None and err.errno in (errno.ENOSPC, errno.EDQUOT):
                    # the disk filled while a cleaned segment was written (its
                    # files are gone again): the log is as it was and serves
                    # on; the next pass tries again (docs/design.md section 3:
                    # a full disk is not a failed disk)
                    log.warning("%s: the cleaner's pass stopped, the disk is full: %s; the log is unchanged",
                                self._dir, err)
                    return None
                if self._failed is None:
                    self._fail(err)
                raise StorageError(f"the cleaner of {self._dir} failed: {err}", directory=self._dir) from err

    def _install_cleaned(self, group: list[LogSegment], index) -> bool:
        """Swap ``group`` for its cleaned segment (written beside it): the
        files (:func:`raylog.storage.cleaner.swap`) and the view, under the
        writer's lock; False when retention took a segment of the group meanwhile."""
        with self._lock:
            if self._closed or self._failed is not None:
                return False
            bases, segments = self._view
            at = next((i for i, s in enumerate(segments) if s is group[0]), None)
            if at is None or len(segments) - at <= len(group) or any(
                    a is not b for a, b in zip(segments[at : at + len(group)], group)):
                return False
            base = group[0].base_offset
            try:
                _cleaner.swap(self._dir, base, [s.base_offset for s in group])
                cleaned = LogSegment.open(self._dir, base)
            except OSError as err:
                self._fail(err)
                raise
            if cleaned.offsets is None:
                err = OSError(f"the cleaned segment {cleaned.path} lost its offset index")
                self._fail(err)
                raise err
            end = at + len(group)
            self._view = (bases[:at] + [base] + bases[end:], segments[:at] + [cleaned] + segments[end:])
            return True

    # -- replica writes (see raylog.replication) ----------------------------------
    #
    # A follower's producer-state table follows its leader's: producer_records
    # hands out what the leader remembers after an offset, the follower passes
    # it to append_replica with the bytes, and truncate_replica forgets what it
    # cuts off. A follower that becomes leader therefore answers a retry of a
    # set its old leader stored with that set's offset instead of storing it
    # again.

    def append_replica(self, message_set, offset: int, sequences=(), spanning=None) -> int:
        """Append a leader's set at ``offset``, which must be this log's end
        (replication: the same bytes at the same byte offset on every
        replica). Validated like :meth:`append`; :class:`InvalidOffsetError`
        when ``offset`` is not the log end or a sequence lies outside the set.

        ``sequences``: the idempotent producers' sets within the bytes, as
        :func:`~raylog.storage.producer_state.parse_records` gives them
        (``(producer id, epoch, first sequence, base offset, lengths)``);
        they are remembered as if appended here by their producers. A set
        is passed with the append that holds its end: it may begin in an
        earlier append (a set larger than one fetch comes in parts).
        ``spanning``: such a set (one record, as ``sequences`` holds them)
        that reaches past this append: journaled now and held as pending
        (:meth:`ProducerStateTable.hold`), so that the part is cut back
        before this replica leads (:meth:`cut_partial_replica_set`) or when
        it reopens.

        Record batches (format 2) come whole and stamped by the leader (each
        frame checked with its crc) and are stored at their own baseOffsets,
        which may leave gaps where the leader's log was cleaned (see "Replica
        writes over cleaned ranges" below); a first batch that begins before
        ``offset`` and reaches past it makes the replica cut back to its start
        and take it whole; one that lies before ``offset`` is refused
        (:class:`InvalidMessageError`). Their producers are remembered from
        their own fields (no ``sequences``)."""
        if format_at(message_set) == 2:
            return self._append_replica_batches(message_set, offset)
        size, count = len(message_set), self._validate(message_set)
        if spanning is not None:
            producer_id, epoch, sequence, base, (length,) = spanning
            if not base < offset + size < base + length:
                raise InvalidOffsetError(
                    f"producer {producer_id}'s set at {base} does not reach past the replica append "
                    f"{offset}..{offset + size} to {self._dir}"
                )
        sequenced = []
        for producer_id, epoch, first_sequence, base, lengths in sequences:
            if not lengths:  # where the leader learnt the producer: goes before its set
                sequenced.append((producer_id, epoch, first_sequence, None, lengths))
                continue
            if not offset < base + sum(lengths) <= offset + size or base < self.log_start_offset:
                raise InvalidOffsetError(
                    f"producer {producer_id}'s sets at {base} do not end within the replica append "
                    f"{offset}..{offset + size} to {self._dir}"
                )
            sequenced.append((producer_id, epoch, first_sequence, base - offset, lengths))
        with self._lock:
            self._check_writable()
            if offset != self._leo:
                raise InvalidOffsetError(f"a replica append at {offset}, but {self._dir} ends at {self._leo}")
            if not count:
                return self._leo
            if spanning is not None:
                try:
                    self._producers.hold(producer_id, epoch, sequence, base, length)
                except OSError as err:
                    if is_disk_full(err):
                        raise self._now_disk_full(err, self._dir) from err
                    self._fail(err)
                    raise StorageError(f"cannot write the producer state of {self._dir}: {err}") from err
            return self._append_locked(message_set, size, count, sequenced)

    def _append_replica_batches(self, data, offset: int) -> int:
        """Append a leader's stamped batches at their own offsets (the
        follower's side of replication over cleaned segments, see "Replica
        writes over cleaned ranges" below); ``offset`` is this log's end."""
        limit = max(self._config.max_message_bytes, RECOVERY_MAX_MESSAGE_BYTES)
        headers = _stored_batches(data, limit)
        if offset != self._leo:
            raise InvalidOffsetError(f"a replica append at {offset}, but {self._dir} ends at {self._leo}")
        if headers and headers[0][1].base_offset < offset < headers[0][1].next_offset:
            # The leader holds the batch this replica's log ends inside of as
            # one batch (its copy is cleaned less, or not at all): the replica
            # cuts back to the batch's start and takes it whole.
            first = headers[0][1].base_offset
            log.info("replica %s cuts %d..%d back to take the leader's batch at %d whole", self._dir, first,
                     offset, first)
            self.truncate_replica(first)
            offset = first
        layout = replica_layout(headers, offset, len(data))
        with self._lock:
            self._check_writable()
            if offset != self._leo:
                raise InvalidOffsetError(f"a replica append at {offset}, but {self._dir} ends at {self._leo}")
            if not headers:
                return self._leo
            if layout.plain:
                begin, stop, stamped = layout.plain
                self._append_locked(data[begin:stop], stop - begin, sum(h.count for _o, h in stamped), (),
                                    stamped=stamped)
            if layout.cleaned is not None:
                begin, stop, end, entries, stamped = layout.cleaned
                self._append_cleaned_locked(data[begin:stop], end, entries, stamped)
            if layout.after:
                begin, stop, stamped = layout.after
                self._append_locked(data[begin:stop], stop - begin, sum(h.count for _o, h in stamped), (),
                                    stamped=stamped)
            return offset

    # Replica writes over cleaned ranges. A leader's cleaned segment (docs/
    # design.md §3) holds batches at offsets that are not their byte
    # positions; a follower that fetches it (a new replica, or one that was
    # away) stores every batch at its own offset, as Kafka's followers do:
    #
    # - batches that continue the log end and whose next offset is their
    #   position plus their size (every batch a leader appends) go to the
    #   active segment as they are (offset == position);
    # - the rest of a fetch, from the first batch that does not (a gap the
    #   cleaner left, or a batch it rewrote), is written as a segment in the
    #   cleaned form: its bytes and an offset index (raylog.storage.offsetindex),
    #   made as the cleaner makes its own (``<base>.log.cleaned`` and
    #   ``<base>.index.cleaned``, then raylog.storage.cleaner.swap), dirty
    #   from its base (this replica's cleaner deduplicates it again), and
    #   never written to again; a new empty active segment starts at its
    #   end (the last batch's next offset);
    # - a fetch that is a gap followed by such plain batches only (the
    #   leader's log past its cleaned segments) makes an empty cleaned
    #   segment over the gap and appends the batches to a new active one.
    #
    # So a replica holds the same kept records at the same offsets as its
    # leader, its reads and its own cleaner work on either form, and
    # truncate_replica cuts a cleaned segment by offset, at a batch boundary.

    def _append_cleaned_locked(self, data, end: int, entries, stamped) -> None:
        """Write ``data`` (whole stamped batches; ``entries``: ``(offset,
        span, position)`` of each) as a segment in the cleaned form over
        ``[log end, end)`` and start a new active segment at ``end``
        (writer's lock held)."""
        if self._active.size:
            self._roll()
        empty, base = self._active, self._leo
        log_name = os.path.join(self._dir, segment_name(base))
        idx_name = os.path.join(self._dir, index_name(base))
        committed = False
        try:
            if self._formats.segments < 2:
                self._formats = format_file.mark_segments(self._dir, self._formats, 2)
            fd = os.open(log_name + _cleaner.CLEANED, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            OffsetIndex(base, end, entries, len(data), base).write(idx_name + _cleaner.CLEANED)
            empty.timeindex.close()
            committed = True
            _cleaner.swap(self._dir, base, [base])
            cleaned = LogSegment.open(self._dir, base)
            new = LogSegment.open(self._dir, end)
            sync_directory(self._dir)
        except OSError as err:
            if not committed and is_disk_full(err):
                for name in (log_name, idx_name):
                    try:
                        os.unlink(name + _cleaner.CLEANED)
                    except FileNotFoundError:
                        pass
                raise self._now_disk_full(err, self._dir) from err
            self._fail(err)
            raise StorageError(f"cannot write a replica's cleaned segment at {base} in {self._dir}: {err}") from err
        bases, segments = self._view
        self._view = ([*bases[:-1], base, end], [*segments[:-1], cleaned, new])
        self._active, self._active_since = new, None
        if stamped:
            self._batch_producers.remember(stamped)
        self._leo = end
        self._note_appended(sum(h.count for _o, h in stamped))

    def cut_partial_replica_set(self) -> int | None:
        """Before this replica leads: cut the log back to the start of the
        leader's set it holds only the first part of (a set larger than one
        fetch), which the producer resends whole; its first messages must
        not be stored twice. Returns the offset cut back to, or ``None``."""
        with self._lock:
            pending = self._producers.pending
        if pending is None or pending[3] >= self._leo:
            return None
        base = pending[3]
        log.warning("replica %s cuts %d..%d back: part of producer %d's set %d, resent whole by its producer",
                    self._dir, base, self._leo, pending[0], pending[2])
        self.truncate_replica(base)
        return base

    def producer_records(self, offset: int, max_bytes: int, learnt: bool = True) -> bytes:
        """The idempotent producers' sets remembered at or after ``offset``,
        as records of the producer-state journal (what a follower passes to
        :meth:`append_replica`, through ``parse_records``); ``learnt``: with
        the sequence each was learnt at (records without sets, which older
        followers cannot read)."""
        with self._lock:
            return self._producers.records_from(offset, max_bytes, learnt)

    def truncate_replica(self, offset: int) -> None:
        """Cut the log back to ``offset`` (a replica of an older leader epoch,
        see :mod:`raylog.replication.state`), forgetting the producers' sets
        cut off; nothing at or past the end, nothing before the log start.

        In a segment the cleaner rewrote (or a replica wrote in the cleaned
        form) the cut is found in its offset index and made at a batch
        boundary: an ``offset`` inside a kept batch cuts before that batch
        (the replica fetches it again). The segment's index is rewritten
        first, then its file cut, and a new empty active segment starts at
        the cut (a crash in between is finished by recovery). Waits for a
        cleaning pass in progress (it reads the segments cut here)."""
        with self._clean_lock, self._flush_lock, self._lock:
            self._check_writable()
            if offset >= self._leo:
                return
            bases, segments = self._view
            offset = max(offset, bases[0])
            keep = segments[: bisect.bisect_right(bases, offset)]
            last = keep[-1]
            if last.offsets is not None:
                entry = last.offsets.locate(offset)
                if entry is not None and entry.offset < offset:
                    offset = entry.offset  # never inside a batch
            try:
                for segment in reversed(segments[len(keep):]):  # newest first: what stays is contiguous
                    _delete_segment(segment)
                if len(keep) < len(segments):
                    sync_directory(self._dir)
                if not last.cleaned:
                    last.truncate(offset - last.base_offset)
                else:
                    keep[-1:] = self._cut_cleaned(last, offset)
            except OSError as err:
                self._fail(err)
                raise StorageError(f"cannot cut the replica in {self._dir} back to {offset}: {err}") from err
            if self._start > offset:  # the start is never past the log end
                try:
                    _log_start.write(self._dir, offset)
                except OSError as err:
                    self._fail(err)
                    raise StorageError(f"cannot record the log start {offset} of {self._dir}: {err}") from err
                self._start = offset
            self._view, self._active, self._leo = ([s.base_offset for s in keep], keep), keep[-1], offset
            self._active_since = None
            self._producers.truncate(offset)
            self._batch_producers.truncate(keep, offset)
            self._txn_indexes.truncate(offset)
            self._checkpoint.write(offset)
            with self._cond:
                self._hw = min(self._hw, offset)

    def _cut_cleaned(self, segment: LogSegment, offset: int) -> list[LogSegment]:
        """Cut the cleaned ``segment`` at ``offset`` (a batch boundary or a
        gap; locks held): what replaces it, the cut segment (unless nothing
        of it stays) and a new empty active segment at ``offset``."""
        base = segment.base_offset
        if offset == base:
            _delete_segment(segment)
            new = LogSegment.open(self._dir, base)
            sync_directory(self._dir)
            return [new]
        index = segment.offsets
        position = index.position_of(offset)
        kept = [e for e in index.entries() if e.offset < offset]
        cut = OffsetIndex(base, offset, kept, position, min(index.dirty_from, offset))
        path = os.path.join(self._dir, index_name(base))
        cut.write(path + _CUT)  # the index first: recovery cuts a longer file to it
        os.replace(path + _CUT, path)
        segment.truncate(position)
        segment.offsets = cut
        new = LogSegment.open(self._dir, offset)
        sync_directory(self._dir)
        return [segment, new]

    def restart_replica_at(self, offset: int) -> None:
        """Start over, empty, at ``offset``, past this log's end: the leader's
        log now begins there (its retention deleted what this replica would
        fetch next: a replica that was away long, or a new one), so the
        replica drops what it holds and follows from the leader's log start
        (Kafka's truncate-fully-and-start-at). The old segments go first, then
        the new empty one is made: a crash in between leaves no segment, and
        the log reopens empty at 0, which the follower restarts from again."""
        with self._flush_lock, self._lock:
            self._check_writable()
            if offset <= self._leo:
                raise InvalidOffsetError(
                    f"a replica starts over only past its log end ({self._leo}), not at {offset}", offset=offset
                )
            try:
                for segment in reversed(self._view[1]):
                    _delete_segment(segment)
                sync_directory(self._dir)
                new = LogSegment.open(self._dir, offset)
                sync_directory(self._dir)  # (a start recorded before lies below offset: the base wins)
            except OSError as err:
                self._fail(err)
                raise StorageError(f"cannot start the replica in {self._dir} over at {offset}: {err}") from err
            self._view, self._active, self._leo = ([offset], [new]), new, offset
            self._start = offset
            self._active_since = None
            self._producers.truncate(0)
            self._batch_producers.restart([new], offset)
            self._txn_indexes.clear()
            self._checkpoint.write(offset)
            with self._cond:
                self._hw = offset

    # -- disk full -------------------------------------------------------------------

    def _check_space(self) -> None:
        """Refuse an append at once while the disk is full (writer lock held),
        except one try every DISK_FULL_RETRY_S."""
        full = self._disk_full
        if full is not None:
            now = time.monotonic()
            if now < self._disk_full_retry_at:
                raise DiskFullError(str(full), **full.details)
            self._disk_full_retry_at = now + DISK_FULL_RETRY_S

    def _now_disk_full(self, err: OSError, path: str) -> DiskFullError:
        """Enter (or stay in) the disk-full state; the error to raise."""
        full = DiskFullError(
            f"disk full on node {self.node}: cannot write {path} ({err.strerror or err}); the set was not "
            f"stored. The partition keeps serving reads and takes writes again once space is freed on that "
            f"disk: retry later (producers do), or free space",
            node=self.node,
            path=path,
            directory=self._dir,
        )
        if self._disk_full is None:
            log.warning("partition log %s: %s", self._dir, full)
        self._disk_full = full
        self._disk_full_retry_at = time.monotonic() + DISK_FULL_RETRY_S
        return full

    def _resume(self, why: str) -> None:
        self._disk_full = None
        self._disk_full_retry_at = 0.0
        log.warning("partition log %s: the disk has room again (%s); writes resume", self._dir, why)

    def maybe_resume(self) -> bool:
        """End the disk-full state when the file system has room for a
        message set again (timer hook; cheap: one ``statvfs`` while full).
        Returns whether it ended now."""
        if self._disk_full is None or self._closed:
            return False
        try:
            st = os.statvfs(self._dir)
        except OSError:
            return False
        if st.f_bavail * st.f_frsize < 2 * self._config.max_message_bytes + (64 << 10):
            return False
        with self._lock:
            if self._disk_full is None:
                return False
            self._resume(f"{st.f_bavail * st.f_frsize} bytes free")
            return True

    def mend(self, offset: int, data: bytes) -> None:
        """Overwrite damaged stored bytes ``[offset, offset + len(data))``
        with ``data``, the same range read from another replica (replicas
        hold the same bytes at the same offsets, docs/design.md §7).

        The range must lie in one segment below the high watermark, and
        ``data`` must be whole messages (record batches stamped with their
        offsets, in a segment of format 2) that pass every check (size, header,
        CRC) and fill it exactly; else :class:`InvalidOffsetError` or
        :class:`CorruptMessageError` and nothing is written. The bytes are
        written in place and synced. Any thread (takes the writer's lock).
        A range in a cleaned segment is refused (:class:`InvalidOffsetError`):
        its positions are not offsets, and its batches are this replica's own
        cleaning, which another replica's bytes need not match (recovery never
        reports damage kept there). Another replica's cleaned bytes for a
        range stored here uncleaned fail the checks above (their batches are
        not at these positions): nothing is written.
        """
        end = offset + len(data)
        with self._lock:
            self._check_writable()
            bases, segments = self._view
            if not data or offset < bases[0] or end > self._hw:
                raise InvalidOffsetError(
                    f"cannot mend [{offset}, {end}) of {self._dir}: not within [{bases[0]}, {self._hw})",
                    offset=offset,
                )
            segment = segments[bisect.bisect_right(bases, offset) - 1]
            if end > segment.end_offset:
                raise InvalidOffsetError(f"cannot mend [{offset}, {end}) of {self._dir}: it crosses a segment",
                                         offset=offset)
            if segment.cleaned:
                # its file positions are not offsets, and its batches are this replica's own cleaning
                raise InvalidOffsetError(
                    f"cannot mend [{offset}, {end}) of {self._dir}: the segment {segment.path} was cleaned "
                    f"(recovery never reports damage kept there); nothing was written",
                    offset=offset,
                )
            limit = max(self._config.max_message_bytes, RECOVERY_MAX_MESSAGE_BYTES)
            if segment.format == 2:  # stored batches, stamped with their offsets
                valid, _count, err = scan_batches(data, limit, base_offset=offset)
            else:
                valid, _count, err = scan_message_set(data, limit, base_offset=offset, check_inner=False)
            if err is not None or valid != len(data):
                raise CorruptMessageError(
                    f"the bytes to mend [{offset}, {end}) of {self._dir} with are not whole valid messages "
                    f"({err}); nothing was written",
                    offset=offset,
                )
            segment.counts.truncate(offset)  # its bytes after offset are written again
            # A descriptor of its own: the segment's is O_APPEND, where pwrite appends.
            fd = os.open(segment.path, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.pwrite(fd, data, offset - segment.base_offset)
                os.fdatasync(fd)
            except OSError as err:
                raise StorageError(f"cannot mend [{offset}, {end}) of {segment.path}: {err}") from err
            finally:
                os.close(fd)
        log.warning("partition log %s: mended the damaged bytes [%d, %d) with a replica's copy", self._dir, offset, end)

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
            submit_flush(self._flush_in_background)

    def wait_for_appends(self, timeout_s: float) -> bool:
        """Block until appended bytes wait for their flush, at most
        ``timeout_s`` (timer hook: an idle log's timer sleeps here instead
        of waking every few milliseconds). Whether there are such bytes."""
        return self._has_unflushed.wait(timeout_s)

    def wake_waiting_timer(self) -> None:
        """Return a timer blocked in :meth:`wait_for_appends` at once (its
        owner is closing)."""
        self._has_unflushed.set()

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
                self._has_unflushed.clear()
            if target == self._hw:
                return False
            started = time.perf_counter()
            try:
                _faults.check("fsync", self._dir)
                active.flush()  # earlier segments were synced when they were rolled
                self._producers.sync()
                self._checkpoint.write(target)
            except OSError as err:
                self._fail(err)
                raise StorageError(f"cannot sync {active.path}: {err}") from err
            with self._cond:
                self._hw = target
                self._cond.notify_all()
            if self._on_flush is not None:
                self._on_flush(time.perf_counter() - started)
            return True

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
                    self._txn_indexes.close()
                    for segment in self._view[1]:
                        segment.timeindex.close()
                self._checkpoint.close()
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
