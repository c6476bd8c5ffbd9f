"""The consumer: pulls partitions at its own pace; brokers keep no state of it.

Each partition the consumer reads has a fetcher thread of its own
(:mod:`raylog.consumer.fetcher`) that long-polls the partition's data server
and hands whole messages over through one bounded queue; the application
takes them with :meth:`Consumer.poll` or by iterating, which never ends (it
blocks until new data is flushed). Units: ``poll(timeout_ms)`` and the
consumer's ``*_ms`` options take milliseconds, as Kafka's consumer does;
``request_timeout_s`` and ``unavailable_warning_s`` take seconds.

The consumer's parts, each given what it uses when the consumer is made:
the offsets asked of the data servers (:class:`~raylog.consumer.positions.OffsetQueries`:
the metadata and the request timeout); group changes handed to the
application's thread (:class:`~raylog.consumer.revocation.GroupNotices`:
the consumer's lock, how to start and stop fetchers, the callbacks, the
commit of revoked partitions); a fetcher per partition
(:mod:`raylog.consumer.fetcher`). This module keeps assignment, positions,
seeks and commits, ``poll``, ``poll_batch`` and the iterator, and ``close``.

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

**Seek versus reset.** ``seek`` to an offset outside the log raises
:class:`raylog.OffsetOutOfRangeError` with the partition's earliest and
latest offsets. ``auto_offset_reset`` (:data:`raylog.config.OFFSET_RESETS`)
only decides where a partition starts when the group has no committed
offset (or the consumer no group), and where it goes when a position is
lost to retention (``"error"``: raise instead).

**Errors keep to their partition.** A partition whose actor is down
(when the consumer is made, too) is retried for as long as it is owned (a warning after
``unavailable_warning_s``). A corrupt message, or an offset outside the log
with ``auto_offset_reset="error"``, raises a typed error from ``poll`` for
every call until the application seeks that partition elsewhere; other
partitions' messages handed before the error are returned first.

**Transactions.** ``isolation_level="read_committed"`` hands out only the
records of committed transactions and plain (non-transactional) writes, in
offset order: the fetches never read past a partition's last stable offset
(a poll there waits, as a long poll, until the open transaction commits or
aborts), and the records of aborted transactions are dropped.
``"read_uncommitted"`` (the default, as Kafka's) hands out every record below
the high watermark, those of open and aborted transactions too. Markers
(control batches) are never handed out (docs/design.md §6).

The i-th message inside a compressed wrapper at ``w`` has the offset ``w + i``;
see :mod:`raylog.consumer.record` for the wrapper rule of ``next_offset``.

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
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Iterator, Sequence

from raylog.audit import DEFAULT_INTERVAL_MS, DEFAULT_WINDOW_MS, AuditCounter, AuditPublisher, new_source_id
from raylog.config import ISOLATION_LEVELS, LATEST, OFFSET_RESETS, RESET_ERROR
from raylog.consumer.batch import MessageBatch, BatchList, fetched_batch
from raylog.consumer.fetcher import Chunk, Fetcher, FetchSettings, decode_fetched
from raylog.consumer.positions import OffsetQueries, TopicPartition
from raylog.consumer.record import Message
from raylog.consumer.revocation import GroupNotices
from raylog.errors import (
    ClosedError,
    ConfigError,
    CorruptMessageError,
    NotOwnerError,
    OffsetOutOfRangeError,
    RaylogError,
    ZooKeeperUnavailableError,
)
from raylog.groups.assignors import resolve as resolve_assignors
from raylog.groups.member import SETTLE_S, GroupMember
from raylog.transfer.protocol import READ_COMMITTED
from raylog.zk.session import connect_kazoo

logger = logging.getLogger(__name__)

#: messages the iterator takes per poll (its batch is committed once all are yielded)
ITERATOR_BATCH = 500


class _Partition:
    """The consumer's state of one partition it reads. Guarded by the consumer's lock."""

    __slots__ = ("fetcher", "position", "error", "paused")

    def __init__(self, fetcher: Fetcher, position: int | None):
        self.fetcher = fetcher
        self.position = position  # after the last message handed out; None until resolved
        self.error: BaseException | None = None  # raised on every poll until a seek
        self.paused = False  # its fetcher stopped by pause(); resume() starts one at the position


class Consumer:
    """A consumer of topics, alone (every partition) or in a group (see the
    module docstring; ``raylog.Client.consumer`` makes one).

    ``partition_assignment_strategy`` (Kafka's name for it) chooses how the
    group divides partitions among its members: the assignors this member
    supports, most preferred first — a name (``"range"``, the default and
    the paper's; ``"round_robin"``; ``"sticky"``, which moves the fewest
    partitions when members join or leave), names separated by commas
    (``"sticky,range"``), or a list of names and assignor objects of your
    own (:mod:`raylog.groups.assignors`). The group applies the first
    assignor, in its oldest member's order, that every member lists (a
    member of an older raylog version supports ``range`` only); with none
    in common, ``range``. An unknown name raises
    :class:`raylog.errors.AssignorError` (a :class:`raylog.ConfigError`)
    before the consumer joins. :attr:`group_assignor` tells which one the
    group applied.

    ``fetch_batches=True`` has the fetchers keep each fetch as
    :class:`~raylog.consumer.batch.MessageBatch` views from the first fetch
    on (what ``poll_batch`` returns; the first ``poll_batch`` turns it on
    otherwise, from the next fetch).
    """

    def __init__(
        self,
        metadata,
        topics: Sequence[str] | str,
        *,
        group: str | None = None,
        auto_offset_reset: str = LATEST,
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
        partition_assignment_strategy=None,
        on_assigned=None,
        on_revoked=None,
        consumer_id: str | None = None,
        audit: bool = False,
        audit_window_ms: int | None = None,
        audit_interval_ms: int | None = None,
        audit_publisher: AuditPublisher | None = None,
        fetch_batches: bool = False,
        isolation_level: str = "read_uncommitted",
    ):
        if isinstance(topics, str):
            topics = [topics]
        if isolation_level not in ISOLATION_LEVELS:
            raise ConfigError(f"isolation_level must be one of {ISOLATION_LEVELS}, got {isolation_level!r}: "
                              f"'read_committed' reads only committed transactions, 'read_uncommitted' everything")
        if auto_offset_reset not in OFFSET_RESETS:
            raise ConfigError(f"auto_offset_reset must be one of {OFFSET_RESETS}, got {auto_offset_reset!r}")
        # Checked with or without a group, so a misspelt name fails at once.
        self.partition_assignment_strategy = resolve_assignors(partition_assignment_strategy)
        if audit and audit_publisher is None:
            raise ConfigError("audit=True needs an audit_publisher (raylog.audit.AuditPublisher); make the "
                              "consumer with client.consumer(..., audit=True), which hands one in")
        self._metadata = metadata
        self.metadata = metadata
        self.topics = list(topics)
        for topic in self.topics:
            metadata.partitions(topic)  # UnknownTopicError now rather than later
        self.group = group
        self.auto_offset_reset = auto_offset_reset
        self.isolation_level = isolation_level
        self.enable_auto_commit = enable_auto_commit and group is not None
        self.auto_commit_interval_s = auto_commit_interval_ms / 1000.0
        self.fetch_max_bytes = fetch_max_bytes
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.max_message_bytes = max_message_bytes
        self.request_timeout_s = request_timeout_s
        self.warn_after_s = unavailable_warning_s
        self.revoke_timeout_s = revoke_timeout_ms / 1000.0
        self._fetch_settings = FetchSettings(
            fetch_max_bytes=fetch_max_bytes, fetch_max_wait_ms=fetch_max_wait_ms,
            max_message_bytes=max_message_bytes, request_timeout_s=request_timeout_s,
            auto_offset_reset=auto_offset_reset, warn_after_s=unavailable_warning_s,
            isolation=READ_COMMITTED if isolation_level == "read_committed" else None,
        )
        #: what the fetchers decode with: poll_batch switches it to batches
        self._decoder = fetched_batch if fetch_batches else decode_fetched

        self._lock = threading.RLock()
        self._offsets = OffsetQueries(metadata, request_timeout_s, self._fetch_settings.isolation)
        self._group_changes = GroupNotices(
            self._lock,
            fetch=self._fetch_assigned,
            stop_fetchers=self._stop_fetchers,
            on_assigned=on_assigned,
            on_revoked=on_revoked,
            commit_revoked=self._commit_revoked,
            revoke_timeout_s=self.revoke_timeout_s,
            group=group,
        )
        #: the group member's callbacks (on its thread): queue the change
        self._on_assigned = self._group_changes.on_assigned
        self._on_revoked = self._group_changes.on_revoked
        self.queue: queue.Queue[Chunk] = queue.Queue(maxsize=queued_chunks)
        self._parts: dict[TopicPartition, _Partition] = {}
        self._pending: collections.deque = collections.deque()  # (chunk, start index)
        self._unyielded: collections.deque = collections.deque()  # the iterator's batch, not yet yielded
        self._epoch = 0
        self._closed = False
        self._last_commit = time.monotonic()
        self._member = None
        #: ``{(topic, partition): (skips, bytes skipped)}`` by :meth:`skip_corrupt`
        self.skipped_corrupt: dict[TopicPartition, tuple[int, int]] = {}

        self._audit = AuditCounter(audit_window_ms or DEFAULT_WINDOW_MS) if audit else None
        self._audit_id = consumer_id or new_source_id("consumer")
        self._audit_interval_s = (audit_interval_ms or DEFAULT_INTERVAL_MS) / 1000.0
        self._audit_next = time.monotonic() + self._audit_interval_s
        self._audit_publisher = audit_publisher

        if group is None:
            partitions = [(t, p) for t in self.topics for p in range(metadata.partitions(t))]
            if auto_offset_reset == RESET_ERROR and partitions:
                # Without a group there is no committed offset: nowhere to start.
                earliest, latest = self.offsets(partitions[0])
                raise OffsetOutOfRangeError(
                    f"a consumer without a group has no committed offset to start from and "
                    f"auto_offset_reset='error'; use 'earliest' or 'latest', or seek after assign "
                    f"({partitions[0][0]}-{partitions[0][1]} holds [{earliest}, {latest}])",
                    offset=None, earliest=earliest, latest=latest)
            self.assign(partitions)
        else:
            # The group session is the consumer's own (never shared with
            # another member): its timeout is the consumer's session timeout.
            self._group_zk = connect_kazoo(metadata.settings.zookeeper, timeout=session_timeout_ms / 1000.0,
                                           token=metadata.settings.token, cluster=metadata.settings.cluster)
            self._member = GroupMember(
                self._group_zk,
                metadata.settings.cluster,
                group,
                self.topics,
                consumer_id=consumer_id,
                on_assigned=self._on_assigned,
                on_revoked=self._on_revoked,
                settle_s=SETTLE_S if settle_ms is None else settle_ms / 1000.0,
                assignors=self.partition_assignment_strategy,
            )
            try:
                self._member.start()
            except BaseException:
                self._member.close()
                self._group_zk.stop()
                self._group_zk.close()
                raise

    # -- assignment ----------------------------------------------------------

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly these partitions (no group), from their reset positions."""
        if self._member is not None:
            raise ConfigError("a consumer in a group is assigned partitions by the group; do not call assign")
        partitions = [(tp[0], int(tp[1])) for tp in partitions]
        # Resolved here, concurrently, so that a wrong token fails the call at
        # once and the partitions that serve start where they are now; one
        # unavailable now is resolved by its fetcher, retrying (as a group's are).
        with ThreadPoolExecutor(max_workers=max(1, min(16, len(partitions)))) as pool:
            starts = list(pool.map(lambda tp: self._offsets.start_position(tp, self.auto_offset_reset), partitions))
        with self._lock:
            self._stop_fetchers(list(self._parts))
            for tp, start in zip(partitions, starts):
                self._start_fetcher(tp, start)

    @property
    def group_assignor(self) -> str | None:
        """The name of the assignor the group applied in this member's last
        rebalance (None without a group or before the first)."""
        return None if self._member is None else self._member.assignor

    def assignment(self) -> frozenset[TopicPartition]:
        """The partitions this consumer reads (in a group: not those being revoked)."""
        with self._lock:
            return frozenset(self._parts) - self._group_changes.revoking

    def _start_fetcher(self, tp: TopicPartition, offset: int | None) -> None:
        self._epoch += 1
        fetcher = Fetcher(tp, offset, self._epoch, settings=self._fetch_settings, metadata=self.metadata,
                          put=self.queue.put, committed=self.committed, offsets=self.offsets,
                          decoder=self._decode)
        self._parts[tp] = _Partition(fetcher, offset)
        fetcher.start()

    def _decode(self, data, offset, tp, max_message, max_inflated):
        """The fetchers' decoder: the one chosen now (poll_batch may switch it
        while they run)."""
        return self._decoder(data, offset, tp, max_message, max_inflated)

    def _fetch_assigned(self, tp: TopicPartition) -> None:
        """A partition the group assigned (lock held): read it from its
        committed offset, which its fetcher resolves, unless it is read already."""
        if tp not in self._parts:
            self._start_fetcher(tp, None)

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
        return part is not None and not part.paused and part.fetcher.epoch == chunk.epoch

    # -- pausing (Kafka's pause/resume) -------------------------------------------

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        """Stop fetching these partitions: polls return none of their
        messages until :meth:`resume`. The position stays where the
        application is (messages fetched but not handed out are dropped and
        fetched again after the resume), commits keep it, and the group
        keeps the partitions assigned. A seek moves a paused partition's
        position and leaves it paused; a partition revoked from a group
        consumer is no longer paused when it comes back. Raises
        :class:`raylog.ConfigError` for a partition not assigned here
        (nothing is paused then)."""
        tps = self._assigned(partitions, "pause")
        with self._lock:
            stopping = []
            for tp in tps:
                part = self._parts[tp]
                if not part.paused:
                    part.paused = True
                    part.fetcher.stop()
                    stopping.append(part.fetcher)
            for fetcher in stopping:
                fetcher.join(timeout=5.0)
            paused = set(tps)
            self._pending = collections.deque((c, i) for c, i in self._pending if self._is_current(c))
            kept = collections.deque()
            for m in self._unyielded:  # the iterator's batch: not handed out, so the position goes back
                tp = (m.topic, m.partition)
                if tp in paused:
                    if self._parts[tp].position is None or m.offset < self._parts[tp].position:
                        self._parts[tp].position = m.offset
                else:
                    kept.append(m)
            self._unyielded = kept

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        """Fetch paused partitions again, from their positions (a partition
        not paused is left as it is). Raises :class:`raylog.ConfigError` for a
        partition not assigned here (nothing is resumed then)."""
        tps = self._assigned(partitions, "resume")
        with self._lock:
            for tp in tps:
                part = self._parts[tp]
                if part.paused:
                    self._start_fetcher(tp, part.position)

    def paused(self) -> frozenset[TopicPartition]:
        """The partitions paused now."""
        with self._lock:
            return frozenset(tp for tp, part in self._parts.items() if part.paused)

    def _assigned(self, partitions: Iterable[TopicPartition], what: str) -> list[TopicPartition]:
        tps = [(tp[0], int(tp[1])) for tp in partitions]
        with self._lock:
            unknown = sorted(tp for tp in tps if tp not in self._parts)
        if unknown:
            raise ConfigError(f"cannot {what} {', '.join(f'{t}-{p}' for t, p in unknown)}: not assigned to this "
                              f"consumer; assigned: {sorted(self.assignment())}")
        return tps

    def _owned_now(self) -> frozenset | None:
        return None if self._member is None else self._member.assignment

    # -- offsets of the partitions (also what the fetchers ask) ------------------

    def committed(self, tp: TopicPartition) -> int | None:
        """The group's committed offset of the partition (None without a group or a commit)."""
        return self._member.committed(*tp) if self._member is not None else None

    def offsets(self, tp: TopicPartition) -> tuple[int, int]:
        """``(earliest, latest)`` of a partition, asked of its data server
        (read_committed: latest is the last stable offset, where
        ``auto_offset_reset="latest"`` starts too)."""
        return self._offsets.offsets(tp)

    # -- seeking ----------------------------------------------------------------

    def seek(self, topic: str, partition: int, offset: int) -> None:
        """Read ``topic``/``partition`` from ``offset`` on (a message's offset
        or ``next_offset``, or a committed offset; inside a compressed wrapper
        the wrapper is fetched and its messages before ``offset`` skipped).
        An offset inside a plain message makes the next polls raise
        :class:`raylog.InvalidOffsetError` until another seek.

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
            if self._parts[tp].paused:  # stays paused; resume() reads from here
                self._parts[tp].position, self._parts[tp].error = offset, None
                self._unyielded = collections.deque(m for m in self._unyielded if (m.topic, m.partition) != tp)
                return
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
            out[tp] = self._offsets.offset_for_time(tp, at)
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
        """The position in the partition: the offset after the last message
        handed to the application (None until the start is resolved)."""
        with self._lock:
            part = self._parts.get((topic, int(partition)))
            return None if part is None else part.position

    # -- commits ------------------------------------------------------------------

    def _auto_commit(self) -> None:
        try:
            self.commit()
        except (ZooKeeperUnavailableError, NotOwnerError, ClosedError) as err:
            # Retried at the next interval; a revocation commits on its own.
            self._last_commit = time.monotonic()
            logger.warning("auto-commit of group %r failed, will retry: %s", self.group, err)

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

    def _commit_revoked(self, partitions: frozenset) -> None:
        """After ``on_revoked`` (auto-commit): store what was handed out of ``partitions``."""
        if self.enable_auto_commit:
            positions = {tp: pos for tp, pos in self._handed_positions().items() if tp in partitions}
            if positions:
                try:
                    self._member.commit(positions)
                except RaylogError as err:
                    # The session was lost or ZooKeeper is down: the next
                    # owner starts from the last commit (at-least-once).
                    logger.info("group %r: could not commit %s while revoking them: %s",
                                self.group, sorted(positions), err)

    # -- polling ------------------------------------------------------------------

    def poll(self, timeout_ms: int = 1000, max_messages: int = 10_000) -> list[Message]:
        """Messages that arrived, at most ``max_messages``; waits up to
        ``timeout_ms`` **milliseconds** (Kafka's unit; the producer's
        ``flush``/``close`` take ``timeout_s`` seconds) when none are there.

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

    def poll_batch(self, timeout_ms: int = 1000, max_messages: int = 100_000) -> list[MessageBatch]:
        """Like ``poll``, but the messages come as :class:`~raylog.consumer.batch.MessageBatch`
        views (see :mod:`raylog.consumer.batch`): at most ``max_messages`` in all."""
        if self._closed:
            raise ClosedError("the consumer is closed; create a new one with client.consumer()")
        self._decoder = fetched_batch
        self._unyielded.clear()
        out = BatchList()
        self._poll(timeout_ms, max_messages, out)
        return list(out)

    def _poll(self, timeout_ms: int, max_messages: int, out: list | None = None) -> list[Message]:
        changes = self._group_changes
        changes.run()
        if self.enable_auto_commit and time.monotonic() - self._last_commit >= self.auto_commit_interval_s:
            self._auto_commit()
        self._raise_pending_error()
        deadline = time.monotonic() + timeout_ms / 1000.0
        if out is None:
            out = []
        while True:
            if changes.notices:
                changes.run()  # a change since: on_assigned runs before its partitions' messages
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
                changes.run()  # a revocation waits for this thread
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

    def skip_corrupt(self) -> dict[TopicPartition, tuple[int, int]]:
        """Move every partition stopped at a corrupt message past the damage.

        A partition whose poll raises :class:`raylog.CorruptMessageError`
        stays there until the application decides; this is the decision to
        skip: the partition is sought to the error's ``next_offset`` (the
        next readable message the server found) and reading goes on. Returns
        ``{(topic, partition): (offset, next_offset)}``, the byte ranges
        skipped (empty when no partition is stopped at a corrupt message).
        Each skip is logged as a warning, counted in :attr:`skipped_corrupt`
        and in the ``raylog_consumer_skipped_corrupt_*`` metrics
        (:func:`raylog.metrics.record_corrupt_skip`); a commit afterwards
        stores the position past the damage. An error without
        ``next_offset`` (found by this consumer's decoder, not by the
        server) is fetched again from its offset, so the server names it.
        """
        with self._lock:
            stuck = {tp: part.error for tp, part in self._parts.items()
                     if isinstance(part.error, CorruptMessageError)}
        skipped = {}
        for tp, err in sorted(stuck.items()):
            start = err.details.get("damaged_from", err.offset)
            following = err.next_offset
            if not isinstance(following, int) or not isinstance(start, int):
                self.seek(tp[0], tp[1], err.offset)  # fetch it again: the server names the next offset
                continue
            self.seek(tp[0], tp[1], following)
            skipped[tp] = (start, following)
            count, size = self.skipped_corrupt.get(tp, (0, 0))
            self.skipped_corrupt[tp] = (count + 1, size + following - start)
            logger.warning("%s-%d: skipped the corrupt bytes [%d, %d) (%d bytes) on request", tp[0], tp[1],
                           start, following, following - start)
            from raylog.metrics import record_corrupt_skip  # lazy: Ray's metrics only when used

            record_corrupt_skip(self._metadata.settings.cluster, tp[0], tp[1], following - start)
        return skipped

    def _publish_audit(self) -> None:
        """Publish what this consumer received since the last time."""
        self._audit_next = time.monotonic() + self._audit_interval_s
        events = self._audit.events("consumed", self._audit_id, self.group)
        if not events:
            return
        self._audit_publisher.publish(events)

    def _take_pending(self, out: list, max_messages: int) -> None:
        # Move queued chunks in without blocking.
        while len(self._pending) < 64:
            try:
                self._pending.append((self.queue.get_nowait(), 0))
            except queue.Empty:
                break
        owned = self._owned_now()
        revoking, assigning = self._group_changes.revoking, self._group_changes.assigning
        pending = self._pending
        held_back = collections.deque()
        while pending and len(out) < max_messages:
            chunk, start = pending.popleft()
            if not self._is_current(chunk):
                continue
            tp = chunk.tp
            part = self._parts[tp]
            if ((owned is not None and tp not in owned) or tp in revoking or tp in assigning
                    or part.error is not None):
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
            if end < len(records) and isinstance(records, MessageBatch):
                # a batch split where a stored message starts keeps its bytes in both parts
                # (a compressed wrapper whole: what a mirror sends on as it came)
                cut = records.cut_before(end)
                if cut > start:
                    end = cut
                elif out:  # its next stored message does not fit: it waits for the next poll, whole
                    pending.appendleft((chunk, start))
                    break
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
                    self._audit_publisher.close()
            if self._member is not None:
                changes = self._group_changes
                changes.run()
                with self._lock:
                    changes.closing = True
                    mine = frozenset(tp for tp in self._parts if tp not in changes.revoking)
                if mine:
                    changes.revoke_here(mine)
                self._member.close()
        finally:
            with self._lock:
                self._closed = True
                self._stop_fetchers(list(self._parts))
                self._group_changes.release_waiters()
            if self._member is not None:
                self._group_zk.stop()
                self._group_zk.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
