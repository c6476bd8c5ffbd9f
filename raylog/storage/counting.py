"""Counting the messages of a log range without handing them out: what a
full read of ``[start, end)`` would return, checked as a read checks it.

A count is what :func:`~raylog.storage.decoding.decode_messages` would
yield over the same bytes: one per plain message, and for a compressed
wrapper one per *inner* message (the wrapper is decompressed, bounded by
``max_inflated_bytes``, and its inner set checked). Every CRC32C is
verified, of the wrappers and of their inner messages: a damaged byte is a
:class:`~raylog.errors.CorruptMessageError` (an
:class:`~raylog.errors.InvalidMessageError` for a bad header or size),
never a smaller or larger count.

The compiled walker of :mod:`raylog.storage._speedups` (``scan``: sizes,
headers and CRC32C of runs of plain messages, without the GIL) counts runs
of plain messages; the Python code here is the reference and judges each
message the walker stops at (a wrapper, a damaged message, a cut tail), so
the errors are the same with and without it (``RAYLOG_PURE_PYTHON=1``).

Record batches (format 2) count their records (control batches count
none: readers are not handed them), each batch validated whole
(:func:`~raylog.storage.record_batch.validate_batch`; runs of plain ones
by the compiled ``batches_count``, which checks each as it does). An offset
inside a batch (a record's) is answered as one inside a wrapper.

A count of a long range (a consumer's lag, a Spark trigger's backlog) is
answered from the segments' record counts (:func:`count_between`,
:mod:`raylog.storage.countindex`): the bytes of a segment are walked and
checked once, by the first count that reaches them, and later counts walk
about one checkpoint interval at each end of their range.

Used by the data server's COUNT request (:mod:`raylog.transfer.protocol`).
All functions are pure or read-only on the log; thread-safe.
"""

from __future__ import annotations

from typing import NamedTuple

from raylog.errors import InvalidMessageError, InvalidOffsetError, OffsetOutOfRangeError
from raylog.storage import message as _format
from raylog.storage.message import HEADER_SIZE, LOG_OVERHEAD, CODEC_MASK, HEADER_CHECK, STOP_HEADER
from raylog.storage.countindex import CHECKPOINT_BYTES
from raylog.storage.message_errors import in_wrapper, inner_set, inside_wrapper
from raylog.storage.record_batch import LOG_OVERHEAD as BATCH_OVERHEAD
from raylog.storage import record_batch as _record_batch
from raylog.storage.record_batch import MAX_BATCH_LENGTH, format_at, validate_batch
from raylog.storage.validation import scan_set, scan_message_set

#: bytes of log read (``os.pread``) and walked at a time by :func:`count_range`
COUNT_BLOCK_BYTES = 4 << 20


def count_message_set(
    buf,
    max_message_bytes: int,
    *,
    base_offset: int = 0,
    max_inflated_bytes: int | None = None,
) -> tuple[int, int, InvalidMessageError | None]:
    """Count the whole messages at the start of ``buf`` without raising.

    Returns ``(valid_bytes, messages, error)``: the length of the run of
    valid messages from the start, how many messages a reader gets from it
    (a wrapper's inner messages each count), and the error about the bytes
    at ``valid_bytes`` (``None`` when all of ``buf`` is valid; a message cut
    by the end of ``buf`` gives one with ``partial=True``). Errors name log
    offsets (``base_offset`` + position).
    """
    mv = memoryview(buf)
    if mv.ndim != 1 or mv.itemsize != 1:
        mv = mv.cast("B")
    if format_at(mv) == 2:
        return _count_batches(mv, max_message_bytes, base_offset, max_inflated_bytes)
    n = len(mv)
    fast = _format._speedups  # looked up per call: tests swap the fast path
    pos = count = 0
    while pos < n:
        if fast is not None:
            valid, more, status = fast.scan(mv[pos:] if pos else mv, max_message_bytes)
            pos += valid
            count += more
            if not status:
                break
        # The reference judges one message: bounds, CRC32C, header.
        end = n
        if n - pos >= HEADER_SIZE:
            size, _crc, magic_attrs, klen = HEADER_CHECK.unpack_from(mv, pos)
            end = min(n, pos + LOG_OVERHEAD + size)
        _valid, one, err = scan_set(mv[pos:end], max_message_bytes, base_offset + pos, False, True, None)
        if err is not None:
            return pos, count, err
        if not one:  # nothing whole at pos (cannot happen after the checks above)
            break
        codec = (magic_attrs & 0xFF) & CODEC_MASK
        if codec:
            try:
                inner = inner_set(
                    mv, pos, end, magic_attrs & 0xFF, klen, max_message_bytes, base_offset + pos, max_inflated_bytes
                )
            except InvalidMessageError as raised:
                return pos, count, raised
            _ok, inner_count, err = scan_message_set(inner, max_message_bytes, _allow_wrappers=False)
            if err is not None:
                return pos, count, in_wrapper(err, codec, base_offset + pos)
            count += inner_count
        else:
            count += 1
        pos = end
    return pos, count, None


