"""The log cleaner of a compacted topic (docs/design.md §3 and §6): rewrite
closed segments keeping, per key, the latest record.

One pass (:func:`clean`, Kafka's ``Cleaner.clean``), over the closed
segments below the high watermark whose records are all older than
``min_compaction_lag_ms``:

1. The **clean section** is the run of segments from the log start that
   carry an offset index (cleaned before); the **dirty section** the
   cleanable segments after it. The pass runs when the dirty bytes are at
   least ``min_cleanable_dirty_ratio`` of both, or when the oldest dirty
   segment is older than ``max_compaction_lag_ms``.
2. The **offset map** (:mod:`raylog.storage.offsetmap`, bounded memory) takes
   ``key -> latest offset`` over the dirty section in offset order. When it
   is full it stops: the pass cleans up to the end of the segment where it
   stopped, and the records after the map's last offset are kept as they are
   (their keys wait for the next pass) -- Kafka's fall-back.
3. Every segment up to there is **rewritten**, in groups of consecutive
   segments of at most ``segment_bytes`` together (small cleaned segments
   merge): a record is kept unless the map holds a later offset of its key; a
   kept tombstone (null value) is dropped once its batch is older than
   ``delete_retention_ms``. Control batches (transaction markers) are kept
   whole. On a log that holds transactions (:class:`Transactions`, the
   log's aborted transactions of the section; a pass then cleans only below
   the last stable offset) the records of committed transactions are
   cleaned as any, those of aborted transactions never enter the map (an
   aborted record never hides a committed one) and are removed; without it
   the batches of transactions are kept whole. The last
   batch of each producer id in the range is cleaned like any other, but
   what it loses from its last kept record on is kept as an **empty batch**
   (no record; :mod:`raylog.storage.record_batch`, "Empty batches") carrying
   the producer's id, epoch and last sequence, so that the producer state
   rebuilt from the log keeps its sequence (Kafka's cleaner keeps such a
   batch too); an empty batch is kept while it is its producer's last and
   dropped once the producer wrote again. A batch whose records are
   all kept is copied byte for byte (its ``baseOffset`` and
   ``lastOffsetDelta`` unchanged); a batch that loses some records is
   written again as one batch per run of consecutive kept records, each with
   ``baseOffset`` = its first record's offset, offsetDeltas ``0 ..
   n - 1`` and ``lastOffsetDelta = n - 1`` (a Kafka client's), uncompressed,
   with the batch's producer id and epoch, the sequence of its first record
   and the batch's leader epoch: every kept record keeps its offset, and every
   reader of format 2 reads such batches as they are (Kafka instead keeps one
   batch with gaps in its offsetDeltas, which raylog's readers refuse).
   Format 1 segments are not cleaned (a compacted topic appends format 2).
4. The **swap** (:func:`swap`, as Kafka's): the new segment and its offset
   index are written as ``<base>.log.cleaned`` and ``<base>.index.cleaned``
   and synced; the index is renamed to ``<base>.index.swap``, then the
   segment to ``<base>.log.swap`` (the commit point; the directory synced);
   the old segments of the group are deleted (their ``.log``, ``.timeindex``
   and ``.index``), then ``.index.swap`` and ``.log.swap`` are renamed to
   their final names. :func:`finish_swaps`, run when the log opens, finishes
   a swap that passed the commit point and undoes one that did not: a
   crash at any point leaves the old segments or the new one, never both,
   never neither. The fault injection points (:mod:`raylog.storage.faults`)
   are ``clean-written``, ``clean-index-swap``, ``clean-swapped``,
   ``clean-deleted`` and ``clean-index``.

The per-record work (checking each batch, reading its keys, the map, the
keep/drop decision) runs in C without the interpreter when
``raylog.storage._compaction`` is built (``_compaction.c``; the map is then
its ``SlotMap``, see :func:`raylog.storage.offsetmap.new_map`): a segment is
read a block at a time into one buffer, the walk fills the map (and notes
the producers' batches on the same reads), then decides per batch to keep
it whole (consecutive kept batches are written in one piece from the block
read), drop it, or write its kept records again as :func:`_run_batch`
does. It leaves to the Python code here, one batch at a time, what it does
not handle: compressed batches (the codecs are Python's) and faulty ones
(the reference raises the error). The Python code is the reference: without
the module it does all the work, with the same result byte for byte
(tests/storage/test_cleaner_compiled.py).

I/O is bounded by a :class:`Throttler` (bytes read and written a second, as
Kafka's ``log.cleaner.io.max.bytes.per.second``) and memory by the map's
buffer and one batch at a time.

Thread-safety: the functions keep no state; :func:`clean` reads only closed
segments (never written again) and the log swaps them under its writer lock
(:meth:`raylog.storage.log.PartitionLog.clean`). A :class:`Throttler`
belongs to one thread.
"""

