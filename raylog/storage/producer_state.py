"""Idempotent producers: the sequences a partition remembers, kept with its log.

A producer with idempotence on numbers the message sets it sends to one
topic-partition 0, 1, 2, ... under a random producer id (PRODUCE version 1,
:mod:`raylog.transfer.protocol`). The partition log remembers, for each
producer id, the last :data:`SEQUENCES_REMEMBERED` sequences with the base
offsets they were stored at, and judges every sequenced set before it is
appended (:meth:`ProducerStateTable.check`):

* a producer id it does not know (any sequence), or ``sequence == last + 1``:
  append, and remember;
* ``sequence <= last`` and still remembered: a duplicate (a retry of a set
  that was stored): append nothing, answer the first base offset;
* ``sequence <= last`` and no longer remembered: :class:`DuplicateSequenceError`;
* ``sequence > last + 1``: :class:`OutOfOrderSequenceError`.

At most ``max_producer_ids`` producer ids are remembered per partition; the
one that appended least recently is forgotten first.

The journal file
----------------

So that a partition actor restarted after its process died (SIGKILL, with
appends still in the page cache) still recognises a duplicate, every
remembered sequence is written to the file ``producer-state`` in the
partition directory *before* its sets are written to the segment: one record
per append (a run of consecutive sets of one producer, joined), big-endian::

     field          type       bytes        meaning
  1. crc            u32        0..4         CRC32C of bytes 4..28+4n of the record
  2. count          u16        4..6         n, the sets of the record (0: see below)
  3. producer id    i64        6..14        the producer's id (non-negative)
  4. epoch          i16        14..16       the producer's epoch (0; reserved)
  5. first sequence i32        16..20       the first set's sequence number
  6. base offset    i64        20..28       log offset of the first set's first byte
  7. lengths        n x i32    28..28+4n    bytes of each set: set k has sequence
                                            first + k and starts at base offset +
                                            lengths[0] + ... + lengths[k-1]

A record with no sets (count 0, base offset -1) says that the producer was
learnt at ``first sequence`` (its last sequence is at least ``first
sequence - 1``) and that none of its sets before those of its next record is
remembered: what a truncation leaves of a producer all of whose remembered
sets it cut off while earlier ones stay in the log (such a producer's older
retries are refused, never stored again), or, before a producer's sets, the
sequence it was learnt at when that is older than its first remembered set
(a producer with more than :data:`SEQUENCES_REMEMBERED` sets), so that a
snapshot and a follower learn it exactly as this table holds it.

The file is created at the first sequenced append. Records are applied in file order. On open (:meth:`ProducerStateTable.open`)
the file is read up to the first record that is cut short or fails its CRC
(a torn tail, dropped), and a set that does not lie wholly within the
recovered log (its end past the log end: it never reached the segment, or
recovery cut it off) is dropped with the sets after it in its record. A set
that lies partly within it (recovery kept its whole messages before a torn
one) is named by :attr:`ProducerStateTable.partial_set_base`: the log cuts
itself back to that set's start, for the producer resends the set whole and
its first messages must not be stored twice. The file is then rewritten
from what is remembered (a snapshot: a temporary file renamed over it), and
rewritten the same way whenever it grows past twice that size plus
:data:`COMPACT_SLACK_BYTES`, so it stays bounded by the state it describes
(a snapshot holds one single-set record of 32 bytes per remembered sequence
and at most one record of 28 bytes without sets per producer id: at most
``max_producer_ids * (SEQUENCES_REMEMBERED * 32 + 28)`` bytes). The file is
synced with the log's flush (:meth:`sync`), so a machine crash keeps what a
flush made durable.

Replication
-----------

A follower keeps its leader's table: it appends the leader's remembered sets
(:meth:`ProducerStateTable.records_from`, journal records read back by
:func:`parse_records`) with the bytes they describe, so that once it leads
it judges a retry as the old leader would. A set larger than one fetch
arrives in parts: its record is journaled with the first part and held as
:attr:`ProducerStateTable.pending` (:meth:`ProducerStateTable.hold`) until
the part that completes it is remembered; a follower that leads or reopens
meanwhile cuts the part back, so the producer's retry stores the set once
(a record journaled twice, held then remembered, is applied once on open).
:meth:`ProducerStateTable.truncate`
forgets the sets a truncation cut off. Producer ids are kept in the order of
their last set, so ``records_from`` stops at the first id with none after the offset.

Thread-safety: not thread-safe; the owning :class:`PartitionLog` calls it
under its writer lock only.
"""