def _count_batches(mv, max_message_bytes: int, base_offset: int, max_inflated_bytes):
    """:func:`count_message_set` of record batches: runs of plain batches in
    one compiled pass (``batches_count``, checking each as
    :func:`~raylog.storage.record_batch.validate_batch` does), the others
    (compressed, control, faulty) one by one here."""
    n = len(mv)
    pos = count = 0
    fast = getattr(_record_batch._speedups, "batches_count", None)  # per call: tests turn it off
    bound = min(max_message_bytes, MAX_BATCH_LENGTH)
    while pos < n:
        if fast is not None:
            run = fast(mv, pos, n, bound)
            if run is None:
                fast = None
            else:
                records, stop = run
                count += records
                pos = stop
                if pos >= n:
                    break
        try:
            header = validate_batch(mv, pos, max_message_bytes, max_inflated_bytes, stored=True)
        except InvalidMessageError as err:
            return pos, count, err
        if not header.control:
            count += header.count
        pos += header.size
    return pos, count, None


def _inside_batch(piece, offset: int):
    """The error for ``offset`` inside the batch ``piece`` starts with (a read there returns that batch)."""
    return inside_wrapper(offset, piece.offset, piece.offset + piece.length)


class Counted(NamedTuple):
    """The answer of :func:`count_range`: ``messages`` in ``[start, next_offset)``."""

    messages: int
    next_offset: int


def count_range(log, start: int, end: int, max_bytes: int, *, held: bool = False) -> Counted:
    """Count the messages of ``log`` (a :class:`~raylog.storage.base.Log`)
    in ``[start, end)``, walking at most about ``max_bytes`` of it: the
    count stops at the first message boundary at or after ``start +
    max_bytes`` (at least one message is counted) and says where
    (``next_offset``; ``end`` when the range is done).

    ``start`` and ``end`` must lie in the log and be message boundaries, as
    a FETCH's offset: :class:`~raylog.errors.OffsetOutOfRangeError` outside
    ``[log start, high watermark]`` or for ``end < start``,
    :class:`~raylog.errors.InvalidOffsetError` off a boundary (with a
    ``wrapper_offset`` detail when inside a compressed wrapper: the reader
    then reads and counts the messages itself). A damaged
    message raises its :class:`~raylog.errors.InvalidMessageError`.

    ``held``: the count's own walks (a segment's record counts, from its
    base offset; a batch holding the start): ``start`` may lie below the log
    start where a deletion of records moved it inside the first segment
    (:meth:`~raylog.storage.log.PartitionLog.delete_records_before`), whose
    bytes the segment still holds (:meth:`~raylog.storage.log.PartitionLog.read_held`).
    """
    earliest, latest = log.log_start_offset, log.high_watermark
    if end < start or end > latest or (start < earliest and not held):
        raise OffsetOutOfRangeError(
            f"count range [{start}, {end}) is not within the log [{earliest}, {latest}]; count up to an offset "
            f"the log gave out",
            offset=end if start >= earliest else start,
            earliest=earliest,
            latest=latest,
        )
    held_read = getattr(log, "read_held", None) or log.read

    def read(offset: int, max_bytes: int):  # below the log start only in the count's own walks
        return log.read(offset, max_bytes) if offset >= earliest else held_read(offset, max_bytes)
    config = log.config
    max_message_bytes = config.max_message_bytes
    max_inflated = config.max_inflated_limit
    limit = start + max(0, max_bytes)
    pos = start
    count = 0
    if start == end:
        piece = read(start, 0)  # the bounds and the boundary are checked all the same
        if piece.offset < start:  # inside a record batch: the read gave the batch
            raise _inside_batch(piece, start)
    while pos < end and (pos == start or pos < limit):
        # at least the whole message at pos (the read's rule), at most the block
        piece = read(pos, min(COUNT_BLOCK_BYTES, end - pos, max(1, limit - pos)))
        if piece.offset < pos:
            raise _inside_batch(piece, pos)
        if piece.offset > pos:  # pos was removed by the log cleaner: the read is of the next kept batch
            if piece.offset >= end:
                pos = end
                break
            pos = piece.offset
        if getattr(piece, "cleaned", False):
            more, pos = _count_cleaned(piece, end, max_message_bytes, max_inflated)
            count += more
            continue
        if piece.length == 0:  # the log was cut under the count (a replica truncated)
            raise OffsetOutOfRangeError(
                f"the log ends at {pos}, before the count's end {end}",
                offset=end,
                earliest=log.log_start_offset,
                latest=pos,
            )
        data = piece.tobytes()
        cut = min(len(data), end - pos)
        valid, more, err = count_message_set(
            memoryview(data)[:cut], max_message_bytes, base_offset=pos, max_inflated_bytes=max_inflated
        )
        count += more
        if err is not None and not (valid and err.details.get("partial")):
            if err.details.get("partial") and cut < len(data):
                if format_at(data, valid) == 2:
                    size = BATCH_OVERHEAD + int.from_bytes(data[valid + 8 : valid + 12], "big")
                    raise inside_wrapper(end, pos + valid, pos + valid + size)
                if len(data) > valid + HEADER_SIZE and data[valid + 9] & CODEC_MASK:
                    size = LOG_OVERHEAD + int.from_bytes(data[valid : valid + 4], "big")
                    raise inside_wrapper(end, pos + valid, pos + valid + size)
                raise InvalidOffsetError(
                    f"offset {end} is not the start of a message in the log (the message at "
                    f"{pos + valid} runs past it); count up to an offset the log gave out",
                    offset=end,
                )
            raise err
        if getattr(piece, "cleaned", False) and valid:
            # a segment the cleaner rewrote: the batches say where their offsets end
            pos = _record_batch.next_offset_after(data, valid)
        else:
            pos += valid
    return Counted(count, pos)


