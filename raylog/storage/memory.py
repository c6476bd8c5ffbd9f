"""A partition log in memory: the :class:`~raylog.storage.base.Log` contract
without files.

It validates and stores message sets exactly as the file log does (the same
:func:`~raylog.storage.validation.validate_message_set`, the same offsets:
byte positions from 0), remembers idempotent producers' sequences with the
same :class:`~raylog.storage.producer_state.ProducerStateTable` (without a
journal), makes appends readable at :meth:`MemoryLog.flush` (or at once with
``flush_on_append``) and hands out :class:`~raylog.storage.base.BytesSlice`
reads. Nothing survives the process: it is for tests (the data channel's
tests run against both logs) and for tools that need a log without a disk.
No retention: the log start stays 0. Record batches (format 2) are
stored beside messages (no segments here, so no roll between formats), and
an offset inside a batch reads that batch; a read ends where the format
changes, as a file log's read ends with its segment. Markers are stored
(:meth:`MemoryLog.append_marker`) but no transaction is tracked: no last
stable offset, no aborted-transactions index (the file log's).

Thread-safety: appends, flushes and ``close`` serialize on one lock; reads
take the same lock briefly; ``wait_for_data`` waits on a condition.
"""

from __future__ import annotations

import bisect
import threading
from typing import Sequence

from raylog.config import TopicConfig
from raylog.errors import ClosedError, CorruptMessageError, InvalidOffsetError, OffsetOutOfRangeError
from raylog.storage.base import BytesSlice, LogBasics
from raylog.storage.message import CODEC_MASK, HEADER_SIZE, LOG_OVERHEAD
from raylog.storage.message_errors import inside_wrapper
from raylog.storage.batch_producers import BatchProducerState
from raylog.storage.keyed import require_keys
from raylog.storage.batch_validation import batch_size_at, prepare_append, stamp_batches
from raylog.storage.markers import encode_marker
from raylog.storage.producer_state import ProducerStateTable
from raylog.storage.record_batch import format_at
from raylog.storage.validation import validate_append

_TS_AT = 10  # a message's timestamp: after size, crc, magic, attributes
_BATCH_TS_AT = 35  # a record batch's maxTimestamp (format 2)


