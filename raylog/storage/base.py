"""The log interface: what the data server and the partition actor need of a
partition's log, so that more than one kind of log can serve them.

Two implementations: :class:`~raylog.storage.log.PartitionLog` (segment
files on local disk, the real one) and :class:`~raylog.storage.memory.MemoryLog`
(bytes in memory, for tests and tools). Both keep the contract of docs/design.md §2
and §3: offsets are byte positions, appends are validated whole message sets
and become visible at a flush, reads hand out bytes below the high watermark
starting on a message boundary.

A read returns a :class:`Slice`: the bytes from an offset, which the data
server sends as they are with :meth:`Slice.send_to` (``os.sendfile`` from a
segment file for :class:`~raylog.storage.log.FileSlice`, one ``sendall`` for
an in-memory :class:`BytesSlice`): the server never looks at what kind of
log it serves.
"""

from __future__ import annotations

import socket
from typing import NamedTuple, Protocol, Sequence, runtime_checkable

from raylog.config import TopicConfig


@runtime_checkable
class Slice(Protocol):
    """Bytes of a log from ``offset``: ``length`` of them."""

    offset: int
    length: int

    def send_to(self, sock: socket.socket, length: int) -> int:
        """Send the first ``length`` bytes to ``sock`` (blocking); return how
        many were sent (fewer only when the log lost them meanwhile, e.g. a
        segment deleted and cut under the reader)."""

    def tobytes(self) -> bytes:
        """The bytes themselves (for readers in the same process)."""


class BytesSlice(NamedTuple):
    """A :class:`Slice` of bytes held in memory."""

    data: bytes
    offset: int

    @property
    def length(self) -> int:
        return len(self.data)

    def send_to(self, sock: socket.socket, length: int) -> int:
        sock.sendall(memoryview(self.data)[:length])
        return min(length, len(self.data))

    def tobytes(self) -> bytes:
        return self.data


@runtime_checkable
class Log(Protocol):
    """A partition's log, as the data server and the partition actor use it.

    Thread-safety: appends, flushes and ``close`` may come from any thread
    (they serialize inside the log); reads and waits from any number of
    threads at once.
    """

    @property
    def config(self) -> TopicConfig:
        """The topic's settings (``max_message_bytes`` bounds a joined append)."""

    @property
    def high_watermark(self) -> int:
        """The end of the flushed, readable bytes."""

    @property
    def log_start_offset(self) -> int:
        """The first offset kept (retention moves it forward)."""

    @property
    def log_end_offset(self) -> int:
        """The end of the appended bytes (flushed or not)."""

    def append(self, message_set: bytes, *, leader_epoch: int = -1) -> int:
        """Validate and append a message set, or record batches (format 2,
        stamped with their offsets and ``leader_epoch``); return its base offset."""

    def append_sequenced(
        self, message_set, producer_id: int, producer_epoch: int, first_sequence: int,
        lengths: Sequence[int], *, name: str = "",
    ) -> int:
        """Append the sets of an idempotent producer (duplicates are not
        stored again: their first base offset is returned)."""

    def flush(self) -> bool:
        """Make every appended byte durable and readable; whether it moved
        the high watermark."""

    def read(self, offset: int, max_bytes: int) -> Slice:
        """Bytes from the message boundary ``offset``: at most ``max_bytes``
        but at least the whole first message, below the high watermark."""

    def wait_for_data(self, offset: int, timeout_s: float) -> bool:
        """Block until the high watermark passes ``offset`` (or timeout, or close)."""

    def offset_for_time(self, timestamp_ms: int) -> int:
        """The first offset whose message is at or after ``timestamp_ms``
        (the high watermark when none is)."""

    def before_acks_all(self) -> None:
        """Called before an ``acks="all"`` append: a replicated leader raises
        :class:`~raylog.errors.NotEnoughReplicasError` here while its ISR is
        below ``min_insync_replicas`` (a single log does nothing)."""

    def close(self) -> None:
        """Stop serving; later calls raise :class:`~raylog.errors.ClosedError`."""


class LogBasics:
    """What the file log and the in-memory log hold alike: the topic's
    config and the high watermark (set by each log as it flushes)."""

    def __init__(self, config: TopicConfig):
        self._config = config
        self._hw = 0

    @property
    def config(self) -> TopicConfig:
        return self._config

    @property
    def high_watermark(self) -> int:
        """Bytes below this offset are flushed and visible to readers."""
        return self._hw

    def before_acks_all(self) -> None:
        """A log of one replica has no ISR to check."""
