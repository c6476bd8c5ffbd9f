"""The key rule of a compacted topic (docs/design.md section 3): every record
has a key, since the cleaner keeps the latest record of each key and a record
without one could never be cleaned. :func:`require_keys` checks a message set
(format 1) or a run of record batches (format 2) before the log appends it;
a keyless record refuses the whole append with
:class:`~raylog.errors.MissingKeyError`, nothing is written.

Stateless; any thread.
"""

from __future__ import annotations

from raylog.errors import MissingKeyError
from raylog.storage.decoding import decode_messages
from raylog.storage.record_batch import decode_batch, format_at, iter_batches


def require_keys(data, max_message_bytes: int, max_inflated_bytes: int | None = None, *, name: str = "") -> None:
    """Raise :class:`MissingKeyError` (with ``offset``, the record's position
    in ``data`` as a log of its own would number it) if a record of ``data``
    has no key. ``data`` was validated already (format 1: a message set;
    format 2: record batches, control batches passed over: their records are
    transaction markers, not the application's). ``name`` (topic-partition)
    goes into the message."""
    where = f" of {name}" if name else ""
    if format_at(data) == 2:
        for pos, header in iter_batches(data):
            if header.control:
                continue
            batch = decode_batch(data, pos, max_message_bytes=max_message_bytes,
                                 max_inflated_bytes=max_inflated_bytes)
            for index, record in enumerate(batch.records):
                if record.key is None:
                    raise _missing(where, pos + index, f"record {index} of the batch at byte {pos}")
        return
    records, _consumed = decode_messages(data, 0, max_message_bytes=max_message_bytes, partial_tail_ok=False,
                                         max_inflated_bytes=max_inflated_bytes)
    for offset, _timestamp, key, _value in records:
        if key is None:
            raise _missing(where, offset, f"the message at byte {offset}")


def _missing(where: str, offset: int, what: str) -> MissingKeyError:
    return MissingKeyError(
        f"{what} of the set has no key, and the topic{where} is compacted (cleanup_policy holds "
        f"'compact'): nothing of the set was stored; give every record a key, or send keyless "
        f"records to a topic with cleanup_policy='delete'",
        offset=offset,
    )
