"""Idempotent producers of format 2: the state a partition keeps from the
record batches' own fields (docs/design.md §2, "The producer state").

A format-2 batch carries its producer: producerId, producerEpoch and
baseSequence (its records have sequences baseSequence .. baseSequence +
count - 1, :attr:`~raylog.storage.record_batch.BatchHeader.last_sequence`).
A batch with producerId >= 0 and a baseSequence (>= 0; not a control
batch, whose markers carry none) is judged before it is appended
(:meth:`BatchProducerState.judge`), by the rules of format 1's
:meth:`~raylog.storage.producer_state.ProducerStateTable.check`:

* a producer id not known, another epoch than the one known, or
  ``baseSequence == last + 1``: append, and remember;
* a batch with the same first and last sequence as one of the last
  :data:`BATCHES_REMEMBERED` stored for the id: a duplicate (a retry):
  append nothing, answer the offset of its first store;
* ``baseSequence <= last`` otherwise: :class:`DuplicateSequenceError`;
* ``baseSequence > last + 1``: :class:`OutOfOrderSequenceError`.

Several batches in one append are appended together only when every
idempotent one is new and in order (else :class:`OutOfOrderSequenceError`:
the caller offers them one by one).

No journal: nothing is written at an append, so an idempotent append needs
one flush, of the segment. The state is rebuilt when the log opens
(:meth:`BatchProducerState.rebuild`) from the headers of the batches after
the newest snapshot, which the log writes at each segment roll (as Kafka's
ProducerStateManager does): ``<offset, 20 digits>.producers``, the state of
the log up to that offset, big-endian::

     field          type   meaning
  1. crc            u32    CRC32C of every byte after this field
  2. version        u16    2 (1: written before transactions, without field 11)
  3. offset         i64    the log offset the state is that of (= the file name's)
  4. producers      u32    n, then n times:
  5.   producer id  i64    (>= 0)
  6.   epoch        i16
  7.   batches      u8     k (1 .. BATCHES_REMEMBERED), then k times, oldest first:
  8.     first seq  i32    the batch's baseSequence
  9.     last seq   i32    its last record's sequence
 10.     offset     i64    the batch's offset (its baseOffset)
 11. transactions   bytes  (version 2) the transactions' section, field by field in
                           :mod:`raylog.storage.transactions` (ongoing transactions
                           and epochs); a snapshot of version 1 holds none

A snapshot is written to a temporary file, synced and renamed (a crash
leaves the old set of snapshots or the new one). One that fails its CRC, or
lies past the recovered log's end, is ignored (and deleted); the state is
then rebuilt from an older one or from the log's first batch. Only the
newest :data:`SNAPSHOTS_KEPT` are kept. At most ``max_producer_ids`` ids are
remembered; the one that appended least recently goes first.

The transactions of the log (:class:`~raylog.storage.transactions.TransactionState`,
:attr:`BatchProducerState.transactions`) are rebuilt with the producers,
from the same snapshot and the same batch headers (a marker's record read
from its segment), which the log then checks its transaction indexes
against (:attr:`TransactionState.replayed <raylog.storage.transactions.TransactionState.replayed>`).

Thread-safety: none; the owning log calls it under its writer lock.
"""

from __future__ import annotations

import logging
import os
import re
import struct
from collections import OrderedDict, deque

from crc32c import crc32c

from raylog.errors import DuplicateSequenceError, InvalidMessageError, OutOfOrderSequenceError
from raylog.storage.markers import decode_marker
from raylog.storage.record_batch import HEADER_SIZE, BatchHeader, read_header
from raylog.storage.transactions import TXN_BITS, TransactionState
from raylog.storage.owner_only import FILE_MODE

__all__ = ["BATCHES_REMEMBERED", "SNAPSHOTS_KEPT", "BatchProducerState", "producer_runs", "snapshot_name"]

log = logging.getLogger(__name__)

#: batches remembered per producer id: twice the sets raylog's producer keeps
#: unacknowledged per partition (16, raylog.transfer.protocol's
#: MAX_IN_FLIGHT_PER_PARTITION), so every retry of a round finds its first
#: store (Kafka remembers five, its clients' in-flight bound)
BATCHES_REMEMBERED = 32
#: snapshots kept in a partition directory
SNAPSHOTS_KEPT = 2
SUFFIX = ".producers"
_NAME = re.compile(r"^(\d{20})\.producers$")
_VERSION = 2
_HEAD = struct.Struct(">IHqI")
_PRODUCER = struct.Struct(">qhB")
_BATCH = struct.Struct(">iiq")
_SEQ_MASK = 0x7FFFFFFF
#: bytes of batch headers read at a time when the state is rebuilt
_READ_BYTES = 1 << 16


