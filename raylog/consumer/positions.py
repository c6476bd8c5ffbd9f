"""Offsets of a consumer's partitions, asked of their data servers
(:class:`OffsetQueries`, a part of :class:`raylog.Consumer`): retried while
the error is retriable or says the endpoint moved (``refresh_metadata``:
then the endpoint is looked up again). The consumer's positions, seeks and
commit rule are in :mod:`raylog.consumer.consumer`.
"""

from __future__ import annotations

import logging

from raylog.config import EARLIEST
from raylog.errors import OffsetOutOfRangeError, RaylogError
from raylog.retry import RetryPolicy
from raylog.transfer.connection import BrokerConnection
from raylog.transfer.protocol import READ_COMMITTED

logger = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
#: how a consumer asks a partition's data server for offsets
OFFSETS_RETRY_TRIES = 5


def _moved(err: BaseException) -> bool:
    return getattr(err, "refresh_metadata", False)


class OffsetQueries:
    """Offsets of partitions, asked of their data servers: a partition's
    ``(earliest, latest)``, the offset for a time, and the reset position of
    a partition being assigned. Given the consumer's ``metadata`` (endpoints,
    token), ``request_timeout_s`` (each question's deadline) and
    ``isolation`` (READ_COMMITTED: the latest offset is the last stable
    offset, as Kafka's read_committed consumer has it). Keeps no state; any
    thread (a fresh connection per question)."""

    def __init__(self, metadata, request_timeout_s: float, isolation: int | None = None):
        self._metadata = metadata
        self.request_timeout_s = request_timeout_s
        self.isolation = isolation

    def offsets(self, tp: TopicPartition) -> tuple[int, int]:
        """``(earliest, latest)`` of a partition, asked of its data server."""
        return self.ask(tp, self._ends(tp))

    def _ends(self, tp: TopicPartition):
        """The question of ``(earliest, latest)``: OFFSETS, and for a
        read_committed consumer the last stable offset (a FETCH version 1 at
        the high watermark answers it without data)."""
        def ends(conn) -> tuple[int, int]:
            earliest, latest = conn.offsets(*tp)
            if self.isolation == READ_COMMITTED:
                latest = min(latest, conn.fetch(*tp, latest, 1, 0, isolation=READ_COMMITTED).last_stable_offset)
            return earliest, latest

        return ends

    def offset_for_time(self, tp: TopicPartition, timestamp_ms: int) -> int:
        """The partition's first offset at or after ``timestamp_ms`` (OFFSETS_FOR_TIME)."""
        return self.ask(tp, lambda conn: conn.offset_for_time(*tp, timestamp_ms))

    def ask(self, tp: TopicPartition, request, tries: int = OFFSETS_RETRY_TRIES):
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

    def start_position(self, tp: TopicPartition, auto_offset_reset: str) -> int | None:
        """The reset position of a partition being assigned, asked once; None
        when its data server is unavailable now (the actor restarts, its node
        is down): its fetcher resolves it then, retrying for as long as it
        runs. Errors that no retry mends (a wrong token) are raised."""
        try:
            earliest, latest = self.ask(tp, self._ends(tp), tries=1)
        except RaylogError as err:
            if isinstance(err, OffsetOutOfRangeError) or not (err.retriable or _moved(err)):
                raise
            logger.info("%s-%d is unavailable (%s); its fetcher resolves its position once it serves", *tp, err)
            return None
        return earliest if auto_offset_reset == EARLIEST else latest
