"""Bounded reads of a topic as Arrow: the read plan, the range reader, Ray Data.

A **read plan** fixes what a batch read of a topic returns. Made once on the
driver by :func:`plan_read`, it holds, per partition, a byte range
``[start, end)`` of the log, both ends message boundaries; ``end`` defaults
to the high watermark seen when the plan was made, so re-running the plan
returns the same messages however much was produced since. A large range
can be split (``min_partitions``) at message boundaries that the partition
actor finds by walking the size fields of its log
(:meth:`raylog.storage.log.PartitionLog.message_boundaries`). Each range
also carries the partition's endpoint as planned and the Ray node that holds
the partition, so readers can run next to the data.

**Range readers** (:func:`read_range`) run wherever the work runs (Spark
executors, Ray tasks). They need nothing but TCP to the partition's data
socket (and ZooKeeper, only to find a partition actor that moved since the
plan): they fetch the range in large chunks, check every message's CRC
(:func:`raylog.storage.message.decode_messages`), and yield
``pyarrow.RecordBatch`` es of :data:`ARROW_SCHEMA`, the columns of Spark's
Kafka source:

=========  ==========================  =========================================
column     Arrow type                  meaning
=========  ==========================  =========================================
key        binary (null: no key)       the message's key
value      binary                      the message's value
topic      string                      the topic
partition  int32                       the partition
offset     int64                       the message's byte offset (inner messages
                                       of a compressed set: the wrapper's)
timestamp  timestamp[us, UTC]          the producer's create time
=========  ==========================  =========================================

**Data loss.** A range that starts below the partition's log start was (in
part) deleted by retention. With ``fail_on_data_loss=True`` (the default)
planning raises :class:`DataLossError` naming the lost range; with False the
lost part is skipped, logged as a warning and listed in
:attr:`ReadPlan.lost`. Retention that runs between planning and reading is
handled the same way by the readers.

**Ray Data.** :func:`read_raylog` gives the plan as a bounded
``ray.data.Dataset`` of the same schema: one read task per range. Ray Data
2.60 applies one set of ``ray_remote_args`` to all the read tasks of a
datasource, so the ranges are grouped by the node that holds their
partition, each group is read by a datasource of its own whose tasks select
that node by its ``ray.io/node-id`` label, falling back to any node
(``fallback_strategy``), and the groups are unioned. The result
converts to Spark with RayDP: ``ds.to_spark(spark)``.

Thread-safety: plans are immutable values (picklable, shipped to workers);
the functions here share no state.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
from typing import Iterator, Mapping, NamedTuple, Sequence

import pyarrow as pa

from raylog.config import MiB
from raylog.errors import (
    BrokerUnavailableError,
    ConfigError,
    InvalidMessageError,
    OffsetOutOfRangeError,
    RaylogError,
    ResourcesUnavailableError,
    UnknownPartitionError,
)
from raylog.metadata import ConnectionSettings

log = logging.getLogger(__name__)

#: the columns of every bounded read (Spark's Kafka source, as Arrow)
ARROW_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    ]
)

#: bytes asked for by one fetch of a range reader (a partition's data server
#: sends at most about its topic's max_message_bytes per reply)
FETCH_BYTES = 8 * MiB
#: a range reader gathers the messages of several fetches into Arrow batches
#: of about this many bytes (fewer, larger batches cost Spark less per row)
BATCH_BYTES = 8 * MiB
#: how long a range reader keeps trying to reach a partition that moved or restarts
RECONNECT_DEADLINE_S = 60.0

#: the label every Ray node carries with its node id
NODE_ID_LABEL = "ray.io/node-id"

EARLIEST = -2
LATEST = -1
_NAMED = {"earliest": EARLIEST, "latest": LATEST}


class DataLossError(OffsetOutOfRangeError):
    """A range to read was (in part) deleted by retention before it was read.

    ``topic``, ``partition``, ``lost_start`` and ``lost_end`` name the lost
    byte range; ``earliest`` and ``latest`` are the partition's log start and
    high watermark. Read from ``earliest`` on, or pass
    ``fail_on_data_loss=False`` to skip what was lost (it is reported).
    """


class ReadRange(NamedTuple):
    """One piece of work: bytes ``[start, end)`` of a partition, both message
    boundaries. ``host``/``port`` is the partition's data socket when planned,
    ``node_id``/``node_ip`` the Ray node holding the partition (None when unknown)."""

    topic: str
    partition: int
    start: int
    end: int
    host: str
    port: int
    node_id: str | None = None
    node_ip: str | None = None

    @property
    def size(self) -> int:
        return self.end - self.start


class LostRange(NamedTuple):
    """Bytes ``[start, end)`` of a partition that retention deleted before the read."""

    topic: str
    partition: int
    start: int
    end: int
    earliest: int

    def describe(self) -> str:
        return (
            f"{self.topic}-{self.partition} [{self.start}, {self.end}) ({self.end - self.start} bytes; "
            f"the log now starts at {self.earliest})"
        )


@dataclasses.dataclass(frozen=True)
class ReadPlan:
    """What a bounded read returns: fixed byte ranges of one topic.

    ``start_offsets``/``end_offsets``: per partition, where the read starts
    (after skipping lost data) and ends; ``high_watermarks``/``log_starts``:
    what the partitions reported when the plan was made; ``lost``: ranges
    skipped because retention deleted them (``fail_on_data_loss=False``).
    """

    topic: str
    settings: ConnectionSettings
    ranges: tuple[ReadRange, ...]
    start_offsets: Mapping[int, int]
    end_offsets: Mapping[int, int]
    log_starts: Mapping[int, int]
    high_watermarks: Mapping[int, int]
    lost: tuple[LostRange, ...] = ()
    fail_on_data_loss: bool = True
    max_message_bytes: int = 1 * MiB
    planned_at: float = dataclasses.field(default_factory=time.time)

    @property
    def total_bytes(self) -> int:
        return sum(r.size for r in self.ranges)

    def report(self) -> dict:
        """A summary for logs: ranges, bytes, and what was skipped as lost."""
        return {
            "topic": self.topic,
            "ranges": len(self.ranges),
            "bytes": self.total_bytes,
            "start_offsets": dict(self.start_offsets),
            "end_offsets": dict(self.end_offsets),
            "lost": [r._asdict() for r in self.lost],
        }


# ----------------------------------------------------------------------------
# planning (driver side)


def default_settings() -> ConnectionSettings | None:
    """The cluster of a call given no ``client=``: the client
    ``raylog.connect()`` made in this process (the last one not closed), else
    ``RAYLOG_ZOOKEEPER`` (with ``RAYLOG_CLUSTER``, default ``"default"``, and
    ``RAYLOG_TOKEN``, by default the token this process derives, see
    :mod:`raylog.auth`), else None."""
    from raylog.client import current_client

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
        from raylog.auth import cluster_token

        token = cluster_token(cluster)  # derived, as a client does (see raylog.auth)
    return ConnectionSettings(zookeeper=zookeeper, cluster=cluster, token=token)


def resolve_connection(client=None, settings: ConnectionSettings | None = None):
    """``(metadata, settings, owned)`` from a :class:`raylog.Client` or
    :class:`ConnectionSettings`, or with neither the cluster of
    :func:`default_settings`; ``owned`` is a metadata view to close."""
    if client is None and settings is None:
        from raylog.client import current_client

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
    from raylog.metadata import Metadata

    metadata = Metadata.connect(settings)
    return metadata, metadata.settings, metadata  # metadata.settings: with the derived token


def _offset_spec(spec, partitions: int, default: int, what: str) -> dict[int, int]:
    """``{partition: offset or EARLIEST/LATEST}`` for every partition."""
    if isinstance(spec, str):
        if spec not in _NAMED:
            raise ConfigError(f"{what} must be 'earliest', 'latest' or {{partition: offset}}, got {spec!r}")
        return {p: _NAMED[spec] for p in range(partitions)}
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
            if offset not in _NAMED:
                raise ConfigError(f"{what}[{p}] must be an offset, 'earliest' or 'latest', got {offset!r}")
            offset = _NAMED[offset]
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < EARLIEST:
            raise ConfigError(
                f"{what}[{p}] must be a byte offset (>= 0), -2 (earliest) or -1 (latest), got {offset!r}"
            )
        resolved[p] = offset
    return resolved


def _node_of(registry, topic: str, partition: int, nodes: list[dict] | None) -> tuple[str | None, str | None]:
    """``(Ray node id, node IP)`` of the node holding the partition's log."""
    if not nodes:
        return None, None
    from raylog.actors.placement import node_identity

    place = registry.placement(topic, partition) or {}
    identity = place.get("node")
    for node in nodes:
        if node.get("Alive") and node_identity(node) == identity:
            return node["NodeID"], node["NodeManagerAddress"]
    return None, None