from __future__ import annotations

import logging
import os
import struct
import time
from array import array
from operator import le
from typing import Callable, NamedTuple

from crc32c import crc32c

from raylog.config import TopicConfig
from raylog.storage import faults as _faults
from raylog.storage.fileops import sync_directory
from raylog.storage.offsetindex import MAX_SEGMENT_BYTES, OffsetIndex, index_name
from raylog.storage.offsetmap import DEFAULT_BUFFER_BYTES, OffsetMap, new_map
from raylog.storage.record_batch import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAX_BATCH_LENGTH,
    BatchHeader,
    decode_batch,
    encode_batch,
    read_header,
)
from raylog.storage.segment import LogSegment, segment_name
from raylog.storage.timeindex import SUFFIX as TIMEINDEX_SUFFIX

log = logging.getLogger(__name__)

if os.environ.get("RAYLOG_PURE_PYTHON", "") in ("", "0"):
    try:
        from raylog.storage import _compaction
    except ImportError:  # not built: the reference below does all the work
        _compaction = None
else:
    _compaction = None

CLEANED = ".cleaned"
SWAP = ".swap"
#: bytes read from a segment at a time
READ_BYTES = 1 << 20
#: the default bound on the cleaner's I/O (bytes read plus written a second)
DEFAULT_IO_BYTES_PER_S = 256 << 20

_CRC = struct.Struct(">I")
_FIXED = struct.Struct(">qi")  # baseOffset, batchLength
_EPOCH_AT = 12
_LOD_AT = 23
_ATTRIBUTES_AT = 21
_CRC_AT = 17
_CODEC_MASK = 0x07


class Throttler:
    """Sleeps so that the bytes counted stay under ``bytes_per_s`` on average
    (checked every few hundred KiB); ``sleep`` is replaceable in tests."""

    def __init__(self, bytes_per_s: float = DEFAULT_IO_BYTES_PER_S, *, clock=time.monotonic, sleep=time.sleep):
        if bytes_per_s <= 0:
            raise ValueError(f"the cleaner's I/O bound must be positive, got {bytes_per_s}")
        self._rate = float(bytes_per_s)
        self._clock, self._sleep = clock, sleep
        self._start = clock()
        self._count = 0
        #: seconds slept so far
        self.slept = 0.0

    def count(self, nbytes: int) -> None:
        self._count += nbytes
        if self._count < 256 << 10:
            return
        elapsed = self._clock() - self._start
        wait = self._count / self._rate - elapsed
        if wait > 0:
            self._sleep(wait)
            self.slept += wait
        self._start, self._count = self._clock(), 0


class Plan(NamedTuple):
    """What a pass would clean: ``clean`` and ``dirty`` segments, the dirty ratio."""

    clean: list
    dirty: list
    ratio: float
    forced: bool


class Result(NamedTuple):
    """What a pass did."""

    #: bytes of dirty log the map covered
    dirty_bytes: int
    #: bytes of segments read and rewritten (clean and dirty)
    bytes_read: int
    bytes_written: int
    records_removed: int
    #: the offset the clean section now ends at
    cleaned_to: int


def _last_record_ms(segment: LogSegment) -> int:
    """When the segment's last record was written (its file's modification time)."""
    return segment.mtime_ms()


def plan(segments: list[LogSegment], hw: int, config: TopicConfig, now_ms: int) -> Plan | None:
    """The sections of a pass over ``segments`` (the log's, the active one
    last), or None when none is due (module docstring, step 1)."""
    closed = []
    for segment in segments[:-1]:  # format 1 or unflushed segments end the range
        if segment.end_offset > hw or not (segment.format == 2 or segment.cleaned):
            break
        closed.append(segment)
    cleanable = [s for s in closed if _last_record_ms(s) <= now_ms - config.min_compaction_lag_ms]
    clean = []
    for segment in cleanable:
        if segment.offsets is None or segment.offsets.dirty_from < segment.end_offset:
            break
        clean.append(segment)
    dirty = cleanable[len(clean):]
    if not dirty:
        return None
    clean_bytes = sum(s.size for s in clean)
    dirty_bytes = sum(s.size for s in dirty)
    ratio = dirty_bytes / max(1, clean_bytes + dirty_bytes)
    forced = _last_record_ms(dirty[0]) <= now_ms - config.max_compaction_lag_ms
    if ratio < config.min_cleanable_dirty_ratio and not forced:
        return None
    return Plan(clean, dirty, ratio, forced)


