"""Read plans, made once on the driver: per partition a byte range of
message boundaries up to the high watermark seen, split for parallelism, with
the node that serves it (the leader's) and the replicas that may serve it
for locality (see :mod:`raylog.read` and :mod:`raylog.read.replicas`)."""

from __future__ import annotations

import logging
import os
from typing import Mapping, Sequence

from raylog import auth
from raylog.config import ISOLATION_LEVELS, NAMESPACE, actor_name
from raylog.errors import (
    BrokerUnavailableError,
    ConfigError,
    DataLossError,
    OffsetOutOfRangeError,
    UnknownPartitionError,
)
from raylog.metadata import ConnectionSettings, Metadata, current_client
from raylog.read.ranges import EARLIEST, LATEST, LostRange, ReadPlan, ReadRange, NAMED_OFFSETS
from raylog.read.replicas import find_candidates
from raylog.transfer.protocol import READ_COMMITTED

log = logging.getLogger(__name__)


def default_settings() -> ConnectionSettings | None:
    """The cluster of a call given no ``client=``: the client
    ``raylog.connect()`` made in this process (the last one not closed), else
    ``RAYLOG_ZOOKEEPER`` (with ``RAYLOG_CLUSTER``, default ``"default"``, and
    ``RAYLOG_TOKEN``, by default the token this process derives, see
    :mod:`raylog.auth`), else None."""
    client = current_client()
    if client is not None:
        return client.settings
    zookeeper = os.environ.get("RAYLOG_ZOOKEEPER")
    if not zookeeper:
        return None
    token = os.environ.get("RAYLOG_TOKEN")
    cluster = os.environ.get("RAYLOG_CLUSTER") or "default"
    if token:
        token = token.encode()
    else:
        token = auth.cluster_token(cluster)  # derived, as a client does (see raylog.auth)
    return ConnectionSettings(zookeeper=zookeeper, cluster=cluster, token=token)


def resolve_connection(client=None, settings: ConnectionSettings | None = None):
    """``(metadata, settings, owned)`` from a :class:`raylog.Client` or
    :class:`ConnectionSettings`, or with neither the cluster of
    :func:`default_settings`; ``owned`` is a metadata view to close."""
    if client is None and settings is None:
        client = current_client()
        if client is None:
            settings = default_settings()
    if client is not None:
        return client.metadata, client.settings, None
    if settings is None:
        raise ConfigError(
            "no raylog cluster to read: call raylog.connect() in this process first, set RAYLOG_ZOOKEEPER "
            "(host:port of the cluster's ZooKeeper), or pass client= (a raylog.Client) or settings= "
            "(its client.settings)"
        )
    if not isinstance(settings, ConnectionSettings):
        raise ConfigError(f"settings must be a raylog ConnectionSettings, got {type(settings).__name__}")
    metadata = Metadata.connect(settings)
    return metadata, metadata.settings, metadata  # metadata.settings: with the derived token


def _offset_spec(spec, partitions: int, default: int, what: str) -> dict[int, int]:
    """``{partition: offset or EARLIEST/LATEST}`` for every partition."""
    if isinstance(spec, str):
        if spec not in NAMED_OFFSETS:
            raise ConfigError(f"{what} must be 'earliest', 'latest' or {{partition: offset}}, got {spec!r}")
        return {p: NAMED_OFFSETS[spec] for p in range(partitions)}
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{what} must be 'earliest', 'latest' or {{partition: offset}}, got {spec!r}")
    resolved = {p: default for p in range(partitions)}
    for p, offset in spec.items():
        try:
            p = int(p)
        except (TypeError, ValueError):
            raise ConfigError(f"{what}: partition keys are integers, got {p!r}") from None
        if not 0 <= p < partitions:
            raise UnknownPartitionError(
                f"{what} names partition {p}; the topic has partitions 0..{partitions - 1}", partition=p
            )
        if isinstance(offset, str):
            if offset not in NAMED_OFFSETS:
                raise ConfigError(f"{what}[{p}] must be an offset, 'earliest' or 'latest', got {offset!r}")
            offset = NAMED_OFFSETS[offset]
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < EARLIEST:
            raise ConfigError(
                f"{what}[{p}] must be a byte offset (>= 0), -2 (earliest) or -1 (latest), got {offset!r}"
            )
        resolved[p] = offset
    return resolved