class MemoryLog(LogBasics):
    """The log of one partition in memory (see the module docstring)."""

    def __init__(self, config: TopicConfig = TopicConfig(), *, flush_on_append: bool = False):
        super().__init__(config)
        self._flush_on_append = flush_on_append
        self._data = bytearray()
        self._starts: list[int] = []  # the offset of every outer message, in order
        self._changes: list[int] = []  # offsets where the format changes (1 <-> 2), in order
        self._format: int | None = None  # the format of the last append
        self._closed = False
        self._producers = ProducerStateTable(None, config.max_producer_ids)
        self._batch_producers = BatchProducerState(None, config.max_producer_ids)
        self._cond = threading.Condition(threading.Lock())

    # -- the contract's properties ------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        return 0

    @property
    def log_end_offset(self) -> int:
        return len(self._data)

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        return f"MemoryLog(hw={self._hw}, end={len(self._data)})"

    # -- writes ----------------------------------------------------------------------

    def append(self, message_set: bytes, *, leader_epoch: int = -1) -> int:
        if format_at(message_set) == 2:
            return self._append_batches(message_set, leader_epoch)
        self._validate(message_set)
        with self._cond:
            self._check_open()
            return self._append_locked(message_set)

    def _append_batches(self, data, leader_epoch: int) -> int:
        """Record batches, as the file log stores them (validated, re-encoded
        where shorter than their count, stamped, idempotent ones judged)."""
        prepared = prepare_append(data, self._config.max_message_bytes, self._config.max_inflated_limit)
        if self._config.compacted:
            require_keys(prepared.data, self._config.max_message_bytes, self._config.max_inflated_limit)
        with self._cond:
            self._check_open()
            if not prepared.records:
                return len(self._data)
            stored = self._batch_producers.judge(prepared.headers, name="memory log", runs=prepared.runs)
            if stored is not None:
                return stored
            base = len(self._data)
            self._note_format(2, base)
            batches = stamp_batches(prepared, base, leader_epoch)
            self._starts.extend(offset for offset, _header in batches)
            self._data += prepared.data
            self._batch_producers.remember(batches, prepared.runs)
            if self._flush_on_append:
                self._advance()
            return base

    def append_marker(self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int, *,
                      leader_epoch: int = -1, timestamp_ms: int | None = None) -> int:
        """Store a transaction marker as the file log does
        (:meth:`~raylog.storage.log.PartitionLog.append_marker`); this log
        keeps no transaction state (no last stable offset, no index)."""
        batch = encode_marker(producer_id, producer_epoch, commit, coordinator_epoch, timestamp_ms)
        prepared = prepare_append(batch, self._config.max_message_bytes, allow_control=True)
        with self._cond:
            self._check_open()
            base = len(self._data)
            self._note_format(2, base)
            stamp_batches(prepared, base, leader_epoch)
            self._starts.append(base)
            self._data += prepared.data
            if self._flush_on_append:
                self._advance()
            return base

    def append_sequenced(
        self, message_set, producer_id: int, producer_epoch: int, first_sequence: int,
        lengths: Sequence[int], *, name: str = "",
    ) -> int:
        self._validate(message_set)
        with self._cond:
            self._check_open()
            stored = self._producers.judge(producer_id, producer_epoch, first_sequence, len(lengths), topic_partition=name)
            if stored is not None:
                return stored
            base = self._append_locked(message_set)
            self._producers.remember(producer_id, producer_epoch, first_sequence, base, lengths)
            return base

    def _validate(self, message_set) -> None:
        validate_append(message_set, self._config.max_message_bytes, self._config.max_inflated_limit)
        if self._config.compacted:
            require_keys(message_set, self._config.max_message_bytes, self._config.max_inflated_limit)

    def _note_format(self, fmt: int, base: int) -> None:
        if self._format is not None and fmt != self._format:
            self._changes.append(base)
        self._format = fmt

    def _append_locked(self, message_set) -> int:
        base = len(self._data)
        self._note_format(1, base)
        view = memoryview(message_set)
        pos = 0
        while pos < len(view):  # validated: whole messages
            self._starts.append(base + pos)
            pos += LOG_OVERHEAD + int.from_bytes(view[pos : pos + 4], "big")
        self._data += message_set
        if self._flush_on_append:
            self._advance()
        return base

    def flush(self) -> bool:
        with self._cond:
            self._check_open()
            return self._advance()

    def _advance(self) -> bool:
        moved = self._hw != len(self._data)
        self._hw = len(self._data)
        self._cond.notify_all()
        return moved

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the in-memory partition log is closed")

    # -- reads -----------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int) -> BytesSlice:
        with self._cond:
            self._check_open()
            hw = self._hw
            if offset < 0 or offset > hw:
                raise OffsetOutOfRangeError(
                    f"offset {offset} is outside the log [0, {hw}]; seek to the earliest (0) or latest ({hw}) offset",
                    offset=offset,
                    earliest=0,
                    latest=hw,
                )
            if offset == hw:
                return BytesSlice(b"", offset)
            offset, first = self._message_at(offset)
            # a read holds one format, as a file log's lies within one segment
            i = bisect.bisect_right(self._changes, offset)
            limit = min(hw, self._changes[i]) if i < len(self._changes) else hw
            end = min(limit, offset + max(first, max_bytes))
            return BytesSlice(bytes(self._data[offset:end]), offset)

    def _message_at(self, offset: int) -> tuple[int, int]:
        """``(its offset, its length)`` of the message at ``offset``, or of the
        record batch that holds ``offset`` (an offset inside a batch reads
        that batch, docs/design.md §2)."""
        i = bisect.bisect_right(self._starts, offset) - 1
        if i >= 0 and format_at(self._data, self._starts[i]) == 2:
            start = self._starts[i]
            length = batch_size_at(self._data, start)
            if offset < start + length:
                return start, length
        return offset, self._message_length(offset)

    def _message_length(self, offset: int) -> int:
        """The whole length of the message at ``offset`` (a boundary, else InvalidOffsetError)."""
        i = bisect.bisect_left(self._starts, offset)
        if i == len(self._starts) or self._starts[i] != offset:
            if i > 0 and self._data[self._starts[i - 1] + 9] & CODEC_MASK:
                high = self._starts[i] if i < len(self._starts) else len(self._data)
                raise inside_wrapper(offset, self._starts[i - 1], high)
            raise InvalidOffsetError(
                f"offset {offset} is not the start of a message in the log; use an offset "
                f"returned by the log (a message's offset or a committed offset)",
                offset=offset,
            )
        size = int.from_bytes(self._data[offset : offset + 4], "big")
        if size < HEADER_SIZE - LOG_OVERHEAD:
            raise CorruptMessageError(f"message at offset {offset} has an impossible size {size}", offset=offset)
        return LOG_OVERHEAD + size

    def wait_for_data(self, offset: int, timeout_s: float) -> bool:
        with self._cond:
            self._cond.wait_for(lambda: self._hw > offset or self._closed, max(0.0, timeout_s))
            return self._hw > offset

    def offset_for_time(self, timestamp_ms: int) -> int:
        with self._cond:
            hw, data = self._hw, self._data
            for start in self._starts:
                if start >= hw:
                    break
                at = _BATCH_TS_AT if format_at(data, start) == 2 else _TS_AT  # a batch's maxTimestamp
                if int.from_bytes(data[start + at : start + at + 8], "big", signed=True) >= timestamp_ms:
                    return start
            return hw
