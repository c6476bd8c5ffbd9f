"""The time index of a segment (docs/design.md §3): ``<base offset, 20 digits>.timeindex``.

A sparse map from time to byte offset, so that a reader can start at the
first message written at or after a time (``OFFSETS_FOR_TIME``,
``consumer.seek_to_timestamp``, Spark's ``startingTimestamp``) without
reading the partition from its start. The file is a run of 20-byte entries,
big-endian::

     field          type  bytes    meaning
  1. max timestamp  i64   0..8     the largest timestamp of every message of the
                                   segment that starts before ``offset``
  2. offset         i64   8..16    a log offset (a message boundary) in the segment
  3. crc            u32   16..20   CRC32C of bytes 0..16 of the entry

Entries are in offset order, so their max timestamps never decrease. One is
added at an append that starts at least :data:`INDEX_INTERVAL_BYTES` after
the previous entry (it names the append's first byte), so the index holds
about one entry per 4 KiB of log. A lookup of time ``t`` starts at the last
entry whose max timestamp is below ``t`` (every message before it is older
than ``t``) and reads messages from there until one has a timestamp at or
after ``t``: at most about one interval plus one append set is read.

Both formats (docs/design.md §2; a segment holds one, ``segment.format``):
in a segment of format 2 the entries name batch positions and the time of
a batch is its maxTimestamp (field 9), so a lookup lands on the batch that
holds the first record at or after the time.

Timestamps are the producers' create times (message field 5); a compressed
wrapper carries the largest time of its inner messages, so a lookup lands on
the wrapper that holds the first message at or after the time, and the
reader may see a few earlier inner messages of that wrapper.

Durability: the index is a hint and is never synced. When a segment is
opened, the entries that are whole, match their CRC, grow in offset and
time and lie inside the segment are kept, and the messages after the last
one are read again on the first append or lookup (that is how recovery
rebuilds it, after a crash or a truncation); a missing or damaged file is
rebuilt the same way (a file of the older 16-byte entries fails the CRC
and is rebuilt too). The index is also checked against the log: the entry
a lookup starts from must hold a whole message with a matching CRC, else
the index of that segment is rebuilt from the log (logged as a warning),
so a wrong index never gives a wrong answer. It is deleted with its
segment.

Thread-safety: the owning log's writer calls :meth:`TimeIndex.on_append`
and :meth:`TimeIndex.truncate` under its lock; :meth:`TimeIndex.lookup`
may run in any thread, and takes the index's own lock.
"""

from __future__ import annotations

import bisect
import logging
import os
import struct
import threading

from crc32c import crc32c

from raylog.storage.message import LOG_OVERHEAD
from raylog.storage.owner_only import FILE_MODE, private_opener as _private_opener
from raylog.storage.resync import message_at
from raylog.storage.message import _speedups  # None in pure-Python mode

log = logging.getLogger(__name__)

SUFFIX = ".timeindex"
#: an entry every this many bytes of log (at append boundaries)
INDEX_INTERVAL_BYTES = 4096
ENTRY = struct.Struct(">qqI")
#: the fields an entry's CRC covers
_ENTRY_FIELDS = struct.Struct(">qq")
#: bytes read at a time when catching up or looking up
READ_CHUNK_BYTES = 256 * 1024
_SIZE = struct.Struct(">I")
_TS_AT = 10  # the timestamp's position in a message (after size, crc, magic, attributes)
_TS = struct.Struct(">q")
_NO_TIME = -(1 << 63)


# format 2: a batch's size is 12 + batchLength (bytes 8..12), its time the maxTimestamp (bytes 35..43)
_BATCH_LENGTH = struct.Struct(">i")
_BATCH_LENGTH_AT = 8
_BATCH_OVERHEAD = 12
_BATCH_TS_AT = 35
_BATCH_MIN = 61  # a whole batch header


def batch_timestamps(data, start: int = 0, end: int | None = None) -> tuple[int, int]:
    """:func:`timestamps` for record batches: ``(largest maxTimestamp, bytes of
    whole batches)`` in ``data[start:end]``."""
    end = len(data) if end is None else end
    largest = _NO_TIME
    pos = start
    while end - pos >= _BATCH_MIN:
        nxt = pos + _frame_size(data, pos, 2)
        if nxt - pos < _BATCH_MIN or nxt > end:
            break
        (ts,) = _TS.unpack_from(data, pos + _BATCH_TS_AT)
        if ts > largest:
            largest = ts
        pos = nxt
    return largest, pos - start


def _frame_size(data, pos: int, fmt) -> int:
    """The whole length of the message (format 1) or batch (2) at ``pos``."""
    if fmt == 2:
        return _BATCH_OVERHEAD + _BATCH_LENGTH.unpack_from(data, pos + _BATCH_LENGTH_AT)[0]
    return LOG_OVERHEAD + _SIZE.unpack_from(data, pos)[0]


def _frame_layout(fmt) -> tuple[int, int]:
    """``(bytes needed to read a frame's size and time, the time's position)``."""
    if fmt == 2:
        return _BATCH_TS_AT + 8, _BATCH_TS_AT
    return LOG_OVERHEAD + _TS_AT + 8, _TS_AT


