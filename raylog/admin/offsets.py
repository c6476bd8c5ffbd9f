"""The client's view of offsets: what each partition holds (log start, high
watermark, offsets by time) and where consumer groups stand (describe,
delete, reset their committed offsets, delete some of them).

:class:`OffsetAdmin` is a part of :class:`raylog.Client`, given the
client's ZooKeeper session, ``settings`` and ``metadata``; the client's
methods of the same names call it. Each question goes to
the partition's data server at an endpoint looked up afresh in ZooKeeper
(an admin call is rare; a stale cache would answer for a moved actor).
Offsets are byte offsets of message starts (docs/design.md §2).

Thread-safety: as the client's; every call opens its own connections.
"""

from __future__ import annotations

from raylog.config import EARLIEST, LATEST
from raylog.errors import ConfigError, InvalidOffsetError, OffsetOutOfRangeError, RaylogError
from raylog.groups import admin as groups
from raylog.storage.decoding import decode_messages
from raylog.transfer.connection import BrokerConnection

#: the targets of :meth:`OffsetAdmin.reset_offsets`
RESET_TARGETS = (EARLIEST, LATEST, "offset", "timestamp")
#: how many bytes a sample or a boundary check reads
_SAMPLE_BYTES = 64 * 1024
#: the log one COUNT request walks (the partition walks at most 64 MiB whatever is asked)
COUNT_STEP_BYTES = 64 * 1024 * 1024
#: the most log :meth:`OffsetAdmin.count_messages` walks by default before it answers None
COUNT_WALK_BYTES = 256 * 1024 * 1024


