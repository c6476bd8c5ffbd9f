"""The consumer's batch path: fetched message sets handed out as views.

``consumer.poll_batch(timeout_ms, max_messages)`` returns a list of
:class:`MessageBatch`, one per run of messages of one partition, with at
most ``max_messages`` messages in all. Positions, commits, errors and group
notices work exactly as for ``poll`` (a batch counts as handed out when it
is returned). A batch is a view of the fetched bytes: its columns
``offsets`` and ``timestamps`` are int64 memoryviews (``numpy.frombuffer``
takes them as they are), ``values`` / ``keys`` are memoryviews of the
fetched set, and no per-message object is made until one is asked for
(``batch[i]`` and iteration give :class:`~raylog.consumer.record.Message`
tuples; ``to_arrow()`` a ``pyarrow.RecordBatch``).

Columns, message by message, in offset order:

``offsets``, ``timestamps``
    int64 memoryviews (offset: docs/design.md §2, record ``i`` of a format-2
    batch at ``p`` reports ``p + i``; timestamp: create time, ms);
``keys``
    ``None`` for no key, else the key's bytes (a memoryview when indexed);
``values``
    the value's bytes, or ``None`` for a format-2 record with a null value
    (a tombstone), which differs from an empty value ``b""``;
``headers``
    a list per message of ``(str, bytes | None)`` pairs, in order,
    duplicates kept; an empty list for a format-1 message (which has none)
    and for a record sent without headers.

``to_arrow()`` gives the same as columns ``offset`` int64, ``timestamp``
int64, ``key`` binary (null: no key), ``value`` binary (null: a tombstone)
and ``headers`` ``list<struct<key: string, value: binary>>`` (as Spark's Kafka
source with ``includeHeaders``; a null ``value`` field for a null header
value; empty lists for format 1).

How: after the first ``poll_batch`` the consumer's fetchers index each
fetched set with the compiled ``_speedups.index`` (one pass: sizes, CRC32C,
headers; every check of the decoder) instead of building a tuple per
message. Record batches (format 2) without a codec and without headers are
indexed alike by ``_speedups.batches_index`` (every check of
``batches_decode``), with each record's next offset as a column of its own
(the batch rule of :mod:`raylog.consumer.record`); such a batch is not
:attr:`~MessageBatch.indexed` in format 1's sense (its offsets are not byte
positions): asked for :attr:`~MessageBatch.records` or cut into parts, it
builds its messages then. A set the index does not fully cover (a compressed wrapper, a bad
message) and every set without the compiled module go through the
reference decoder, so errors and wrapper offsets are the decoder's; such a
batch holds those decoded messages and the bytes they came from
(:meth:`MessageBatch.stored_bytes`: a mirror sends compressed wrappers on as
they are). ``poll`` keeps working on the same
consumer (batches are taken apart into messages).

Thread-safety: a MessageBatch is immutable and may be shared between threads.
"""

from __future__ import annotations

import bisect

from raylog.consumer.record import InnerMessage, Message, last_inner, with_next_offsets
from raylog.storage import message as _format
from raylog.storage.decoding import decode_messages
from raylog.storage.record_batch import MAX_BATCH_LENGTH, format_at

_EMPTY = memoryview(b"").cast("q")