def encode_entry(max_ts: int, offset: int) -> bytes:
    fields = _ENTRY_FIELDS.pack(max_ts, offset)
    return fields + crc32c(fields).to_bytes(4, "big")


def index_name(base_offset: int) -> str:
    return f"{base_offset:020d}{SUFFIX}"


def timestamps(data, start: int = 0, end: int | None = None) -> tuple[int, int]:
    """``(largest timestamp, bytes of whole messages)`` of the messages in
    ``data[start:end]`` (a message cut by ``end`` is left out)."""
    end = len(data) if end is None else end
    unpack_size = _SIZE.unpack_from
    unpack_ts = _TS.unpack_from
    largest = _NO_TIME
    pos = start
    while end - pos >= LOG_OVERHEAD + _TS_AT + 4:
        (size,) = unpack_size(data, pos)
        nxt = pos + LOG_OVERHEAD + size
        if size < _TS_AT + 4 or nxt > end:
            break
        (ts,) = unpack_ts(data, pos + _TS_AT)
        if ts > largest:
            largest = ts
        pos = nxt
    return largest, pos - start


#: the reference above, kept for tests and the pure-Python mode
timestamps_reference = timestamps
if getattr(_speedups, "timestamps", None) is not None:  # (a module built before it lacks it)
    # The same pass compiled (it runs on every append): the results are the
    # reference's exactly (tests compare both).
    def timestamps(data, start: int = 0, end: int | None = None) -> tuple[int, int]:  # noqa: F811
        return _speedups.timestamps(data, start, len(data) if end is None else end)


batch_timestamps_reference = batch_timestamps
if getattr(_speedups, "batches_largest_ts", None) is not None:
    # likewise for record batches (every format-2 append)
    def batch_timestamps(data, start: int = 0, end: int | None = None) -> tuple[int, int]:  # noqa: F811
        return _speedups.batches_largest_ts(data, start, len(data) if end is None else end)