def batches(segment: LogSegment, throttler: Throttler | None = None):
    """``(position, header, bytes)`` of each batch of ``segment`` in order,
    read in blocks of :data:`READ_BYTES`."""
    size = segment.size
    pos = 0
    block, block_at = b"", 0
    while pos < size:
        rel = pos - block_at
        if rel + HEADER_SIZE > len(block):
            block, block_at, rel = segment.read_at(pos, min(READ_BYTES, size - pos)), pos, 0
            if throttler is not None:
                throttler.count(len(block))
        header = read_header(block, rel)
        end = rel + header.size
        if end > len(block):
            block, block_at, rel = segment.read_at(pos, max(header.size, min(READ_BYTES, size - pos))), pos, 0
            if throttler is not None:
                throttler.count(len(block))
            end = header.size
            if len(block) < end:
                raise OSError(f"the segment {segment.path} is cut inside the batch at position {pos}")
        yield pos, header, memoryview(block)[rel:end]
        pos += header.size
        _let_others_run()


#: the longest the pass keeps the interpreter before it lets other threads run
YIELD_EVERY_S = 0.0005
_last_yield = [0.0]


def _let_others_run() -> None:
    """Give the interpreter to the partition's other threads (appends,
    reads) at a batch boundary once the pass has had it for
    :data:`YIELD_EVERY_S`: the pass runs beside them in one process, and
    they would otherwise wait up to the interpreter's switch interval (5 ms)."""
    now = time.perf_counter()
    if now - _last_yield[0] >= YIELD_EVERY_S:
        time.sleep(0)
        _last_yield[0] = time.perf_counter()


def _plain(header: BatchHeader, txns: "Transactions | None" = None) -> bool:
    """A batch whose records take part in compaction: not a marker, and not
    of a transaction unless the pass knows the transactions (``txns``)."""
    return not header.control and (not header.transactional or txns is not None)


class Transactions:
    """Which transactional batches of a pass were aborted, from the log's
    aborted transactions over the section (``(producer id, first offset,
    marker offset)`` each, :class:`~raylog.storage.transactions.AbortedTxn`):
    a transactional batch of producer P at offset o is aborted when one of P's
    spans holds o (Kafka's rule); the others below the last stable offset
    committed. Immutable after it is made."""

    def __init__(self, aborted):
        self._spans: dict[int, list[tuple[int, int]]] = {}
        for txn in aborted:
            self._spans.setdefault(txn[0], []).append((txn[1], txn[2]))

    def aborted(self, header: BatchHeader) -> bool:
        spans = self._spans.get(header.producer_id)
        return bool(spans) and header.transactional and any(
            first <= header.base_offset < last for first, last in spans)


def dirty_start(segment: LogSegment) -> int:
    """The first offset of ``segment`` the cleaner has not deduplicated."""
    return segment.base_offset if segment.offsets is None else segment.offsets.dirty_from


def build_map(dirty: list[LogSegment], offset_map, max_message_bytes: int, max_inflated: int,
              throttler: Throttler | None = None, producers: dict | None = None,
              txns: Transactions | None = None) -> int:
    """Fill ``offset_map`` over the ``dirty`` segments from their first
    offset not deduplicated (step 2); the offset where it stopped: the end
    of the last segment when all fit, else the first record it could not take.
    ``producers`` (the compiled path only): filled with each dirty segment's
    ``(producer id, batch offset)`` pairs that :func:`last_producer_batches`
    reads, gathered on the same reads (the segment where the map stopped included)."""
    fast = _compiled(offset_map)
    for segment in dirty:
        start = dirty_start(segment)
        if fast:
            pairs: list = []
            stopped = _map_segment(segment, start, offset_map, max_message_bytes, max_inflated, throttler, pairs)
            if producers is not None:
                producers[segment.base_offset] = pairs
            if stopped is not None:
                return stopped
            continue
        for _pos, header, data in batches(segment, throttler):
            stopped = _map_batch(offset_map, header, data, start, max_message_bytes, max_inflated, txns)
            if stopped is not None:
                return stopped
    return dirty[-1].end_offset