class MessageBatch:
    """Messages of one partition, in order: an index over fetched bytes (or
    the decoded messages of a set the index does not cover)."""

    __slots__ = ("topic", "partition", "_buf", "_offsets", "_timestamps", "_bounds", "_records", "next_offset",
                 "_stored_at", "_cuts", "_nexts")

    def __init__(self, topic, partition, buf, offsets, timestamps, bounds, next_offset, records=None, nexts=None):
        self.topic = topic
        self.partition = partition
        self._buf = buf  # a memoryview of the fetched bytes (None with records)
        self._offsets = offsets  # int64 memoryviews
        self._timestamps = timestamps
        # three int64s per message: key start (-1: none), value start, value end; four in an index of
        # record batches: key start and end, value start and end (-1: a null key or value)
        self._bounds = bounds
        self._records = records  # the decoded messages, when not indexed
        #: where to resume after the batch's last message
        self.next_offset = next_offset
        self._stored_at = None  # the log offset of a decoded batch's stored bytes
        self._cuts = None  # (message index, byte position) where its stored messages start, computed once
        # an index of record batches (format 2): each record's next offset (int64s); None for format 1
        self._nexts = nexts

    @classmethod
    def of_records(cls, records: list, stored=None, stored_at: int | None = None) -> "MessageBatch":
        """A batch of decoded messages (of one partition); ``stored``: the
        bytes they were decoded from, when they are all of them (whole
        messages, compressed wrappers included, as the log stores them),
        which start at log offset ``stored_at``."""
        first = records[0]
        batch = cls(first.topic, first.partition, stored, None, None, None, records[-1].next_offset, records)
        if stored is not None:
            if stored_at is None:
                raise ValueError("stored bytes need the offset they start at")
            batch._stored_at = stored_at
        return batch

    def stored_cuts(self) -> list[int]:
        """Where a decoded batch with stored bytes can be split into parts
        that keep stored bytes of their own: the message indices ``k``
        (``0 < k < len``) before which a stored message starts (a plain one,
        or a compressed wrapper, whose inner messages are never split).
        Slicing the batch at such indices keeps the stored bytes."""
        return [k for k, _ in self._stored_starts()[1:]]

    def cut_before(self, k: int) -> int:
        """Where to split the batch at ``k`` messages or fewer so that both
        parts keep stored bytes: ``k`` for an indexed batch or one without
        stored bytes; else the last stored message start at or before ``k``
        (0 when the first stored message holds more than ``k``)."""
        if self._nexts is not None and self._records is None and k < len(self._offsets):
            # an index of record batches: back to the first record of the batch holding record k
            offsets = self._offsets
            while k > 0 and offsets[k] == offsets[k - 1] + 1:
                k -= 1
            return k
        if self._records is None or self._buf is None or k >= len(self._records):
            return k
        cuts = self.stored_cuts()
        i = bisect.bisect_right(cuts, k)
        return cuts[i - 1] if i else 0

    def _stored_starts(self) -> list[tuple[int, int]]:
        """``(message index, byte position)`` of every stored message that
        starts a message of the batch, the first at ``(0, 0)``."""
        if self._cuts is None:
            if self._records is None or self._buf is None:
                raise ValueError("only a decoded batch with stored bytes has stored messages to cut at")
            buf, records, base = self._buf, self._records, self._stored_at
            offsets = [m.offset for m in records]
            starts, pos, end = [], 0, len(buf)
            # format 1: a u32 size, then that many bytes; format 2: baseOffset, then a batchLength (§2)
            batches = format_at(buf) == 2
            while pos + (12 if batches else 4) <= end:
                k = bisect.bisect_left(offsets, base + pos)
                if k < len(records) and (not starts or k > starts[-1][0]):
                    starts.append((k, pos))
                if batches:
                    pos += 12 + int.from_bytes(buf[pos + 8 : pos + 12], "big")
                else:
                    pos += 4 + int.from_bytes(buf[pos : pos + 4], "big")
            self._cuts = starts
        return self._cuts

    def __len__(self) -> int:
        return len(self._records) if self._records is not None else len(self._offsets)

    @property
    def indexed(self) -> bool:
        """Whether the batch indexes fetched format-1 bytes (uncompressed
        messages as the log stores them, their offsets byte positions), not
        decoded messages or records of batches."""
        return self._records is None and self._nexts is None

    @property
    def records(self) -> list | None:
        """The decoded messages of a batch that is not indexed (else None).
        An index of record batches builds its messages when first asked."""
        if self._records is None and self._nexts is not None:
            self._records = [self._message(i) for i in range(len(self._offsets))]
        return self._records

    @property
    def has_stored_bytes(self) -> bool:
        """Whether :meth:`stored_bytes` can give the batch's messages as the
        log stores them: always for an indexed batch; for decoded messages
        when the batch holds all that a fetch decoded (a part of it, a part
        of a wrapper above all, has no bytes of its own)."""
        return self._records is None or self._buf is not None

    def stored_bytes(self, stop: int | None = None) -> memoryview:
        """The bytes of the first ``stop`` messages (all by default) exactly
        as the log stores them. For an indexed batch an uncompressed message
        set, the same bytes that encoding those messages again would give;
        for decoded messages (see :attr:`has_stored_bytes`) all of them only,
        compressed wrappers as they came."""
        if self._records is not None or self._nexts is not None:
            if self._buf is None:
                raise ValueError("a batch of decoded messages taken apart from their fetch has no stored bytes")
            if stop not in (None, len(self)):
                raise ValueError("the stored bytes of decoded messages cover all of them, not a part")
            return self._buf
        n = len(self._offsets)
        stop = n if stop is None else stop
        if not 0 < stop <= n:
            raise IndexError(f"stored_bytes({stop}) of a batch of {n} messages")
        # messages lie back to back in the fetched bytes, and an offset is a byte position in the log
        end = self._bounds[3 * stop - 1]
        length = (self.next_offset if stop == n else self._offsets[stop]) - self._offsets[0]
        return self._buf[end - length : end]

    @property
    def offsets(self) -> memoryview:
        """The messages' offsets (int64; inner message i of a wrapper at w reports w + i)."""
        if self._records is not None:
            return memoryview(_int64s([m.offset for m in self._records]))
        return self._offsets

    @property
    def timestamps(self) -> memoryview:
        if self._records is not None:
            return memoryview(_int64s([m.timestamp for m in self._records]))
        return self._timestamps

    @property
    def headers(self) -> list:
        """Each message's headers: a list of ``(str, bytes | None)`` (empty
        for none, and for every format-1 message)."""
        if self._records is not None:
            return [list(m.headers) for m in self._records]
        return [[] for _ in range(len(self._offsets))]

    @property
    def values(self) -> list:
        """The values, as memoryviews of the fetched bytes (bytes when
        decoded; ``None`` for a format-2 null value, a tombstone)."""
        if self._records is not None:
            return [m.value for m in self._records]
        buf, b = self._buf, self._bounds
        if self._nexts is not None:  # four bounds a record: key start, key end, value start, value end
            return [None if b[i + 2] < 0 else buf[b[i + 2] : b[i + 3]] for i in range(0, len(b), 4)]
        return [buf[b[i + 1] : b[i + 2]] for i in range(0, len(b), 3)]

    @property
    def keys(self) -> list:
        if self._records is not None:
            return [m.key for m in self._records]
        buf, b = self._buf, self._bounds
        if self._nexts is not None:
            return [None if b[i] < 0 else buf[b[i] : b[i + 1]] for i in range(0, len(b), 4)]
        return [None if b[i] < 0 else buf[b[i] : b[i + 1]] for i in range(0, len(b), 3)]

    def __getitem__(self, i):
        if self._nexts is not None and self._records is None:
            if isinstance(i, slice):
                self.records  # noqa: B018 - a part of an index of record batches: as decoded messages
            else:
                if i < 0:
                    i += len(self)
                if not 0 <= i < len(self):
                    raise IndexError("MessageBatch index out of range")
                return self._message(i)
        if isinstance(i, slice):
            if self._records is not None:
                n = len(self._records)
                start, stop, step = i.indices(n)
                if (start, stop, step) == (0, n, 1):
                    return self  # all of it: its stored bytes stay
                records = self._records[i]
                if not records:
                    return None
                if self._buf is not None and step == 1:
                    where = dict(self._stored_starts())
                    if start in where and (stop in where or stop == n):
                        # whole stored messages: the part keeps their bytes
                        begin, after = where[start], where.get(stop, len(self._buf))
                        return MessageBatch.of_records(records, self._buf[begin:after], self._stored_at + begin)
                return MessageBatch.of_records(records)
            start, stop, step = i.indices(len(self))
            if step != 1 or start >= stop:
                raise IndexError("a MessageBatch slices into a non-empty run of messages")
            b = self._bounds
            after = self.next_offset if stop == len(self) else self._offsets[stop]
            return MessageBatch(self.topic, self.partition, self._buf, self._offsets[start:stop],
                                self._timestamps[start:stop], b[3 * start : 3 * stop], after)
        if self._records is not None:
            return self._records[i]
        if i < 0:
            i += len(self)
        b, buf = self._bounds, self._buf
        key = None if b[3 * i] < 0 else bytes(buf[b[3 * i] : b[3 * i + 1]])
        value = bytes(buf[b[3 * i + 1] : b[3 * i + 2]])
        return Message(self.topic, self.partition, self._offsets[i], self._timestamps[i], key, value)

    def _message(self, i: int):
        """Record ``i`` of an index of record batches, as the decoder builds
        it: its next offset by the batch rule (:mod:`raylog.consumer.record`)."""
        b, buf = self._bounds, self._buf
        key = None if b[4 * i] < 0 else bytes(buf[b[4 * i] : b[4 * i + 1]])
        value = None if b[4 * i + 2] < 0 else bytes(buf[b[4 * i + 2] : b[4 * i + 3]])
        offset, nxt = self._offsets[i], self._nexts[i]
        if nxt == offset + 1:
            return tuple.__new__(InnerMessage, (self.topic, self.partition, offset, self._timestamps[i], key, value))
        return last_inner((self.topic, self.partition, offset, self._timestamps[i], key, value), nxt)

    def __iter__(self):
        if self._records is not None:
            return iter(self._records)
        return (self[i] for i in range(len(self)))

    def to_arrow(self):
        """A ``pyarrow.RecordBatch`` of :func:`arrow_schema` (offset,
        timestamp, key, value, headers: see the module docstring); the int64
        columns are not copied, keys and values are."""
        import pyarrow as pa  # heavy, and only this method needs it: imported here on purpose

        n = len(self)
        if self._records is None or not any(m.headers for m in self._records):
            # no message has headers (every format-1 batch): n empty lists, without a Python list each
            headers = pa.ListArray.from_arrays(_zero_offsets(n + 1), pa.array([], headers_type().value_type))
        else:
            headers = pa.array([[{"key": k, "value": v} for k, v in m.headers] for m in self._records],
                               headers_type())
        return pa.RecordBatch.from_arrays(
            [pa.array(self.offsets, pa.int64()), pa.array(self.timestamps, pa.int64()),
             pa.array([None if k is None else bytes(k) for k in self.keys], pa.binary()),
             pa.array([None if v is None else bytes(v) for v in self.values], pa.binary()),
             headers],
            schema=arrow_schema(),
        )

    def __repr__(self) -> str:
        return f"MessageBatch({self.topic}-{self.partition}, {len(self)} messages, next_offset={self.next_offset})"