class OffsetAdmin:
    """Partition offsets and consumer groups' committed offsets (part of
    :class:`raylog.Client`). Given: ``zk``, the client's ZooKeeper session;
    ``settings``, its :class:`~raylog.metadata.ConnectionSettings` (cluster,
    token); ``metadata``, its :class:`~raylog.metadata.Metadata` (endpoints,
    partition counts)."""

    def __init__(self, *, zk, settings, metadata):
        self._zk = zk
        self.settings = settings
        self.metadata = metadata

    def _connect_to(self, topic: str, partition: int, *, wait_s: float = 5.0, timeout_s: float = 10.0):
        """A connection to the partition's data server (endpoint looked up afresh)."""
        host, port = self.metadata.endpoint(topic, partition, refresh=True, wait_s=wait_s)
        return BrokerConnection(host, port, token=self.settings.token, timeout_s=timeout_s)

    # -- partitions ----------------------------------------------------------

    def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        """What :meth:`raylog.Client.offsets` does (documented there)."""
        with self._connect_to(topic, partition) as conn:
            return conn.offsets(topic, partition)

    def count_messages(self, topic: str, partition: int, start: int, end: int | None = None,
                       max_walk_bytes: int = COUNT_WALK_BYTES) -> int | None:
        """What :meth:`raylog.Client.count_messages` does (documented there)."""
        if not isinstance(max_walk_bytes, int) or max_walk_bytes <= 0:
            raise ConfigError(f"max_walk_bytes must be a positive int, got {max_walk_bytes!r}")
        with self._connect_to(topic, partition) as conn:
            if end is None:
                end = conn.offsets(topic, partition)[1]
            total, pos = 0, start
            while pos < end:
                budget = max_walk_bytes - (pos - start)
                if budget <= 0:
                    return None
                counted, following = conn.count(topic, partition, pos, end, min(COUNT_STEP_BYTES, budget), -1)
                if following <= pos:
                    if budget < COUNT_STEP_BYTES:
                        return None  # the next message is larger than what is left of the bound
                    raise InvalidOffsetError(f"counting {topic}-{partition} made no progress at offset {pos}",
                                             topic=topic, partition=partition, offset=pos)
                total, pos = total + counted, following
            return total

    def offsets_for_times(self, topic: str, timestamp_ms: int) -> dict[int, int]:
        """What :meth:`raylog.Client.offsets_for_times` does (documented there)."""
        out = {}
        for p in range(self.metadata.partitions(topic)):
            with self._connect_to(topic, p) as conn:
                out[p] = conn.offset_for_time(topic, p, int(timestamp_ms))
        return out

    def end_offsets(self, topic: str) -> dict[int, int]:
        """What :meth:`raylog.Client.end_offsets` does (documented there)."""
        return {p: self.offsets(topic, p)[1] for p in range(self.metadata.partitions(topic))}

    # -- consumer groups -----------------------------------------------------

    def list_groups(self) -> list[str]:
        """What :meth:`raylog.Client.list_groups` does (documented there)."""
        return groups.list_groups(self._zk, self.settings.cluster)

    def describe_group(self, group: str, timeout_s: float = 5.0) -> list[dict]:
        """What :meth:`raylog.Client.describe_group` does (documented there)."""
        return groups.describe_group(self._zk, self.settings.cluster, group, self._partition_info, timeout_s=timeout_s)

    def _partition_info(self, topic: str, partition: int, committed: int | None) -> tuple:
        """``(high watermark, mean message size near committed, messages from
        committed to the high watermark)`` of a partition: the last counted by
        the partition (COUNT, from its segments' record counts; None for no
        committed offset or a count that failed), from the log start when the
        committed offset is before it."""
        with self._connect_to(topic, partition, wait_s=2.0, timeout_s=5.0) as conn:
            start, end = conn.offsets(topic, partition)
            at = committed if committed is not None and start <= committed < end else start
            if at >= end:
                return end, None, (None if committed is None else 0)
            result = conn.fetch(topic, partition, at, _SAMPLE_BYTES, inside_wrapper=True)
            lag = None if committed is None else 0
            if committed is not None and committed < end:
                try:
                    lag, pos = 0, at
                    while pos < end:
                        counted, following = conn.count(topic, partition, pos, end, COUNT_STEP_BYTES, -1)
                        if following <= pos:
                            lag = None
                            break
                        lag, pos = lag + counted, following
                except RaylogError:
                    lag = None  # the estimate stands alone
        # The sample counts stored messages (a compressed wrapper counts as its inner messages).
        records, used = decode_messages(result.data, result.offset)
        return end, (used / len(records) if records else None), lag

    def delete_group(self, group: str) -> None:
        """What :meth:`raylog.Client.delete_group` does (documented there)."""
        groups.delete_group(self._zk, self.settings.cluster, group)

    def delete_group_offsets(self, group: str, partitions) -> list[tuple[str, int]]:
        """What :meth:`raylog.Client.delete_group_offsets` does (documented there)."""
        return groups.delete_group_offsets(self._zk, self.settings.cluster, group, partitions)

    def reset_offsets(self, group: str, topic: str, to: str, *, offset: int | None = None,
                      timestamp_ms: int | None = None, partitions=None, dry_run: bool = True) -> list[dict]:
        """What :meth:`raylog.Client.reset_offsets` does (documented there)."""
        groups.refuse_if_active(self._zk, self.settings.cluster, group, "reset the offsets of")  # before any scan
        if to not in RESET_TARGETS:
            raise ConfigError(f"to must be 'earliest', 'latest', 'offset' or 'timestamp', got {to!r}")
        if (to == "offset") != (offset is not None) or (to == "timestamp") != (timestamp_ms is not None):
            raise ConfigError("give offset= exactly with to='offset' and timestamp_ms= exactly with to='timestamp'")
        count = self.metadata.partitions(topic)
        chosen = sorted(range(count) if partitions is None else {int(p) for p in partitions})
        bad = [p for p in chosen if not 0 <= p < count]
        if bad:
            raise ConfigError(f"{topic} has partitions 0..{count - 1}; no partition {bad}")
        targets = {p: self._reset_target(topic, p, to, offset, timestamp_ms) for p in chosen}
        return groups.reset_offsets(self._zk, self.settings.cluster, group, topic, targets, dry_run=dry_run)

    def _reset_target(self, topic: str, partition: int, to: str, offset: int | None, timestamp_ms: int | None) -> int:
        with self._connect_to(topic, partition) as conn:
            start, end = conn.offsets(topic, partition)
            if to == EARLIEST:
                return start
            if to == LATEST:
                return end
            if to == "offset":
                return _check_boundary(conn, topic, partition, offset, start, end)
            return _first_at_or_after(conn, topic, partition, timestamp_ms, start, end)


def _check_boundary(conn, topic: str, partition: int, offset: int, start: int, end: int) -> int:
    """``offset`` if it starts a message of the log ``[start, end]``."""
    if not start <= offset <= end:
        raise OffsetOutOfRangeError(
            f"{topic}-{partition}: offset {offset} is outside the log [{start}, {end}]",
            offset=offset, earliest=start, latest=end)
    if offset < end:
        try:
            result = conn.fetch(topic, partition, offset, _SAMPLE_BYTES, inside_wrapper=True)  # an inner message's too
            decode_messages(result.data, result.offset)
        except RaylogError as err:
            raise InvalidOffsetError(
                f"{topic}-{partition}: offset {offset} is not the start of a message ({err}); "
                f"use a message's offset or next_offset", offset=offset) from err
    return offset


def _first_at_or_after(conn, topic: str, partition: int, timestamp_ms: int, start: int, end: int) -> int:
    """The offset of the first message whose timestamp is at least
    ``timestamp_ms`` (a scan from ``start``), else ``end``."""
    at = start
    while at < end:
        data = conn.fetch(topic, partition, at, 1 << 20).data
        records, used = decode_messages(data, at)
        for record_offset, ts, _key, _value in records:
            if ts >= timestamp_ms:
                return record_offset
        if used == 0:
            break
        at += used
    return end
