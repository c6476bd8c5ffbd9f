"""Format 2 in the log, append and recovery side: the checks a partition makes
before it stores record batches (:func:`prepare_append`), stamps them at the
log end (:func:`stamp_batches`), and the scan recovery makes of stored ones
(:func:`scan_batches`). The format itself is :mod:`raylog.storage.record_batch`;
format 1's counterpart is :mod:`raylog.storage.validation`.

An append of format 2 is one or more whole batches back to back. Each is
validated whole (:func:`~raylog.storage.record_batch.validate_batch`: every
record, decompressed within ``max_inflated_bytes``); a compressed batch
shorter than its count is stored uncompressed
(:func:`~raylog.storage.record_batch.reencode_uncompressed`), and refused
when that is longer than ``max_message_bytes``. A control batch (a
transaction marker) is refused (:class:`~raylog.errors.ControlBatchError`):
markers are the partition's own (:mod:`raylog.storage.markers`). Nothing is
stored when any batch is refused.

Pure functions; any thread.
"""

from __future__ import annotations

from typing import NamedTuple

from raylog.errors import ControlBatchError, InvalidMessageError, MessageTooLargeError
from raylog.storage import record_batch as _record_batch
from raylog.storage.message import DEFAULT_MAX_MESSAGE_BYTES
from raylog.storage.record_batch import (
    LOG_OVERHEAD,
    MAX_BATCH_LENGTH,
    BatchHeader,
    check_frame,
    needs_reencode,
    read_header,
    reencode_uncompressed,
    stamp_into,
    validate_batch,
)

__all__ = ["PreparedBatches", "prepare_append", "stamp_batches", "scan_batches", "batch_size_at"]

#: bytes of a batch before its records (its header)
_HEADER_LENGTH_AT = 8


class PreparedBatches(NamedTuple):
    """Batches ready to store: ``data`` (their bytes, re-encoded where needed,
    not yet stamped), ``headers`` (each batch's position in ``data`` and header),
    ``records`` (the number of records, what flush counts) and ``runs``."""

    data: bytearray
    headers: list[tuple[int, BatchHeader]]
    records: int
    #: the idempotent producers' runs of the batches
    #: (:func:`~raylog.storage.batch_producers.producer_runs`), when computed
    runs: list | None = None


_prepared = PreparedBatches._make


def _compiled(name: str):
    """The compiled pass ``name`` of :mod:`raylog.storage._speedups`, or None
    (pure-Python mode, or a module built before it): looked up per call, as
    tests turn the compiled path off through ``record_batch._speedups``."""
    return getattr(_record_batch._speedups, name, None)


def batch_size_at(buf, pos: int = 0) -> int:
    """``12 + batchLength`` of the batch at ``pos`` (unchecked)."""
    return LOG_OVERHEAD + int.from_bytes(buf[pos + _HEADER_LENGTH_AT : pos + LOG_OVERHEAD], "big", signed=True)