def _ray_nodes() -> list[dict] | None:
    try:
        import ray

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
    """
    from raylog.transfer.connection import BrokerConnection

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
            with BrokerConnection(host, port, token=settings.token, timeout_s=30) as conn:
                log_start, hw = conn.offsets(topic, p)
                named = {EARLIEST: log_start, LATEST: hw}
                start, end = named.get(starts[p], starts[p]), named.get(ends[p], ends[p])
                if end > hw:
                    raise OffsetOutOfRangeError(
                        f"ending offset {end} of {topic}-{p} is past its high watermark {hw}; "
                        f"end at most at {hw} ('latest')",
                        offset=end,
                        earliest=log_start,
                        latest=hw,
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
                # Explicit offsets must be message boundaries: the server
                # checks the message at an offset when asked to read there.
                for offset in {start, end}:
                    if log_start < offset < hw:
                        conn.fetch(topic, p, offset, 1, 0)  # InvalidOffsetError
            node_id, node_ip = _node_of(registry, topic, p, nodes)
            start_offsets[p], end_offsets[p], log_starts[p], hws[p] = start, end, log_start, hw
            if end > start:
                ranges.append(ReadRange(topic, p, start, end, host, port, node_id, node_ip))
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
    import ray

    from raylog.actors.partition import NAMESPACE, actor_name

    counts = split_counts([r.size for r in ranges], min_partitions)
    calls = []
    for rng, count in zip(ranges, counts):
        if count <= 1:
            calls.append(None)
            continue
        targets = [rng.start + rng.size * k // count for k in range(1, count)]
        try:
            actor = ray.get_actor(actor_name(settings.cluster, rng.topic, rng.partition), namespace=NAMESPACE)
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


# ----------------------------------------------------------------------------
# reading (executor side)


def records_to_batch(records: list, topic: str, partition: int) -> pa.RecordBatch:
    """``decode_messages`` records ``(offset, timestamp_ms, key, value)`` as a
    RecordBatch of :data:`ARROW_SCHEMA`."""
    import numpy as np

    n = len(records)
    keys = [r[2] for r in records]
    ts = np.fromiter([r[1] for r in records], dtype=np.int64, count=n)
    ts *= 1000
    columns = [
        pa.nulls(n, pa.binary()) if keys.count(None) == n else pa.array(keys, pa.binary()),
        pa.array([r[3] for r in records], pa.binary()),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        pa.array(np.fromiter([r[0] for r in records], dtype=np.int64, count=n)),
        pa.array(ts, pa.timestamp("us", tz="UTC")),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


class _Endpoint:
    """The connection a range reader uses, refreshed from ZooKeeper when the
    partition actor moved since the plan was made."""

    def __init__(self, settings: ConnectionSettings, rng: ReadRange, timeout_s: float, max_message_bytes: int):
        self.settings, self.rng, self.timeout_s = settings, rng, timeout_s
        self.max_message_bytes = max_message_bytes
        self.host, self.port = rng.host, rng.port
        self.conn = None

    def connection(self):
        from raylog.transfer.connection import BrokerConnection
        from raylog.transfer.protocol import FRAME_OVERHEAD_BYTES

        if self.conn is None:
            self.conn = BrokerConnection(
                self.host,
                self.port,
                token=self.settings.token,
                timeout_s=self.timeout_s,
                max_frame_bytes=self.max_message_bytes + FRAME_OVERHEAD_BYTES,
            )
        return self.conn

    def refresh(self) -> None:
        from raylog.metadata import Metadata

        self.close()
        metadata = Metadata.connect(self.settings)
        try:
            self.host, self.port = metadata.endpoint(self.rng.topic, self.rng.partition, refresh=True, wait_s=5.0)
        finally:
            metadata.close()

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def read_range(
    rng: ReadRange,
    settings: ConnectionSettings,
    *,
    fail_on_data_loss: bool = True,
    fetch_bytes: int = FETCH_BYTES,
    batch_bytes: int = BATCH_BYTES,
    max_message_bytes: int = 1 * MiB,
    reconnect_deadline_s: float = RECONNECT_DEADLINE_S,
    timeout_s: float = 30.0,
    lost: list | None = None,
) -> Iterator[pa.RecordBatch]:
    """The messages of ``rng`` as RecordBatches of :data:`ARROW_SCHEMA`,
    each gathered from fetches of up to ``fetch_bytes`` until it holds about
    ``batch_bytes`` of log.

    A partition actor that restarted or moved is found again through
    ZooKeeper, for up to ``reconnect_deadline_s``. Bytes that retention
    deleted since planning raise :class:`DataLossError`, or with
    ``fail_on_data_loss=False`` are skipped, logged and appended to ``lost``.
    """
    from raylog.storage.message import decode_messages

    topic, partition, end = rng.topic, rng.partition, rng.end
    endpoint = _Endpoint(settings, rng, timeout_s, max_message_bytes)
    offset = rng.start
    first_failure = None
    pending: list = []
    pending_from = offset
    try:
        while offset < end:
            if pending and offset - pending_from >= batch_bytes:
                yield records_to_batch(pending, topic, partition)
                pending, pending_from = [], offset
            try:
                result = endpoint.connection().fetch(topic, partition, offset, min(fetch_bytes, end - offset), 0)
            except OffsetOutOfRangeError as err:
                if offset >= err.earliest:
                    raise DataLossError(
                        f"{topic}-{partition} ends at {err.latest} but the plan reads it up to {end}: "
                        f"the log lost flushed data since it was planned",
                        topic=topic, partition=partition, lost_start=max(offset, err.latest), lost_end=end,
                        offset=offset, earliest=err.earliest, latest=err.latest,
                    ) from None
                gone = LostRange(topic, partition, offset, min(end, err.earliest), err.earliest)
                if fail_on_data_loss:
                    raise DataLossError(
                        f"offsets {gone.describe()} were deleted by retention after the read was planned; "
                        f"plan the read again, or pass fail_on_data_loss=False to skip what was lost",
                        topic=topic, partition=partition, lost_start=gone.start, lost_end=gone.end,
                        offset=offset, earliest=err.earliest, latest=err.latest,
                    ) from None
                log.warning("reading %s: skipping lost %s", topic, gone.describe())
                if lost is not None:
                    lost.append(gone)
                offset = gone.end
                continue
            except RaylogError as err:
                if not err.refresh_metadata:
                    raise
                now = time.monotonic()
                first_failure = first_failure or now
                if now - first_failure > reconnect_deadline_s:
                    raise
                log.info("reading %s-%d at %d: %s; finding the partition again", topic, partition, offset, err)
                time.sleep(min(1.0, 0.05 + (now - first_failure) / 10))
                try:
                    endpoint.refresh()
                except BrokerUnavailableError:
                    pass
                continue
            first_failure = None
            data = result.data
            if not data:
                raise DataLossError(
                    f"{topic}-{partition} has nothing at {offset} although the plan reads it up to {end}: "
                    f"the log lost flushed data since it was planned",
                    topic=topic, partition=partition, lost_start=offset, lost_end=end,
                    offset=offset, earliest=result.log_start_offset, latest=result.high_watermark,
                )
            records, consumed = decode_messages(data, offset, max_message_bytes=max_message_bytes)
            if not consumed:
                raise InvalidMessageError(
                    f"the fetch of {topic}-{partition} at {offset} returned no whole message", offset=offset
                )
            offset += consumed
            pending.extend(records)
        if pending:
            yield records_to_batch(pending, topic, partition)
    finally:
        endpoint.close()


def read_ranges(
    ranges: Sequence[ReadRange], settings: ConnectionSettings, **options
) -> Iterator[pa.RecordBatch]:
    """:func:`read_range` over several ranges, one after the other."""
    for rng in ranges:
        yield from read_range(rng, settings, **options)


def head_values(plan: ReadPlan, limit: int) -> list[bytes]:
    """The values of the first ``limit`` messages of ``plan`` (range by range),
    read directly by the caller; for schema inference on the driver."""
    values: list[bytes] = []
    for rng in plan.ranges:
        for batch in read_range(
            rng,
            plan.settings,
            fail_on_data_loss=False,
            fetch_bytes=min(FETCH_BYTES, 256 * limit + 4096),
            batch_bytes=1,
            max_message_bytes=plan.max_message_bytes,
        ):
            values.extend(batch.column(1).to_pylist()[: limit - len(values)])
            if len(values) >= limit:
                return values
    return values


# ----------------------------------------------------------------------------
# Ray Data


def _read_task_tables(rng: ReadRange, settings: ConnectionSettings, options: dict):
    for batch in read_range(rng, settings, **options):
        yield pa.Table.from_batches([batch])


def _datasource_class():
    from ray.data.block import BlockMetadata
    from ray.data.datasource import Datasource, ReadTask

    class RaylogDatasource(Datasource):
        """Ranges of a :class:`ReadPlan` as a Ray Data source: one read task per range."""

        def __init__(self, plan: ReadPlan, ranges: Sequence[ReadRange], fetch_bytes: int = FETCH_BYTES):
            super().__init__()
            self._plan = plan
            self._ranges = list(ranges)
            self._options = {
                "fail_on_data_loss": plan.fail_on_data_loss,
                "fetch_bytes": fetch_bytes,
                "max_message_bytes": plan.max_message_bytes,
            }

        def get_name(self) -> str:
            return f"Raylog({self._plan.topic})"

        def estimate_inmemory_data_size(self) -> int:
            return sum(r.size for r in self._ranges)

        def get_read_tasks(self, parallelism: int, per_task_row_limit=None, data_context=None) -> list:
            tasks = []
            for rng in self._ranges:
                meta = BlockMetadata(num_rows=None, size_bytes=rng.size, exec_stats=None, input_files=None)
                read_fn = functools.partial(_read_task_tables, rng, self._plan.settings, self._options)
                tasks.append(ReadTask(read_fn, meta, schema=ARROW_SCHEMA, per_task_row_limit=per_task_row_limit))
            return tasks

    return RaylogDatasource


def read_raylog(
    topic: str,
    starting_offsets="earliest",
    ending_offsets="latest",
    *,
    min_partitions: int | None = None,
    fail_on_data_loss: bool = True,
    client=None,
    settings: ConnectionSettings | None = None,
    plan: ReadPlan | None = None,
    locality: bool = True,
    fetch_bytes: int = FETCH_BYTES,
    **read_options,
):
    """A bounded ``ray.data.Dataset`` of ``topic`` with :data:`ARROW_SCHEMA`.

    The arguments are those of :func:`plan_read` (or pass a ``plan``). One
    read task per range; with ``locality`` the tasks of each node's ranges
    prefer that node: a label selector on the node's id (``ray.io/node-id``)
    with a fallback to any node, so a read still runs when that node has no
    free CPU for it or is gone (see the module docstring). ``read_options``
    go to ``ray.data.read_datasource`` (``num_cpus``, ``memory``,
    ``concurrency`` ...).

    It never waits for good for CPUs that others hold: without
    ``num_cpus`` and with no CPU free (a Spark session's executors hold
    them all, say), the read tasks ask for none and the dataset is read at
    once; a ``num_cpus`` that is not free now raises
    :class:`~raylog.errors.ResourcesUnavailableError` naming what is
    needed and what is free (see :func:`_read_resources`).

    The dataset converts to Spark with RayDP: ``ds.to_spark(spark)``.
    """
    import ray

    if plan is None:
        plan = plan_read(
            topic,
            starting_offsets,
            ending_offsets,
            min_partitions=min_partitions,
            fail_on_data_loss=fail_on_data_loss,
            client=client,
            settings=settings,
        )
    if not plan.ranges:
        return ray.data.from_arrow(ARROW_SCHEMA.empty_table())
    read_options, materialize = _read_resources(read_options)
    datasource = _datasource_class()
    groups: dict[str | None, list[ReadRange]] = {}
    for rng in plan.ranges:
        groups.setdefault(rng.node_id if locality else None, []).append(rng)
    datasets = []
    for node_id, ranges in groups.items():
        options = dict(read_options)
        if node_id is not None and "label_selector" not in options:
            options.update(placement_options(node_id))
        datasets.append(
            ray.data.read_datasource(
                datasource(plan, ranges, fetch_bytes), override_num_blocks=len(ranges), **options
            )
        )
    dataset = datasets[0] if len(datasets) == 1 else datasets[0].union(*datasets[1:])
    return dataset.materialize() if materialize else dataset


def _free_cpus() -> tuple[float, float]:
    """``(CPUs free now, CPUs of the largest alive node)`` of the Ray cluster."""
    import ray

    largest = max((n.get("Resources", {}).get("CPU", 0.0) for n in ray.nodes() if n.get("Alive")), default=0.0)
    return ray.available_resources().get("CPU", 0.0), largest


def _read_resources(read_options: dict) -> tuple[dict, bool]:
    """The read tasks' resources, so that a read never waits for CPUs that
    others hold (a Spark session's executors, say) without saying so.

    - ``num_cpus`` given: it must fit on a node (else ConfigError) and be
      free now (else :class:`ResourcesUnavailableError` naming both);
    - not given, a CPU free: Ray Data's default (1 CPU per read task);
    - not given, no CPU free: the read tasks ask for no CPU (they mostly
      wait on sockets) and the dataset is read at once
      (``materialize``): later steps of Ray Data (``count``'s projection,
      say) would ask for a CPU each and wait for good. A warning says so.

    Returns the options and whether to materialize."""
    options = dict(read_options)
    free, largest = _free_cpus()
    asked = options.get("num_cpus")
    if asked is not None:
        if asked > largest:
            raise ConfigError(
                f"read tasks with num_cpus={asked:g} never fit: the largest Ray node has {largest:g} CPUs; "
                f"pass num_cpus={largest:g} or less (num_cpus=0 reads without holding a CPU)"
            )
        if asked > free:
            raise ResourcesUnavailableError(
                f"read_raylog needs {asked:g} free CPU per read task (num_cpus={asked:g}) and the Ray "
                f"cluster has {free:g} free now of {largest:g} on its largest node (others hold the rest, "
                f"e.g. Spark executors); pass num_cpus=0, or free CPUs (fewer executor_cores), then retry",
                needed_cpus=asked,
                free_cpus=free,
            )
        return options, False
    if free >= 1:
        return options, False
    log.warning(
        "read_raylog: no CPU of the Ray cluster is free (%g free; e.g. Spark executors hold them): the "
        "read tasks run without a CPU and the dataset is read now; later Ray Data steps that need a CPU "
        "(map_batches ...) wait until one is free",
        free,
    )
    options["num_cpus"] = 0
    return options, True


def placement_options(node_id: str) -> dict:
    """Remote options that prefer the Ray node ``node_id``: its id label, then
    (``fallback_strategy``) any node."""
    return {"label_selector": {NODE_ID_LABEL: node_id}, "fallback_strategy": [{"label_selector": {}}]}
