"""The aborted-transactions index of a segment (docs/design.md §3 and §6): ``<base offset, 20 digits>.txnindex``.

Kafka's ``.txnindex``: one entry per transaction aborted by a marker in
the segment, so that a ``read_committed`` reader learns which producers'
records to drop from a range (:meth:`TxnIndexes.aborted`, Kafka's
``collectAbortedTxns``) without reading the markers first. The file is a
run of 36-byte entries, big-endian::

     field               type  bytes    meaning
  1. producer id         i64   0..8     the producer whose transaction was aborted
  2. first offset        i64   8..16    the offset of its transaction's first batch on this partition
  3. last offset         i64   16..24   the offset of the abort marker (in this segment)
  4. last stable offset  i64   24..32   the log's last stable offset right after the marker
  5. crc                 u32   32..36   CRC32C of bytes 0..32 of the entry

Entries are in marker order (last offsets grow strictly). An entry is
written when the marker is appended (not synced then); the file is synced
when its segment rolls, before the producer snapshot of the roll
(:mod:`raylog.storage.batch_producers`), so every entry before the newest
snapshot is durable. When the log opens, a file's whole entries with a
matching CRC, in order, and with markers inside the log are kept (a torn or
damaged tail, or entries cut off with the log, are dropped and the file
rewritten); the aborts replayed from the newest snapshot on (the rebuild of
the producer state) are added where missing (:meth:`TxnIndexes.restore`),
so a crash at any point leaves the index whole for the log that recovered.

Files belong to offsets, not to segment objects: the file of base ``b``
holds the aborts whose markers lie in ``[b, next file's base)``. A cleaned
segment that merged several (:mod:`raylog.storage.cleaner`, which keeps
markers and transactional batches whole) keeps its old segments' files
beside its own. Retention deletes the files of the offsets it deleted
(after the segments: a crash in between leaves a file below the log start,
deleted at the next open); a truncation cuts entries with it.

Thread-safety: the writer's calls (``append``, ``truncate``,
``delete_below``, ``sync``, ``restore``, ``close``) run under the owning
log's writer lock; :meth:`TxnIndexes.aborted` may run in any thread (it
reads lists and a view the writer appends to or replaces whole).
"""

from __future__ import annotations

import bisect
import logging
import os
import re
import struct

from crc32c import crc32c

from raylog.storage.owner_only import FILE_MODE, private_opener as _private_opener
from raylog.storage.transactions import AbortedTxn

__all__ = ["SUFFIX", "TxnIndex", "TxnIndexes", "index_name"]

log = logging.getLogger(__name__)

SUFFIX = ".txnindex"
_NAME = re.compile(r"^(\d{20})\.txnindex$")
_FIELDS = struct.Struct(">qqqq")
ENTRY = struct.Struct(">qqqqI")
assert ENTRY.size == 36


def index_name(base_offset: int) -> str:
    return f"{base_offset:020d}{SUFFIX}"


def encode_entry(txn: AbortedTxn) -> bytes:
    fields = _FIELDS.pack(*txn)
    return fields + crc32c(fields).to_bytes(4, "big")


class TxnIndex:
    """The aborted transactions of one file (see the module docstring)."""

    __slots__ = ("base_offset", "path", "entries", "_fd", "_dirty", "_broken")

    def __init__(self, directory: str, base_offset: int):
        self.base_offset = base_offset
        self.path = os.path.join(directory, index_name(base_offset))
        #: the entries, by last offset (appended to, or replaced whole)
        self.entries: list[AbortedTxn] = []
        self._fd: int | None = None
        self._dirty = False
        self._broken = False  # a write failed: the file is rewritten whole at the next sync

    @classmethod
    def open(cls, directory: str, base_offset: int, end_offset: int) -> tuple["TxnIndex", int]:
        """The index of ``base_offset``, its entries with markers below
        ``end_offset`` (the log end); ``(index, entries dropped)``."""
        index = cls(directory, base_offset)
        with open(index.path, "rb") as f:
            raw = f.read()
        last = base_offset - 1
        for *fields, crc in ENTRY.iter_unpack(raw[: len(raw) - len(raw) % ENTRY.size]):
            txn = AbortedTxn(*fields)
            if crc != crc32c(_FIELDS.pack(*fields)) or txn.last_offset <= last or txn.last_offset >= end_offset:
                break
            index.entries.append(txn)
            last = txn.last_offset
        dropped = (len(raw) - len(index.entries) * ENTRY.size + ENTRY.size - 1) // ENTRY.size
        if len(index.entries) * ENTRY.size != len(raw):
            index._rewrite()
        return index, dropped

    def append(self, txn: AbortedTxn) -> None:
        """Add an abort (its marker after every other's here, else the file is rewritten in order)."""
        entries = self.entries
        if entries and txn.last_offset <= entries[-1].last_offset:
            if any(e.producer_id == txn.producer_id and e.last_offset == txn.last_offset for e in entries):
                return
            new = entries + [txn]
            new.sort(key=lambda e: e.last_offset)
            self.entries = new
            self._broken = True
            self.sync()
            return
        entries.append(txn)
        if self._broken:
            return
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
            data = encode_entry(txn)
            written = os.write(self._fd, data)
            if written != len(data):
                raise OSError(f"a short write ({written} of {len(data)} bytes)")
            self._dirty = True
        except OSError as err:  # kept in memory; the file is rewritten whole at the next sync (a roll)
            log.warning("cannot write the transaction index %s (%s); it is rewritten at the next roll",
                        self.path, err)
            self._broken = True

    def sync(self) -> None:
        """Make the file durable (raises ``OSError``)."""
        if self._broken:
            self._rewrite(raising=True)
        elif self._dirty and self._fd is not None:
            os.fdatasync(self._fd)
            self._dirty = False

    def truncate(self, end_offset: int) -> None:
        """Drop the entries whose markers lie at or past ``end_offset``."""
        keep = [e for e in self.entries if e.last_offset < end_offset]
        if len(keep) != len(self.entries):
            self.entries = keep
            self._rewrite()

    def delete(self) -> None:
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None

    def _rewrite(self, raising: bool = False) -> None:
        self.close()
        tmp = self.path + ".tmp"
        try:
            with open(tmp, "wb", opener=_private_opener) as f:
                f.write(b"".join(encode_entry(e) for e in self.entries))
                f.flush()
                os.fdatasync(f.fileno())
            os.replace(tmp, self.path)
            self._broken = self._dirty = False
        except OSError as err:
            self._broken = True
            if raising:
                raise
            log.warning("cannot rewrite the transaction index %s: %s", self.path, err)