def _count_cleaned(piece, end: int, max_message_bytes: int, max_inflated: int) -> tuple[int, int]:
    """Count the records of a read from a segment the cleaner rewrote
    (docs/design.md §3: kept batches at their own offsets, gaps between):
    ``(records, next offset)`` of its whole batches below ``end``, each
    validated; offsets the cleaner removed count nothing."""
    data = piece.tobytes()
    count, pos = 0, min(piece.offset, end)
    for at, header in _record_batch.iter_batches(data):
        if header.base_offset >= end:
            break
        validate_batch(data, at, max_message_bytes, max_inflated, stored=True)
        if header.next_offset > end:
            raise inside_wrapper(end, header.base_offset, header.next_offset)
        if not header.control:
            count += header.count
        pos = header.next_offset
    return count, pos


def _message_at(log, offset: int) -> int:
    """The offset of the message a read at ``offset`` (a boundary) starts
    with: ``offset``, or past it where the log cleaner removed ``offset``
    (docs/design.md §3: the read gives the next kept batch)."""
    return max(offset, log.read(offset, 0).offset)


def count_between(log, start: int, end: int, max_bytes: int | None = None) -> Counted | None:
    """:func:`count_range` from the segments' record counts
    (:mod:`raylog.storage.countindex`): the messages of ``[start, end)``
    (message boundaries, checked as :func:`count_range` checks them), found
    by a walk from the last checkpoint before each end of the range. The
    bytes of the range no count walked yet are walked and checked (at most
    about ``max_bytes`` of them: the answer then stops short, at
    ``next_offset``) and remembered. ``None`` for a log without segments (in
    memory): the caller walks the range. Errors as :func:`count_range`'s."""
    spans = _spans(log, start, end)
    if spans is None:
        return None
    walk = [max_bytes if max_bytes is not None else 1 << 62]
    total = 0
    for segment, lo, hi, closed in spans:
        before, _ = _records_to(log, segment, lo, False, None)
        records, reached = _records_to(log, segment, hi, closed, walk, (lo, before))
        total += records - before
        if reached < hi:
            return Counted(total, reached)
    return Counted(total, end)


def _spans(log, start: int, end: int):
    """``(segment, lo, hi, hi is the segment's end)`` over ``[start, end)``
    after the range's bounds and ends are checked; None without segments."""
    spans_of = getattr(log, "segment_spans", None)
    if spans_of is None:
        return None
    # the bounds, and the first message from start (a walk's errors); a walk to end checks it
    count_range(log, start, end, 0)
    spans = spans_of(start, end)
    return [(segment, lo, hi, i < len(spans) - 1) for i, (segment, lo, hi) in enumerate(spans)]