def prepare_append(
    data, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, max_inflated_bytes: int | None = None, *,
    allow_control: bool = False,
) -> PreparedBatches:
    """Check the batches of an append (see the module docstring).

    Raises :class:`MessageTooLargeError` for an append larger than
    ``max_message_bytes`` (as format 1's sets are bounded) or a batch that
    is, :class:`InvalidMessageError` / :class:`CorruptMessageError` /
    :class:`InflatedSizeTooLargeError` for a bad one (naming its position in
    ``data``), including bytes after the last whole batch;
    :class:`ControlBatchError` for a control batch, unless ``allow_control``
    (the partition's own markers, :meth:`~raylog.storage.log.PartitionLog.append_marker`).
    """
    size = len(data)
    if size > max_message_bytes:
        raise MessageTooLargeError(
            f"an append of {size} bytes of record batches is larger than max_message_bytes "
            f"({max_message_bytes}); send smaller batches or raise max_message_bytes on the topic",
            size=size,
            limit=max_message_bytes,
        )
    if not size:
        return PreparedBatches(bytearray(), [], 0)
    compiled = _record_batch._speedups  # looked up per call: tests turn it off
    fast = getattr(compiled, "batches_prepare", None)
    bound = max_message_bytes if max_message_bytes < MAX_BATCH_LENGTH else MAX_BATCH_LENGTH
    run = None
    if fast is not None:
        # the common case first: all plain batches, all sound (what raylog's producer sends)
        run = fast(data, 0, size, bound, BatchHeader)
        if run is None:
            fast = None
        elif run[2] == size:
            pairs = run[0]
            runs = None
            if len(pairs) > 1:
                runs_of = getattr(compiled, "batches_runs", None)
                runs = None if runs_of is None else runs_of(data, 0, size)
            return _prepared((bytearray(data), pairs, run[1], runs))
    out = bytearray()
    headers: list[tuple[int, BatchHeader]] = []
    records = 0
    pos = 0
    while pos < size:
        if fast is not None:
            # the run of plain batches from pos, checked in one compiled pass;
            # the batch it stops at (compressed, control, faulty) goes the way below
            if pos:  # (the run from 0 was taken above)
                run = fast(data, pos, size, bound, BatchHeader)
            if run is None:
                fast = None
            else:
                pairs, count, stop = run
                if pairs:
                    shift = len(out) - pos
                    headers.extend([(at + shift, header) for at, header in pairs] if shift else pairs)
                    out += memoryview(data)[pos:stop]
                    records += count
                    pos = stop
                    if pos >= size:
                        break
        header = validate_batch(data, pos, max_message_bytes, max_inflated_bytes)
        if header.control and not allow_control:
            raise ControlBatchError(
                f"the batch at offset {pos} is a control batch (a transaction marker): only the partition "
                f"writes markers, for its transaction coordinator; nothing of this append was stored. Send "
                f"data batches, and end a transaction through the producer's commit or abort",
                offset=pos,
            )
        batch = memoryview(data)[pos : pos + header.size]
        if needs_reencode(header):
            batch = reencode_uncompressed(data, pos, max_message_bytes, max_inflated_bytes)
            length = len(batch) - LOG_OVERHEAD
            if length > min(max_message_bytes, MAX_BATCH_LENGTH):
                raise MessageTooLargeError(
                    f"the batch at offset {pos} holds {header.count} records in {header.size} compressed "
                    f"bytes; stored uncompressed (a batch is never shorter than its count) it takes "
                    f"{len(batch)} bytes, more than max_message_bytes ({max_message_bytes}): send it "
                    f"uncompressed or in smaller batches",
                    offset=pos,
                    size=length,
                    limit=max_message_bytes,
                )
            header = read_header(batch)
        headers.append((len(out), header))
        out += batch
        records += header.count
        pos += LOG_OVERHEAD + int.from_bytes(data[pos + 8 : pos + 12], "big")
    return PreparedBatches(out, headers, records)


def stamp_batches(prepared: PreparedBatches, base: int, leader_epoch: int = -1) -> list[tuple[int, BatchHeader]]:
    """Stamp the prepared batches in place for the log offset ``base`` (each
    batch's baseOffset is its own position); ``(offset, header)`` of each,
    headers as stored."""
    fast = getattr(_record_batch._speedups, "batches_stamp", None)
    data = prepared[0]
    if fast is not None and type(data) is bytearray:
        stamped = fast(data, 0, len(data), base, leader_epoch, BatchHeader)
        if stamped is not None:
            return stamped
    stamped = []
    for at, _header in prepared.headers:
        stamp_into(prepared.data, at, base + at, leader_epoch)
        stamped.append((base + at, read_header(prepared.data, at)))
    return stamped


def scan_batches(
    buf, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, *, base_offset: int = 0
) -> tuple[int, int, InvalidMessageError | None]:
    """Check the stored batches at the start of ``buf`` without raising, as
    :func:`~raylog.storage.validation.scan_message_set` does for format 1
    (recovery): ``(valid_bytes, count, error)``. Each batch's frame is
    checked (:func:`~raylog.storage.record_batch.check_frame`: sizes, magic,
    the crc over its records, attributes) and its baseOffset must be its log
    offset (``base_offset`` + position): a batch is stamped before it is
    stored. A batch cut off by the end of ``buf`` gives ``partial=True``."""
    n = len(buf)
    pos = count = 0
    while pos < n:
        try:
            header = check_frame(buf, pos, max_message_bytes)
        except InvalidMessageError as err:
            details = dict(err.details)
            details["offset"] = base_offset + pos
            return pos, count, type(err)(f"at offset {base_offset + pos}: {err}", **details)
        if header.base_offset != base_offset + pos:
            return pos, count, InvalidMessageError(
                f"the batch at offset {base_offset + pos} says its baseOffset is {header.base_offset}: "
                f"not a batch stored here",
                offset=base_offset + pos,
            )
        pos += header.size
        count += 1
    return pos, count, None