def _map_batch(offset_map, header: BatchHeader, data, start: int, max_message_bytes: int,
               max_inflated: int, txns: Transactions | None = None) -> int | None:
    """Step 2 for one batch (the reference): the offset of its first record
    the map refused, None when it took them all."""
    if not _plain(header, txns) or header.next_offset <= start:
        return None
    if txns is not None and txns.aborted(header):
        return None  # an aborted record never hides another
    records = decode_batch(data, 0, max_message_bytes=max_message_bytes, max_inflated_bytes=max_inflated).records
    if header.base_offset < start:
        records = [r for r in records if r.offset >= start]
    if not records:
        return None
    # records of a batch have consecutive offsets from the first
    taken = offset_map.put_many([r.key for r in records], records[0].offset)
    if taken < len(records):
        return records[taken].offset
    return None


# -- the compiled path (raylog.storage._compaction) ----------------------------
#
# A segment is read a block at a time (as batches() reads it) and each block
# walked in C without the interpreter; a batch the walk does not handle
# (compressed, faulty) goes through the reference code above and below for
# that batch alone, then the walk goes on after it.


def _compiled(offset_map) -> bool:
    return _compaction is not None and isinstance(offset_map, _compaction.SlotMap)


class _Blocks:
    """A segment's bytes, a block of at least :data:`READ_BYTES` (or to the
    end) at a time, read into one reused buffer (a window is valid until the
    next call)."""

    def __init__(self, segment: LogSegment, throttler: Throttler | None):
        self.segment, self.size = segment, segment.size
        self._throttler = throttler
        self._buffer = bytearray(min(READ_BYTES, self.size))
        self.block, self.at = memoryview(self._buffer)[:0], 0

    def window(self, pos: int, need: int = HEADER_SIZE) -> tuple[memoryview, int]:
        """``(block, position of pos in it)`` with at least ``need`` bytes from ``pos``."""
        rel = pos - self.at
        if rel < 0 or rel + need > len(self.block):
            length = min(max(need, READ_BYTES), self.size - pos)
            self.block.release()
            if length > len(self._buffer):
                self._buffer = bytearray(length)
            view = memoryview(self._buffer)[:length]
            got = os.preadv(self.segment.fd, [view], pos)
            view.release()
            self.block, self.at, rel = memoryview(self._buffer)[:got], pos, 0
            if self._throttler is not None:
                self._throttler.count(got)
            if got < need:
                raise OSError(f"the segment {self.segment.path} is cut inside the batch at position {pos}")
        return self.block, rel

    def batch(self, pos: int) -> tuple[BatchHeader, memoryview]:
        """The header and bytes of the batch at ``pos``."""
        block, rel = self.window(pos)
        header = read_header(block, rel)
        block, rel = self.window(pos, max(header.size, HEADER_SIZE))
        return header, block[rel : rel + header.size]


def _walk(segment: LogSegment, throttler: Throttler | None, step, slow, pos: int = 0) -> tuple[int | None, int]:
    """Run ``step(block, rel) -> (rel, status, value)`` over the segment
    from ``pos``, ``slow(header, data) -> None | result`` on each batch it
    leaves to the reference: ``(result, position)``, the first result that
    is not None (``step``'s ``STATUS_FULL`` value included) and the
    position of the batch it came from, or ``(None, the segment's size)``."""
    blocks = _Blocks(segment, throttler)
    need = HEADER_SIZE
    size = segment.size
    while pos < size:
        block, rel = blocks.window(pos, need)
        end, status, value = step(block, rel)
        pos += end - rel
        need = HEADER_SIZE
        if status == _compaction.STATUS_END:
            continue
        if status == _compaction.STATUS_TAIL:
            need = value
        elif status == _compaction.STATUS_FULL:
            return value, pos
        else:
            header, data = blocks.batch(pos)
            got = slow(header, data)
            if got is not None:
                return got, pos
            pos += header.size
    return None, size


def _producer_step(pairs: list):
    def step(block, rel):
        stop, status, value, found = _compaction.producer_batches(block, rel, MAX_BATCH_LENGTH)
        pairs.extend(found)
        return stop, status, value

    return step


def _producer_note(pairs: list):
    def note(header: BatchHeader, _data=None) -> None:
        if header.producer_id >= 0 and header.base_sequence >= 0 and not header.control:
            pairs.append((header.producer_id, header.base_offset))

    return note


