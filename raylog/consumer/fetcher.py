"""One partition's fetcher: a thread that long-polls the partition's data
server from a position on and hands whole messages to the consumer.

A fetcher first **resolves** its starting position when it was not given one
(the group's committed offset, else ``auto_offset_reset``), so that the
partitions of an assignment resolve concurrently, each on its own thread,
and never under the consumer's lock. It then fetches (``fetch_max_wait_ms``
long polls), decodes each reply with storage's decoder (every CRC checked,
sizes bounded by ``max_message_bytes`` before any allocation, decompressed
sets bounded as storage bounds them) and puts chunks on the consumer's
bounded queue.

Errors keep to their partition:

* **transient** (the partition actor restarts or moved, ZooKeeper is slow,
  a timeout): retried with jittered back-off for as long as the fetcher runs,
  that is as long as the consumer owns the partition. After
  ``warn_after_s`` of failures one warning is logged; it never gives up.
* **an offset out of range**: with ``auto_offset_reset`` ``earliest`` or
  ``latest`` the position moves there (a warning is logged: Kafka's rule for
  a lost position); with ``"error"`` the fetcher reports a typed error and
  stops.
* **read_committed** (``isolation_level``, docs/design.md §6): the fetches
  ask for the bytes below the partition's last stable offset (FETCH version
  1); a fetch at it waits on the server, as a long poll, until the open
  transaction ends. The records of the reply's aborted transactions are
  dropped here (:func:`aborted_ranges`: Kafka's rule), markers (control
  batches) are never handed out by the decoders, whatever the isolation.
* **a corrupt or invalid message**, or any other non-retriable error: the
  fetcher hands over the messages before it, fetches once more from the bad
  message (the server checks the message a fetch starts at, and answers a
  damaged one with :class:`CorruptMessageError` carrying ``next_offset``,
  the next readable message), then reports it and stops. The consumer
  raises it on every poll until the application seeks past it (Kafka's
  behaviour) or calls ``consumer.skip_corrupt()``: never skipped silently,
  never abandoned.

Thread-safety: a fetcher is driven by its own thread; :meth:`Fetcher.stop`
may be called from any thread.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable

from raylog.config import EARLIEST, LATEST
from raylog.consumer.record import Message, with_next_offsets
from raylog.errors import InvalidMessageError, OffsetOutOfRangeError, RaylogError
from raylog.retry import RetryPolicy
from raylog.storage import record_batch
from raylog.storage.aborted_reads import aborted_ranges, drop_aborted
from raylog.storage.decoding import decode_messages
from raylog.transfer.connection import BrokerConnection
from raylog.transfer.protocol import FRAME_OVERHEAD_BYTES

logger = logging.getLogger(__name__)

TopicPartition = tuple[str, int]

#: back-off between tries of a transient failure: 0.05 s doubling to 1 s, ±50 %,
#: without a deadline (the bound is ownership: the fetcher stops when revoked)
TRANSIENT_RETRY = RetryPolicy.forever(delay_s=0.05, max_delay_s=1.0, jitter=0.5)


def decode_fetched(data, offset: int, tp, max_message: int, max_inflated: int):
    """The messages of a fetched set (each with its ``next_offset``) and the
    bytes they take: the default ``decoder`` of a :class:`Fetcher`
    (:func:`raylog.consumer.batch.fetched_batch` is the batch path's)."""
    records, consumed = decode_messages(
        data, offset, max_message_bytes=max_message, record_type=Message, prefix=tp, max_inflated_bytes=max_inflated
    )
    if record_batch.format_at(data) == 2:
        return records, consumed  # built with their next offsets (the batch rule), none a plain Message
    return with_next_offsets(records, offset + consumed), consumed


def _batch_start(data, offset: int) -> int:
    """Where the fetched ``data`` starts in the log. The server reads a
    position inside a format-2 batch from the batch's start but answers with
    the position asked for; the batch's baseOffset is its start (stamped at
    append, docs/design.md §2). Format 1 (and a wrapper re-read from its
    start, where the answer's offset already is the start): ``offset``."""
    if len(data) >= 17 and data[8] == 0 and record_batch.format_at(data) == 2:
        base = int.from_bytes(data[:8], "big")
        if base < offset:
            return base
    return offset


class Chunk:
    """What a fetcher hands over: messages and the position after them, a
    resolved or reset position (no messages), or an error."""

    __slots__ = ("tp", "epoch", "records", "next_offset", "error")

    def __init__(self, tp, epoch, records=(), next_offset=None, error=None):
        self.tp = tp
        self.epoch = epoch
        self.records = records
        self.next_offset = next_offset
        self.error = error


@dataclass(frozen=True)
class FetchSettings:
    """A consumer's settings that its fetchers read (immutable, so shared
    by every fetcher of the consumer without a lock)."""

    fetch_max_bytes: int = 1 << 20
    fetch_max_wait_ms: int = 500
    #: None: the topic's own max_message_bytes
    max_message_bytes: int | None = None
    request_timeout_s: float = 30.0
    auto_offset_reset: str = LATEST
    #: seconds of failures before the one warning
    warn_after_s: float = 60.0
    #: READ_COMMITTED (read_committed: FETCH version 1 below the last
    #: stable offset, aborted transactions dropped) or None (read_uncommitted:
    #: FETCH version 0, every record below the high watermark)
    isolation: int | None = None


class Fetcher(threading.Thread):
    """Fetches one partition until stopped (see the module docstring).

    It is given what it uses and nothing else: ``settings``; ``metadata``
    (``endpoint``, ``config``, ``forget``, ``settings.token``); ``put``, a
    bounded queue's ``put(chunk, timeout=)`` (raises :class:`queue.Full`);
    ``committed(tp)``, the group's committed offset or None; ``offsets(tp)``,
    the partition's ``(earliest, latest)``; and ``decoder(data, offset, tp,
    max_message, max_inflated) -> (records, consumed)``, called once a fetch
    (:func:`decode_fetched` unless given).
    """

    def __init__(
        self,
        tp: TopicPartition,
        offset: int | None,
        epoch: int,
        *,
        settings: FetchSettings,
        metadata,
        put: Callable[..., None],
        committed: Callable[[TopicPartition], int | None],
        offsets: Callable[[TopicPartition], tuple[int, int]],
        decoder: Callable = decode_fetched,
    ):
        super().__init__(name=f"raylog-fetch-{tp[0]}-{tp[1]}", daemon=True)
        self.settings = settings
        self.metadata = metadata
        self._queue_put = put
        self._committed = committed
        self._offsets = offsets
        self._decoder = decoder
        self.tp = tp
        self.offset = offset
        self.epoch = epoch
        self.stopped = threading.Event()
        self.conn = None
        self._failing_since: float | None = None
        self._warned = False
        self._backoff = TRANSIENT_RETRY.start()
        #: the offset whose message failed to decode once (fetched again from there)
        self._suspect: int | None = None

    def stop(self) -> None:
        self.stopped.set()
        conn = self.conn
        if conn is not None:
            conn.close()  # wakes a blocked long poll

    # -- helpers ---------------------------------------------------------------

    def _put(self, chunk: Chunk) -> bool:
        """Queue a chunk, waiting for room; False once stopped."""
        while not self.stopped.is_set():
            try:
                self._queue_put(chunk, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _transient(self, err: RaylogError) -> None:
        """Back off (jittered) after a transient failure; warn once after
        warn_after_s. The next connection looks the endpoint up again when
        the error says so (``refresh_metadata``)."""
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if err.refresh_metadata:
            self.metadata.forget(*self.tp)
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
        if not self._warned and now - self._failing_since >= self.settings.warn_after_s:
            self._warned = True
            logger.warning("%s-%d unreachable for %.0fs (%s); still retrying for as long as it is owned",
                           self.tp[0], self.tp[1], now - self._failing_since, err)
        self._backoff.wait(self.stopped)  # no deadline: ends early when the fetcher stops

    def _recovered(self) -> None:
        if self._failing_since is not None:
            if self._warned:
                logger.warning("%s-%d reachable again", *self.tp)
            self._failing_since, self._warned = None, False
            self._backoff.reset()

    def _connect(self) -> None:
        s, metadata = self.settings, self.metadata
        # The cached endpoint, unless _transient forgot it (refresh_metadata).
        host, port = metadata.endpoint(*self.tp, wait_s=1.0)
        # A reply holds at least one whole message, however large the topic allows.
        limit = max(s.fetch_max_bytes, metadata.config(self.tp[0]).max_message_bytes)
        self.conn = BrokerConnection(host, port, token=metadata.settings.token, timeout_s=s.request_timeout_s,
                                     max_frame_bytes=limit + FRAME_OVERHEAD_BYTES)

    def _reset(self, err: OffsetOutOfRangeError | None) -> int:
        """The position ``auto_offset_reset`` gives (``err`` has the range when known)."""
        earliest, latest = (err.earliest, err.latest) if err is not None else self._offsets(self.tp)
        policy = self.settings.auto_offset_reset
        if policy == EARLIEST:
            return earliest
        if policy == LATEST:
            return latest
        raise OffsetOutOfRangeError(
            f"{self.tp[0]}-{self.tp[1]}: "
            + ("no committed offset" if err is None else f"offset {err.offset} is out of range")
            + f" and auto_offset_reset='error'; seek to an offset in [{earliest}, {latest}]",
            offset=None if err is None else err.offset, earliest=earliest, latest=latest)

    def _resolve(self) -> int | None:
        """The committed offset, else the reset position; retried while transient."""
        while not self.stopped.is_set():
            try:
                committed = self._committed(self.tp)
                offset = committed if committed is not None else self._reset(None)
                self._recovered()
                return offset
            except RaylogError as err:
                if not (err.retriable or err.refresh_metadata) or isinstance(err, OffsetOutOfRangeError):
                    raise
                self._transient(err)
        return None

    def _put_inside_wrapper(self, data, start: int, max_message: int, max_inflated: int,
                            dropped=()) -> None:
        """Hand over the wrapper (or format-2 batch) at ``start`` that holds the position,
        without its inner messages before the position, and move past it."""
        if record_batch.format_at(data) == 2:
            # a format-2 batch: baseOffset(8) + batchLength(4) + batchLength bytes
            size = 12 + int.from_bytes(data[8:12], "big") if len(data) >= 12 else 0
        else:
            size = 4 + int.from_bytes(data[:4], "big") if len(data) >= 4 else 0
        records, consumed = decode_messages(
            memoryview(data)[:size], start, max_message_bytes=max_message, record_type=Message,
            prefix=self.tp, max_inflated_bytes=max_inflated, partial_tail_ok=False,
        )
        end = start + consumed
        if record_batch.format_at(data) == 2 and consumed:
            end = record_batch.next_offset_after(data, consumed) or end
        records = with_next_offsets(drop_aborted([m for m in records if m.offset >= self.offset], dropped), end)
        self.offset = end
        self._put(Chunk(self.tp, self.epoch, records, end))

    # -- the loop ----------------------------------------------------------------

    def run(self) -> None:
        s = self.settings
        decoder = self._decoder
        topic, partition = self.tp
        try:
            if self.offset is None:
                offset = self._resolve()
                if offset is None:
                    return
                self.offset = offset
                self._put(Chunk(self.tp, self.epoch, (), offset))  # the position, for commit and position()
            config = self.metadata.config(topic)
            max_message = s.max_message_bytes or config.max_message_bytes
            max_inflated = max(config.max_inflated_limit, max_message)  # storage's bound on a decompressed set
            while not self.stopped.is_set():
                try:
                    if self.conn is None:
                        self._connect()
                    result = self.conn.fetch(topic, partition, self.offset, s.fetch_max_bytes, s.fetch_max_wait_ms,
                                             inside_wrapper=True, isolation=s.isolation)
                except OffsetOutOfRangeError as err:
                    if self.stopped.is_set():
                        return
                    new = self._reset(err)
                    logger.warning("%s-%d: offset %d is out of range [%d, %d]; resetting to %d (auto_offset_reset=%r)",
                                   topic, partition, self.offset, err.earliest, err.latest, new, s.auto_offset_reset)
                    self.offset = new
                    self._put(Chunk(self.tp, self.epoch, (), new))
                    continue
                except RaylogError as err:
                    if self.stopped.is_set():
                        return
                    if not (err.retriable or err.refresh_metadata):
                        raise
                    self._transient(err)
                    continue
                if self.stopped.is_set():
                    return
                self._recovered()
                data = result.data
                if not data:
                    continue
                dropped = aborted_ranges(data, result.aborted)
                start = _batch_start(data, result.offset)
                if start < self.offset:
                    # a position inside a compressed wrapper or a format-2
                    # batch (a record's offset): it came whole from its start;
                    # skip what is before the position
                    self._put_inside_wrapper(data, start, max_message, max_inflated, dropped)
                    continue
                try:
                    if dropped:  # messages, some dropped (a batch decoder's columns would hold them)
                        records, consumed = decode_fetched(data, self.offset, self.tp, max_message, max_inflated)
                        records = drop_aborted(records, dropped)
                    else:
                        records, consumed = decoder(data, self.offset, self.tp, max_message, max_inflated)
                except InvalidMessageError as err:
                    # Hand over the whole messages before the bad one, then
                    # fetch from the bad one: the server checks the message
                    # at a fetch's start and names a damaged one with the
                    # next readable offset (CorruptMessageError.next_offset);
                    # bytes damaged in transit read well the second time.
                    bad = getattr(err, "offset", None)
                    if not isinstance(bad, int) or not self.offset <= bad <= self.offset + len(data):
                        raise
                    if bad > self.offset:
                        records, consumed = decode_messages(
                            memoryview(data)[: bad - self.offset], self.offset, max_message_bytes=max_message,
                            record_type=Message, prefix=self.tp, max_inflated_bytes=max_inflated,
                            partial_tail_ok=False,
                        )
                        self.offset += consumed
                        records = with_next_offsets(drop_aborted(records, dropped), self.offset)
                        self._put(Chunk(self.tp, self.epoch, records, self.offset))
                    if self._suspect == self.offset:
                        raise  # the server sent it twice as it is: report it
                    self._suspect = self.offset
                    continue
                self._suspect = None
                if consumed == 0:
                    continue  # the server always sends a whole first message; nothing to do
                end = self.offset + consumed
                if record_batch.format_at(data) == 2:  # batches say where they end (a compacted topic's differ)
                    end = record_batch.next_offset_after(data, consumed) or end
                self.offset = end
                self._put(Chunk(self.tp, self.epoch, records, end))
        except Exception as err:  # noqa: BLE001 - reported through poll, on every poll until a seek
            if not self.stopped.is_set():
                if not isinstance(err, RaylogError):
                    logger.exception("%s-%d: the fetcher failed", topic, partition)
                self._put(Chunk(self.tp, self.epoch, error=err))
        finally:
            if self.conn is not None:
                self.conn.close()