def _ray_nodes() -> list[dict] | None:
    try:
        import ray  # heavy (Ray): imported when used

        return ray.nodes() if ray.is_initialized() else None
    except Exception:  # noqa: BLE001 - locality is a preference, not a need
        return None


def plan_read(
    topic: str,
    starting_offsets="earliest",
    ending_offsets="latest",
    *,
    min_partitions: int | None = None,
    fail_on_data_loss: bool = True,
    client=None,
    settings: ConnectionSettings | None = None,
    isolation_level: str = "read_uncommitted",
) -> ReadPlan:
    """The byte ranges a bounded read of ``topic`` returns.

    ``starting_offsets``: ``"earliest"`` (each partition's log start),
    ``"latest"`` (its high watermark: nothing) or ``{partition: offset}``
    (others from the log start; ``-2``/``"earliest"`` and ``-1``/``"latest"``
    allowed as values). ``ending_offsets``: ``"latest"`` (the high watermark
    now) or ``{partition: offset}`` (others: latest). Offsets are message
    boundaries (a message's offset, a committed offset, a high watermark).

    Raises :class:`~raylog.errors.UnknownTopicError` for an unknown topic,
    :class:`~raylog.errors.UnknownPartitionError` for a partition it lacks,
    :class:`~raylog.errors.InvalidOffsetError` for an offset that is not a
    message boundary, :class:`~raylog.errors.OffsetOutOfRangeError` for an
    offset past the high watermark, :class:`~raylog.errors.ConfigError` for
    a start after its end, and :class:`DataLossError` for a range retention
    already deleted (with ``fail_on_data_loss=True``).

    ``min_partitions``: split ranges (the larger ones more) so that there are
    at least this many, at message boundaries found by the partition actors.

    ``isolation_level``: ``"read_uncommitted"`` (every record below the high
    watermark) or ``"read_committed"`` (docs/design.md §6: ``"latest"`` is
    each partition's last stable offset, an ending offset past it is
    refused, and the ranges are read without the records of aborted
    transactions, from the leaders).
    """
    if isolation_level not in ISOLATION_LEVELS:
        raise ConfigError(f"isolation_level must be one of {ISOLATION_LEVELS}, got {isolation_level!r}")
    committed = isolation_level == "read_committed"
    if min_partitions is not None and (not isinstance(min_partitions, int) or min_partitions < 1):
        raise ConfigError(f"min_partitions must be a positive integer, got {min_partitions!r}")
    metadata, settings, owned = resolve_connection(client, settings)
    try:
        registry = metadata.registry
        config = registry.topic_config(topic)  # UnknownTopicError
        partitions = config.partitions
        starts = _offset_spec(starting_offsets, partitions, EARLIEST, "starting_offsets")
        ends = _offset_spec(ending_offsets, partitions, LATEST, "ending_offsets")
        nodes = _ray_nodes()
        ranges: list[ReadRange] = []
        lost: list[LostRange] = []
        start_offsets, end_offsets, log_starts, hws = {}, {}, {}, {}
        for p in range(partitions):
            host, port = metadata.endpoint(topic, p, refresh=True, wait_s=10.0)
            with settings.broker_connection(host, port, timeout_s=30) as conn:
                log_start, hw = conn.offsets(topic, p)
                latest, what = hw, "high watermark"
                if committed:  # a read_committed FETCH at the high watermark: nothing, and the last stable offset
                    latest = conn.fetch(topic, p, hw, 1, 0, isolation=READ_COMMITTED).last_stable_offset
                    latest, what = min(max(latest, log_start), hw), "last stable offset"
                named = {EARLIEST: log_start, LATEST: latest}
                start, end = named.get(starts[p], starts[p]), named.get(ends[p], ends[p])
                if end > latest:
                    raise OffsetOutOfRangeError(
                        f"ending offset {end} of {topic}-{p} is past its {what} {latest}; "
                        f"end at most at {latest} ('latest')",
                        offset=end,
                        earliest=log_start,
                        latest=latest,
                    )
                if start > end:
                    if start > hw:
                        raise OffsetOutOfRangeError(
                            f"starting offset {start} of {topic}-{p} is past its high watermark {hw}; "
                            f"start at most at {hw} ('latest')",
                            offset=start,
                            earliest=log_start,
                            latest=hw,
                        )
                    raise ConfigError(
                        f"starting offset {start} of {topic}-{p} is after its ending offset {end}"
                    )
                if start < log_start:
                    gone = LostRange(topic, p, start, min(end, log_start), log_start)
                    if fail_on_data_loss:
                        raise DataLossError(
                            f"offsets {gone.describe()} were deleted by retention before they were read; "
                            f"read from {log_start} ('earliest') on, or pass fail_on_data_loss=False "
                            f"to skip what was lost",
                            topic=topic,
                            partition=p,
                            lost_start=gone.start,
                            lost_end=gone.end,
                            offset=start,
                            earliest=log_start,
                            latest=hw,
                        )
                    log.warning("reading %s: skipping lost %s", topic, gone.describe())
                    lost.append(gone)
                    start = min(max(start, log_start), max(end, log_start))
                    end = max(end, start)
                # Explicit offsets must be message boundaries or the record
                # offsets of inner messages of a compressed wrapper: the server
                # checks the message at an offset when asked to read there.
                for offset in {start, end}:
                    if log_start < offset < hw:
                        conn.fetch(topic, p, offset, 1, 0, inside_wrapper=True)  # InvalidOffsetError
            # The candidates after the offsets: an ISR member listed now held the high watermark read
            # above (the ISR shrinks only after the committed offset stopped waiting for it).
            candidates = find_candidates(registry, topic, p, (host, port), nodes)
            leader = candidates[0]
            start_offsets[p], end_offsets[p], log_starts[p], hws[p] = start, end, log_start, hw
            if end > start:
                ranges.append(ReadRange(topic, p, start, end, host, port, leader.node_id, leader.node_ip,
                                        candidates))
        if min_partitions is not None and 0 < len(ranges) < min_partitions:
            ranges = _split(settings, ranges, min_partitions)
        return ReadPlan(
            topic=topic,
            settings=settings,
            ranges=tuple(ranges),
            start_offsets=start_offsets,
            end_offsets=end_offsets,
            log_starts=log_starts,
            high_watermarks=hws,
            lost=tuple(lost),
            fail_on_data_loss=fail_on_data_loss,
            max_message_bytes=config.max_message_bytes,
            isolation_level=isolation_level,
        )
    finally:
        if owned is not None:
            owned.close()