def _map_segment(segment: LogSegment, start: int, offset_map, max_message_bytes: int, max_inflated: int,
                 throttler: Throttler | None, pairs: list) -> int | None:
    limit = min(max_message_bytes, MAX_BATCH_LENGTH)
    note = _producer_note(pairs)

    def step(block, rel):
        stop, status, value = _compaction.map_batches(offset_map, block, rel, start, limit)
        pairs.extend(_compaction.producer_batches(block[:stop], rel, MAX_BATCH_LENGTH)[3])
        return stop, status, value

    def slow(header, data):
        note(header)
        return _map_batch(offset_map, header, data, start, max_message_bytes, max_inflated)

    stopped, pos = _walk(segment, throttler, step, slow)
    if stopped is not None:
        # the rest of the segment from the batch where the map stopped, for the producers alone
        # (that batch may be noted twice: the same pair again changes nothing)
        _walk(segment, throttler, _producer_step(pairs), note, pos)
    return stopped


def groups(segments: list[LogSegment], max_bytes: int) -> list[list[LogSegment]]:
    """Consecutive segments of at most ``max_bytes`` together (one alone may be larger)."""
    out: list[list[LogSegment]] = []
    size = 0
    limit = min(max_bytes, MAX_SEGMENT_BYTES)
    for segment in segments:
        if out and size + segment.size <= limit:
            out[-1].append(segment)
            size += segment.size
        else:
            out.append([segment])
            size = segment.size
    return out


def last_producer_batches(segments: list[LogSegment], throttler: Throttler | None = None,
                          known: dict | None = None) -> set[int]:
    """The offset of the last batch of each producer id in ``segments``;
    ``known``: the pairs of some of them already read (:func:`build_map`'s ``producers``)."""
    last: dict[int, int] = {}
    for segment in segments:
        if known is not None and segment.base_offset in known:
            last.update(known[segment.base_offset])
            continue
        pairs: list = []
        if _compaction is None:
            note = _producer_note(pairs)
            for _pos, header, _data in batches(segment, throttler):
                note(header)
        else:
            _walk(segment, throttler, _producer_step(pairs), _producer_note(pairs))
        last.update(pairs)
    return set(last.values())


def _run_batch(header: BatchHeader, run, first_index: int) -> bytes:
    """The kept records ``run`` (consecutive, from record ``first_index`` of
    the batch ``header``) as one batch of their own (module docstring, step 3)."""
    sequence = -1 if header.base_sequence < 0 else (header.base_sequence + first_index) & 0x7FFFFFFF
    data = bytearray(encode_batch(
        [r.value for r in run], keys=[r.key for r in run], headers=[r.headers or None for r in run],
        timestamp_ms=[r.timestamp for r in run], producer_id=header.producer_id,
        producer_epoch=header.producer_epoch, base_sequence=sequence,
        log_append_time=header.log_append_time,
    ))
    _FIXED.pack_into(data, 0, header.base_offset + first_index, len(data) - LOG_OVERHEAD)
    struct.pack_into(">i", data, _EPOCH_AT, header.partition_leader_epoch)
    struct.pack_into(">i", data, _LOD_AT, len(run) - 1)
    _CRC.pack_into(data, _CRC_AT, crc32c(memoryview(data)[_ATTRIBUTES_AT:]))
    return bytes(data)