from __future__ import annotations

import logging
import os
import struct
from collections import OrderedDict

from crc32c import crc32c

from raylog.errors import CorruptMessageError, DuplicateSequenceError, OutOfOrderSequenceError
from raylog.storage.fileops import is_disk_full
from raylog.storage.owner_only import FILE_MODE

log = logging.getLogger(__name__)

FILE_NAME = "producer-state"
#: sequences (and their base offsets) remembered per producer id
SEQUENCES_REMEMBERED = 32
#: the journal may exceed twice its snapshot size by this much before it is compacted
COMPACT_SLACK_BYTES = 1 << 20

#: the fixed part of a record: crc, count, producer id, epoch, first sequence, base offset
HEADER = struct.Struct(">IHqhiq")
_FIXED = struct.Struct(">Hqhiq")  # the same without the crc
HEADER_SIZE = HEADER.size
assert HEADER_SIZE == 28
#: a snapshot's record of one set
RECORD_SIZE = HEADER_SIZE + 4
_CRC = struct.Struct(">I")
_lengths_structs: dict[int, struct.Struct] = {}


def _lengths(n: int) -> struct.Struct:
    st = _lengths_structs.get(n)
    if st is None:
        st = _lengths_structs[n] = struct.Struct(f">{n}i")
    return st


def _record(producer_id: int, epoch: int, first_sequence: int, base: int, lengths) -> bytes:
    body = _FIXED.pack(len(lengths), producer_id, epoch, first_sequence, base) + _lengths(len(lengths)).pack(*lengths)
    return _CRC.pack(crc32c(body)) + body


def parse_records(data) -> list[tuple[int, int, int, int, tuple[int, ...]]]:
    """The records of ``data`` (journal format) as ``(producer id, epoch,
    first sequence, base offset, lengths)``; :class:`CorruptMessageError`
    for a record cut short or failing its CRC."""
    records, pos, size = [], 0, len(data)
    while pos < size:
        if pos + HEADER_SIZE > size:
            raise CorruptMessageError(f"a producer-state record cut short at byte {pos}", offset=pos)
        crc, count, producer_id, epoch, sequence, base = HEADER.unpack_from(data, pos)
        end = pos + HEADER_SIZE + 4 * count
        if end > size or crc32c(memoryview(data)[pos + 4 : end]) != crc:
            raise CorruptMessageError(f"a damaged producer-state record at byte {pos}", offset=pos)
        records.append((producer_id, epoch, sequence, base, _lengths(count).unpack_from(data, pos + HEADER_SIZE)))
        pos = end
    return records