def split_counts(sizes: Sequence[int], min_partitions: int) -> list[int]:
    """How many pieces each range becomes so that there are at least
    ``min_partitions`` in all, in proportion to the ranges' sizes."""
    total = sum(sizes)
    counts = [max(1, min(size, round(min_partitions * size / total))) if total else 1 for size in sizes]
    while sum(counts) < min_partitions:
        # The range with the largest pieces gets one more (if it has bytes to split).
        i = max(range(len(sizes)), key=lambda k: sizes[k] / counts[k])
        if sizes[i] <= counts[i]:
            break
        counts[i] += 1
    return counts


def _split(settings: ConnectionSettings, ranges: list[ReadRange], min_partitions: int) -> list[ReadRange]:
    """Ranges cut into pieces at message boundaries found by the partition actors."""
    import ray  # heavy (Ray): imported when used

    counts = split_counts([r.size for r in ranges], min_partitions)
    calls = []
    for rng, count in zip(ranges, counts):
        if count <= 1:
            calls.append(None)
            continue
        targets = [rng.start + rng.size * k // count for k in range(1, count)]
        # the leader's actor (a replicated partition's may not have the plain name after a failover)
        name = (rng.replicas[0].actor if rng.replicas else None) or actor_name(settings.cluster, rng.topic,
                                                                                rng.partition)
        try:
            actor = ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            raise BrokerUnavailableError(
                f"no partition actor runs for {rng.topic}-{rng.partition} to split its range; retry shortly",
                topic=rng.topic,
                partition=rng.partition,
            ) from None
        calls.append(actor.message_boundaries.remote(rng.start, rng.end, targets))
    pending = [c for c in calls if c is not None]
    answers = iter(ray.get(pending)) if pending else iter(())
    out: list[ReadRange] = []
    for rng, call in zip(ranges, calls):
        if call is None:
            out.append(rng)
            continue
        cuts = sorted({rng.start, *next(answers), rng.end})
        out.extend(rng._replace(start=a, end=b) for a, b in zip(cuts, cuts[1:]))
    return out