class _Writer:
    """The ``.cleaned`` segment file of a group and its index entries."""

    def __init__(self, path: str, throttler: Throttler | None):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        self.entries: list[tuple[int, int, int]] = []
        self.size = 0
        self._throttler = throttler
        self._pending: list[bytes] = []
        self._pending_bytes = 0

    def add(self, offset: int, span: int, data) -> None:
        self.entries.append((offset, span, self.size))
        self.size += len(data)
        self._pending.append(bytes(data))
        self._pending_bytes += len(data)
        if self._pending_bytes >= READ_BYTES:
            self._drain()

    def add_run(self, entries, data) -> None:
        """Batches kept whole, back to back in ``data``: ``entries`` their
        ``(offset, span, position in data)``."""
        at = self.size
        self.entries.extend((offset, span, at + pos) for offset, span, pos in entries)
        self.size += len(data)
        self._drain()
        nbytes = len(data)
        while data:  # one write from the block read, no copy
            data = data[os.write(self.fd, data):]
        if self._throttler is not None:
            self._throttler.count(nbytes)

    def _drain(self) -> None:
        if self._pending:
            data = memoryview(b"".join(self._pending))
            while data:
                data = data[os.write(self.fd, data):]
            if self._throttler is not None:
                self._throttler.count(self._pending_bytes)
        self._pending, self._pending_bytes = [], 0

    def finish(self) -> None:
        self._drain()
        os.fsync(self.fd)
        os.close(self.fd)

    def abandon(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


def empty_batch(header: BatchHeader, first_index: int) -> bytes:
    """What the cleaner keeps of the producer's last batch ``header`` whose
    records from index ``first_index`` on it removed: an empty batch over
    their offsets with the producer's last sequence
    (:mod:`raylog.storage.record_batch`, "Empty batches")."""
    sequence = -1 if header.base_sequence < 0 else (header.base_sequence + first_index) & 0x7FFFFFFF
    data = bytearray(HEADER_SIZE)
    struct.pack_into(
        ">qiibIhiqqqhii", data, 0, header.base_offset + first_index, HEADER_SIZE - LOG_OVERHEAD,
        header.partition_leader_epoch, header.magic, 0, header.attributes & ~_CODEC_MASK,
        header.count - 1 - first_index, header.base_timestamp, header.max_timestamp, header.producer_id,
        header.producer_epoch, sequence, 0,
    )
    _CRC.pack_into(data, _CRC_AT, crc32c(memoryview(data)[_ATTRIBUTES_AT:]))
    return bytes(data)


def _clean_batch(writer: _Writer, header: BatchHeader, data, offset_map, keep_whole: set[int], horizon: int,
                 max_message_bytes: int, max_inflated: int, txns: Transactions | None = None) -> int:
    """Step 3 for one batch (the reference): write what it keeps; the records it removed."""
    span = header.last_offset_delta + 1
    last = header.base_offset in keep_whole  # its producer's last batch in the range
    if not _plain(header, txns) or (header.empty and last):
        writer.add(header.base_offset, span, data)
        return 0
    if header.empty:
        return 0  # its producer wrote again: the later batch carries the sequence
    records = decode_batch(data, 0, max_message_bytes=max_message_bytes, max_inflated_bytes=max_inflated).records
    first = header.base_offset
    expired = header.max_timestamp <= horizon
    offsets = range(first, first + len(records))
    keep = list(map(le, offset_map.get_many([r.key for r in records]), offsets))
    if expired:
        keep = [k and r.value is not None for k, r in zip(keep, records)]
    if txns is not None and txns.aborted(header):
        keep = [False] * len(records)  # an aborted transaction's records are removed
    if all(keep):
        writer.add(header.base_offset, span, data)
        return 0
    removed = keep.count(False)
    if not any(keep) and not last:
        return removed
    i = 0
    while i < len(records):
        if not keep[i]:
            i += 1
            continue
        j = i
        while j < len(records) and keep[j]:
            j += 1
        writer.add(header.base_offset + i, j - i, _run_batch(header, records[i:j], i))
        i = j
    if last and not keep[-1]:
        tail = len(keep) - keep[::-1].index(True) if any(keep) else 0
        writer.add(header.base_offset + tail, len(keep) - tail, empty_batch(header, tail))
    return removed


def _write_actions(writer: _Writer, block, actions: bytes, runs: bytes) -> int:
    """Write what ``plan_batches`` made of ``block``'s batches: those kept
    whole (each run of consecutive ones in one piece, from the block) and
    the run batches of those cut (from ``runs``); the records removed."""
    removed = 0
    run_start = run_end = -1
    entries: list[tuple[int, int, int]] = []
    items = array("q", actions)
    for i in range(0, len(items), 6):
        kind, pos, size, base, span, count = items[i : i + 6]
        if kind == _compaction.ACTION_DROP:
            removed += count
            continue
        if kind == _compaction.ACTION_RUN or pos != run_end:
            if entries:
                writer.add_run(entries, block[run_start:run_end])
                entries = []
            run_end = -1
        if kind == _compaction.ACTION_RUN:
            writer.add(base, span, runs[pos : pos + size])
            continue
        if not entries:
            run_start = pos
        entries.append((base, span, pos - run_start))
        run_end = pos + size
    if entries:
        writer.add_run(entries, block[run_start:run_end])
    return removed


def write_cleaned(directory: str, group: list[LogSegment], offset_map: OffsetMap, keep_whole: set[int],
                  config: TopicConfig, now_ms: int, throttler: Throttler | None = None,
                  dirty_from: int | None = None, expire_tombstones: bool = True,
                  txns: Transactions | None = None) -> tuple[OffsetIndex, int]:
    """Write the cleaned segment of ``group`` as ``<base>.log.cleaned`` and
    ``<base>.index.cleaned`` (both synced): ``(its index, records removed)``;
    ``dirty_from``: where the map stopped, when inside the group;
    ``expire_tombstones`` False: every tombstone (and marker) is kept,
    however old; ``txns``: the pass's transactions (:class:`Transactions`;
    the reference then cleans every batch: the compiled walk keeps batches
    of transactions whole)."""
    base = group[0].base_offset
    end = group[-1].end_offset
    log_path = os.path.join(directory, segment_name(base) + CLEANED)
    writer = _Writer(log_path, throttler)
    removed = 0
    horizon = now_ms - config.delete_retention_ms if expire_tombstones else -(1 << 62)
    max_message_bytes, max_inflated = config.max_message_bytes, config.max_inflated_limit
    fast = _compiled(offset_map) and txns is None
    keep_sorted = array("q", sorted(keep_whole)).tobytes()
    limit = min(max_message_bytes, MAX_BATCH_LENGTH)

    def slow(header, data) -> None:
        nonlocal removed
        removed += _clean_batch(writer, header, data, offset_map, keep_whole, horizon, max_message_bytes,
                                max_inflated, txns)

    def step(block, rel):
        nonlocal removed
        stop, status, value, actions, runs = _compaction.plan_batches(offset_map, block, rel, keep_sorted, horizon,
                                                                      limit)
        removed += _write_actions(writer, block, actions, runs)
        return stop, status, value

    try:
        for segment in group:
            if fast:
                _walk(segment, throttler, step, slow)
                continue
            for _pos, header, data in batches(segment, throttler):
                slow(header, data)
        writer.finish()
        # the cleaned segment is as old as its newest part (retention and the compaction lags read it)
        newest = max(os.fstat(s.fd).st_mtime_ns for s in group)
        os.utime(log_path, ns=(newest, newest))
    except BaseException:
        writer.abandon()
        _unlink(log_path)
        raise
    index = OffsetIndex(base, end, writer.entries, writer.size, dirty_from)
    index_path = os.path.join(directory, index_name(base) + CLEANED)
    try:
        index.write(index_path)
    except BaseException:
        _unlink(log_path)
        _unlink(index_path)
        raise
    return index, removed


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _delete_segment_files(directory: str, base: int) -> None:
    for name in (segment_name(base), f"{base:020d}{TIMEINDEX_SUFFIX}", index_name(base)):
        _unlink(os.path.join(directory, name))


def swap(directory: str, base: int, old_bases: list[int]) -> None:
    """Replace the segments ``old_bases`` by the cleaned segment of ``base``
    written by :func:`write_cleaned` (module docstring, step 4)."""
    log_name, idx_name = segment_name(base), index_name(base)
    _faults.check("clean-written", directory)
    os.replace(os.path.join(directory, idx_name + CLEANED), os.path.join(directory, idx_name + SWAP))
    _faults.check("clean-index-swap", directory)
    os.replace(os.path.join(directory, log_name + CLEANED), os.path.join(directory, log_name + SWAP))
    sync_directory(directory)  # the commit point
    _faults.check("clean-swapped", directory)
    _finish(directory, base, old_bases)


def _finish(directory: str, base: int, old_bases: list[int]) -> None:
    """The swap of ``base`` after its commit point: delete the old segments,
    then give the new files their names."""
    log_name, idx_name = segment_name(base), index_name(base)
    idx_swap = os.path.join(directory, idx_name + SWAP)
    if os.path.exists(idx_swap):  # else the old segments are gone and the index has its name already
        for old in old_bases:
            _delete_segment_files(directory, old)
            _faults.check("clean-deleted", directory)
        os.replace(idx_swap, os.path.join(directory, idx_name))
        _faults.check("clean-index", directory)
    os.replace(os.path.join(directory, log_name + SWAP), os.path.join(directory, log_name))
    sync_directory(directory)


def finish_swaps(directory: str) -> list[str]:
    """Recovery, before the segments are opened: finish every swap past its
    commit point (a ``.log.swap``), undo every other (``.cleaned`` files, an
    ``.index.swap`` alone). Returns notes for the recovery log."""
    notes = []
    names = os.listdir(directory)
    for name in names:
        if name.endswith(CLEANED):
            _unlink(os.path.join(directory, name))
            notes.append(f"a cleaning interrupted before its swap left {name}: deleted (the old segments stay)")
    bases = set()
    for name in names:
        if name.endswith(".log" + SWAP):
            bases.add(int(name[:20]))
    for name in names:
        if name.endswith(".index" + SWAP) and int(name[:20]) not in bases:
            _unlink(os.path.join(directory, name))
            notes.append(f"a cleaning interrupted before its commit left {name}: deleted (the old segments stay)")
    for base in sorted(bases):
        idx_swap = os.path.join(directory, index_name(base) + SWAP)
        idx_final = os.path.join(directory, index_name(base))
        try:
            with open(idx_swap if os.path.exists(idx_swap) else idx_final, "rb") as f:
                data = f.read()
            size = os.stat(os.path.join(directory, segment_name(base) + SWAP)).st_size
            index = OffsetIndex.from_bytes(data, base, size)
        except (OSError, ValueError) as err:
            raise OSError(f"the cleaned segment {segment_name(base)}{SWAP} has no sound offset index ({err}); "
                          f"restore the partition from a replica") from err
        old = []
        for name in names:
            if name.endswith(".log") and name[:20].isdigit() and base <= int(name[:20]) < index.end_offset:
                old.append(int(name[:20]))
        _finish(directory, base, old)
        notes.append(f"a cleaning interrupted after its commit was finished: {segment_name(base)} replaces "
                     f"the segments of offsets [{base}, {index.end_offset})")
    return notes


def clean(log_view: tuple[list, list], hw: int, directory: str, config: TopicConfig, now_ms: int,
          install: Callable[[list[LogSegment], LogSegment], bool], *, buffer_bytes: int = DEFAULT_BUFFER_BYTES,
          throttler: Throttler | None = None, force: bool = False,
          tombstone_limit: int | None = None, aborted: Callable[[int, int], list] | None = None) -> Result | None:
    """One pass over the log's ``log_view`` (module docstring): None when none
    is due (``force``: whenever there is a dirty segment). ``install(group,
    cleaned segment)`` is the log's: it swaps the group for the cleaned
    segment under its writer lock (calling :func:`swap`) and says whether it
    did (False: retention took the group meanwhile; the files are dropped).
    ``tombstone_limit``: on a replicated partition, the offset below which
    every replica holds the log; a group reaching past it keeps its
    tombstones whatever their age (a replica that has not copied a
    tombstone yet would otherwise never get it, and keep the value it
    deleted). ``aborted(start, end)``: on a log that holds transactions, its
    aborted transactions overlapping ``[start, end)`` (``hw`` is then at most
    the last stable offset): the records of committed transactions are
    cleaned, those of aborted ones removed (:class:`Transactions`), by the
    reference code (the compiled walk keeps batches of transactions whole);
    None: batches of transactions are kept whole."""
    _bases, segments = log_view
    due = plan(segments, hw, config.replace(min_cleanable_dirty_ratio=1e-9) if force else config, now_ms)
    if due is None:
        return None
    txns = None
    if aborted is not None:
        first = (due.clean or due.dirty)[0].base_offset
        txns = Transactions(aborted(first, due.dirty[-1].end_offset))
    offset_map = new_map(buffer_bytes) if txns is None else OffsetMap(buffer_bytes)
    producers: dict = {}
    stop = build_map(due.dirty, offset_map, config.max_message_bytes, config.max_inflated_limit, throttler,
                     producers, txns)
    section = due.clean + [s for s in due.dirty if s.base_offset < stop]
    dirty_bytes = sum(s.size for s in due.dirty if s.base_offset < stop)
    keep_whole = last_producer_batches(section, throttler, producers)
    read = written = removed = 0
    for group in groups(section, config.segment_bytes):
        dirty_from = stop if stop < group[-1].end_offset else None
        # a tombstone goes only below what every replica holds (tombstone_limit; None: unreplicated)
        expire = tombstone_limit is None or group[-1].end_offset <= tombstone_limit
        index, lost = write_cleaned(directory, group, offset_map, keep_whole, config, now_ms, throttler, dirty_from,
                                    expire_tombstones=expire, txns=txns)
        base = group[0].base_offset
        read += sum(s.size for s in group)
        written += index.file_size
        removed += lost
        if not install(group, index):
            for name in (segment_name(base) + CLEANED, index_name(base) + CLEANED):
                _unlink(os.path.join(directory, name))
            break
    return Result(dirty_bytes, read, written, removed, section[-1].end_offset)
