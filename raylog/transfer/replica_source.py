"""What the data server needs from a partition's leader to answer a
follower's REPLICA_FETCH (:mod:`raylog.transfer.protocol`): the leader
(:class:`raylog.replication.leader.Leader`) implements it; the transfer
layer knows it only through this interface (docs/design.md section 1:
replication imports transfer, not the other way)."""

from __future__ import annotations

from typing import NamedTuple, Protocol

from raylog.storage.base import Slice


class ReplicaRead(NamedTuple):
    """The leader's answer to one replica fetch: ``data`` (its log from the
    follower's log end, flushed or not), ``sets`` (the producers' sets those
    bytes hold, as producer-state journal records), the leader's committed
    offset (``high_watermark``), its log start and its leader epoch."""

    data: Slice
    sets: bytes
    high_watermark: int
    log_start_offset: int
    leader_epoch: int


class ReplicaSource(Protocol):
    """A partition's leader as the REPLICA_FETCH handler sees it.
    Implementations are called from any connection thread at once."""

    def record_progress(self, replica: str, leader_epoch: int, log_end: int, flushed: int) -> None:
        """The follower ``replica`` holds its log up to ``log_end``, synced up
        to ``flushed``: update its progress, the committed offset and the
        ISR. Raises :class:`~raylog.errors.NotOwnerError` for a replica that
        is not the partition's or another leader epoch than the leader's."""

    def replica_read(self, replica: str, offset: int, max_bytes: int) -> ReplicaRead:
        """The leader's log from ``offset`` (at most ``max_bytes``, flushed
        or not) and the producers' sets those bytes hold."""

    def wait_for_end(self, offset: int, timeout_s: float) -> bool:
        """Block until the leader's log end passes ``offset`` (or
        ``timeout_s``, or the log closes); whether it did."""
