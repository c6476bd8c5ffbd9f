"""The producer: batches messages per partition and sends them in the background.

``send`` only appends the message to the open batch of its partition (a
keyed message goes to ``crc32c(key) mod partitions``; keyless ones stick to
one partition per batch, see :mod:`raylog.partitioner`). A batch is handed to
the sender thread when it holds ``batch_size`` messages or is ``linger_ms``
old. The sender encodes each batch as one message set (compressed into a
wrapper message when ``compression`` is set) and writes every ready batch
of a partition to that partition's data server in one go.

``acks=0`` (the paper's default) writes and does not wait; a broker that
refuses a request closes the connection, and the sender reconnects.
``acks=1`` waits for the base offset of each set: a message acknowledged
this way is in the partition log and survives a broker restart once
flushed. Failed sends are retried (a refreshed endpoint, a new connection)
under the producer's :class:`~raylog.retry.RetryPolicy`; an error that
outlives the retries is raised by the next ``send``, ``flush`` or ``close``
— never dropped silently.

Every message of a batch carries the batch's creation time as its
timestamp unless ``send`` is given one.

Thread-safety: ``send``, ``send_batch``, ``flush`` and ``close`` may be
called from any number of threads; the batches are guarded by one lock and
only the sender thread talks to the sockets.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Sequence

from raylog.errors import (
    ClosedError,
    ConfigError,
    NotOwnerError,
    RaylogError,
    RequestTimeoutError,
)
from raylog.partitioner import StickyPartitioner, partition_for_key
from raylog.retry import RetryPolicy

log = logging.getLogger(__name__)


class _Batch:
    __slots__ = ("topic", "partition", "values", "keys", "created", "timestamps")

    def __init__(self, topic: str, partition: int, now: float):
        self.topic = topic
        self.partition = partition
        self.values: list[bytes] = []
        self.keys: list[bytes | None] | None = None  # made when a keyed message joins
        self.timestamps: list[int] | None = None  # made when a message brings its own
        self.created = now


class Producer:
    def __init__(
        self,
        metadata,
        *,
        batch_size: int = 50,
        linger_ms: float = 5,
        compression: str | None = None,
        acks: int = 1,
        retry: RetryPolicy | None = None,
        max_buffered_messages: int = 500_000,
        request_timeout_s: float = 30.0,
        audit: bool = False,
        audit_window_ms: int | None = None,
        audit_interval_ms: int | None = None,
    ):
        from raylog.storage.message import codec_id

        if batch_size < 1:
            raise ConfigError(f"batch_size must be at least 1, got {batch_size}")
        if acks not in (0, 1):
            raise ConfigError(f"acks must be 0 (no reply) or 1 (wait for the log), got {acks!r}")
        if linger_ms < 0:
            raise ConfigError(f"linger_ms must be non-negative, got {linger_ms}")
        codec_id(compression)  # raises ConfigError for an unknown codec
        self._metadata = metadata
        self.batch_size = batch_size
        self.linger_s = linger_ms / 1000.0
        self.compression = compression
        self.acks = acks
        self.retry = retry or RetryPolicy(max_tries=8, delay_s=0.05, max_delay_s=1.0, deadline_s=30.0)
        self.request_timeout_s = request_timeout_s
        self._max_buffered = max_buffered_messages

        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)  # sender waits for work
        self._space = threading.Condition(self._lock)  # senders wait for buffer space
        self._drained = threading.Condition(self._lock)  # flush waits for an empty pipeline
        self._open: dict[tuple[str, int], _Batch] = {}
        self._keyless: dict[str, _Batch] = {}  # the open sticky batch of each topic
        self._ready: collections.deque[_Batch] = collections.deque()
        self._buffered = 0
        self._in_flight = 0
        self._sender_waiting = False
        self._sticky = StickyPartitioner()
        self._partition_counts: dict[str, int] = {}
        self._error: BaseException | None = None
        self._closed = False
        self.sent_messages = 0
        self.sent_batches = 0

        from raylog.audit import DEFAULT_INTERVAL_MS, DEFAULT_WINDOW_MS, AuditCounter, new_source_id

        self.producer_id = new_source_id("producer")
        self._audit = AuditCounter(audit_window_ms or DEFAULT_WINDOW_MS) if audit else None
        self._audit_interval_s = (audit_interval_ms or DEFAULT_INTERVAL_MS) / 1000.0
        self._audit_next = time.monotonic() + self._audit_interval_s
        self._audit_now = False

        self._connections: dict[tuple[str, int], object] = {}
        self._sender = threading.Thread(target=self._run_sender, name="raylog-producer", daemon=True)
        self._sender.start()

    # -- the caller's side ---------------------------------------------------

    def _partitions(self, topic: str) -> int:
        count = self._partition_counts.get(topic)
        if count is None:
            count = self._partition_counts[topic] = self._metadata.partitions(topic)
        return count

    def send(
        self,
        topic: str,
        value: bytes,
        key: bytes | None = None,
        *,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> None:
        """Queue one message. Returns at once unless the buffer is full."""
        if type(value) is not bytes:
            raise TypeError(f"value must be bytes, got {type(value).__name__}; encode it first")
        if key is None and partition is None and timestamp_ms is None:
            # The hot path: a keyless message joins its topic's sticky batch.
            with self._lock:
                batch = self._keyless.get(topic)
                if (
                    batch is not None
                    and batch.keys is None
                    and batch.timestamps is None
                    and self._buffered < self._max_buffered
                    and self._error is None
                ):
                    values = batch.values
                    values.append(value)
                    self._buffered += 1
                    if len(values) >= self.batch_size:
                        self._seal(batch)
                    return
        self._send_slow(topic, value, key, partition, timestamp_ms)

    def _send_slow(self, topic, value, key, partition, timestamp_ms) -> None:
        if partition is None:
            count = self._partition_counts.get(topic) or self._partitions(topic)
            if key is not None:
                partition = partition_for_key(key, count)
        with self._lock:
            if self._error is not None or self._closed:
                self._raise_pending()
            if self._buffered >= self._max_buffered:
                self._wait_for_space()
            sticky = partition is None
            if sticky:
                partition = self._sticky.partition(topic, count)
            batch = self._open.get((topic, partition))
            if batch is None:
                batch = self._open[(topic, partition)] = _Batch(topic, partition, time.time())
            if sticky:
                self._keyless[topic] = batch
            if key is not None and batch.keys is None:
                batch.keys = [None] * len(batch.values)
            batch.values.append(value)
            if batch.keys is not None:
                batch.keys.append(key)
            if timestamp_ms is not None:
                self._set_timestamp(batch, timestamp_ms)
            elif batch.timestamps is not None:
                batch.timestamps.append(int(batch.created * 1000))
            self._buffered += 1
            if len(batch.values) >= self.batch_size:
                self._seal(batch)

    def send_batch(
        self,
        topic: str,
        values: Sequence[bytes],
        keys: Sequence[bytes | None] | None = None,
        *,
        partition: int | None = None,
    ) -> None:
        """Queue many messages at once (each still partitioned by its key)."""
        if keys is not None and len(keys) != len(values):
            raise ConfigError(f"{len(values)} values but {len(keys)} keys")
        if keys is None and partition is None:
            # Keyless: fill sticky batches without a per-message lookup.
            values = list(values)
            for value in values:
                if type(value) is not bytes:
                    raise TypeError(f"values must be bytes, got {type(value).__name__}")
            start = 0
            while start < len(values):
                with self._lock:
                    if self._error is not None or self._closed:
                        self._raise_pending()
                    if self._buffered >= self._max_buffered:
                        self._wait_for_space()
                    count = self._partition_counts.get(topic)
                    if count is None:
                        count = self._partitions(topic)
                    p = self._sticky.partition(topic, count)
                    batch = self._open.get((topic, p))
                    if batch is None:
                        batch = self._open[(topic, p)] = _Batch(topic, p, time.time())
                    self._keyless[topic] = batch
                    take = min(self.batch_size - len(batch.values), len(values) - start)
                    batch.values.extend(values[start : start + take])
                    if batch.keys is not None:
                        batch.keys.extend([None] * take)
                    if batch.timestamps is not None:
                        batch.timestamps.extend([int(batch.created * 1000)] * take)
                    self._buffered += take
                    start += take
                    if len(batch.values) >= self.batch_size:
                        self._seal(batch)
            return
        for i, value in enumerate(values):
            self.send(topic, value, None if keys is None else keys[i], partition=partition)

    def flush(self, timeout_s: float | None = None) -> None:
        """Send everything queued so far and wait for it (and its acks)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._lock:
            for batch in list(self._open.values()):
                self._seal(batch)
            if self._audit is not None:
                self._audit_now = True
                self._wake.notify()
            while (self._ready or self._in_flight or self._audit_now) and self._error is None:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise RequestTimeoutError(
                        f"flush did not finish within {timeout_s} s; {self._buffered} messages "
                        f"still queued (is the cluster reachable?)"
                    )
                self._drained.wait(remaining if remaining is not None else 1.0)
            if self._error is not None:
                self._raise_pending()

    def close(self, timeout_s: float | None = 60.0) -> None:
        """Flush, then stop the sender. Idempotent."""
        if self._closed:
            return
        try:
            self.flush(timeout_s)
        finally:
            with self._lock:
                self._closed = True
                self._wake.notify_all()
                self._space.notify_all()
            self._sender.join(timeout=10)
            for conn in self._connections.values():
                conn.close()
            self._connections.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def stats(self) -> dict:
        return {
            "sent_messages": self.sent_messages,
            "sent_batches": self.sent_batches,
            "buffered": self._buffered,
            "error": repr(self._error) if self._error else None,
        }

    # -- helpers called with the lock held -----------------------------------

    def _set_timestamp(self, batch: _Batch, timestamp_ms: int) -> None:
        if batch.timestamps is None:
            batch.timestamps = [int(batch.created * 1000)] * (len(batch.values) - 1)
        batch.timestamps.append(timestamp_ms)

    def _seal(self, batch: _Batch) -> None:
        del self._open[(batch.topic, batch.partition)]
        if self._audit is not None:
            if batch.timestamps is None:
                self._audit.add(batch.topic, int(batch.created * 1000), len(batch.values))
            else:
                self._audit.add_timestamps(batch.topic, batch.timestamps)
        if self._keyless.get(batch.topic) is batch:
            del self._keyless[batch.topic]
            self._sticky.batch_sent(batch.topic, self._partition_counts.get(batch.topic, 1))
        self._ready.append(batch)
        if self._sender_waiting:
            self._wake.notify()

    def _wait_for_space(self) -> None:
        for batch in list(self._open.values()):
            self._seal(batch)
        while self._buffered >= self._max_buffered and self._error is None and not self._closed:
            self._space.wait(1.0)
        if self._error is not None or self._closed:
            self._raise_pending()

    def _raise_pending(self):
        if self._error is not None:
            err, self._error = self._error, None
            raise err
        raise ClosedError("the producer is closed; create a new one with client.producer()")

    # -- the sender thread ---------------------------------------------------

    def _run_sender(self) -> None:
        while True:
            with self._lock:
                while not self._ready and not self._closed:
                    if self._audit is not None and (self._audit_now or time.monotonic() >= self._audit_next):
                        break
                    if self._open:
                        oldest = min(b.created for b in self._open.values())
                        wait = oldest + self.linger_s - time.time()
                        if wait <= 0:
                            for batch in [b for b in self._open.values() if b.created + self.linger_s <= time.time()]:
                                self._seal(batch)
                            continue
                    else:
                        wait = None
                    if self._audit is not None:
                        until_audit = max(0.0, self._audit_next - time.monotonic())
                        wait = until_audit if wait is None else min(wait, until_audit)
                    self._sender_waiting = True
                    self._wake.wait(wait)
                    self._sender_waiting = False
                if not self._ready and self._closed:
                    return
                batches = list(self._ready)
                self._ready.clear()
                self._in_flight = len(batches)
                publish_audit = self._audit is not None and (
                    self._audit_now or time.monotonic() >= self._audit_next or self._closed
                )
            try:
                self._send_all(batches)
                if publish_audit:
                    self._publish_audit()
                error = None
            except BaseException as err:  # noqa: BLE001 - handed to the caller
                error = err
                log.warning("producer send failed after retries: %s", err)
            with self._lock:
                done = sum(len(b.values) for b in batches)
                self._buffered -= done
                self._in_flight = 0
                if publish_audit:
                    self._audit_now = False
                    self._audit_next = time.monotonic() + self._audit_interval_s
                if error is not None and self._error is None:
                    self._error = error
                else:
                    self.sent_messages += done
                    self.sent_batches += len(batches)
                self._space.notify_all()
                self._drained.notify_all()

    def _send_all(self, batches: list[_Batch]) -> None:
        from raylog.storage.message import encode_message_set

        by_partition: dict[tuple[str, int], list[bytes]] = {}
        for b in batches:
            sets = by_partition.setdefault((b.topic, b.partition), [])
            timestamps = b.timestamps if b.timestamps is not None else int(b.created * 1000)
            message_set = encode_message_set(b.values, b.keys, timestamps, self.compression)
            limit = self._metadata.config(b.topic).max_message_bytes
            if len(message_set) <= limit or len(b.values) == 1:
                sets.append(message_set)
            else:
                sets.extend(self._split(b, timestamps, limit))
        for (topic, partition), sets in by_partition.items():
            self.retry.call(self._send_sets, topic, partition, sets)

    def _split(self, b: _Batch, timestamps, limit: int) -> list[bytes]:
        """A batch too large for one request, as several sets within ``limit``
        (a single message above it is sent alone and refused by the broker)."""
        from raylog.storage.message import HEADER_SIZE, encode_message_set

        sets, start, size = [], 0, 0
        n = len(b.values)
        for i in range(n + 1):
            grow = 0 if i == n else HEADER_SIZE + len(b.values[i]) + (len(b.keys[i] or b"") if b.keys else 0)
            if i == n or (size + grow > limit and i > start):
                ts = timestamps if isinstance(timestamps, int) else timestamps[start:i]
                keys = b.keys[start:i] if b.keys is not None else None
                sets.append(encode_message_set(b.values[start:i], keys, ts, self.compression))
                start, size = i, 0
            size += grow
        return sets

    def _publish_audit(self) -> None:
        """Send the audit counts since the last time (sender thread only)."""
        from raylog.audit import AUDIT_TOPIC
        from raylog.storage.message import encode_message_set

        events = self._audit.events("produced", self.producer_id)
        if events:
            self.retry.call(self._send_sets, AUDIT_TOPIC, 0, [encode_message_set(events)], acks=1)

    def _send_sets(self, topic: str, partition: int, sets: list[bytes], acks: int | None = None) -> None:
        from raylog.transfer.client import BrokerConnection

        key = (topic, partition)
        conn = self._connections.get(key)
        try:
            if conn is None:
                from raylog.transfer.protocol import FRAME_OVERHEAD_BYTES

                host, port = self._metadata.endpoint(topic, partition, wait_s=1.0)
                conn = BrokerConnection(
                    host,
                    port,
                    token=self._metadata.settings.token,
                    timeout_s=self.request_timeout_s,
                    max_frame_bytes=self._metadata.config(topic).max_message_bytes + FRAME_OVERHEAD_BYTES,
                )
                self._connections[key] = conn
            conn.produce_many(topic, partition, sets, self.acks if acks is None else acks)
        except RaylogError as err:
            if err.retriable or isinstance(err, NotOwnerError):
                # The actor moved or restarted: forget what we knew.
                dropped = self._connections.pop(key, None)
                if dropped is not None:
                    dropped.close()
                self._metadata.forget(topic, partition)
            raise