_CONTROL_BIT = 0x20  # attributes bit 5 (docs/design.md §2)


def _sequenced(header: BatchHeader) -> bool:
    """Whether a batch is judged by its sequence: an idempotent producer's
    data (a control batch, a transaction marker, has no sequence: -1)."""
    # (fields by index, on every append: producerId, baseSequence, attributes' control bit)
    return header[9] >= 0 and header[11] >= 0 and not header[5] & _CONTROL_BIT


def producer_runs(headers) -> list[tuple[int, int, int, int, int, int]]:
    """The producers' runs of an append's batches (``(position, header)``
    each): ``(producer id, epoch, first sequence, last sequence, first,
    stop)`` for each longest stretch ``headers[first:stop]`` of batches of
    one producer id and epoch whose sequences follow one another (a batch
    not :func:`_sequenced` is in no run). What :meth:`BatchProducerState.judge`
    and :meth:`~BatchProducerState.remember` take instead of walking every
    batch; ``_speedups.batches_runs`` computes the same from the bytes."""
    runs = []
    run = None
    for index, (_pos, h) in enumerate(headers):
        if not _sequenced(h):
            if run is not None:
                runs.append(tuple(run))
                run = None
            continue
        if run is not None and run[0] == h.producer_id and run[1] == h.producer_epoch and (
            h.base_sequence == (run[3] + 1) & _SEQ_MASK
        ):
            run[3] = h.last_sequence
            run[5] = index + 1
            continue
        if run is not None:
            runs.append(tuple(run))
        run = [h.producer_id, h.producer_epoch, h.base_sequence, h.last_sequence, index, index + 1]
    if run is not None:
        runs.append(tuple(run))
    return runs


def snapshot_name(offset: int) -> str:
    return f"{offset:020d}{SUFFIX}"


def _headers(segment, pos: int, stop: int) -> list[tuple[int, BatchHeader]]:
    """``(offset, header)`` of the whole batches of ``segment`` in ``[pos, stop)``,
    read in blocks of :data:`_READ_BYTES` (a header that straddles a block is read again).
    A segment the cleaner rewrote has its batches at the positions its offset index names."""
    if segment.offsets is not None:
        return [(entry.offset, read_header(segment.read_at(entry.position, HEADER_SIZE)))
                for entry in segment.offsets.batches_between(pos, stop)
                if entry.next_offset <= stop]
    found = []
    block, block_at = b"", pos
    while stop - pos >= HEADER_SIZE:
        rel = pos - block_at
        if rel < 0 or rel + HEADER_SIZE > len(block):
            block, block_at, rel = segment.read_at(pos - segment.base_offset, min(_READ_BYTES, stop - pos)), pos, 0
            if len(block) < HEADER_SIZE:
                break
        header = read_header(block, rel)
        if header.batch_length < HEADER_SIZE - 12 or pos + header.size > stop:
            break  # recovery checked the log: only damage it kept stops the walk
        found.append((pos, header))
        pos += header.size
    return found


class _Producer:
    __slots__ = ("epoch", "batches")

    def __init__(self, epoch: int):
        self.epoch = epoch
        #: (first sequence, last sequence, offset) of the last batches, oldest first
        self.batches: deque[tuple[int, int, int]] = deque(maxlen=BATCHES_REMEMBERED)

    @property
    def last(self) -> int:
        return self.batches[-1][1]


