"""The consumer: pulls partitions at its own pace; brokers keep no state of it.

Each partition the consumer reads has a fetcher thread of its own
(:mod:`raylog.consumer.fetcher`) that long-polls the partition's data server
and hands whole messages over through one bounded queue; the application
takes them with :meth:`Consumer.poll` or by iterating, which never ends (it
blocks until new data is flushed).

**Positions.** The consumer's position in a partition is the offset after the
last message it *handed to the application* (``Message.next_offset``). When
iterating, a message counts as handed when it is yielded; with ``poll``, when
the batch is returned.

**The commit rule** (Kafka's): a commit, automatic or manual, stores only
positions handed out by earlier polls. Auto-commit runs at the start of
``poll`` (every ``auto_commit_interval_ms``), before anything new is taken,
so it commits what the previous polls returned: the application asked for
more, so it is done with them. Iteration takes its next batch the same way,
only after every message of the last one was yielded. A crash therefore
loses nothing: what was handed out but not committed comes again.

**Revocation runs on the application's thread.** When a rebalance moves a
partition away, the consumer stops handing it out at once, and the next
``poll`` (or the iterator) runs ``on_revoked(partitions)`` there, on the
application's thread, then commits the positions of those partitions (with
auto-commit): inside ``on_revoked`` the partitions are still owned, so a
manual ``commit()`` also stores them. Only then are the owner nodes
released. If the application does not poll within ``revoke_timeout_ms`` the
partitions are released without a commit (their messages come again to the
next owner). ``on_assigned`` runs on the application's thread too, in the
next ``poll``; the partitions' starting positions are resolved by their
fetchers, concurrently and outside any lock.

**Errors keep to their partition.** A partition whose actor is down is
retried for as long as it is owned (a warning after
``unavailable_warning_s``). A corrupt message, or an offset outside the log
with ``auto_offset_reset="error"``, raises a typed error from ``poll`` for
every call until the application seeks that partition elsewhere; other
partitions' messages handed before the error are returned first.

**Seek versus reset.** ``seek`` to an offset outside the log raises
:class:`raylog.OffsetOutOfRangeError` with the partition's earliest and
latest offsets. ``auto_offset_reset`` only decides where a partition starts
when the group has no committed offset (or the consumer no group), and where
it goes when a position is lost to retention (``"error"``: raise instead).

Offsets inside a compressed wrapper all equal the wrapper's offset; see
:mod:`raylog.consumer.record` for the wrapper rule of ``next_offset``.

Thread-safety: ``poll``/iteration, ``commit``, ``seek`` and ``close`` are for
one application thread. Fetchers and the group member run on threads of
their own and meet the application thread under one lock, held only for
short bookkeeping (never across a network call).
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from typing import Iterable, Iterator, Sequence

from raylog.consumer.fetcher import Chunk, Fetcher
from raylog.errors import (
    ClosedError,
    ConfigError,
    NotOwnerError,
    OffsetOutOfRangeError,
    RaylogError,
    ZooKeeperUnavailableError,
)
from raylog.consumer.record import Message
from raylog.retry import RetryPolicy

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
_RESETS = ("earliest", "latest", "error")
#: messages the iterator takes per poll (its batch is committed once all are yielded)
ITERATOR_BATCH = 500


class _Partition:
    """The consumer's state of one partition it reads. Guarded by the consumer's lock."""

    __slots__ = ("fetcher", "position", "error")

    def __init__(self, fetcher: Fetcher, position: int | None):
        self.fetcher = fetcher
        self.position = position  # after the last message handed out; None until resolved
        self.error: BaseException | None = None  # raised on every poll until a seek


class _Notice:
    """A group change for the application's thread: ``kind`` is "assigned" or "revoked"."""

    __slots__ = ("kind", "partitions", "done", "abandoned")

    def __init__(self, kind: str, partitions: frozenset):
        self.kind = kind
        self.partitions = partitions
        self.done = threading.Event()
        self.abandoned = False


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
        unavailable_warning_s: float = 60.0,
        revoke_timeout_ms: int = 30_000,
        settle_ms: int | None = None,
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
        self.metadata = metadata
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
        self.warn_after_s = unavailable_warning_s
        self.revoke_timeout_s = revoke_timeout_ms / 1000.0
        self._user_on_assigned = on_assigned
        self._user_on_revoked = on_revoked

        self._lock = threading.RLock()
        self.queue: queue.Queue[Chunk] = queue.Queue(maxsize=queued_chunks)
        self._parts: dict[TopicPartition, _Partition] = {}
        self._pending: collections.deque = collections.deque()  # (chunk, start index)
        self._unyielded: collections.deque = collections.deque()  # the iterator's batch, not yet yielded
        self._notices: collections.deque[_Notice] = collections.deque()
        self._revoking: set[TopicPartition] = set()
        self._epoch = 0
        self._closed = False
        self._closing = False
        self._last_commit = time.monotonic()
        self._member = None

        from raylog.audit import DEFAULT_INTERVAL_MS, DEFAULT_WINDOW_MS, AuditCounter, new_source_id

        self._audit = AuditCounter(audit_window_ms or DEFAULT_WINDOW_MS) if audit else None
        self._audit_id = consumer_id or new_source_id("consumer")
        self._audit_interval_s = (audit_interval_ms or DEFAULT_INTERVAL_MS) / 1000.0
        self._audit_next = time.monotonic() + self._audit_interval_s
        self._audit_producer = None

        if group is None:
            partitions = [(t, p) for t in self.topics for p in range(metadata.partitions(t))]
            if auto_offset_reset == "error" and partitions:
                # Without a group there is no committed offset: nowhere to start.
                earliest, latest = self.offsets(partitions[0])
                raise OffsetOutOfRangeError(
                    f"a consumer without a group has no committed offset to start from and "
                    f"auto_offset_reset='error'; use 'earliest' or 'latest', or seek after assign "
                    f"({partitions[0][0]}-{partitions[0][1]} holds [{earliest}, {latest}])",
                    offset=None, earliest=earliest, latest=latest)
            self.assign(partitions)
        else:
            from raylog.groups.member import SETTLE_S, GroupMember
            from raylog.zk.server import connect_kazoo

            # The group session is the consumer's own (never shared with
            # another member): its timeout is the consumer's session timeout.
            self._group_zk = connect_kazoo(metadata.settings.zookeeper, timeout=session_timeout_ms / 1000.0)
            self._member = GroupMember(
                self._group_zk,
                metadata.settings.cluster,
                group,
                self.topics,
                consumer_id=consumer_id,
                on_assigned=self._on_assigned,
                on_revoked=self._on_revoked,
                settle_s=SETTLE_S if settle_ms is None else settle_ms / 1000.0,
            )
            try:
                self._member.start()
            except BaseException:
                self._member.close()
                self._group_zk.stop()
                self._group_zk.close()
                raise

    # -- what the fetchers ask of the consumer -----------------------------------

    def committed(self, tp: TopicPartition) -> int | None:
        return self._member.committed(*tp) if self._member is not None else None

    def offsets(self, tp: TopicPartition) -> tuple[int, int]:
        """``(earliest, latest)`` of a partition, asked of its data server."""
        return self._ask(tp, lambda conn: conn.offsets(*tp))

    def _ask(self, tp: TopicPartition, request):
        """``request(conn)`` on a connection to the partition's data server,
        tried up to 5 times within ``request_timeout_s`` while the error is
        retriable or says the endpoint moved; after an error whose
        ``refresh_metadata`` is set the endpoint is looked up again."""
        from raylog.transfer.connection import BrokerConnection

        stale = False

        def attempt():
            nonlocal stale
            try:
                host, port = self._metadata.endpoint(*tp, refresh=stale, wait_s=5.0)
                with BrokerConnection(host, port, token=self._metadata.settings.token,
                                      timeout_s=self.request_timeout_s) as conn:
                    return request(conn)
            except RaylogError as err:
                stale = err.refresh_metadata
                raise

        return RetryPolicy(max_tries=5, delay_s=0.1, deadline_s=self.request_timeout_s).call(
            attempt, retry_if=lambda err: getattr(err, "refresh_metadata", False))

    # -- assignment ----------------------------------------------------------

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly these partitions (no group), from their reset positions."""
        if self._member is not None:
            raise ConfigError("a consumer in a group is assigned partitions by the group; do not call assign")
        partitions = [(tp[0], int(tp[1])) for tp in partitions]
        # Resolved here, concurrently, so that a wrong token or an unreachable
        # partition fails the call at once (a group resolves in its fetchers).
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=max(1, min(16, len(partitions)))) as pool:
            starts = list(pool.map(self._reset_position, partitions))
        with self._lock:
            self._stop_fetchers(list(self._parts))
            for tp, start in zip(partitions, starts):
                self._start_fetcher(tp, start)

    def _reset_position(self, tp: TopicPartition) -> int:
        earliest, latest = self.offsets(tp)
        return earliest if self.auto_offset_reset == "earliest" else latest

    def assignment(self) -> frozenset[TopicPartition]:
        """The partitions this consumer reads (in a group: not those being revoked)."""
        with self._lock:
            return frozenset(self._parts) - self._revoking

    def _start_fetcher(self, tp: TopicPartition, offset: int | None) -> None:
        self._epoch += 1
        fetcher = Fetcher(self, tp, offset, self._epoch)
        self._parts[tp] = _Partition(fetcher, offset)
        fetcher.start()

    def _stop_fetchers(self, tps: Iterable[TopicPartition]) -> None:
        stopping = [self._parts.pop(tp).fetcher for tp in list(tps) if tp in self._parts]
        for fetcher in stopping:
            fetcher.stop()
        for fetcher in stopping:
            fetcher.join(timeout=5.0)  # a fetcher waiting for room in the queue notices stop within 0.1 s
        self._pending = collections.deque((c, i) for c, i in self._pending if self._is_current(c))
        self._unyielded = collections.deque(m for m in self._unyielded if (m.topic, m.partition) in self._parts)

    def _is_current(self, chunk: Chunk) -> bool:
        part = self._parts.get(chunk.tp)
        return part is not None and part.fetcher.epoch == chunk.epoch

    # -- group callbacks (on the group member's thread) --------------------------

    def _on_assigned(self, partitions: frozenset) -> None:
        with self._lock:
            for tp in sorted(partitions):
                if tp not in self._parts:
                    self._start_fetcher(tp, None)  # resolves its committed offset itself
            self._notices.append(_Notice("assigned", partitions))

    def _on_revoked(self, partitions: frozenset) -> None:
        notice = _Notice("revoked", partitions)
        with self._lock:
            if self._closing:
                return  # close() revokes everything on the application's thread itself
            self._revoking |= partitions  # handed out no more, from now on
            self._notices.append(notice)
        # The application's thread runs on_revoked and commits in its next poll.
        if not notice.done.wait(self.revoke_timeout_s):
            with self._lock:
                if not notice.done.is_set():
                    notice.abandoned = True
                    log.warning("group %r: the application did not poll within %.0fs; releasing %s without "
                                "a commit (their messages since the last commit come again)",
                                self.group, self.revoke_timeout_s, sorted(partitions))
                    self._drop(partitions)

    def _drop(self, partitions) -> None:
        with self._lock:
            self._stop_fetchers(partitions)
            self._revoking -= set(partitions)

    # -- the application's thread: notices ---------------------------------------

    def _run_notices(self) -> None:
        while True:
            with self._lock:
                if not self._notices:
                    return
                notice = self._notices.popleft()
            if notice.kind == "assigned":
                if self._user_on_assigned is not None:
                    self._user_on_assigned(notice.partitions)
                continue
            try:
                if not notice.abandoned:
                    self._revoke_here(notice.partitions)
            finally:
                with self._lock:
                    if not notice.abandoned:
                        self._drop(notice.partitions)
                    notice.done.set()

    def _revoke_here(self, partitions: frozenset) -> None:
        """on_revoked, then commit what was handed out (auto-commit), on this thread."""
        try:
            if self._user_on_revoked is not None:
                self._user_on_revoked(partitions)
        finally:
            if self.enable_auto_commit:
                positions = {tp: pos for tp, pos in self._handed_positions().items() if tp in partitions}
                if positions:
                    try:
                        self._member.commit(positions)
                    except RaylogError as err:
                        # The session was lost or ZooKeeper is down: the next
                        # owner starts from the last commit (at-least-once).
                        log.info("group %r: could not commit %s while revoking them: %s",
                                 self.group, sorted(positions), err)

    # -- reading -------------------------------------------------------------

    def seek(self, topic: str, partition: int, offset: int) -> None:
        """Read ``topic``/``partition`` from ``offset`` on (a message boundary:
        a message's offset or ``next_offset``, or a committed offset).

        Raises :class:`raylog.OffsetOutOfRangeError` (with ``earliest`` and
        ``latest``) for an offset outside the log; the position is unchanged
        then. A seek clears the partition's pending error.
        """
        tp = (topic, int(partition))
        with self._lock:
            if tp not in self._parts:
                raise ConfigError(f"{topic}-{partition} is not assigned to this consumer; assigned: {sorted(self._parts)}")
        offset = int(offset)
        earliest, latest = self.offsets(tp)
        if not earliest <= offset <= latest:
            raise OffsetOutOfRangeError(
                f"cannot seek {topic}-{partition} to {offset}: the log holds [{earliest}, {latest}]; "
                f"seek within it (the earliest, the latest, or a message's offset)",
                offset=offset, earliest=earliest, latest=latest)
        with self._lock:
            if tp not in self._parts:
                raise ConfigError(f"{topic}-{partition} was revoked meanwhile; nothing moved")
            self._stop_fetchers([tp])
            self._start_fetcher(tp, offset)

    def offsets_for_times(self, timestamps: dict) -> dict:
        """``{(topic, partition): offset}`` for ``{(topic, partition):
        timestamp_ms}``: the offset of the partition's first message whose
        timestamp is at or after the time (a compressed set: its wrapper),
        or the high watermark when there is none (OFFSETS_FOR_TIME)."""
        out = {}
        for tp, timestamp_ms in timestamps.items():
            tp, at = (tp[0], int(tp[1])), int(timestamp_ms)
            out[tp] = self._ask(tp, lambda conn, tp=tp, at=at: conn.offset_for_time(*tp, at))
        return out

    def seek_to_timestamp(self, timestamp_ms: int, partitions: Iterable[TopicPartition] | None = None) -> dict:
        """Read each assigned partition (or only ``partitions``) from its
        first message at or after ``timestamp_ms`` (ms since the epoch; see
        :meth:`offsets_for_times`); returns ``{(topic, partition): offset}``."""
        with self._lock:
            targets = sorted(self._parts) if partitions is None else [(t, int(p)) for t, p in partitions]
        found = self.offsets_for_times({tp: timestamp_ms for tp in targets})
        for tp, offset in found.items():
            self.seek(tp[0], tp[1], offset)
        return found

    def position(self, topic: str, partition: int) -> int | None:
        with self._lock:
            part = self._parts.get((topic, int(partition)))
            return None if part is None else part.position

    def _owned_now(self) -> frozenset | None:
        return None if self._member is None else self._member.assignment

    def poll(self, timeout_ms: int = 1000, max_messages: int = 10_000) -> list[Message]:
        """Messages that arrived, at most ``max_messages``; waits up to
        ``timeout_ms`` when none are there.

        First runs what the group asks of this thread (``on_revoked`` and its
        commit, ``on_assigned``), then auto-commits the positions of earlier
        polls when due. Raises a partition's error (an offset out of range
        with ``auto_offset_reset="error"``, a corrupt message) on every call
        until that partition is sought elsewhere.
        """
        if self._closed:
            raise ClosedError("the consumer is closed; create a new one with client.consumer()")
        self._unyielded.clear()  # a direct poll ends the iterator's batch
        return self._poll(timeout_ms, max_messages)

    def _poll(self, timeout_ms: int, max_messages: int) -> list[Message]:
        self._run_notices()
        if self.enable_auto_commit and time.monotonic() - self._last_commit >= self.auto_commit_interval_s:
            self._auto_commit()
        self._raise_pending_error()
        deadline = time.monotonic() + timeout_ms / 1000.0
        out: list[Message] = []
        while True:
            with self._lock:
                self._take_pending(out, max_messages)
            if out:
                break
            self._raise_pending_error()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                chunk = self.queue.get(timeout=min(remaining, 0.1))
            except queue.Empty:
                self._run_notices()  # a revocation waits for this thread
                continue
            with self._lock:
                self._pending.append((chunk, 0))
        if self._audit is not None and time.monotonic() >= self._audit_next:
            self._publish_audit()
        return out

    def _raise_pending_error(self) -> None:
        with self._lock:
            owned = self._owned_now()
            for tp, part in sorted(self._parts.items()):
                if part.error is not None and (owned is None or tp in owned):
                    raise part.error

    def _auto_commit(self) -> None:
        try:
            self.commit()
        except (ZooKeeperUnavailableError, NotOwnerError, ClosedError) as err:
            # Retried at the next interval; a revocation commits on its own.
            self._last_commit = time.monotonic()
            log.warning("auto-commit of group %r failed, will retry: %s", self.group, err)

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
        while len(self._pending) < 64:
            try:
                self._pending.append((self.queue.get_nowait(), 0))
            except queue.Empty:
                break
        owned = self._owned_now()
        pending = self._pending
        held_back = collections.deque()
        while pending and len(out) < max_messages:
            chunk, start = pending.popleft()
            if not self._is_current(chunk):
                continue
            tp = chunk.tp
            part = self._parts[tp]
            if (owned is not None and tp not in owned) or tp in self._revoking or part.error is not None:
                # Not sure we own it now (disconnected, rebalancing) or it is
                # stopped at an error: keep the chunk, in order, for later.
                held_back.append((chunk, start))
                continue
            if chunk.error is not None:
                part.error = chunk.error
                held_back.append((chunk, start))  # dropped by the seek that clears it
                if not out:
                    raise chunk.error
                continue
            records = chunk.records
            if not records:
                if part.position is None or start == 0:
                    part.position = chunk.next_offset  # resolved or reset position
                continue
            room = max_messages - len(out)
            end = min(len(records), start + room)
            handed = records if start == 0 and end == len(records) else records[start:end]
            out.extend(handed)
            if self._audit is not None:
                self._audit.add_timestamps(tp[0], [m.timestamp for m in handed])
            if end == len(records):
                part.position = chunk.next_offset
            else:
                pending.appendleft((chunk, end))
                part.position = handed[-1].next_offset
                break
        # chunks held back go first next time, in their order
        held_back.extend(pending)
        self._pending = held_back

    def __iter__(self) -> Iterator[Message]:
        """Never ends: blocks until new messages are flushed. A message counts
        as handed out (for commits) when it is yielded."""
        if self._closed:
            raise ClosedError("the consumer is closed; create a new one with client.consumer()")
        while True:
            self._unyielded = collections.deque(self._poll(1000, ITERATOR_BATCH))
            while self._unyielded:
                yield self._unyielded.popleft()

    # -- offsets -------------------------------------------------------------

    def _handed_positions(self) -> dict[TopicPartition, int]:
        """Positions after the last message handed to the application."""
        with self._lock:
            positions = {tp: p.position for tp, p in self._parts.items() if p.position is not None}
            seen = set()
            for m in self._unyielded:  # the iterator's batch: not handed out yet
                tp = (m.topic, m.partition)
                if tp not in seen:
                    seen.add(tp)
                    positions[tp] = m.offset
        return positions

    def commit(self) -> None:
        """Store the positions handed to the application so far, for the
        partitions this consumer owns (group only). Inside ``on_revoked`` the
        partitions being revoked are still owned and are committed too."""
        if self._member is None:
            raise ConfigError("commit needs a consumer group: client.consumer(topics, group='name')")
        owned = self._member.owned
        positions = {tp: pos for tp, pos in self._handed_positions().items() if tp in owned}
        # Even with nothing to store, ask the member: it raises while the
        # group's ZooKeeper session is down, which the caller should know.
        self._member.commit(positions)
        self._last_commit = time.monotonic()

    def close(self) -> None:
        """Revoke everything on this thread (``on_revoked``, then commit with
        auto-commit), leave the group, stop fetching; publish the last audit
        counts when auditing."""
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
                self._run_notices()
                with self._lock:
                    self._closing = True
                    mine = frozenset(tp for tp in self._parts if tp not in self._revoking)
                if mine:
                    self._revoke_here(mine)
                self._member.close()
        finally:
            with self._lock:
                self._closed = True
                self._stop_fetchers(list(self._parts))
                for notice in self._notices:
                    notice.done.set()
            if self._member is not None:
                self._group_zk.stop()
                self._group_zk.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
