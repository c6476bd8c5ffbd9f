"""The table view of a topic: the latest value of each key, tombstones
removed (the state a changelog holds), as a ``ray.data.Dataset``
(:func:`read_table`, ``client.read_table``).

The read deduplicates by itself, so it is right before the log cleaner of a
compacted topic has run as after (docs/design.md §3, §6): within a
partition the record with the highest offset of a key wins, and a null
value (a tombstone) removes the key. The work is distributed: one read task
per partition (the read plan is not split), each reading its partition's
range (:func:`raylog.read.reader.read_range`, gaps of cleaned segments
skipped) and keeping only its latest rows (:func:`latest_per_key`), so a
task holds about one partition's table at a time.

A key lives in one partition when the topic is written as raylog's producer
and Kafka clients' default partitioners write a keyed record
(``crc32c(key) mod partitions``, :mod:`raylog.producer.partitioner`; a
Kafka client's own hash likewise sends a key always to the same partition).
A topic written with explicit partitions may hold a key in several: the
table then has one row per partition that holds the key (that partition's
latest), told apart by the ``partition`` column; offsets of different
partitions do not order records, so no row is chosen among them. Records
without a key (a compacted topic refuses them; another topic may hold
some) belong to no row and are left out.

Thread-safety: the functions keep no state; any thread.
"""

from __future__ import annotations

from typing import Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from raylog.metadata import ConnectionSettings
from raylog.read.datasource import read_raylog
from raylog.read.plan import plan_read
from raylog.read.ranges import ARROW_SCHEMA, ReadRange
from raylog.read.reader import read_range

#: the temporary column of row numbers a deduplication groups on
_ROW = "__row"


def latest_rows(table: pa.Table) -> pa.Table:
    """The last row of each non-null key of ``table`` (rows of one partition
    in offset order), tombstones kept, in offset order."""
    table = table.filter(pc.is_valid(table.column("key")))
    if table.num_rows < 2:
        return table
    numbered = pa.table({"key": table.column("key"), _ROW: pa.array(range(table.num_rows), pa.int64())})
    last = numbered.group_by("key", use_threads=False).aggregate([(_ROW, "max")]).column(f"{_ROW}_max")
    if len(last) == table.num_rows:
        return table  # every key once
    return table.take(last.take(pc.array_sort_indices(last)))


def latest_per_key(tables: Iterable[pa.Table]) -> pa.Table:
    """The table view of the rows of ``tables`` (one partition's, in offset
    order): :func:`latest_rows` of them all, tombstones removed. Memory: the
    rows kept so far and about as many read since (they are deduplicated
    whenever the rows read since outnumber the rows kept)."""
    kept = ARROW_SCHEMA.empty_table()
    waiting: list[pa.Table] = []
    rows = 0
    for table in tables:
        waiting.append(table)
        rows += table.num_rows
        if rows > max(kept.num_rows, 1 << 16):
            kept = latest_rows(pa.concat_tables([kept, *waiting]))
            waiting, rows = [], 0
    if waiting:
        kept = latest_rows(pa.concat_tables([kept, *waiting]))
    return kept.filter(pc.is_valid(kept.column("value")))


def read_range_latest(rng: ReadRange, settings: ConnectionSettings, options: dict,
                      replica: str | None) -> Iterator[pa.Table]:
    """A read task of :func:`read_table`: the table view of ``rng`` (a whole
    partition's range), as one Arrow table."""
    yield latest_per_key(pa.Table.from_batches([batch]) for batch in read_range(rng, settings, replica=replica,
                                                                                **options))


def read_table(topic: str, ending_offsets="latest", *, fail_on_data_loss: bool = True, client=None,
               settings: ConnectionSettings | None = None, locality: bool = True, **options):
    """The latest value of each key of ``topic``, tombstones removed, as a
    ``ray.data.Dataset`` with the columns of :func:`~raylog.read.read_raylog`
    (:data:`~raylog.read.ARROW_SCHEMA`): one row per key (per partition that
    holds it, see the module docstring), the row of its latest record, in
    offset order within a partition.

    Read from each partition's log start up to ``ending_offsets``
    (``"latest"``: the high watermarks now, or ``{partition: offset}``), one
    read task per partition; right whether or not the log cleaner of a
    compacted topic has run (the read deduplicates). ``fail_on_data_loss``,
    ``client``, ``settings`` are those of :func:`~raylog.read.plan_read`,
    ``locality`` and the other ``options`` those of
    :func:`~raylog.read.read_raylog`. Its errors are theirs.
    """
    plan = plan_read(topic, "earliest", ending_offsets, fail_on_data_loss=fail_on_data_loss, client=client,
                     settings=settings)
    return read_raylog(topic, plan=plan, locality=locality, read_task=read_range_latest, **options)