class BatchProducerState:
    """The idempotent producers of a log's format-2 batches (see the module docstring)."""

    def __init__(self, directory: str | None, max_producer_ids: int = 10_000, *,
                 require_verification: bool = False):
        """``directory=None``: in memory only (no snapshots; the in-memory log's).
        ``require_verification``: see :class:`~raylog.storage.transactions.TransactionState`."""
        self._dir = directory
        self._max = max_producer_ids
        self._producers: OrderedDict[int, _Producer] = OrderedDict()
        #: the log's transactions, kept in the same snapshots
        self.transactions = TransactionState(max_producer_ids, require_verification)

    def __len__(self) -> int:
        return len(self._producers)

    def last_sequence(self, producer_id: int) -> int | None:
        state = self._producers.get(producer_id)
        return None if state is None else state.last

    def describe(self) -> list[tuple[int, int, int]]:
        """``(producer id, epoch, last sequence)`` of every producer
        remembered, least recently appending first."""
        return [(pid, state.epoch, state.last) for pid, state in self._producers.items()]

    # -- the writer's calls ---------------------------------------------------------

    def judge(self, headers, *, name: str = "", runs=None) -> int | None:
        """Judge the batches of one append (``(position, header)`` each):
        ``None`` to append them, else (one idempotent batch, a duplicate)
        the offset of its first store. Raises as the module docstring says.
        ``runs``: their :func:`producer_runs` when known (computed here otherwise)."""
        if len(headers) == 1:  # (one batch: most appends; fields by index, as _sequenced reads them)
            h = headers[0][1]
            if h[9] < 0 or h[11] < 0 or h[5] & _CONTROL_BIT:
                return None
            state = self._producers.get(h[9])
            if state is None or state.epoch != h[10] or h[11] == (state.batches[-1][1] + 1) & _SEQ_MASK:
                return None  # new, or the next in order
            return self._check(h, name)
        if runs is None:
            runs = producer_runs(headers)
        # Within a run every batch follows the one before it: judging each
        # run's first sequence judges all of its batches.
        expected: dict[int, tuple[int, int]] = {}
        for producer_id, epoch, first, last, _i, _j in runs:
            state = self._producers.get(producer_id)
            known = expected.get(producer_id) or (None if state is None else (state.epoch, state.last))
            if known is not None and known[0] == epoch and first != (known[1] + 1) & _SEQ_MASK:
                raise OutOfOrderSequenceError(
                    f"{name}: the batches of producer {producer_id} from sequence {first} "
                    f"are not all new and in order (expected {(known[1] + 1) & _SEQ_MASK}); offer them one by one",
                    producer_id=producer_id,
                    sequence=first,
                    expected=(known[1] + 1) & _SEQ_MASK,
                )
            expected[producer_id] = (epoch, last)
        return None

    def _check(self, h: BatchHeader, name: str) -> int | None:
        state = self._producers.get(h.producer_id)
        if state is None or state.epoch != h.producer_epoch:
            return None
        expected = (state.last + 1) & _SEQ_MASK
        if h.base_sequence == expected:
            return None
        for first, last, offset in state.batches:
            if first == h.base_sequence and last == h.last_sequence:
                return offset
        if h.base_sequence > state.last:
            raise OutOfOrderSequenceError(
                f"{name}: producer {h.producer_id} sent a batch at sequence {h.base_sequence} but the next "
                f"expected is {expected}; a batch in between is missing, this one was not stored",
                producer_id=h.producer_id,
                sequence=h.base_sequence,
                expected=expected,
            )
        raise DuplicateSequenceError(
            f"{name}: producer {h.producer_id} sent sequences {h.base_sequence}..{h.last_sequence} again, "
            f"which were stored before (the last stored is {state.last}) but are no longer remembered as "
            f"one batch; not stored again, its offset is unknown",
            producer_id=h.producer_id,
            sequence=h.base_sequence,
            last=state.last,
        )

    def remember(self, batches, runs=None) -> None:
        """Remember the idempotent batches just appended (``(offset, header)``
        each; ``runs``: their :func:`producer_runs` when known). Of a run,
        only its last :data:`BATCHES_REMEMBERED` batches are looked at: the
        ones before would leave the producer's window anyway."""
        producers = self._producers
        if runs is None:
            if len(batches) != 1:
                if not batches:
                    return
                runs = producer_runs(batches)
            else:  # one batch (most appends): its fields by index, as _sequenced reads them
                offset, h = batches[0]
                producer_id, epoch, first = h[9], h[10], h[11]
                if producer_id < 0 or first < 0 or h[5] & _CONTROL_BIT:
                    return
                state = producers.get(producer_id)
                if state is None or state.epoch != epoch:
                    state = producers[producer_id] = _Producer(epoch)
                producers.move_to_end(producer_id)
                state.batches.append((first, (first + h[12] - 1) & _SEQ_MASK, offset))
                if len(producers) > self._max:
                    producers.popitem(last=False)
                return
        for producer_id, epoch, _first, _last, i, j in runs:
            state = producers.get(producer_id)
            if state is None or state.epoch != epoch:
                state = producers[producer_id] = _Producer(epoch)
            producers.move_to_end(producer_id)
            state.batches.extend(
                [(h.base_sequence, h.last_sequence, offset) for offset, h in batches[max(i, j - BATCHES_REMEMBERED) : j]]
            )
            while len(producers) > self._max:
                producers.popitem(last=False)

    # -- snapshots and rebuilding ---------------------------------------------------

    def snapshot(self, offset: int) -> None:
        """Write the state as that of the log up to ``offset`` (at a roll;
        raises ``OSError``), and delete all but the newest snapshots."""
        if self._dir is None:
            return
        parts = [struct.pack(">HqI", _VERSION, offset, len(self._producers))]
        for producer_id, state in self._producers.items():
            parts.append(_PRODUCER.pack(producer_id, state.epoch, len(state.batches)))
            parts.extend(_BATCH.pack(*b) for b in state.batches)
        parts.append(self.transactions.to_bytes())
        body = b"".join(parts)
        path = os.path.join(self._dir, snapshot_name(offset))
        tmp = path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
        try:
            os.write(fd, crc32c(body).to_bytes(4, "big") + body)
            os.fdatasync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        for old in self._snapshots()[:-SNAPSHOTS_KEPT]:
            self._delete(old)

    def _snapshots(self) -> list[int]:
        found = []
        for name in os.listdir(self._dir):
            match = _NAME.match(name)
            if match:
                found.append(int(match.group(1)))
        return sorted(found)

    def _delete(self, offset: int) -> None:
        try:
            os.unlink(os.path.join(self._dir, snapshot_name(offset)))
        except FileNotFoundError:
            pass

    def _load(self, offset: int) -> bool:
        """Load the snapshot of ``offset``; whether it was sound."""
        try:
            with open(os.path.join(self._dir, snapshot_name(offset)), "rb") as f:
                data = f.read()
            crc, version, at, count = _HEAD.unpack_from(data, 0)
            if crc != crc32c(memoryview(data)[4:]) or version not in (1, _VERSION) or at != offset:
                return False
            producers: OrderedDict[int, _Producer] = OrderedDict()
            pos = _HEAD.size
            for _ in range(count):
                producer_id, epoch, k = _PRODUCER.unpack_from(data, pos)
                pos += _PRODUCER.size
                state = producers[producer_id] = _Producer(epoch)
                for _ in range(k):
                    state.batches.append(_BATCH.unpack_from(data, pos))
                    pos += _BATCH.size
            if version >= 2:
                pos = self.transactions.load(data, pos, offset)
            if pos != len(data):
                self.transactions.reset()
                return False
        except (OSError, struct.error):
            self.transactions.reset()
            return False
        self._producers = producers
        return True

    def rebuild(self, segments, end_offset: int) -> list[str]:
        """The state of the log ``segments`` up to ``end_offset``: the newest
        sound snapshot at or before it (one from before the log start, whose
        segments retention deleted, included), then the headers of the format-2
        batches after it. Snapshots past ``end_offset`` and damaged ones are deleted.
        Returns notes for the recovery log."""
        notes: list[str] = []
        self._producers = OrderedDict()
        self.transactions.reset()
        start = segments[0].base_offset if segments else 0
        if self._dir is not None:
            for offset in reversed(self._snapshots()):
                if offset > end_offset:
                    self._delete(offset)
                    continue
                if self._load(offset):  # (one older than the log start, after retention, holds)
                    start = max(offset, start)
                    break
                notes.append(f"producer snapshot {snapshot_name(offset)} is damaged; ignored and deleted")
                self._delete(offset)
        self.transactions.replaying = True
        try:
            for segment in segments:
                if segment.format != 2 or segment.end_offset <= start:
                    continue
                headers = _headers(segment, max(start, segment.base_offset), min(segment.end_offset, end_offset))
                self.remember(headers)
                self._replay_transactions(segment, headers, end_offset)
        finally:
            self.transactions.replaying = False
        return notes

    def _replay_transactions(self, segment, headers, end_offset: int) -> None:
        """Rebuild: the transactions of the batches ``headers`` of ``segment``
        (everything recovered counts as below the high watermark)."""
        txns = self.transactions
        for offset, h in headers:
            if h[9] < 0 or not (h[5] & TXN_BITS or txns.tracking):
                continue
            marker = None
            if h[5] & _CONTROL_BIT:
                position = (offset - segment.base_offset if segment.offsets is None
                            else segment.offsets.position_of(offset))
                try:
                    marker = decode_marker(segment.read_at(position, h.size))
                except InvalidMessageError:  # damage recovery kept (reported there): no decision read
                    continue
            txns.apply(offset, h, marker, end_offset)

    def truncate(self, segments, end_offset: int) -> None:
        """The log was cut back to ``end_offset``: rebuild from it."""
        self.rebuild(segments, end_offset)

    def restart(self, segments, offset: int) -> None:
        """The log starts over, empty, at ``offset`` (a replica restarted at its
        leader's log start): every snapshot goes, the state is empty."""
        if self._dir is not None:
            for old in self._snapshots():
                self._delete(old)
        self.rebuild(segments, offset)