class TimeIndex:
    """The time index of one segment; see the module docstring."""

    __slots__ = ("base_offset", "path", "_times", "_offsets", "_max_ts", "_covered", "_lock", "_fd")

    def __init__(self, directory: str, base_offset: int):
        self.base_offset = base_offset
        self.path = os.path.join(directory, index_name(base_offset))
        self._times: list[int] = []
        self._offsets: list[int] = []
        self._max_ts = _NO_TIME  # largest timestamp of the messages before _covered
        self._covered = base_offset  # log offset up to which messages are accounted for
        self._lock = threading.Lock()
        self._fd: int | None = None

    @classmethod
    def open(cls, directory: str, base_offset: int, end_offset: int) -> "TimeIndex":
        """The index of the segment ``[base_offset, end_offset)``: its file's
        whole entries inside the segment (the rest is rebuilt when needed)."""
        index = cls(directory, base_offset)
        try:
            with open(index.path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            raw = b""
        except OSError as err:
            log.warning("time index %s unreadable (%s); rebuilding it", index.path, err)
            raw = b""
        last_ts, last_offset = _NO_TIME, base_offset
        kept = 0
        for ts, offset, crc in ENTRY.iter_unpack(raw[: len(raw) - len(raw) % ENTRY.size]):
            if crc != crc32c(_ENTRY_FIELDS.pack(ts, offset)):
                log.warning("time index %s is damaged at entry %d (CRC mismatch); rebuilding it from there",
                            index.path, kept)
                break
            if offset <= last_offset or offset >= end_offset or ts < last_ts:
                break  # past the segment's end (truncated by recovery) or damaged
            index._times.append(ts)
            index._offsets.append(offset)
            last_ts, last_offset = ts, offset
            kept += 1
        if index._offsets:
            index._max_ts = index._times[-1]
            index._covered = index._offsets[-1]
        if kept * ENTRY.size != len(raw):
            index._rewrite()
        return index

    # -- writer (under the log's lock) -------------------------------------------------

    def on_append(self, segment, message_set, offset: int) -> None:
        """Account for ``message_set`` appended at log ``offset`` of ``segment``."""
        with self._lock:
            if self._covered < offset:
                self._catch_up(segment, offset)
            if offset - (self._offsets[-1] if self._offsets else self.base_offset) >= INDEX_INTERVAL_BYTES:
                self._add(self._max_ts, offset)
            if getattr(segment, "format", 1) == 2:
                largest, _ = batch_timestamps(message_set)
            else:
                largest, _ = timestamps(message_set)
            if largest > self._max_ts:
                self._max_ts = largest
            self._covered = offset + len(message_set)

    def truncate(self, end_offset: int) -> None:
        """The segment was cut at ``end_offset``: drop what lies past it."""
        with self._lock:
            keep = bisect.bisect_left(self._offsets, end_offset)
            if keep < len(self._offsets) or self._covered > end_offset:
                del self._times[keep:], self._offsets[keep:]
                self._max_ts = self._times[-1] if self._times else _NO_TIME
                self._covered = self._offsets[-1] if self._offsets else self.base_offset
                self._rewrite()

    def delete(self) -> None:
        with self._lock:
            self._close_fd()
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    def close(self) -> None:
        with self._lock:
            self._close_fd()

    # -- readers --------------------------------------------------------------------

    def lookup(self, segment, timestamp_ms: int, end_offset: int) -> int | None:
        """The offset of the first message of ``segment`` below ``end_offset``
        whose timestamp is at or after ``timestamp_ms``, or None."""
        with self._lock:
            if self._covered < end_offset:
                self._catch_up(segment, end_offset)
            i = bisect.bisect_left(self._times, timestamp_ms)  # entries [0, i) have max < t
            start = self._offsets[i - 1] if i else self.base_offset
            if i and not self._holds_message(segment, start, end_offset):
                # Checked against the log: the entry is no message boundary, so
                # the index is wrong (damaged, or left from another log). Rebuild.
                log.warning("time index %s: entry at offset %d is not a message of the segment; rebuilding "
                            "the index from the log", self.path, start)
                self._reset()
                self._catch_up(segment, end_offset)
                i = bisect.bisect_left(self._times, timestamp_ms)
                start = self._offsets[i - 1] if i else self.base_offset
        return _scan_for(segment, start, end_offset, timestamp_ms)

    @staticmethod
    def _holds_message(segment, offset: int, end_offset: int) -> bool:
        base = segment.base_offset
        read = lambda at, length: segment.read_at(at - base, length)  # noqa: E731
        return message_at(read, offset, max(end_offset, segment.end_offset), segment.end_offset - offset) is not None

    def _reset(self) -> None:
        """Forget every entry (lock held): the index is rebuilt from the segment."""
        self._times, self._offsets = [], []
        self._max_ts, self._covered = _NO_TIME, self.base_offset
        self._rewrite()

    def boundary_before(self, offset: int) -> int:
        """The offset of the last entry at or before ``offset`` (a message
        boundary when the index is right; callers check it), else the base."""
        with self._lock:
            i = bisect.bisect_right(self._offsets, offset)
            return self._offsets[i - 1] if i else self.base_offset

    # -- internals ------------------------------------------------------------------

    def _catch_up(self, segment, end_offset: int) -> None:
        """Account for the messages in ``[_covered, end_offset)`` (after opening)."""
        pos = self._covered
        last = self._offsets[-1] if self._offsets else self.base_offset
        fmt = getattr(segment, "format", 1)
        need, ts_at = _frame_layout(fmt)
        while pos < end_offset:
            data = segment.read_at(pos - segment.base_offset, min(READ_CHUNK_BYTES, end_offset - pos))
            if not data:
                break
            # entries at message boundaries, one per interval
            p = 0
            n = len(data)
            while n - p >= need:
                length = _frame_size(data, p, fmt)
                if p + length > n or (fmt == 2 and length < need):  # (a batch's length may be negative)
                    break
                if pos + p - last >= INDEX_INTERVAL_BYTES:
                    self._add(self._max_ts, pos + p)
                    last = pos + p
                (ts,) = _TS.unpack_from(data, p + ts_at)
                if ts > self._max_ts:
                    self._max_ts = ts
                p += length
            if p == 0:
                if len(data) >= need:
                    # one message larger than the chunk: read it whole
                    whole = segment.read_at(pos - segment.base_offset, _frame_size(data, 0, fmt))
                    largest, used = (batch_timestamps if fmt == 2 else timestamps)(whole)
                    if used:
                        self._max_ts = max(self._max_ts, largest)
                        pos += used
                        continue
                break
            pos += p
        self._covered = pos

    def _add(self, max_ts: int, offset: int) -> None:
        self._times.append(max_ts)
        self._offsets.append(offset)
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
            os.write(self._fd, encode_entry(max_ts, offset))
        except OSError as err:  # a hint only: the lookup still works from memory
            log.warning("cannot write the time index %s: %s", self.path, err)

    def _rewrite(self) -> None:
        self._close_fd()
        try:
            tmp = self.path + ".tmp"
            with open(tmp, "wb", opener=_private_opener) as f:
                f.write(b"".join(encode_entry(t, o) for t, o in zip(self._times, self._offsets)))
            os.replace(tmp, self.path)
        except OSError as err:
            log.warning("cannot rewrite the time index %s: %s", self.path, err)

    def _close_fd(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None


def _scan_for(segment, start: int, end: int, timestamp_ms: int) -> int | None:
    """The first message in ``[start, end)`` of ``segment`` with a timestamp at or after the time."""
    pos = start
    fmt = getattr(segment, "format", 1)
    need, ts_at = _frame_layout(fmt)
    while pos < end:
        data = segment.read_at(pos - segment.base_offset, min(READ_CHUNK_BYTES, end - pos))
        if not data:
            return None
        p = 0
        n = len(data)
        while n - p >= need:
            length = _frame_size(data, p, fmt)
            if p + length > n and p:
                break
            (ts,) = _TS.unpack_from(data, p + ts_at)
            if ts >= timestamp_ms:
                return pos + p
            if fmt == 2 and length < need:
                return None  # not a batch (a negative length would walk back)
            p += length
        if p == 0:
            return None
        pos += p
    return None