class TxnIndexes:
    """The transaction indexes of one partition log, by base offset (see the module docstring)."""

    def __init__(self, directory: str):
        self._dir = directory
        #: (bases, indexes), both by base offset; replaced whole by the writer
        self._view: tuple[list[int], list[TxnIndex]] = ([], [])

    @classmethod
    def open(cls, directory: str, log_start: int, end_offset: int) -> tuple["TxnIndexes", list[str]]:
        """The indexes of the log ``[log_start, end_offset)`` in ``directory``;
        files below the start (retention's leftovers) or past the end (cut
        with the log) are deleted. Returns notes for the recovery log."""
        notes: list[str] = []
        indexes = cls(directory)
        found = []
        for name in sorted(os.listdir(directory)):
            match = _NAME.match(name)
            if not match:
                if name.endswith(SUFFIX + ".tmp"):  # a rewrite the process died in: the file itself stands
                    os.unlink(os.path.join(directory, name))
                continue
            base = int(match.group(1))
            index = TxnIndex(directory, base)
            if base < log_start or base >= end_offset:
                index.delete()
                continue
            index, dropped = TxnIndex.open(directory, base, end_offset)
            if dropped:
                notes.append(f"dropped {dropped} torn, damaged or cut entries of {index.path}")
            found.append(index)
        indexes._view = ([i.base_offset for i in found], found)
        return indexes, notes

    def _index_for(self, segment_base: int) -> TxnIndex:
        bases, indexes = self._view
        i = bisect.bisect_left(bases, segment_base)
        if i < len(bases) and bases[i] == segment_base:
            return indexes[i]
        index = TxnIndex(self._dir, segment_base)
        self._view = (bases[:i] + [segment_base] + bases[i:], indexes[:i] + [index] + indexes[i:])
        return index

    def append(self, segment_base: int, txn: AbortedTxn) -> None:
        """Record an abort whose marker is in the segment of ``segment_base``."""
        self._index_for(segment_base).append(txn)

    def restore(self, segment_bases: list[int], replayed: list[AbortedTxn]) -> int:
        """Add the replayed aborts missing from the files (after a crash);
        how many were added."""
        known = {(e.producer_id, e.last_offset) for index in self._view[1] for e in index.entries}
        # the file of the marker's offsets: a cleaned segment's old files included (module docstring),
        # so that the files, taken in base order, keep the markers in order
        bases = sorted(set(segment_bases) | set(self._view[0]))
        added = 0
        for txn in replayed:
            if (txn.producer_id, txn.last_offset) in known:
                continue
            base = bases[bisect.bisect_right(bases, txn.last_offset) - 1]
            self.append(base, txn)
            added += 1
        return added

    def aborted(self, start: int, upper: int) -> list[AbortedTxn]:
        """The aborted transactions that overlap ``[start, upper)``: marker at
        or after ``start``, first offset before ``upper``, in marker order
        (Kafka's collectAbortedTxns: from the file holding ``start`` on,
        until an entry's last stable offset reaches ``upper``: a transaction
        aborted later began after it)."""
        bases, indexes = self._view
        found = []
        for index in indexes[max(0, bisect.bisect_right(bases, start) - 1):]:
            for txn in index.entries:
                if txn.last_offset >= start and txn.first_offset < upper:
                    found.append(txn)
                if txn.last_stable_offset >= upper:
                    return found
        return found

    def sync(self, segment_base: int | None = None) -> None:
        """Sync the file of ``segment_base`` (every file: ``None``); raises ``OSError``."""
        for index in self._view[1]:
            if segment_base is None or index.base_offset == segment_base:
                index.sync()

    def truncate(self, end_offset: int) -> None:
        """The log was cut back to ``end_offset``."""
        bases, indexes = self._view
        keep = [i for i in indexes if i.base_offset < end_offset]
        for index in indexes[len(keep):]:
            index.delete()
        for index in keep:
            index.truncate(end_offset)
        self._view = ([i.base_offset for i in keep], keep)

    def delete_below(self, log_start: int) -> None:
        """Retention moved the log start to ``log_start``: delete the files of the offsets before it."""
        bases, indexes = self._view
        gone = [i for i in indexes if i.base_offset < log_start]
        if not gone:
            return
        self._view = (bases[len(gone):], indexes[len(gone):])
        for index in gone:
            index.delete()

    def clear(self) -> None:
        """Delete every file (the log starts over)."""
        for index in self._view[1]:
            index.delete()
        self._view = ([], [])

    def close(self) -> None:
        for index in self._view[1]:
            index.close()
