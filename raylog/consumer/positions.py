"""The consumer's positions and Kafka's commit rule.

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

Offsets come from the partition's data server (:meth:`Positions._ask`),
retried while the error is retriable or says the endpoint moved
(``refresh_metadata``: then the endpoint is looked up again).

:class:`Positions` is a part of :class:`raylog.Consumer` (a mixin); it uses
the consumer's ``_lock``, ``_parts``, ``_unyielded``, ``_member``,
``_metadata``, ``request_timeout_s``, ``auto_offset_reset`` and its
fetchers (``_start_fetcher``/``_stop_fetchers``). Same thread rules as the
consumer.
"""

from __future__ import annotations

import logging
import time
from typing import Iterable

from raylog.config import EARLIEST
from raylog.errors import (
    ClosedError,
    ConfigError,
    NotOwnerError,
    OffsetOutOfRangeError,
    RaylogError,
    ZooKeeperUnavailableError,
)
from raylog.retry import RetryPolicy
from raylog.transfer.connection import BrokerConnection

logger = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
#: how a consumer asks a partition's data server for offsets
OFFSETS_RETRY_TRIES = 5


def _moved(err: BaseException) -> bool:
    return getattr(err, "refresh_metadata", False)


class Positions:
    """Offsets, seeks, positions and commits (part of :class:`raylog.Consumer`)."""

    # -- offsets of the partitions (also what the fetchers ask) ------------------

    def committed(self, tp: TopicPartition) -> int | None:
        """The group's committed offset of the partition (None without a group or a commit)."""
        return self._member.committed(*tp) if self._member is not None else None

    def offsets(self, tp: TopicPartition) -> tuple[int, int]:
        """``(earliest, latest)`` of a partition, asked of its data server."""
        return self._ask(tp, lambda conn: conn.offsets(*tp))

    def _ask(self, tp: TopicPartition, request, tries: int = OFFSETS_RETRY_TRIES):
        """``request(conn)`` on a connection to the partition's data server,
        tried up to ``tries`` times within ``request_timeout_s`` while the error is
        retriable or says the endpoint moved; after an error whose
        ``refresh_metadata`` is set the endpoint is looked up again."""
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

        policy = RetryPolicy(max_tries=tries, delay_s=0.1, deadline_s=self.request_timeout_s)
        return policy.call(attempt, retry_if=_moved)

    def _start_position(self, tp: TopicPartition) -> int | None:
        """The reset position of a partition being assigned, asked once; None
        when its data server is unavailable now (the actor restarts, its node
        is down): its fetcher resolves it then, retrying for as long as it
        runs. Errors that no retry mends (a wrong token) are raised."""
        try:
            earliest, latest = self._ask(tp, lambda conn: conn.offsets(*tp), tries=1)
        except RaylogError as err:
            if isinstance(err, OffsetOutOfRangeError) or not (err.retriable or _moved(err)):
                raise
            logger.info("%s-%d is unavailable (%s); its fetcher resolves its position once it serves", *tp, err)
            return None
        return earliest if self.auto_offset_reset == EARLIEST else latest

    # -- seeking ----------------------------------------------------------------

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
