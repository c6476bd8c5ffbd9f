"""What a read_committed reader drops (docs/design.md §6): the records of
aborted transactions in the bytes of a read_committed FETCH, by Kafka's rule
(its consumer's ``AbortedTransaction`` handling). Shared by raylog's
consumer (:mod:`raylog.consumer.fetcher`) and the range readers of Ray Data
and Spark (:mod:`raylog.read.reader`). Pure functions; no state."""

from __future__ import annotations

from raylog.errors import InvalidMessageError
from raylog.storage import record_batch

__all__ = ["aborted_ranges", "drop_aborted"]


def aborted_ranges(data, aborted) -> list[tuple[int, int]]:
    """The ``[start, end)`` offsets of the batches in ``data`` whose records
    belong to an aborted transaction, by Kafka's rule: a transactional batch
    of producer ``P`` at offset ``o`` is aborted when one of ``aborted``
    (``(producer id, first offset, abort marker offset)``, a read_committed
    FETCH's) is ``P``'s with ``first offset <= o < marker offset``. Control
    batches are left to the decoders (they never hand them out). Bytes that
    are not format-2 batches hold no transaction (none). Pure."""
    if not aborted or record_batch.format_at(data) != 2:
        return []
    by_producer: dict[int, list[tuple[int, int]]] = {}
    for producer_id, first, last in aborted:
        by_producer.setdefault(producer_id, []).append((first, last))
    ranges = []
    try:
        for _, header in record_batch.iter_batches(data):
            if not header.transactional or header.control:
                continue
            spans = by_producer.get(header.producer_id)
            if spans and any(first <= header.base_offset < last for first, last in spans):
                ranges.append((header.base_offset, header.next_offset))
    except InvalidMessageError:
        pass  # the decoder reports bad bytes where they are; the batches before them are walked
    return ranges


def drop_aborted(records, ranges) -> list:
    """``records`` (messages with an ``offset``) without those in ``ranges``
    (:func:`aborted_ranges`)."""
    if not ranges:
        return records
    return [m for m in records if not any(start <= m.offset < end for start, end in ranges)]
