"""Unbounded Ray Data reads: a topic as a stream of micro-batches whose
position is a consumer group's committed offsets.

::

    import raylog
    from raylog.read import read_raylog_stream

    client = raylog.connect()
    with read_raylog_stream("clicks", group="clicks-to-parquet", client=client,
                            idle_timeout_s=30) as stream:
        for batch in stream:                               # a bounded ray.data.Dataset
            batch.map_batches(enrich).write_parquet("/data/clicks")
        # leaving the loop normally committed the last batch too

Each micro-batch is a bounded ``ray.data.Dataset`` (the schema of
:data:`raylog.read.ARROW_SCHEMA`, read as :func:`raylog.read.read_raylog`
reads) of every topic's byte ranges from the stream's position to the high
watermarks seen when the batch is planned. The position starts at the
group's committed offsets (docs/design.md §4,
``consumers/<group>/offsets/<topic>/<p>``, the nodes consumer groups use);
a partition the group never committed starts at ``starting_offsets``
(``"earliest"``, ``"latest"`` or ``{partition: offset}`` as
:func:`raylog.read.read_raylog` takes them; with several topics,
``{topic: spec}``). A partition added to a topic while the stream runs
(``client.add_partitions``) is read from its start: all of it is new since
the stream began (as Spark's Kafka source does). When nothing new is readable the stream waits,
re-planning every ``poll_interval_s``, until data comes, ``stop_event`` is
set, or ``idle_timeout_s`` passes with nothing new.

**Commit rule (at-least-once).** The group's offsets advance for batch *k*
only when the caller asks for batch *k+1* (``next(stream)``: the ``for``
loop's next turn), or ends the iteration that way (the loop's last
``next`` after ``max_batches``, an idle timeout or the stop event), or calls
:meth:`RaylogStream.commit`. So consume a batch (write it, collect it, run
its pipeline to the end) before the loop body returns: a Ray Data dataset is
lazy, and a batch the caller merely holds counts as consumed once the next
one is asked for. Leaving the loop by ``break`` or an exception, closing the
stream, or a killed driver commits nothing of the batch in hand: a restarted
pipeline with the same group reads it again (and whatever came since), in
order per partition. A batch is never committed twice nor out of order.

**One reader per group.** The stream is not a member of the group (it
takes no partitions and triggers no rebalance), so it refuses a group with
live consumer members (:class:`raylog.GroupActiveError`), at the start and
before every commit: both would move the same offsets. Before each commit
it also checks that the group's offsets are still those it read or last
stored; if another writer moved them (a second stream, an offset reset) it
raises :class:`raylog.ConcurrentLoadError` and stores nothing. The check
and the writes are not one ZooKeeper transaction: run one stream per group.

Partitions added to a topic while the stream runs are read from their log
start. Offsets deleted by retention before they were read raise
:class:`raylog.read.DataLossError` (``fail_on_data_loss=False``: skipped,
logged, listed in :attr:`RaylogStream.lost`).

Thread-safety: a stream is used by one thread (the one iterating it);
``stop_event`` may be set from any thread.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Mapping

from raylog.errors import ConcurrentLoadError, ConfigError, GroupActiveError
from raylog.groups.admin import live_members
from raylog.read.datasource import read_raylog
from raylog.read.group_offsets import offset_store
from raylog.read.plan import plan_read, resolve_connection
from raylog.read.ranges import FETCH_BYTES

log = logging.getLogger(__name__)

#: Options of ``ray.data.read_datasource`` a stream passes on to each batch's read tasks.
READ_OPTIONS = ("num_cpus", "num_gpus", "memory", "concurrency", "resources", "ray_remote_args",
                "runtime_env", "accelerator_type", "max_calls")
#: the longest ``poll_interval_s`` accepted, seconds (a stream re-plans at least this often when idle)
MAX_POLL_INTERVAL_S = 300.0


def read_raylog_stream(topics, *, group: str, starting_offsets="earliest", poll_interval_s: float = 1.0,
                       idle_timeout_s: float | None = None, max_batches: int | None = None,
                       stop_event: threading.Event | None = None, min_partitions: int | None = None,
                       fail_on_data_loss: bool = True, locality: bool = True, fetch_bytes: int = FETCH_BYTES,
                       client=None, settings=None, **read_options) -> "RaylogStream":
    """An iterator of micro-batches of ``topics`` (a name or a list of
    names), each a bounded ``ray.data.Dataset``, read from and committed to
    consumer group ``group`` (see the module docstring for the commit rule).

    Bounds (each optional; with none the stream runs until the caller stops
    iterating): ``max_batches`` (stop after this many batches),
    ``idle_timeout_s`` (stop after this long with nothing new),
    ``stop_event`` (a ``threading.Event``: stop when set). When idle it
    re-plans every ``poll_interval_s`` (0 < it <= :data:`MAX_POLL_INTERVAL_S`).
    ``min_partitions``, ``fail_on_data_loss``, ``locality``, ``fetch_bytes``,
    ``client`` and ``settings`` are those of :func:`raylog.read.read_raylog`;
    the other keywords must be among :data:`READ_OPTIONS` (Ray remote
    options of the read tasks); any other is refused by name.

    Runnable example (a local cluster, a topic with 3 messages)::

        import raylog
        from raylog.read import read_raylog_stream

        client = raylog.connect()
        client.create_topic("events", partitions=2)
        producer = client.producer()
        for i in range(3):
            producer.send("events", b"event-%d" % i).result()
        producer.close()

        def upper(batch):                                  # a pandas DataFrame
            batch["value"] = batch["value"].map(bytes.upper)
            return batch

        seen = []
        with read_raylog_stream("events", group="uppercase", client=client, idle_timeout_s=5) as stream:
            for ds in stream:
                seen += list(ds.map_batches(upper, batch_format="pandas").to_pandas()["value"])
        assert sorted(seen) == [b"EVENT-0", b"EVENT-1", b"EVENT-2"]
        client.close()

    Raises :class:`~raylog.errors.ConfigError` for a bad argument,
    :class:`~raylog.errors.UnknownTopicError` for an unknown topic and
    :class:`~raylog.errors.GroupActiveError` for a group with live members.
    """
    unknown = sorted(name for name in read_options if name not in READ_OPTIONS)
    if unknown:
        raise ConfigError(
            f"read_raylog_stream got unknown option(s) {', '.join(unknown)}; it takes group, starting_offsets, "
            f"poll_interval_s, idle_timeout_s, max_batches, stop_event, min_partitions, fail_on_data_loss, "
            f"locality, fetch_bytes, client, settings and the read options {', '.join(READ_OPTIONS)}"
        )
    topics = _topic_list(topics)
    if not isinstance(group, str) or not group or "/" in group:
        raise ConfigError(f"group must be a non-empty string without '/', got {group!r}")
    _check_number("poll_interval_s", poll_interval_s, low=0.0, high=MAX_POLL_INTERVAL_S, open_low=True)
    if idle_timeout_s is not None:
        _check_number("idle_timeout_s", idle_timeout_s, low=0.0)
    if max_batches is not None and (not isinstance(max_batches, int) or isinstance(max_batches, bool)
                                    or max_batches < 1):
        raise ConfigError(f"max_batches must be a positive integer or None, got {max_batches!r}")
    if stop_event is not None and not (callable(getattr(stop_event, "is_set", None))
                                       and callable(getattr(stop_event, "wait", None))):
        raise ConfigError(f"stop_event must be a threading.Event (is_set and wait), got {stop_event!r}")
    if min_partitions is not None and (not isinstance(min_partitions, int) or isinstance(min_partitions, bool)
                                       or min_partitions < 1):
        raise ConfigError(f"min_partitions must be a positive integer or None, got {min_partitions!r}")
    for name, value in (("fail_on_data_loss", fail_on_data_loss), ("locality", locality)):
        if not isinstance(value, bool):
            raise ConfigError(f"{name} must be True or False, got {value!r}")
    if not isinstance(fetch_bytes, int) or isinstance(fetch_bytes, bool) or fetch_bytes < 1:
        raise ConfigError(f"fetch_bytes must be a positive integer, got {fetch_bytes!r}")
    starts = _starting_specs(starting_offsets, topics)
    return RaylogStream(
        topics, group, starts, poll_interval_s=float(poll_interval_s), idle_timeout_s=idle_timeout_s,
        max_batches=max_batches, stop_event=stop_event,
        plan_options={"min_partitions": min_partitions, "fail_on_data_loss": fail_on_data_loss},
        dataset_options={"locality": locality, "fetch_bytes": fetch_bytes, **read_options},
        client=client, settings=settings,
    )


def _topic_list(topics) -> list[str]:
    names = [topics] if isinstance(topics, str) else topics
    if not isinstance(names, (list, tuple)) or not names:
        raise ConfigError(f"topics must be a topic name or a non-empty list of names, got {topics!r}")
    for name in names:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"a topic name is a non-empty string, got {name!r}")
    if len(set(names)) != len(names):
        raise ConfigError(f"topics names a topic twice: {list(names)!r}")
    return list(names)


def _check_number(name: str, value, *, low: float, high: float | None = None, open_low: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
    ok = ok and (value > low if open_low else value >= low) and (high is None or value <= high)
    if not ok:
        bound = f"> {low:g}" if open_low else f">= {low:g}"
        bound += "" if high is None else f" and <= {high:g}"
        raise ConfigError(f"{name} must be a number of seconds {bound}, got {value!r}")


def _starting_specs(spec, topics: list[str]) -> dict:
    """``{topic: starting spec}``: a string for all, ``{partition: offset}``
    for the one topic, or ``{topic: spec}``."""
    if isinstance(spec, str):
        if spec not in ("earliest", "latest"):
            raise ConfigError(f"starting_offsets must be 'earliest', 'latest' or a mapping, got {spec!r}")
        return {t: spec for t in topics}
    if not isinstance(spec, Mapping):
        raise ConfigError(f"starting_offsets must be 'earliest', 'latest' or a mapping, got {spec!r}")
    if spec and all(isinstance(k, str) and not k.lstrip("-").isdigit() for k in spec):
        unknown = sorted(set(spec) - set(topics))
        if unknown:
            raise ConfigError(f"starting_offsets names topics the stream does not read: {unknown}")
        out = {t: "earliest" for t in topics}
        for topic, value in spec.items():
            if not isinstance(value, str):
                out[topic] = _check_partition_map(value, f"starting_offsets[{topic!r}]")
            elif value in ("earliest", "latest"):
                out[topic] = value
            else:
                raise ConfigError(f"starting_offsets[{topic!r}] must be 'earliest', 'latest' or a mapping, "
                                  f"got {value!r}")
        return out
    if len(topics) != 1:
        raise ConfigError(
            "with several topics, starting_offsets is 'earliest', 'latest' or {topic: 'earliest' | 'latest' | "
            "{partition: offset}}"
        )
    return {topics[0]: _check_partition_map(spec, "starting_offsets")}


def _check_partition_map(spec, what: str) -> dict[int, object]:
    """``{partition: offset or 'earliest'/'latest'}`` of a mapping (the
    partitions themselves are checked against the topic when planning)."""
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{what} must be 'earliest', 'latest' or {{partition: offset}}, got {spec!r}")
    out = {}
    for p, offset in spec.items():
        try:
            partition = int(p)
        except (TypeError, ValueError):
            raise ConfigError(f"{what}: partition keys are integers, got {p!r}") from None
        named = isinstance(offset, str) and offset in ("earliest", "latest")
        number = isinstance(offset, int) and not isinstance(offset, bool) and offset >= -2
        if partition < 0 or not (named or number):
            raise ConfigError(f"{what}[{p!r}] must be a byte offset (>= 0), 'earliest' or 'latest' for a "
                              f"partition >= 0, got {offset!r}")
        out[partition] = offset
    return out


@dataclasses.dataclass(frozen=True)
class _Connection:
    """What :func:`raylog.read.plan_read` uses of a ``client=``: the
    metadata view and the settings (here those the stream opened)."""

    metadata: object
    settings: object


class RaylogStream:
    """The iterator :func:`read_raylog_stream` returns. Its state: the
    position (``{(topic, partition): next offset}``), the batch handed out
    and not committed yet (:attr:`pending`), and the offsets it last stored
    or read (:attr:`committed`). One thread; see the module docstring."""

    def __init__(self, topics, group, starts, *, poll_interval_s, idle_timeout_s, max_batches, stop_event,
                 plan_options, dataset_options, client, settings):
        self.topics = topics
        self.group = group
        self._starts = starts
        self._poll_interval_s = poll_interval_s
        self._idle_timeout_s = idle_timeout_s
        self._max_batches = max_batches
        self._stop_event = stop_event
        self._plan_options = plan_options
        self._dataset_options = dataset_options
        self._metadata, self._conn_settings, self._owned = resolve_connection(client, settings)
        # every plan reuses this connection (a client's, or the one opened here): plan_read needs of
        # a client only its metadata and settings
        self._connection = client if client is not None else _Connection(self._metadata, self._conn_settings)
        self._closed = False
        try:
            #: each topic's partition count when the stream started: later ones are read from their start
            self._counts = {topic: self._metadata.partitions(topic) for topic in topics}  # UnknownTopicError
            self._store = offset_store(self._metadata)
            self._refuse_if_active("read")
            #: ``{(topic, partition): offset}`` stored for the group (read at the start, then stored by commits)
            self.committed: dict[tuple[str, int], int] = {
                key: offset for key, offset in self._store.committed_all(group).items() if key[0] in topics
            }
        except BaseException:
            self.close()
            raise
        self._position = dict(self.committed)
        #: the offsets that committing the batch in hand stores (empty: none in hand)
        self.pending: dict[tuple[str, int], int] = {}
        #: batches handed out so far
        self.batches = 0
        #: ranges skipped as lost (``fail_on_data_loss=False``), every batch's
        self.lost: list = []
        self._done = False

    # -- iteration -------------------------------------------------------------

    def __iter__(self):
        return self

    def __next__(self):
        """Commit the batch in hand (the caller consumed it), then the next
        batch: planned now, or after waiting for data; StopIteration at a
        bound."""
        self._check_open()
        self.commit()
        if self._done or (self._max_batches is not None and self.batches >= self._max_batches):
            self._done = True
            raise StopIteration
        idle_since = time.monotonic()
        while True:
            dataset, ends = self._plan_batch()
            if dataset is not None:
                self.pending = ends
                self.batches += 1
                return dataset
            if self._stop_event is not None and self._stop_event.is_set():
                break
            waited = time.monotonic() - idle_since
            wait = self._poll_interval_s
            if self._idle_timeout_s is not None:
                if waited >= self._idle_timeout_s:
                    break
                wait = min(wait, self._idle_timeout_s - waited)
            if self._stop_event is not None:
                self._stop_event.wait(wait)
            else:
                time.sleep(wait)
        self._done = True
        raise StopIteration

    def _plan_batch(self):
        """``(dataset, end offsets)`` of everything readable past the
        position, or ``(None, {})`` when nothing is."""
        plans = []
        for topic in self.topics:
            count = self._metadata.partitions(topic)
            default = self._starts[topic]
            start = {}
            for p in range(count):
                if (topic, p) in self._position:
                    start[p] = self._position[(topic, p)]
                elif p >= self._counts[topic]:
                    start[p] = "earliest"  # added since the stream started (client.add_partitions)
                elif isinstance(default, str):
                    start[p] = default
                else:
                    start[p] = default.get(p, "earliest")
            plan = plan_read(topic, start, "latest", client=self._connection, **self._plan_options)
            for gone in plan.lost:
                log.warning("stream of group %r skips %s", self.group, gone.describe())
            self.lost.extend(plan.lost)
            plans.append(plan)
        ends: dict[tuple[str, int], int] = {}
        for plan in plans:
            ends.update({(plan.topic, p): offset for p, offset in plan.end_offsets.items()})
        # "latest" and "earliest" are resolved once, into offsets, even when nothing is read
        self._position.update(ends)
        readable = [plan for plan in plans if plan.ranges and plan.total_bytes > 0]
        if not readable:
            return None, {}
        datasets = [read_raylog(plan.topic, plan=plan, **self._dataset_options) for plan in readable]
        dataset = datasets[0] if len(datasets) == 1 else datasets[0].union(*datasets[1:])
        return dataset, ends

    # -- commits -----------------------------------------------------------------

    def commit(self) -> dict[tuple[str, int], int]:
        """Store the end offsets of the batch in hand as the group's committed
        offsets (call it once the batch is consumed; ``next`` does it too).
        Returns what was stored (empty: no batch in hand). Raises
        :class:`~raylog.errors.GroupActiveError` if the group has live
        members and :class:`~raylog.errors.ConcurrentLoadError` if its
        offsets moved since this stream read or stored them; neither stores
        anything."""
        self._check_open()
        if not self.pending:
            return {}
        self._refuse_if_active("commit the offsets of")
        keys = sorted(self.pending)
        now = {key: self._store.committed(self.group, *key) for key in keys}
        moved = {key: (self.committed.get(key), now[key]) for key in keys if now[key] != self.committed.get(key)}
        if moved:
            raise ConcurrentLoadError(
                f"the committed offsets of group {self.group!r} moved while this stream read them ("
                + ", ".join(f"{t}-{p}: {a} -> {b}" for (t, p), (a, b) in moved.items())
                + "); nothing was committed. Run one stream per group, then start it again",
                group=self.group,
                moved={f"{t}-{p}": ab for (t, p), ab in moved.items()},
            )
        stored = {}
        for key in keys:
            if self.pending[key] != self.committed.get(key):
                self._store.commit(self.group, key[0], key[1], self.pending[key])
                stored[key] = self.pending[key]
        self.committed.update(self.pending)
        self.pending = {}
        log.debug("stream of group %r committed %s", self.group, stored)
        return stored

    def _refuse_if_active(self, doing: str) -> None:
        members = live_members(self._metadata.zk, self._conn_settings.cluster, self.group)
        if members:
            raise GroupActiveError(
                f"cannot {doing} consumer group {self.group!r} as a stream: it has {len(members)} live consumer "
                f"member(s) ({', '.join(sorted(members))}) that move the same offsets; stop them, or stream "
                f"with a group of its own",
                group=self.group,
                members=sorted(members),
            )

    # -- lifetime ----------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ConfigError(f"the stream of group {self.group!r} is closed; start a new one to read on")

    def close(self) -> None:
        """Stop; the batch in hand is not committed (call :meth:`commit`
        first if it was consumed). Idempotent."""
        self._closed = True
        if self._owned is not None:
            self._owned.close()
            self._owned = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return (f"RaylogStream({self.topics!r}, group={self.group!r}, {self.batches} batches, "
                f"{'a batch' if self.pending else 'nothing'} in hand)")