def headers_type():
    """The Arrow type of a headers column: ``list<struct<key: string, value: binary>>``."""
    import pyarrow as pa

    return pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))


def arrow_schema():
    """The schema of :meth:`MessageBatch.to_arrow`."""
    import pyarrow as pa

    return pa.schema([pa.field("offset", pa.int64()), pa.field("timestamp", pa.int64()),
                      pa.field("key", pa.binary()), pa.field("value", pa.binary()),
                      pa.field("headers", headers_type())])


def _zero_offsets(n: int):
    """``n`` zero list offsets (int32): the offsets of ``n - 1`` empty lists."""
    import numpy as np
    import pyarrow as pa

    return pa.array(np.zeros(n, dtype=np.int32))


def _int64s(values: list):
    import array

    return array.array("q", values)


def fetched_batch(data, offset: int, tp, max_message: int, max_inflated: int):
    """The records of a fetched set as a fetcher hands them over, and the
    bytes they take: a :class:`MessageBatch` indexing ``data`` when the
    compiled index covers all of its whole messages, else the decoder's
    messages (which raises for a bad message, as ``poll`` does)."""
    fast = _format._speedups
    if fast is not None and format_at(data) == 2 and hasattr(fast, "batches_index"):
        mv = memoryview(data)
        offsets, timestamps, bounds, nexts, stop = fast.batches_index(mv, 0, len(mv), min(max_message, MAX_BATCH_LENGTH))
        if offsets and (stop == len(mv) or _cut_batch(mv, stop, max_message)):
            # plain batches without headers, every check made: the columns, no message built
            nexts = memoryview(nexts).cast("q")
            batch = MessageBatch(tp[0], tp[1], mv[:stop], memoryview(offsets).cast("q"),
                                 memoryview(timestamps).cast("q"), memoryview(bounds).cast("q"), nexts[-1],
                                 nexts=nexts)
            batch._stored_at = offset
            return batch, stop
    elif fast is not None:
        mv = memoryview(data)
        offsets, timestamps, bounds, used, status = fast.index(mv, offset, max_message)
        if offsets and (status == 0 or (status == 1 and _whole_tail(mv, used, max_message))):
            batch = MessageBatch(tp[0], tp[1], mv, memoryview(offsets).cast("q"), memoryview(timestamps).cast("q"),
                                 memoryview(bounds).cast("q"), offset + used)
            return batch, used
    records, consumed = decode_messages(
        data, offset, max_message_bytes=max_message, record_type=Message, prefix=tp, max_inflated_bytes=max_inflated
    )
    records = with_next_offsets(records, offset + consumed)
    if not records:
        return records, consumed
    # the bytes decoded are whole messages from ``offset``: kept, so that the batch can be sent on as it came
    return MessageBatch.of_records(records, stored=memoryview(data)[:consumed], stored_at=offset), consumed


