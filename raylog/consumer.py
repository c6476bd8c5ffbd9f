"""The consumer: pulls partitions at its own pace; brokers keep no state of it.

Each partition the consumer reads has a **fetcher** thread of its own that
long-polls the partition's data server (``fetch_max_wait_ms``), parses the
whole messages of each reply and hands them over in a bounded queue; the
application takes them with :meth:`Consumer.poll` or by iterating, which
never ends (it blocks until new data is flushed). The consumer's
**position** in a partition is the offset after the last message it handed
out; ``commit`` stores positions (consumer groups), ``seek`` moves one.

Without a group, the consumer reads every partition of its topics, or the
ones given to :meth:`assign`. With a group, ZooKeeper decides: see
:mod:`raylog.groups.coordinator`; the consumer starts fetchers for what it
is assigned, commits and stops them for what is revoked, and hands out
nothing from a partition it is not sure it owns.

Offsets inside a compressed wrapper all equal the wrapper's offset, so a
position taken in the middle of a wrapper points at the wrapper itself:
after a restart, its messages already handed out come again (at-least-once).

Thread-safety: ``poll``/iteration, ``commit``, ``seek`` and ``close`` are
meant for one application thread; fetchers and group callbacks run on
threads of their own and meet the application thread under one lock.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from typing import Iterable, Iterator, Sequence

from raylog.errors import (
    ClosedError,
    ConfigError,
    NotOwnerError,
    OffsetOutOfRangeError,
    RaylogError,
    ZooKeeperUnavailableError,
)
from raylog.message import Message
from raylog.retry import RetryPolicy

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
_RESETS = ("earliest", "latest", "error")


class _Chunk:
    __slots__ = ("tp", "fetch_epoch", "records", "next_offset", "error")

    def __init__(self, tp, fetch_epoch, records=None, next_offset=0, error=None):
        self.tp = tp
        self.fetch_epoch = fetch_epoch
        self.records = records
        self.next_offset = next_offset
        self.error = error


class _Fetcher(threading.Thread):
    """Fetches one partition from ``offset`` on, until stopped."""

    def __init__(self, consumer: "Consumer", tp: TopicPartition, offset: int, fetch_epoch: int):
        super().__init__(name=f"raylog-fetch-{tp[0]}-{tp[1]}", daemon=True)
        self.consumer = consumer
        self.tp = tp
        self.offset = offset
        self.fetch_epoch = fetch_epoch
        self.stopped = threading.Event()
        self.conn = None

    def stop(self) -> None:
        self.stopped.set()
        conn = self.conn
        if conn is not None:
            conn.close()  # wakes a blocked long poll

    def _connect(self, refresh: bool):
        from raylog.transfer.client import BrokerConnection

        c = self.consumer
        from raylog.transfer.protocol import FRAME_OVERHEAD_BYTES

        host, port = c._metadata.endpoint(*self.tp, refresh=refresh, wait_s=1.0)
        # A reply holds at least one whole message, however large the topic allows.
        limit = max(c.fetch_max_bytes, c._metadata.config(self.tp[0]).max_message_bytes)
        self.conn = BrokerConnection(
            host,
            port,
            token=c._metadata.settings.token,
            timeout_s=c.request_timeout_s,
            max_frame_bytes=limit + FRAME_OVERHEAD_BYTES,
        )

    def run(self) -> None:
        from raylog.storage.message import decode_messages

        c = self.consumer
        topic, partition = self.tp
        put = c._queue.put
        max_message = c.max_message_bytes or c._metadata.config(topic).max_message_bytes
        failures = 0
        first_failure = 0.0
        while not self.stopped.is_set():
            try:
                if self.conn is None:
                    self._connect(refresh=failures > 0)
                result = self.conn.fetch(topic, partition, self.offset, c.fetch_max_bytes, c.fetch_max_wait_ms)
                if self.stopped.is_set():
                    return
                failures = 0
                data = result.data
                if not data:
                    continue
                records, consumed = decode_messages(
                    data, self.offset, max_message_bytes=max_message, record_type=Message, prefix=self.tp
                )
                if consumed == 0:
                    continue  # the server always sends a whole first message; nothing to do
                self.offset += consumed
                put(_Chunk(self.tp, self.fetch_epoch, records, self.offset))
            except OffsetOutOfRangeError as err:
                if c.auto_offset_reset == "error" or self.stopped.is_set():
                    put(_Chunk(self.tp, self.fetch_epoch, error=err))
                    return
                new = err.earliest if (c.auto_offset_reset == "earliest" or self.offset < err.earliest) else err.latest
                log.warning(
                    "%s-%d: offset %d is out of range [%d, %d]; resetting to %d (%s)",
                    topic, partition, self.offset, err.earliest, err.latest, new, c.auto_offset_reset,
                )
                self.offset = new
                put(_Chunk(self.tp, self.fetch_epoch, [], new))
            except RaylogError as err:
                if self.stopped.is_set():
                    return
                if not (err.retriable or isinstance(err, NotOwnerError)):
                    put(_Chunk(self.tp, self.fetch_epoch, error=err))
                    return
                # The partition actor restarts or moved: reconnect with back-off,
                # for as long as the consumer's reconnect deadline allows.
                if self.conn is not None:
                    self.conn.close()
                    self.conn = None
                c._metadata.forget(topic, partition)
                now = time.monotonic()
                if failures == 0:
                    first_failure = now
                failures += 1
                if now - first_failure > c.reconnect_deadline_s:
                    put(_Chunk(self.tp, self.fetch_epoch, error=err))
                    return
                self.stopped.wait(min(1.0, 0.05 * 2 ** min(failures, 5)))
            except Exception as err:  # noqa: BLE001 - surfaced through poll
                if not self.stopped.is_set():
                    put(_Chunk(self.tp, self.fetch_epoch, error=err))
                return
        if self.conn is not None:
            self.conn.close()


class Consumer:
    def __init__(
        self,
        metadata,
        topics: Sequence[str] | str,
        *,
        group: str | None = None,
        auto_offset_reset: str = "latest",
        enable_auto_commit: bool = True,
        auto_commit_interval_ms: int = 5000,
        session_timeout_ms: int = 10_000,
        fetch_max_bytes: int = 1 << 20,
        fetch_max_wait_ms: int = 500,
        max_message_bytes: int | None = None,
        queued_chunks: int = 64,
        request_timeout_s: float = 30.0,
        reconnect_deadline_s: float = 60.0,
        on_assigned=None,
        on_revoked=None,
        consumer_id: str | None = None,
        audit: bool = False,
        audit_window_ms: int | None = None,
        audit_interval_ms: int | None = None,
    ):
        if isinstance(topics, str):
            topics = [topics]
        if auto_offset_reset not in _RESETS:
            raise ConfigError(f"auto_offset_reset must be one of {_RESETS}, got {auto_offset_reset!r}")
        self._metadata = metadata
        self.topics = list(topics)
        for topic in self.topics:
            metadata.partitions(topic)  # UnknownTopicError now rather than later
        self.group = group
        self.auto_offset_reset = auto_offset_reset
        self.enable_auto_commit = enable_auto_commit and group is not None
        self.auto_commit_interval_s = auto_commit_interval_ms / 1000.0
        self.fetch_max_bytes = fetch_max_bytes
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.max_message_bytes = max_message_bytes
        self.request_timeout_s = request_timeout_s
        self.reconnect_deadline_s = reconnect_deadline_s
        self._user_on_assigned = on_assigned
        self._user_on_revoked = on_revoked

        self._lock = threading.RLock()
        self._queue: queue.Queue[_Chunk] = queue.Queue(maxsize=queued_chunks)
        self._fetchers: dict[TopicPartition, _Fetcher] = {}
        self._positions: dict[TopicPartition, int] = {}
        self._pending: collections.deque = collections.deque()  # (chunk, start index)
        self._fetch_epoch = 0
        self._closed = False
        self._last_commit = time.monotonic()
        self._member = None

        from raylog.audit import DEFAULT_INTERVAL_MS, DEFAULT_WINDOW_MS, AuditCounter, new_source_id

        self._audit = AuditCounter(audit_window_ms or DEFAULT_WINDOW_MS) if audit else None
        self._audit_id = consumer_id or new_source_id("consumer")
        self._audit_interval_s = (audit_interval_ms or DEFAULT_INTERVAL_MS) / 1000.0
        self._audit_next = time.monotonic() + self._audit_interval_s
        self._audit_producer = None

        if group is None:
            self.assign([(t, p) for t in self.topics for p in range(metadata.partitions(t))])
        else:
            from raylog.groups.coordinator import GroupMember
            from raylog.groups.zookeeper import connect_kazoo

            # The group session is the consumer's own: its timeout is the
            # consumer's session timeout, and it dies with the consumer.
            self._group_zk = connect_kazoo(metadata.settings.zookeeper, timeout=session_timeout_ms / 1000.0)
            self._member = GroupMember(
                self._group_zk,
                metadata.settings.cluster,
                group,
                self.topics,
                consumer_id=consumer_id,
                on_assigned=self._on_assigned,
                on_revoked=self._on_revoked,
            )
            self._member.start()

    # -- assignment ----------------------------------------------------------

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly these partitions (no group), from their committed or
        reset positions."""
        if self._member is not None:
            raise ConfigError("a consumer in a group is assigned partitions by the group; do not call assign")
        with self._lock:
            self._stop_fetchers(list(self._fetchers))
            for tp in partitions:
                tp = (tp[0], int(tp[1]))
                self._start_fetcher(tp, self._reset_position(tp))

    def assignment(self) -> frozenset[TopicPartition]:
        with self._lock:
            return frozenset(self._fetchers)

    def _reset_position(self, tp: TopicPartition) -> int:
        earliest, latest = self._offsets(tp)
        if self.auto_offset_reset == "earliest":
            return earliest
        if self.auto_offset_reset == "latest":
            return latest
        raise OffsetOutOfRangeError(
            f"{tp[0]}-{tp[1]} has no committed offset and auto_offset_reset='error'; "
            f"seek to an offset in [{earliest}, {latest}] or use 'earliest'/'latest'",
            offset=None,
            earliest=earliest,
            latest=latest,
        )

    def _offsets(self, tp: TopicPartition) -> tuple[int, int]:
        """``(earliest, latest)`` of a partition, asked of its data server."""
        from raylog.transfer.client import BrokerConnection

        def ask(refresh):
            host, port = self._metadata.endpoint(*tp, refresh=refresh, wait_s=5.0)
            with BrokerConnection(host, port, token=self._metadata.settings.token, timeout_s=self.request_timeout_s) as conn:
                return conn.offsets(*tp)

        tries = iter([False] + [True] * 20)
        return RetryPolicy(max_tries=20, delay_s=0.1, deadline_s=self.reconnect_deadline_s).call(
            lambda: ask(next(tries, True)), retry_on=(NotOwnerError,)
        )

    def _start_fetcher(self, tp: TopicPartition, offset: int) -> None:
        self._fetch_epoch += 1
        self._positions[tp] = offset
        fetcher = self._fetchers[tp] = _Fetcher(self, tp, offset, self._fetch_epoch)
        fetcher.start()

    def _stop_fetchers(self, tps: Iterable[TopicPartition]) -> None:
        stopping = [self._fetchers.pop(tp) for tp in list(tps) if tp in self._fetchers]
        for fetcher in stopping:
            fetcher.stop()
        for fetcher in stopping:
            # A fetcher blocked on a full queue cannot finish; drain stale chunks.
            while fetcher.is_alive():
                self._drain_stale()
                fetcher.join(timeout=0.05)
        self._pending = collections.deque(
            (chunk, i) for chunk, i in self._pending if chunk.tp in self._fetchers
        )

    def _drain_stale(self) -> None:
        kept = []
        while True:
            try:
                chunk = self._queue.get_nowait()
            except queue.Empty:
                break
            if self._is_current(chunk):
                kept.append(chunk)
        for chunk in kept:
            self._pending.append((chunk, 0))

    def _is_current(self, chunk: _Chunk) -> bool:
        fetcher = self._fetchers.get(chunk.tp)
        return fetcher is not None and fetcher.fetch_epoch == chunk.fetch_epoch

    # group callbacks (run on the group member's thread)

    def _on_assigned(self, partitions: frozenset) -> None:
        with self._lock:
            for tp in sorted(partitions):
                if tp in self._fetchers:
                    continue
                committed = self._member.committed(*tp)
                self._start_fetcher(tp, committed if committed is not None else self._reset_position(tp))
        if self._user_on_assigned is not None:
            self._user_on_assigned(partitions)

    def _on_revoked(self, partitions: frozenset) -> None:
        if self._user_on_revoked is not None:
            self._user_on_revoked(partitions)
        with self._lock:
            positions = {tp: self._positions[tp] for tp in partitions if tp in self._positions}
            self._stop_fetchers(partitions)
            for tp in partitions:
                self._positions.pop(tp, None)
            if positions and self.enable_auto_commit:
                try:
                    self._member.commit(positions)
                except (ZooKeeperUnavailableError, ClosedError, NotOwnerError) as err:
                    # Revoked because ZooKeeper is gone or the session expired:
                    # the next owner starts from the last commit (at-least-once).
                    log.info("could not commit %s while revoking them: %s", sorted(positions), err)

    # -- reading -------------------------------------------------------------

    def seek(self, topic: str, partition: int, offset: int) -> None:
        """Read ``topic``/``partition`` from ``offset`` on (a message boundary:
        a message's offset or a committed offset)."""
        tp = (topic, int(partition))
        with self._lock:
            if tp not in self._fetchers:
                raise ConfigError(f"{topic}-{partition} is not assigned to this consumer; assigned: {sorted(self._fetchers)}")
            self._stop_fetchers([tp])
            self._start_fetcher(tp, int(offset))

    def position(self, topic: str, partition: int) -> int | None:
        return self._positions.get((topic, int(partition)))

    def poll(self, timeout_ms: int = 1000, max_messages: int = 10_000) -> list[Message]:
        """Messages that arrived, at most ``max_messages``; waits up to
        ``timeout_ms`` when none are there. Raises a fetcher's error (an
        invalid offset, corrupt data, a partition gone for too long)."""
        if self._closed:
            raise ClosedError("the consumer is closed; create a new one with client.consumer()")
        deadline = time.monotonic() + timeout_ms / 1000.0
        out: list[Message] = []
        while True:
            with self._lock:
                self._take_pending(out, max_messages)
            if out or len(out) >= max_messages:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                chunk = self._queue.get(timeout=min(remaining, 0.2))
            except queue.Empty:
                continue
            with self._lock:
                self._pending.append((chunk, 0))
        if self.enable_auto_commit and time.monotonic() - self._last_commit >= self.auto_commit_interval_s:
            try:
                self.commit()
            except (ZooKeeperUnavailableError, NotOwnerError) as err:
                # Retried at the next interval; a rebalance commits on its own.
                self._last_commit = time.monotonic()
                log.warning("auto-commit of group %r failed, will retry: %s", self.group, err)
        if self._audit is not None and time.monotonic() >= self._audit_next:
            self._publish_audit()
        return out

    def _publish_audit(self) -> None:
        """Publish what this consumer received since the last time."""
        from raylog.audit import AUDIT_TOPIC
        from raylog.producer import Producer

        self._audit_next = time.monotonic() + self._audit_interval_s
        events = self._audit.events("consumed", self._audit_id, self.group)
        if not events:
            return
        if self._audit_producer is None:
            self._audit_producer = Producer(self._metadata, acks=1, batch_size=100, linger_ms=0)
        self._audit_producer.send_batch(AUDIT_TOPIC, events)
        self._audit_producer.flush()

    def _take_pending(self, out: list, max_messages: int) -> None:
        # Move queued chunks in without blocking.
        while len(self._pending) < 8:
            try:
                self._pending.append((self._queue.get_nowait(), 0))
            except queue.Empty:
                break
        member = self._member
        owned = member.assignment if member is not None else None
        pending = self._pending
        while pending and len(out) < max_messages:
            chunk, start = pending[0]
            if not self._is_current(chunk) or (owned is not None and chunk.tp not in owned):
                pending.popleft()
                if owned is not None and chunk.tp not in owned and self._is_current(chunk):
                    # Not sure we own it right now (disconnected or rebalancing):
                    # keep the chunk until ownership is settled.
                    pending.append((chunk, start))
                    if all(c.tp not in owned for c, _ in pending):
                        return
                continue
            if chunk.error is not None:
                pending.popleft()
                raise chunk.error
            records = chunk.records
            room = max_messages - len(out)
            end = min(len(records), start + room)
            handed = records if start == 0 and end == len(records) else records[start:end]
            out.extend(handed)
            if self._audit is not None:
                self._audit.add_timestamps(chunk.tp[0], [m.timestamp for m in handed])
            if end == len(records):
                pending.popleft()
                self._positions[chunk.tp] = chunk.next_offset
            else:
                pending[0] = (chunk, end)
                self._positions[chunk.tp] = records[end].offset

    def __iter__(self) -> Iterator[Message]:
        """Never ends: blocks until new messages are flushed."""
        while True:
            for message in self.poll(timeout_ms=1000):
                yield message

    # -- offsets -------------------------------------------------------------

    def commit(self) -> None:
        """Store the positions of the partitions this consumer owns (group only)."""
        if self._member is None:
            raise ConfigError("commit needs a consumer group: client.consumer(topics, group='name')")
        with self._lock:
            owned = self._member.assignment
            positions = {tp: pos for tp, pos in self._positions.items() if tp in owned}
        # Even with nothing to store, ask the member: it raises while the
        # group's ZooKeeper session is down, which the caller should know.
        self._member.commit(positions)
        self._last_commit = time.monotonic()

    def close(self) -> None:
        """Commit (when auto-commit is on), leave the group, stop fetching;
        publish the last audit counts when auditing."""
        if self._closed:
            return
        try:
            if self._audit is not None:
                try:
                    self._publish_audit()
                finally:
                    if self._audit_producer is not None:
                        self._audit_producer.close()
            if self._member is not None:
                self._member.close()  # revokes everything: commits positions
        finally:
            with self._lock:
                self._closed = True
                self._stop_fetchers(list(self._fetchers))
            if self._member is not None:
                self._group_zk.stop()
                self._group_zk.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