class _Producer:
    """What is remembered of one producer id."""

    __slots__ = ("epoch", "learnt", "first", "last", "bases", "lengths", "gap_ok")

    def __init__(self, epoch: int, sequence: int):
        self.epoch = epoch
        #: the sequence the id was (re)learnt at (a truncation that cuts it off forgets the id)
        self.learnt = sequence
        #: the first sequence whose set is remembered since then (later than
        #: ``learnt`` when the sets in between were never known here: a
        #: leader's that it no longer remembered when it handed the rest over)
        self.first = sequence
        #: a "learnt at" record was just applied: the next set may follow a gap
        self.gap_ok = False
        self.last = sequence - 1
        #: base offsets by ``sequence % SEQUENCES_REMEMBERED``
        self.bases = [-1] * SEQUENCES_REMEMBERED
        self.lengths = [0] * SEQUENCES_REMEMBERED

    def remember(self, sequence: int, base: int, length: int) -> None:
        slot = sequence % SEQUENCES_REMEMBERED
        self.bases[slot] = base
        self.lengths[slot] = length
        self.last = sequence

    def window(self) -> range:
        """The sequences remembered."""
        return range(max(self.first, self.last - SEQUENCES_REMEMBERED + 1), self.last + 1)

    def skip_to(self, sequence: int) -> None:
        """Continue at ``sequence`` after a gap of sets never known here."""
        self.last = sequence - 1
        self.first = sequence
        self.gap_ok = False

    def remembered(self, sequence: int) -> int | None:
        if sequence in self.window():
            return self.bases[sequence % SEQUENCES_REMEMBERED]
        return None


