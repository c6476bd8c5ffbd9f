"""Transactions on the partition's side (docs/design.md §6): the ongoing
transactions of a log, its last stable offset, and the checks a
transactional write passes (Kafka's ProducerStateManager and
ProducerAppendInfo, with KIP-890's verification).

What the state is made of (all of it from the batches' own fields, so it is
rebuilt from the log as the idempotent producers are,
:mod:`raylog.storage.batch_producers`, which owns it and keeps it in its
snapshots):

* per producer id that wrote a transactional batch or has a marker: its
  latest **epoch**, the **coordinator epoch** of its last marker, and the
  **first offset** of its ongoing transaction (-1: none). A transactional
  batch of a producer with no ongoing transaction starts one at its offset;
  a marker (:mod:`raylog.storage.markers`) ends it, committed or aborted
  (a :class:`CompletedTxn`). A marker of a producer with no ongoing
  transaction changes only the epochs (an empty transaction here).
* the **last stable offset** (:meth:`TransactionState.last_stable_offset`):
  the first offset of the earliest transaction that is ongoing, or that
  ended with a marker not yet below the high watermark (Kafka's unstable
  offsets: a reader must see the marker's decision before the data it
  decides), else the high watermark. A ``read_committed`` reader reads only
  below it.

Checks before an append (:meth:`TransactionState.check_epochs` before the
idempotent producers' sequences are judged, :meth:`TransactionState.check`
after; a replica's append and the rebuild check nothing, they take the
leader's log as it is):

* a batch of an older epoch than the one known for its producer id:
  :class:`~raylog.errors.InvalidProducerEpochError` (fenced by a newer
  producer of the same transactional id);
* a plain batch of a producer whose transaction is ongoing:
  :class:`~raylog.errors.InvalidTxnStateError` (Kafka's rule);
* with verification on (``require_verification``; KIP-890): the first
  transactional batch of a transaction needs the
  :class:`VerificationGuard` that :meth:`TransactionState.start_verification`
  handed out for its producer and that no marker has cleared since (the
  partition's owner asks the coordinator whether the partition belongs to
  the producer's ongoing transaction between the two): else
  :class:`~raylog.errors.InvalidTxnStateError`, so a late write of an ended
  transaction never opens a transaction that nothing would end (a hung
  transaction);
* a marker of an older producer epoch (``InvalidProducerEpochError``) or
  coordinator epoch (:class:`~raylog.errors.TransactionCoordinatorFencedError`)
  than the producer's (:meth:`TransactionState.check_marker`).

The snapshot section (:meth:`TransactionState.to_bytes`, after the
producers of a ``.producers`` snapshot of version 2), big-endian::

     field          type   meaning
  1. producers      u32    m, then m times:
  2.   producer id  i64    (>= 0)
  3.   epoch        i16    its latest epoch
  4.   coord epoch  i32    the coordinator epoch of its last marker (-1 none)
  5.   first offset i64    the first offset of its ongoing transaction (-1 none)

At most ``max_producer_ids`` producers are kept: the one that wrote least
recently without an ongoing transaction goes first (a producer with an
ongoing transaction is never forgotten).

Thread-safety: the writer's calls (``check``, ``apply``, the snapshot's)
run under the owning log's writer lock; :meth:`last_stable_offset` may run
in any thread (it reads one tuple the writer replaces whole).
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from typing import NamedTuple

from raylog.errors import (
    InvalidMessageError,
    InvalidProducerEpochError,
    InvalidTxnStateError,
    TransactionCoordinatorFencedError,
)
from raylog.storage.markers import Marker

__all__ = ["AbortedTxn", "CompletedTxn", "TransactionState", "VerificationGuard", "TXN_BITS"]

#: attributes bits 4 (transactional) and 5 (control)
TXN_BITS = 0x30
_TRANSACTIONAL = 0x10
_CONTROL = 0x20
_COUNT = struct.Struct(">I")
_PRODUCER = struct.Struct(">qhiq")


class AbortedTxn(NamedTuple):
    """An aborted transaction of one producer on a partition: its data lies
    in ``[first_offset, last_offset)``, its abort marker at ``last_offset``;
    ``last_stable_offset`` is the log's last stable offset right after the
    marker (ignoring the high watermark; Kafka's AbortedTxn)."""

    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


class CompletedTxn(NamedTuple):
    """A transaction ended by the marker at ``last_offset``."""

    producer_id: int
    first_offset: int
    last_offset: int
    aborted: bool
    #: the last stable offset right after the marker (the first offset of
    #: the earliest other ongoing transaction, else the offset after the marker)
    last_stable_offset: int

    def as_aborted(self) -> AbortedTxn:
        return AbortedTxn(self.producer_id, self.first_offset, self.last_offset, self.last_stable_offset)


class VerificationGuard:
    """What :meth:`TransactionState.start_verification` hands out for a
    producer: the append of its transaction's first batch must carry this
    very object (KIP-890's VerificationGuard). Compared by identity."""

    __slots__ = ("producer_id", "epoch")

    def __init__(self, producer_id: int, epoch: int):
        self.producer_id = producer_id
        self.epoch = epoch

    def __repr__(self) -> str:
        return f"VerificationGuard(producer {self.producer_id}, epoch {self.epoch})"


class _TxnProducer:
    __slots__ = ("epoch", "coordinator_epoch", "first_offset")

    def __init__(self, epoch: int, coordinator_epoch: int = -1, first_offset: int = -1):
        self.epoch = epoch
        self.coordinator_epoch = coordinator_epoch
        self.first_offset = first_offset


class TransactionState:
    """The transactions of one partition log (see the module docstring)."""

    def __init__(self, max_producer_ids: int = 10_000, require_verification: bool = False):
        self._max = max_producer_ids
        #: KIP-890: a transaction's first batch needs a guard (see the module docstring)
        self.require_verification = require_verification
        self._producers: OrderedDict[int, _TxnProducer] = OrderedDict()
        self._guards: dict[int, VerificationGuard] = {}
        #: (first offset, marker offset, producer id) of transactions ended
        #: by a marker that may still be at or past the high watermark
        self._completed: list[tuple[int, int, int]] = []
        #: what readers look at: (first offset, marker offset or None while
        #: ongoing, producer id), by first offset; replaced whole
        self._unstable: tuple = ()
        #: the aborted transactions :meth:`apply` met while :attr:`replaying` (a rebuild's)
        self.replayed: list[AbortedTxn] = []
        #: set by the rebuild while it replays the log's batches
        self.replaying = False

    # -- inspection (any thread) ------------------------------------------------------

    def last_stable_offset(self, hw: int) -> int:
        """The first offset of the earliest unstable transaction (ongoing,
        or ended by a marker at or past ``hw``), else ``hw``."""
        for first, marker, _pid in self._unstable:
            if marker is None or marker >= hw:
                return first if first < hw else hw
        return hw

    def ongoing(self) -> dict[int, int]:
        """``producer id -> first offset`` of the ongoing transactions."""
        return {pid: first for first, marker, pid in self._unstable if marker is None}

    def epoch_of(self, producer_id: int) -> int | None:
        state = self._producers.get(producer_id)
        return None if state is None else state.epoch

    def __len__(self) -> int:
        return len(self._producers)

    @property
    def tracking(self) -> bool:
        """Whether any producer is known (else plain batches need no look)."""
        return bool(self._producers)

    # -- the writer's calls -------------------------------------------------------------

    def start_verification(self, producer_id: int, epoch: int) -> VerificationGuard | None:
        """KIP-890's first step: ``None`` when the producer's transaction is
        ongoing here at ``epoch`` already (nothing to verify); else a new
        guard, kept for the producer, to pass to the append once the
        coordinator said the partition is in the producer's transaction."""
        state = self._producers.get(producer_id)
        if state is not None and state.first_offset >= 0 and state.epoch == epoch:
            return None
        guard = self._guards[producer_id] = VerificationGuard(producer_id, epoch)
        return guard

    def check_epochs(self, headers, *, name: str = "") -> None:
        """The epoch rule alone, for the batches of one append: judged
        before their sequences (a zombie's batch is fenced, not out of
        order; Kafka's order), while a retry of a stored batch is still
        answered as a duplicate before :meth:`check`."""
        producers = self._producers
        if not producers:
            return
        for _pos, h in headers:
            state = producers.get(h[9])
            if state is not None and h[10] < state.epoch:
                self._fenced(h[9], h[10], state.epoch, name)

    @staticmethod
    def _fenced(pid: int, epoch: int, known: int, name: str):
        raise InvalidProducerEpochError(
            f"{name}: producer {pid} wrote with epoch {epoch}, but epoch {known} of it was seen: a "
            f"newer producer with its transactional id fenced it. Nothing was stored; close this "
            f"producer", producer_id=pid, epoch=epoch, current_epoch=known)

    def check(self, headers, guard: VerificationGuard | None = None, *, name: str = "") -> None:
        """Check the data batches of one append (``(position, header)``
        each) against the transactions; raises as the module docstring says."""
        producers = self._producers
        tentative: dict[int, tuple[int, bool]] = {}
        for pos, h in headers:
            pid, attributes = h[9], h[5]
            txn = attributes & _TRANSACTIONAL
            if pid < 0:
                if txn:
                    raise InvalidMessageError(
                        f"{name}: the transactional batch at {pos} has no producer id; a transactional "
                        f"producer sends its id and epoch with every batch", offset=pos)
                continue
            state = producers.get(pid)
            if state is None and not txn and pid not in tentative:
                continue
            epoch = h[10]
            known, ongoing = tentative.get(pid) or (
                (state.epoch, state.first_offset >= 0) if state is not None else (-1, False))
            if epoch < known:
                self._fenced(pid, epoch, known, name)
            if txn:
                if not (ongoing and epoch == known) and self.require_verification:  # (Kafka: ongoing at this epoch)
                    kept = self._guards.get(pid)
                    if guard is None or guard is not kept or guard.epoch != epoch:
                        raise InvalidTxnStateError(
                            f"{name}: producer {pid} (epoch {epoch}) wrote a transactional batch, but no "
                            f"ongoing transaction of it was verified with the coordinator for this partition "
                            f"(KIP-890): nothing was stored. Add the partition to the transaction first",
                            producer_id=pid, epoch=epoch)
                tentative[pid] = (max(epoch, known), True)
            elif ongoing:
                raise InvalidTxnStateError(
                    f"{name}: producer {pid} wrote a non-transactional batch while its transaction is open "
                    f"here: nothing was stored. Commit or abort the transaction first",
                    producer_id=pid, epoch=epoch)
            else:
                tentative[pid] = (max(epoch, known), False)

    def check_marker(self, producer_id: int, epoch: int, coordinator_epoch: int, *, name: str = "") -> None:
        """Check a marker about to be written for the coordinator."""
        state = self._producers.get(producer_id)
        if state is None:
            return
        if epoch < state.epoch:
            raise InvalidProducerEpochError(
                f"{name}: a marker of producer {producer_id} with epoch {epoch}, but epoch {state.epoch} of it "
                f"was seen: the marker was not written", producer_id=producer_id, epoch=epoch,
                current_epoch=state.epoch)
        if coordinator_epoch < state.coordinator_epoch:
            raise TransactionCoordinatorFencedError(
                f"{name}: a marker of producer {producer_id} from coordinator epoch {coordinator_epoch}, but "
                f"coordinator epoch {state.coordinator_epoch} wrote one before: the marker was not written "
                f"(a newer coordinator completes the transaction)", producer_id=producer_id,
                coordinator_epoch=coordinator_epoch, current_coordinator_epoch=state.coordinator_epoch)

    def apply(self, offset: int, header, marker: Marker | None, hw: int) -> CompletedTxn | None:
        """Account for the batch ``header`` stored at ``offset`` (a control
        batch with its ``marker``); ``hw``: the log's high watermark (ended
        transactions whose marker lies below it are stable). The transaction
        it ends, if any."""
        pid, attributes = header[9], header[5]
        if pid < 0:
            return None
        producers = self._producers
        state = producers.get(pid)
        if state is None:
            if not attributes & TXN_BITS:
                return None
            state = producers[pid] = _TxnProducer(header[10])
        else:
            producers.move_to_end(pid)
        if header[10] > state.epoch:
            state.epoch = header[10]
        completed = None
        if attributes & _CONTROL:
            if marker is None:
                return None
            self._guards.pop(pid, None)
            state.coordinator_epoch = marker.coordinator_epoch
            if state.first_offset >= 0:
                next_offset = header.next_offset
                others = [p.first_offset for other, p in producers.items() if other != pid and p.first_offset >= 0]
                completed = CompletedTxn(pid, state.first_offset, offset, not marker.commit,
                                         min(others) if others else next_offset)
                self._completed.append((state.first_offset, offset, pid))
                state.first_offset = -1
                if completed.aborted and self.replaying:
                    self.replayed.append(completed.as_aborted())
            self._publish(hw)
        elif attributes & _TRANSACTIONAL and state.first_offset < 0:
            state.first_offset = offset
            self._guards.pop(pid, None)
            self._publish(hw)
        if len(producers) > self._max:
            self._forget_one()
        return completed

    def _forget_one(self) -> None:
        for pid, state in self._producers.items():
            if state.first_offset < 0:
                del self._producers[pid]
                self._guards.pop(pid, None)
                return

    def _publish(self, hw: int) -> None:
        """Replace what readers see (writer side)."""
        self._completed = [c for c in self._completed if c[1] >= hw]
        ongoing = [(p.first_offset, None, pid) for pid, p in self._producers.items() if p.first_offset >= 0]
        self._unstable = tuple(sorted(ongoing + [(f, m, p) for f, m, p in self._completed],
                                      key=lambda row: row[0]))

    def reset(self) -> None:
        """Forget everything (before a rebuild)."""
        self._producers = OrderedDict()
        self._guards = {}
        self._completed = []
        self._unstable = ()
        self.replayed = []

    # -- snapshots --------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        """The snapshot section (module docstring)."""
        parts = [_COUNT.pack(len(self._producers))]
        parts.extend(_PRODUCER.pack(pid, s.epoch, s.coordinator_epoch, s.first_offset)
                     for pid, s in self._producers.items())
        return b"".join(parts)

    def load(self, data, pos: int, hw: int) -> int:
        """Take the state from the snapshot section at ``data[pos:]``; the
        position after it (``struct.error`` when cut)."""
        self.reset()
        (count,) = _COUNT.unpack_from(data, pos)
        pos += _COUNT.size
        for _ in range(count):
            pid, epoch, coordinator_epoch, first = _PRODUCER.unpack_from(data, pos)
            pos += _PRODUCER.size
            self._producers[pid] = _TxnProducer(epoch, coordinator_epoch, first)
        self._publish(hw)
        return pos