def _records_to(log, segment, position: int, closed: bool, walk: list | None,
                known: tuple[int, int] = (-1, 0)) -> tuple[int, int]:
    """``(records, reached)``: the records from ``segment``'s base offset up
    to ``reached``, which is ``position`` (a boundary in the segment, or its
    end: ``closed``) unless the walk's byte budget (``walk[0]``, spent here;
    None for no bound) ran out first (at least one message is walked). By
    the segment's record counts: the bytes past its last checkpoint are
    walked and checked, and checkpoints kept (at the segment's end when
    ``closed``). ``known`` is a ``(position, records)`` learnt already (the
    start of a range): a walk starts at the later of it and the checkpoint."""
    counts = segment.counts
    at, records = max(counts.floor(position), known)
    if at == position:
        return records, at
    with counts.walk_lock:
        at, records = max(counts.floor(position), known)  # another count may have walked it meanwhile
        first = True
        while at < position and (first or walk is None or walk[0] > 0):
            first = False
            step = CHECKPOINT_BYTES if walk is None else max(1, min(CHECKPOINT_BYTES, walk[0]))
            counted = count_range(log, at, position, step, held=True)
            if walk is not None:
                walk[0] -= counted.next_offset - at
            at, records = counted.next_offset, records + counted.messages
            if at < position:
                counts.add(at, records)
            elif closed:
                counts.add(at, records, end=True)
    return records, at


def _jump(log, start: int, end: int, budget: int, max_bytes: int) -> tuple[int, int]:
    """``(records, position)``: the furthest known boundary in ``[start,
    end]`` with at most ``budget`` records from ``start`` (a boundary), by
    the segments' record counts (walking at most about ``max_bytes`` of
    bytes not walked before); ``(0, start)`` without them. The walk from
    there to the exact end is the caller's."""
    spans = _spans(log, start, end)
    if not spans:
        return 0, start
    walk = [max_bytes]
    count, pos = 0, start
    for segment, lo, hi, closed in spans:
        before, _ = _records_to(log, segment, lo, False, None)
        whole, reached = _records_to(log, segment, hi, closed, walk, (lo, before))
        if reached == hi and whole - before <= budget - count:
            count, pos = count + whole - before, hi
            continue
        best = 0
        for at, records in segment.counts.checkpoints():
            if lo < at <= reached and records - before <= budget - count:
                pos, best = at, records - before
        count += best
        break
    return count, pos


def count_records(log, start: int, end: int, max_bytes: int, max_messages: int) -> Counted:
    """COUNT version 1: :func:`count_range` from a record offset, stopping
    after at most ``max_messages`` messages (``-1``: no bound).

    ``start`` may be the record offset of an inner message of a compressed
    wrapper (docs/design.md §2): the count starts at that inner message.
    When the last message counted is an inner message of a wrapper that
    holds more, ``next_offset`` is the record offset of the next one
    (wrapper offset + its index), where a read or a count can start. ``end``
    must be a message boundary, as for :func:`count_range`; the errors are
    its errors.
    """
    budget = max_messages if max_messages >= 0 else 1 << 62
    count_range(log, end, end, 0)  # end: a boundary within the log
    if end < start:
        count_range(log, start, end, 0)  # raises OffsetOutOfRangeError
    count = 0
    pos = start
    try:
        piece = log.read(start, 0)
        if piece.offset < start:  # a record of a batch: counted from it, as an inner message
            raise _inside_batch(piece, start)
        # (piece.offset > start: start was removed by the log cleaner; the count goes on from the gap)
    except InvalidOffsetError as err:
        wrapper, wrapper_end = err.details.get("wrapper_offset"), err.details.get("next_offset")
        if wrapper is None or wrapper_end > end:
            raise
        inner = count_range(log, wrapper, wrapper_end, 1, held=True).messages
        left = max(0, inner - (start - wrapper))
        if left > budget:
            return Counted(budget, start + budget)
        count, budget, pos = left, budget - left, wrapper_end
    step = COUNT_BLOCK_BYTES
    if budget > 0 and pos < end:  # the segments' record counts, then a walk of the rest
        if getattr(log, "segment_spans", None) is not None:
            step = CHECKPOINT_BYTES  # what is left after a jump lies within about one interval
        if max_messages < 0:
            counted = count_between(log, pos, end, max_bytes)
            if counted is not None:
                return Counted(count + counted.messages, counted.next_offset)
        else:
            more, pos = _jump(log, pos, end, budget, max_bytes)
            count, budget, start = count + more, budget - more, pos
    limit = start + max(0, max_bytes)
    first = True
    while pos < end and budget > 0 and (first or pos < limit):
        first = False
        counted = count_range(log, pos, end, min(step, max(1, limit - pos)))
        if counted.messages <= budget:
            count += counted.messages
            budget -= counted.messages
            pos = counted.next_offset
        elif step > 1:
            step = max(1, step // 8)  # too many: walk a shorter stretch from pos again
            first = True
        else:  # one wrapper holds more messages than are left to count: stop inside it
            # (its record i is at its offset + i; pos may lie in a gap the log cleaner left before it)
            return Counted(count + budget, _message_at(log, pos) + budget)
    return Counted(count, pos)
