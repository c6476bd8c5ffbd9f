"""The incremental loader: the paper's Hadoop load job, as a Spark read that
tracks its own offsets.

::

    df, load = raylog_spark.load_incremental(spark, "clicks", "warehouse", client=client)
    df.write.mode("append").parquet("/data/clicks")      # the job's output
    load.commit()                                         # only after the output is safe

Each run reads everything since the group's committed offsets (a partition
the group never committed starts at its log start) up to the end offsets
snapshot when the run starts, and :meth:`IncrementalLoad.commit` stores
those end offsets as the group's committed offsets (docs/design.md §4
``consumers/<group>/offsets/<topic>/<p>``, the nodes consumer groups use).
A run that fails before ``commit`` leaves the offsets where they were, so
the next run reads the same ranges again (and more, if more came): every
message is loaded at least once, and exactly once when each run's output
and commit both succeed or both fail.

``commit`` refuses to store offsets when the group's committed offsets
changed since the run started (another loader or a consumer of the group
moved them), so two overlapping runs cannot silently skip data. The check
and the writes are not one ZooKeeper transaction: run one loader per
(topic, group) at a time.
"""

from __future__ import annotations

import logging

from raylog.errors import ConcurrentLoadError, ConfigError
from raylog.read import ReadPlan, offset_store, plan_read, resolve_connection
from raylog_spark.reader import plan_dataframe

log = logging.getLogger(__name__)


class IncrementalLoad:
    """The handle of one incremental load: what it reads and its commit.

    ``start_offsets``/``end_offsets``: ``{partition: offset}`` read by this
    run; ``committed_before``: the group's offsets when it started (None for
    a partition never committed). Not thread-safe; one run, one handle.
    """

    def __init__(self, plan: ReadPlan, group: str, committed_before: dict, client=None, settings=None):
        self.plan = plan
        self.topic = plan.topic
        self.group = group
        self.committed_before = dict(committed_before)
        self.start_offsets = dict(plan.start_offsets)
        self.end_offsets = dict(plan.end_offsets)
        self._client = client
        self._settings = settings
        self.committed = False

    @property
    def bytes(self) -> int:
        """Bytes of log this run reads."""
        return self.plan.total_bytes

    def commit(self) -> dict[int, int]:
        """Store the run's end offsets as the group's committed offsets; call
        it once the job's output is written. Returns the offsets stored.
        Raises :class:`ConcurrentLoadError` if the group's offsets moved since
        the run started; a second call does nothing."""

        if self.committed:
            return self.end_offsets
        metadata, settings, owned = resolve_connection(self._client, self._settings)
        try:
            store = offset_store(metadata)
            now = {p: store.committed(self.group, self.topic, p) for p in self.end_offsets}
            moved = {p: (self.committed_before.get(p), now[p]) for p in now if now[p] != self.committed_before.get(p)}
            if moved:
                raise ConcurrentLoadError(
                    f"the committed offsets of group {self.group!r} on {self.topic!r} changed while this load "
                    f"ran ({', '.join(f'{p}: {a} -> {b}' for p, (a, b) in sorted(moved.items()))}); "
                    f"nothing was committed. Run the load again.",
                    group=self.group,
                    topic=self.topic,
                    moved=moved,
                )
            for p, offset in sorted(self.end_offsets.items()):
                store.commit(self.group, self.topic, p, offset)
        finally:
            if owned is not None:
                owned.close()
        self.committed = True
        log.info("load of %s for group %r committed %s", self.topic, self.group, self.end_offsets)
        return self.end_offsets

    def __repr__(self) -> str:
        state = "committed" if self.committed else "not committed"
        return f"IncrementalLoad({self.topic!r}, group={self.group!r}, {self.bytes} bytes, {state})"


def load_incremental(
    spark,
    topic: str,
    group: str,
    value_format: str = "binary",
    *,
    client=None,
    settings=None,
    min_partitions: int | None = None,
    fail_on_data_loss: bool = True,
    **read_options,
):
    """``(DataFrame, IncrementalLoad)``: the messages of ``topic`` that
    ``group`` has not loaded yet, up to the end offsets now.

    Commit with ``handle.commit()`` after the job has written its output.
    A committed offset that retention has since deleted raises
    :class:`raylog.read.DataLossError` (``fail_on_data_loss=False``: the lost
    part is skipped and reported in ``handle.plan.lost``). ``value_format``
    and ``read_options`` are those of :func:`raylog_spark.read_topic`.
    """

    if not group or not isinstance(group, str):
        raise ConfigError(f"group must be a non-empty string, got {group!r}")
    metadata, conn_settings, owned = resolve_connection(client, settings)
    try:
        partitions = metadata.partitions(topic)  # UnknownTopicError
        store = offset_store(metadata)
        committed = {p: store.committed(group, topic, p) for p in range(partitions)}
    finally:
        if owned is not None:
            owned.close()
    starting = {p: ("earliest" if offset is None else offset) for p, offset in committed.items()}
    plan = plan_read(
        topic,
        starting,
        "latest",
        min_partitions=min_partitions,
        fail_on_data_loss=fail_on_data_loss,
        client=client,
        settings=settings,
    )
    for gone in plan.lost:
        log.warning("load of %s for group %r skips %s", topic, group, gone.describe())
    df = plan_dataframe(spark, plan, value_format, client=client, **read_options)
    df.raylog_plan = plan
    return df, IncrementalLoad(plan, group, committed, client=client, settings=conn_settings)