def _cut_batch(mv, used: int, max_message: int) -> bool:
    """Whether the bytes after ``used`` are only a record batch cut by the
    end of the fetch (left for the next one)."""
    rest = len(mv) - used
    if rest < 12:
        return True
    length = int.from_bytes(mv[used + 8 : used + 12], "big", signed=True)
    return 49 <= length <= min(max_message, MAX_BATCH_LENGTH) and 12 + length > rest


def _whole_tail(mv, used: int, max_message: int) -> bool:
    """Whether the bytes after ``used`` are only a message cut by the end of
    the fetch (left for the next one), not a bad one."""
    rest = len(mv) - used
    if rest < 4:
        return True
    size = int.from_bytes(mv[used : used + 4], "big")
    return _format.MIN_MESSAGE_SIZE <= size <= max_message and 4 + size > rest


class BatchList(list):
    """The list ``poll_batch`` fills: one batch per run handed over; its
    length is the number of messages (what the consumer's take counts)."""

    __slots__ = ("messages",)

    def __init__(self):
        super().__init__()
        self.messages = 0

    def extend(self, handed) -> None:
        self.append(handed if isinstance(handed, MessageBatch) else MessageBatch.of_records(handed))
        self.messages += len(handed)

    def __len__(self) -> int:
        return self.messages

    def __bool__(self) -> bool:
        return self.messages > 0
