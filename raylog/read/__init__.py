"""Bounded reads of a topic as Arrow: the read plan, the range reader, Ray Data.

Modules: :mod:`~raylog.read.ranges` (the schema, plans and ranges as values),
:mod:`~raylog.read.plan` (planning on the driver), :mod:`~raylog.read.reader`
(range readers), :mod:`~raylog.read.datasource` (Ray Data),
:mod:`~raylog.read.stream` (unbounded reads: a topic as micro-batches whose
position is a consumer group's committed offsets),
:mod:`~raylog.read.group_offsets` (a group's committed offsets for readers
that keep its position themselves), :mod:`~raylog.read.table` (the table
view: the latest value of each key, ``read_table``). Everything public
is importable from :mod:`raylog.read`.

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
(:func:`raylog.storage.decoding.decode_messages`), and yield
``pyarrow.RecordBatch`` es of :data:`ARROW_SCHEMA`, the columns of Spark's
Kafka source:

=========  ==========================  =========================================
column     Arrow type                  meaning
=========  ==========================  =========================================
key        binary (null: no key)       the message's key
value      binary (null: a tombstone)  the message's value; null for a format-2
                                       record with a null value, which differs
                                       from an empty value
topic      string                      the topic
partition  int32                       the partition
offset     int64                       the message's offset (docs/design.md §2:
                                       a byte position; inner message i of a
                                       wrapper or record i of a format-2 batch
                                       at p: p + i)
timestamp  timestamp[us, UTC]          the producer's create time
headers    list<struct<key: string,    a format-2 record's headers in order,
           value: binary>>             duplicates kept (a null header value is
                                       null); an empty list for format 1
=========  ==========================  =========================================

Both formats are read alike, in one read (a log of format-1 segments followed
by format-2 ones, as an upgrade leaves it). ``headers`` was added last, so
code that reads columns by name or position (the first six) is unchanged.

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

from raylog.errors import DataLossError
from raylog.read.datasource import (
    PLAN_OPTIONS,
    placement_options,
    read_raylog,
)
from raylog.read.group_offsets import offset_store
from raylog.read.plan import (
    default_settings,
    plan_read,
    resolve_connection,
    split_counts,
)
from raylog.read.ranges import (
    ARROW_SCHEMA,
    BATCH_BYTES,
    EARLIEST,
    FETCH_BYTES,
    LATEST,
    LostRange,
    NODE_ID_LABEL,
    RECONNECT_DEADLINE_S,
    ReadPlan,
    ReadRange,
    records_to_batch,
)
from raylog.read.reader import (
    head_values,
    read_range,
    read_ranges,
)
from raylog.read.stream import RaylogStream, read_raylog_stream
from raylog.read.table import latest_per_key, read_table

__all__ = [
    "ARROW_SCHEMA",
    "BATCH_BYTES",
    "DataLossError",
    "EARLIEST",
    "FETCH_BYTES",
    "LATEST",
    "LostRange",
    "NODE_ID_LABEL",
    "PLAN_OPTIONS",
    "RECONNECT_DEADLINE_S",
    "ReadPlan",
    "RaylogStream",
    "ReadRange",
    "default_settings",
    "head_values",
    "latest_per_key",
    "offset_store",
    "placement_options",
    "plan_read",
    "read_range",
    "read_ranges",
    "read_raylog",
    "read_raylog_stream",
    "read_table",
    "records_to_batch",
    "resolve_connection",
    "split_counts",
]