class ProducerStateTable:
    """The remembered sequences of one partition (see the module docstring)."""

    def __init__(self, directory: str | None, max_producer_ids: int = 10_000):
        """``directory=None``: remembered in memory only, with no journal (the
        in-memory log's table)."""
        self._dir = directory
        self._path = os.path.join(directory, FILE_NAME) if directory is not None else None
        self._max = max_producer_ids
        self._producers: OrderedDict[int, _Producer] = OrderedDict()
        self._fd: int | None = None
        self._journal_bytes = 0
        self._dirty = False
        #: after :meth:`open`: the base offset of a sequenced set only partly
        #: in the recovered log (its whole messages before a torn one), which
        #: the log must be cut back to; ``None`` when there is none
        self.partial_set_base: int | None = None
        #: a follower's: the leader's set ``(producer id, epoch, sequence,
        #: base, length)`` of which the log holds only the first part (a set
        #: larger than one fetch), journaled with that part (:meth:`hold`)
        #: and remembered once the part that completes it arrives
        self.pending: tuple[int, int, int, int, int] | None = None

    # -- open and recover -------------------------------------------------------

    def open(self, log_end_offset: int) -> list[str]:
        """Read the journal against the recovered log (ending at
        ``log_end_offset``) and rewrite it compacted. Returns notes on what
        was dropped (for the recovery log)."""
        notes: list[str] = []
        if self._path is None:
            return notes
        try:
            with open(self._path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return notes  # no idempotent producer wrote here yet: created on first use
        dropped_beyond = 0
        self.partial_set_base = None
        pos = 0
        size = len(data)
        while pos + HEADER_SIZE <= size:
            crc, count, producer_id, epoch, sequence, base = HEADER.unpack_from(data, pos)
            end = pos + HEADER_SIZE + 4 * count
            if end > size or crc32c(memoryview(data)[pos + 4 : end]) != crc:
                break
            lengths = _lengths(count).unpack_from(data, pos + HEADER_SIZE)
            pos = end
            if not count:  # learnt at ``sequence``, nothing remembered (yet)
                self._mark(producer_id, epoch, sequence)
                continue
            for k, length in enumerate(lengths):
                if base + length > log_end_offset:
                    dropped_beyond += count - k
                    if base < log_end_offset:  # its first messages reached the segment, the rest did not
                        self.partial_set_base = base if self.partial_set_base is None else min(
                            self.partial_set_base, base)
                    break
                self._apply(producer_id, epoch, sequence, base, length)
                base += length
                sequence += 1
        if pos < len(data):
            notes.append(f"dropped a torn or damaged tail of {len(data) - pos} bytes of {self._path}")
        if dropped_beyond:
            notes.append(
                f"dropped {dropped_beyond} remembered sequence(s) of sets beyond the log end {log_end_offset}"
            )
        try:
            self._rewrite()
        except OSError as err:
            if not is_disk_full(err):
                raise
            # Opened all the same (reads go on); the journal is rewritten
            # before its next record (journal() finds no open file), and
            # until then it is only read, never appended to.
            notes.append(f"the journal {self._path} is not compacted yet: the disk is full ({err.strerror})")
        return notes

    def _apply(self, producer_id: int, epoch: int, sequence: int, base: int, length: int) -> None:
        producers = self._producers
        state = producers.get(producer_id)
        if state is not None and epoch == state.epoch and state.remembered(sequence) == base:
            return  # journaled again: a follower's set held in parts, then completed
        if state is not None and state.gap_ok and epoch == state.epoch and sequence > state.last:
            state.skip_to(sequence)  # after a "learnt at" record: the sets between were not handed over
            producers.move_to_end(producer_id)
        elif state is None or sequence != state.last + 1 or epoch != state.epoch:
            state = self._learn(producer_id, epoch, sequence)
        else:
            producers.move_to_end(producer_id)
        state.gap_ok = False
        state.remember(sequence, base, length)

    def _mark(self, producer_id: int, epoch: int, sequence: int) -> None:
        """A record without sets: the id was learnt at ``sequence`` (its last
        is at least ``sequence - 1``), and none of its sets before the next
        record's is remembered (a truncation's, or a leader's whose older
        sets it no longer remembers: snapshots and replication)."""
        state = self._producers.get(producer_id)
        if state is not None and state.epoch == epoch and state.last >= sequence - 1:
            state.learnt = min(state.learnt, sequence)
        else:
            state = self._learn(producer_id, epoch, sequence)
        state.gap_ok = True

    def _learn(self, producer_id: int, epoch: int, sequence: int) -> _Producer:
        """(Re)learn a producer id whose next sequence is ``sequence``."""
        producers = self._producers
        state = producers[producer_id] = _Producer(epoch, sequence)
        producers.move_to_end(producer_id)
        if len(producers) > self._max:
            producers.popitem(last=False)
        return state

    def _records(self) -> bytes:
        parts = []
        for producer_id, state in self._producers.items():
            window = state.window()
            if not window:  # a truncation left it known, nothing remembered
                parts.append(_record(producer_id, state.epoch, state.last + 1, -1, ()))
            elif state.learnt < window[0]:  # learnt before its first remembered set
                parts.append(_record(producer_id, state.epoch, state.learnt, -1, ()))
            for sequence in window:
                slot = sequence % SEQUENCES_REMEMBERED
                parts.append(_record(producer_id, state.epoch, sequence, state.bases[slot], (state.lengths[slot],)))
        if self.pending is not None:  # so that a reopen still cuts the part back
            producer_id, epoch, sequence, base, length = self.pending
            parts.append(_record(producer_id, epoch, sequence, base, (length,)))
        return b"".join(parts)

    def _rewrite(self) -> None:
        """Replace the journal with a snapshot of what is remembered."""
        if self._path is None:
            return
        data = self._records()
        tmp = self._path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fdatasync(fd)
        except OSError:
            try:  # (a full disk) the journal stays as it was; no half snapshot left behind
                os.unlink(tmp)
            except OSError:
                pass
            raise
        finally:
            os.close(fd)
        os.replace(tmp, self._path)
        if self._fd is not None:
            os.close(self._fd)
        self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self._journal_bytes = len(data)
        self._dirty = False

    # -- the writer's calls (under the log's writer lock) ---------------------------

    def describe(self) -> list[tuple[int, int, int]]:
        """``(producer id, epoch, last sequence)`` of every producer
        remembered (format 1's sets), least recently appending first."""
        return [(pid, state.epoch, state.last) for pid, state in self._producers.items()]

    def check(self, producer_id: int, epoch: int, sequence: int, *, topic_partition: str = "") -> int | None:
        """Judge a sequenced set: ``None`` to append it, else the base offset
        of its first store (a duplicate: append nothing). Raises
        :class:`OutOfOrderSequenceError` or :class:`DuplicateSequenceError`."""
        state = self._producers.get(producer_id)
        if state is None or sequence == state.last + 1:
            return None
        if sequence > state.last:
            raise OutOfOrderSequenceError(
                f"{topic_partition}: producer {producer_id} sent sequence {sequence} but the next "
                f"expected is {state.last + 1}; a set in between is missing, this one was not stored",
                producer_id=producer_id,
                sequence=sequence,
                expected=state.last + 1,
            )
        base = state.remembered(sequence)
        if base is None:
            raise DuplicateSequenceError(
                f"{topic_partition}: producer {producer_id} sent sequence {sequence} again, which was "
                f"stored before (the last stored is {state.last}) but is no longer remembered; "
                f"not stored again, its offset is unknown",
                producer_id=producer_id,
                sequence=sequence,
                last=state.last,
            )
        return base

    def judge(self, producer_id: int, epoch: int, first_sequence: int, sets: int, *, topic_partition: str = "") -> int | None:
        """Judge the ``sets`` sets of one append: ``None`` to append them,
        else (one set, a duplicate) the base offset of its first store. One
        set goes by :meth:`check`; several are appended together only when
        all are new and in order, else :class:`OutOfOrderSequenceError` (the
        caller offers them one by one)."""
        if sets == 1:
            return self.check(producer_id, epoch, first_sequence, topic_partition=topic_partition)
        if not self.check_run(producer_id, first_sequence):
            raise OutOfOrderSequenceError(
                f"{topic_partition}: the run of sets from sequence {first_sequence} is not all new and in order",
                producer_id=producer_id,
                sequence=first_sequence,
            )
        return None

    def check_run(self, producer_id: int, first_sequence: int) -> bool:
        """Whether a run of consecutive sets from ``first_sequence`` on may be
        appended as one (all of them new, in order)."""
        state = self._producers.get(producer_id)
        return state is None or first_sequence == state.last + 1

    def journal(self, producer_id: int, epoch: int, first_sequence: int, base: int, lengths) -> None:
        """Write the records of the sets about to be appended (before the
        segment write; raises ``OSError``)."""
        if self._path is None:
            return
        data = _record(producer_id, epoch, first_sequence, base, lengths)
        if self._fd is None:
            self._rewrite()
        written = 0
        try:
            while written < len(data):  # a short write, then the reason (a full disk) raised
                written += os.write(self._fd, data[written:])
        except OSError:
            if written:  # cut the torn record off: records after it must stay aligned
                try:
                    os.ftruncate(self._fd, os.fstat(self._fd).st_size - written)
                except OSError:
                    pass
            raise
        self._journal_bytes += written
        self._dirty = True

    def hold(self, producer_id: int, epoch: int, sequence: int, base: int, length: int) -> None:
        """A follower: journal the leader's set that the append about to be
        made holds only the first part of (before the segment write), and
        keep it as :attr:`pending`. It is remembered when the append that
        completes it passes it to :meth:`remember`; until then a retry of it
        is judged as a set not stored (the log is cut back to its base before
        this replica leads, :attr:`pending`), and a reopen finds it partly
        in the log and cuts it back the same way (:attr:`partial_set_base`)."""
        if self.pending != (producer_id, epoch, sequence, base, length):
            self.journal(producer_id, epoch, sequence, base, (length,))
            self.pending = (producer_id, epoch, sequence, base, length)

    def remember(self, producer_id: int, epoch: int, first_sequence: int, base: int, lengths) -> None:
        """Remember the sets just appended (after the segment write)."""
        if self.pending is not None and self.pending[0] == producer_id and self.pending[3] == base:
            self.pending = None
        if not lengths:  # a leader's "learnt at" record (replication)
            self._mark(producer_id, epoch, first_sequence)
            return
        state = self._producers.get(producer_id)
        if state is not None and epoch == state.epoch and len(lengths) == 1 and state.remembered(first_sequence) == base:
            return  # already remembered
        if state is None or first_sequence != state.last + 1 or epoch != state.epoch:
            sequence = first_sequence
            for length in lengths:
                self._apply(producer_id, epoch, sequence, base, length)
                base += length
                sequence += 1
        else:  # the common case: the next sets of a known producer
            state.gap_ok = False
            self._producers.move_to_end(producer_id)
            bases, lens = state.bases, state.lengths
            sequence = first_sequence
            for length in lengths:
                slot = sequence % SEQUENCES_REMEMBERED
                bases[slot] = base
                lens[slot] = length
                base += length
                sequence += 1
            state.last = sequence - 1
        limit = 2 * len(self._producers) * SEQUENCES_REMEMBERED * RECORD_SIZE + COMPACT_SLACK_BYTES
        if self._journal_bytes > limit:
            self._rewrite()

    # -- replication ------------------------------------------------------------------

    def records_from(self, offset: int, max_bytes: int, learnt: bool = True) -> bytes:
        """The remembered sets that end after ``offset`` (those that start at
        or after it, and one that ``offset`` falls inside: a follower that
        fetched part of a set learns it with the bytes that complete it), as
        single-set records in base-offset order, as many as fit in ``max_bytes``;
        with ``learnt``, a producer's first remembered set comes after a record
        without sets naming the sequence it was learnt at, when that is older."""
        found = []
        for producer_id in reversed(self._producers):
            state = self._producers[producer_id]
            window = state.window()
            if not window:
                break  # emptied by a truncation: ordered before every id with a set
            slot = window[-1] % SEQUENCES_REMEMBERED
            if state.bases[slot] + state.lengths[slot] <= offset:
                break  # ids are in the order of their last set: the rest lie before offset
            for sequence in reversed(window):
                slot = sequence % SEQUENCES_REMEMBERED
                if state.bases[slot] + state.lengths[slot] <= offset:
                    break
                found.append((state.bases[slot], 1, producer_id, state.epoch, sequence, state.lengths[slot]))
            else:
                if learnt and state.learnt < window[0]:  # the follower learns the id where this table did
                    found.append((state.bases[window[0] % SEQUENCES_REMEMBERED], 0, producer_id, state.epoch,
                                  state.learnt, None))
        found.sort()
        del found[max(0, max_bytes) // RECORD_SIZE :]
        return b"".join(_record(pid, epoch, seq, -1 if length is None else base, () if length is None else (length,))
                        for base, _, pid, epoch, seq, length in found)

    def truncate(self, log_end_offset: int) -> None:
        """Forget the sets that do not lie wholly below ``log_end_offset``
        (the log was cut back there) and rewrite the journal. A producer id
        keeps its last sequence below the cut, so that an older retry is
        still refused; an id learnt at a set that was cut is forgotten."""
        if self.pending is not None and self.pending[3] >= log_end_offset:
            self.pending = None
        kept = []
        for producer_id, state in self._producers.items():
            window = state.window()
            cut = next((seq for seq in window if state.bases[seq % SEQUENCES_REMEMBERED]
                        + state.lengths[seq % SEQUENCES_REMEMBERED] > log_end_offset), None)
            if cut is not None:
                if cut == state.learnt:
                    continue
                state.first, state.last = window[0], cut - 1
            window = state.window()
            last_base = state.bases[window[-1] % SEQUENCES_REMEMBERED] if window else -1
            kept.append((last_base, producer_id, state))
        kept.sort(key=lambda row: row[0])  # keep the order of the last sets (records_from)
        self._producers = OrderedDict((producer_id, state) for _, producer_id, state in kept)
        self._rewrite()

    def sync(self) -> None:
        """Make the journal durable (with the log's flush)."""
        if self._dirty and self._fd is not None:
            self._dirty = False
            os.fdatasync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    # -- inspection -----------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._producers)

    def last_sequence(self, producer_id: int) -> int | None:
        state = self._producers.get(producer_id)
        return None if state is None else state.last
