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
partition directory *before* its set is written to the segment. The file is
a run of fixed-size records, big-endian::

     field          type  bytes   meaning
  1. crc            u32   0..4    CRC32C of bytes 4..30 of the record
  2. producer id    i64   4..12   the producer's id (non-negative)
  3. epoch          i16   12..14  the producer's epoch (0; reserved)
  4. sequence       i32   14..18  the set's sequence number
  5. base offset    i64   18..26  log offset of the set's first byte
  6. length         i32   26..30  bytes of the set

The file is created at the first sequenced append. Records are applied in file order. On open (:meth:`ProducerStateTable.open`)
the file is read up to the first record that is cut short or fails its CRC
(a torn tail, dropped), and a record whose set does not lie wholly within
the recovered log (``base offset + length > log end``: the set never reached
the segment, or recovery cut it off) is dropped. The file is then rewritten
from what is remembered (a snapshot: a temporary file renamed over it), and
rewritten the same way whenever it grows past twice that size plus
:data:`COMPACT_SLACK_BYTES`, so it stays bounded by the state it describes
(at most ``max_producer_ids * SEQUENCES_REMEMBERED`` records). The file is
synced with the log's flush (:meth:`sync`), so a machine crash keeps what a
flush made durable.

Thread-safety: not thread-safe; the owning :class:`PartitionLog` calls it
under its writer lock only.
"""

from __future__ import annotations

import logging
import os
import struct
from collections import OrderedDict

from crc32c import crc32c

from raylog.errors import DuplicateSequenceError, OutOfOrderSequenceError

log = logging.getLogger(__name__)

FILE_NAME = "producer-state"
#: sequences (and their base offsets) remembered per producer id
SEQUENCES_REMEMBERED = 32
#: the journal may exceed twice its snapshot size by this much before it is compacted
COMPACT_SLACK_BYTES = 1 << 20

RECORD = struct.Struct(">Iqhiqi")
_BODY = struct.Struct(">qhiqi")
RECORD_SIZE = RECORD.size
assert RECORD_SIZE == 30


class _Producer:
    """What is remembered of one producer id."""

    __slots__ = ("epoch", "first", "last", "bases", "lengths")

    def __init__(self, epoch: int, sequence: int):
        self.epoch = epoch
        #: the first sequence remembered since the id was (re)learnt
        self.first = sequence
        self.last = sequence - 1
        #: base offsets by ``sequence % SEQUENCES_REMEMBERED``
        self.bases = [-1] * SEQUENCES_REMEMBERED
        self.lengths = [0] * SEQUENCES_REMEMBERED

    def remember(self, sequence: int, base: int, length: int) -> None:
        slot = sequence % SEQUENCES_REMEMBERED
        self.bases[slot] = base
        self.lengths[slot] = length
        self.last = sequence

    def remembered(self, sequence: int) -> int | None:
        if max(self.first, self.last - SEQUENCES_REMEMBERED + 1) <= sequence <= self.last:
            return self.bases[sequence % SEQUENCES_REMEMBERED]
        return None


class ProducerStateTable:
    """The remembered sequences of one partition (see the module docstring)."""

    def __init__(self, directory: str, max_producer_ids: int = 10_000):
        self._dir = directory
        self._path = os.path.join(directory, FILE_NAME)
        self._max = max_producer_ids
        self._producers: OrderedDict[int, _Producer] = OrderedDict()
        self._fd: int | None = None
        self._journal_bytes = 0
        self._dirty = False

    # -- open and recover -------------------------------------------------------

    def open(self, log_end_offset: int) -> list[str]:
        """Read the journal against the recovered log (ending at
        ``log_end_offset``) and rewrite it compacted. Returns notes on what
        was dropped (for the recovery log)."""
        notes: list[str] = []
        try:
            with open(self._path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return notes  # no idempotent producer wrote here yet: created on first use
        usable = len(data) - len(data) % RECORD_SIZE
        dropped_beyond = 0
        pos = 0
        while pos < usable:
            crc, = struct.unpack_from(">I", data, pos)
            body = data[pos + 4 : pos + RECORD_SIZE]
            if crc32c(body) != crc:
                break
            producer_id, epoch, sequence, base, length = _BODY.unpack(body)
            pos += RECORD_SIZE
            if base + length > log_end_offset:
                dropped_beyond += 1
                continue
            self._apply(producer_id, epoch, sequence, base, length)
        if pos < len(data):
            notes.append(f"dropped a torn or damaged tail of {len(data) - pos} bytes of {self._path}")
        if dropped_beyond:
            notes.append(
                f"dropped {dropped_beyond} remembered sequence(s) of sets beyond the log end {log_end_offset}"
            )
        self._rewrite()
        return notes

    def _apply(self, producer_id: int, epoch: int, sequence: int, base: int, length: int) -> None:
        producers = self._producers
        state = producers.get(producer_id)
        if state is None or sequence != state.last + 1 or epoch != state.epoch:
            state = _Producer(epoch, sequence)
            producers[producer_id] = state
            if len(producers) > self._max:
                producers.popitem(last=False)
        else:
            producers.move_to_end(producer_id)
        state.remember(sequence, base, length)

    def _records(self) -> bytes:
        parts = []
        for producer_id, state in self._producers.items():
            start = max(state.first, state.last - SEQUENCES_REMEMBERED + 1)
            for sequence in range(start, state.last + 1):
                slot = sequence % SEQUENCES_REMEMBERED
                body = _BODY.pack(producer_id, state.epoch, sequence, state.bases[slot], state.lengths[slot])
                parts.append(struct.pack(">I", crc32c(body)) + body)
        return b"".join(parts)

    def _rewrite(self) -> None:
        """Replace the journal with a snapshot of what is remembered."""
        data = self._records()
        tmp = self._path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fdatasync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self._path)
        if self._fd is not None:
            os.close(self._fd)
        self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self._journal_bytes = len(data)
        self._dirty = False

    # -- the writer's calls (under the log's writer lock) ---------------------------

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

    def check_run(self, producer_id: int, first_sequence: int) -> bool:
        """Whether a run of consecutive sets from ``first_sequence`` on may be
        appended as one (all of them new, in order)."""
        state = self._producers.get(producer_id)
        return state is None or first_sequence == state.last + 1

    def journal(self, producer_id: int, epoch: int, first_sequence: int, base: int, lengths) -> None:
        """Write the records of the sets about to be appended (before the
        segment write; raises ``OSError``)."""
        parts = []
        pack = _BODY.pack
        sequence = first_sequence
        for length in lengths:
            body = pack(producer_id, epoch, sequence, base, length)
            parts.append(struct.pack(">I", crc32c(body)) + body)
            base += length
            sequence += 1
        data = b"".join(parts)
        if self._fd is None:
            self._rewrite()
        written = os.write(self._fd, data)
        if written != len(data):
            raise OSError(f"short write to {self._path}: {written} of {len(data)} bytes")
        self._journal_bytes += written
        self._dirty = True

    def remember(self, producer_id: int, epoch: int, first_sequence: int, base: int, lengths) -> None:
        """Remember the sets just appended (after the segment write)."""
        sequence = first_sequence
        for length in lengths:
            self._apply(producer_id, epoch, sequence, base, length)
            base += length
            sequence += 1
        limit = 2 * len(self._producers) * SEQUENCES_REMEMBERED * RECORD_SIZE + COMPACT_SLACK_BYTES
        if self._journal_bytes > limit:
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
