"""Spark DataFrames into topics: ``write_topic``.

::

    n = raylog_spark.write_topic(df, "clicks", key_col="user", value_col="payload", client=client)

Each Spark task writes its own rows: it runs a :class:`raylog.Producer` with
a metadata view of its own (``Metadata.connect(settings)``: ZooKeeper for
the endpoints, then TCP to the partition actors), sends the rows of every
Arrow batch Spark hands it (``mapInArrow``, no Python rows), flushes, and
reports how many it wrote; the driver adds the reports up.

Columns: ``value_col`` and ``key_col`` may be binary (written as they are),
string (UTF-8), a struct, map or array (written as JSON, ``to_json``) or any
other atomic type (its string form). A null value is a tombstone (as in
Spark's Kafka sink); a null key means no key. Keys go to partitions by the
producer's stable hash; keyless rows fill one partition per batch (sticky);
``partition_col`` chooses the partition of each row instead.

Each task's producer waits for acks "all" by default (a batch is answered
once flushed and on every in-sync replica). Delivery is at-least-once: each
task's producer is idempotent within the task, but Spark retries a failed
task with a new producer, which writes that task's rows again (the
``format("raylog")`` sink stores a retried task's rows once).
"""

from __future__ import annotations

import functools
from typing import Iterator

import pyarrow as pa

from raylog import Producer
from raylog.errors import ConfigError
from raylog.metadata import Metadata
from raylog.read import resolve_connection


def _as_binary(df, name: str):
    from pyspark.sql import functions as F  # heavy (Spark): imported when used
    from pyspark.sql import types as T  # heavy (Spark): imported when used

    if name not in df.columns:
        raise ConfigError(f"the DataFrame has no column {name!r}; its columns are {df.columns}")
    dtype = df.schema[name].dataType
    column = F.col(name)
    if isinstance(dtype, T.BinaryType):
        return column
    if isinstance(dtype, (T.StructType, T.MapType, T.ArrayType)):
        return F.to_json(column).cast("binary")
    return column.cast("string").cast("binary")


def write_topic(
    df,
    topic: str,
    key_col: str | None = None,
    value_col: str = "value",
    *,
    partition_col: str | None = None,
    client=None,
    settings=None,
    acks: int | str = "all",
    compression: str | None = None,
    batch_size: int = 500,
    linger_ms: float = 5,
) -> int:
    """Write the rows of ``df`` into ``topic`` from the executors; returns
    the number of messages written.

    ``client`` (a :class:`raylog.Client`) or ``settings`` (its
    ``client.settings``) name the cluster; with neither, the cluster
    ``raylog.connect()`` made in this process (or ``RAYLOG_ZOOKEEPER``). ``acks``, ``compression``,
    ``batch_size`` and ``linger_ms`` configure each task's producer
    (``acks="all"``, the default: each batch is flushed and on every in-sync
    replica before the task ends; ``1``: appended by its partition). Raises
    :class:`~raylog.errors.UnknownTopicError` on the driver for an unknown
    topic, :class:`~raylog.errors.ConfigError` for a missing column.
    """
    metadata, settings, owned = resolve_connection(client, settings)
    try:
        partitions = metadata.partitions(topic)  # UnknownTopicError before any Spark job
    finally:
        if owned is not None:
            owned.close()
    columns = [_as_binary(df, value_col).alias("value")]
    if key_col is not None:
        columns.append(_as_binary(df, key_col).alias("key"))
    if partition_col is not None:
        if partition_col not in df.columns:
            raise ConfigError(f"the DataFrame has no column {partition_col!r}; its columns are {df.columns}")
        columns.append(df[partition_col].cast("int").alias("partition"))
    options = {"acks": acks, "compression": compression, "batch_size": batch_size, "linger_ms": linger_ms}
    writer = functools.partial(write_batches, topic, settings, options, partitions)
    counts = df.select(*columns).mapInArrow(writer, "written long").collect()
    return sum(row["written"] for row in counts)


def write_batches(topic: str, settings, options: dict, partitions: int, batches: Iterator[pa.RecordBatch]):
    """The ``mapInArrow`` function of :func:`write_topic`: one producer per
    task; yields one row, the number of messages it wrote."""

    metadata = Metadata.connect(settings)
    producer = Producer(metadata, **options)
    written = 0
    try:
        for batch in batches:
            names = batch.schema.names
            column = batch.column(names.index("value"))
            values = column.to_pylist()
            keys = batch.column(names.index("key")).to_pylist() if "key" in names else None
            if column.null_count and "partition" not in names:
                for i, value in enumerate(values):  # a null value: a tombstone
                    producer.send(topic, value, None if keys is None else keys[i])
            elif "partition" in names:
                parts = batch.column(names.index("partition")).to_pylist()
                for i, value in enumerate(values):
                    p = parts[i]
                    if p is None or not 0 <= p < partitions:
                        raise ConfigError(f"partition {p!r} is not one of {topic!r}'s 0..{partitions - 1}")
                    producer.send(topic, value, None if keys is None else keys[i], partition=p)
            else:
                producer.send_batch(topic, values, keys)
            written += len(values)
        producer.flush()
    finally:
        producer.close()
        metadata.close()
    yield pa.RecordBatch.from_arrays([pa.array([written], pa.int64())], names=["written"])
