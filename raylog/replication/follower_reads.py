"""Reads from a follower (Kafka's KIP-392, "fetch from follower"): the
follower's log as bounded readers (Spark, Ray Data) see it.

A follower serves FETCH, OFFSETS and OFFSETS_FOR_TIME of its partition up to
its **served high watermark**: the smaller of the high watermark it learned
from the leader (every reply to its replication fetches carries the
leader's committed offset, see :meth:`~raylog.replication.leader.Leader.replica_read`)
and its own flushed end. It never serves its own log end beyond that, so it
never hands out bytes a leader change could truncate: everything below the
leader's committed offset is on every in-sync replica, the next leader is
one of them, and a replica truncates only down to where that leader's epoch
began, at or above the committed offset (an unclean election breaks this
for every reader, as it does for consumers; the follower then caps what it
serves at the truncation, see below).

- a fetch below the served high watermark: the follower's bytes (the same
  bytes at the same offsets as the leader's), cut at it;
- at or above it, up to the follower's own log end: empty (a long poll
  waits, bounded, for the follower to learn more), as the leader answers at
  its high watermark;
- past the follower's log end or below its log start (retention runs on
  each replica by itself): :class:`OffsetOutOfRangeError`; the follower
  cannot tell such an offset from one it has not fetched yet, so a reader
  asks the leader then;
- writes: :class:`NotOwnerError` (only the leader appends).

The learned high watermark only grows while the actor lives (a new leader
starts low and catches up; what an earlier leader committed stays
committed), except that a follower that truncates to where a new leader
epoch began caps it there (after an unclean election, the topic's
``unclean_leader_election``, that can be below what was committed); a
restarted follower serves nothing until its first reply.

Consumers keep reading from the leader (the ``endpoint`` node); readers find
followers by their ``replicas/<node>`` nodes (:mod:`raylog.read.replicas`).

Thread-safety: :class:`ServedWatermark` guards its value with a condition
(the follower's thread raises it, data-server threads read and wait);
:class:`FollowerView` keeps no state of its own.
"""

from __future__ import annotations

import threading

from raylog.errors import NotOwnerError, OffsetOutOfRangeError


class ServedWatermark:
    """The high watermark a follower learned from its leader."""

    def __init__(self):
        self._cond = threading.Condition()
        self._learned = 0
        self._closed = False

    @property
    def learned(self) -> int:
        return self._learned

    def learn(self, high_watermark: int) -> None:
        """A replication reply said the leader's committed offset is ``high_watermark``."""
        with self._cond:
            if high_watermark > self._learned:
                self._learned = high_watermark
                self._cond.notify_all()

    def cap(self, offset: int) -> None:
        """The follower truncated to where a new leader epoch began: what it
        learned past ``offset`` was committed by a leader whose data there
        is gone (only an unclean election starts an epoch below the committed
        offset), so it serves no more than ``offset`` until told again."""
        with self._cond:
            self._learned = min(self._learned, offset)

    def notify(self) -> None:
        """The follower's log grew (appended and flushed): wake waiting reads."""
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def wait(self, predicate, timeout_s: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._closed or predicate(), max(0.0, timeout_s)) and predicate()


class FollowerView:
    """The follower's log as readers see it (see the module docstring)."""

    def __init__(self, partition_log, watermark: ServedWatermark, node: str):
        self._log, self._watermark, self._node = partition_log, watermark, node

    @property
    def config(self):
        return self._log.config

    @property
    def closed(self) -> bool:
        return self._log.closed

    @property
    def log_start_offset(self) -> int:
        return self._log.log_start_offset

    @property
    def high_watermark(self) -> int:
        """What this follower serves: the learned high watermark, within its flushed log."""
        return max(self._log.log_start_offset, min(self._watermark.learned, self._log.high_watermark))

    def read(self, offset: int, max_bytes: int):
        served = self.high_watermark
        if offset > served:
            end = self._log.high_watermark
            if offset > end:
                start = self._log.log_start_offset
                raise OffsetOutOfRangeError(
                    f"offset {offset} is past the log of the follower {self._node} [{start}, {end}] (it may "
                    f"not have fetched it yet); ask the partition's leader", offset=offset, earliest=start,
                    latest=served,
                )
            return self._log.read(offset, max_bytes)._replace(length=0)  # not learned as committed yet
        chunk = self._log.read(offset, max_bytes)
        return chunk._replace(length=max(0, min(chunk.length, served - offset)))

    def wait_for_data(self, offset: int, timeout_s: float) -> bool:
        return self._watermark.wait(lambda: self.high_watermark > offset, timeout_s)

    def offset_for_time(self, timestamp_ms: int) -> int:
        return min(self._log.offset_for_time(timestamp_ms), self.high_watermark)

    def _refuse(self, *args, **kwargs):
        raise NotOwnerError(
            f"the replica on {self._node} is a follower and accepts no writes; refresh the partition's "
            f"endpoint (its leader) from the registry"
        )

    append = append_sequenced = before_acks_all = flush = _refuse
