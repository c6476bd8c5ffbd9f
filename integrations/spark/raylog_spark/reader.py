"""Topics as Spark DataFrames: ``read_topic`` and the DataFrame of a read plan.

::

    client = raylog.connect()
    spark = raylog_spark.init_spark()
    df = raylog_spark.read_topic(spark, "clicks", client=client)
    df.groupBy("partition").count().show()

How a read runs:

1. On the driver, :func:`raylog.read.plan_read` snapshots each partition's
   log start and high watermark once and fixes the byte ranges to read
   (validating explicit offsets, reporting or refusing lost data, splitting
   ranges for ``min_partitions`` at message boundaries). The plan, with the
   partitions' endpoints, is a small picklable value.
2. The executors read the ranges, one Spark partition per range, each
   preferring the node that holds the range's partition (Spark's scheduler
   runs the read there when an executor runs there; ``spark.locality.wait``
   bounds how long it waits for one). Two engines read:

   * ``"jvm"``: the Spark data source ``raylog`` (Java, built by
     :mod:`raylog_spark.jvm`, added to the session by ``init_spark``) runs
     in the executors' JVMs: ``spark.read.format("raylog")`` with the plan's
     ranges as an option; it fetches from the data sockets, checks every
     message's CRC32C, unpacks compressed wrappers and builds Spark rows
     without any Python worker. A bare ``df.count()`` is pushed down to
     the partition actors (the COUNT request: each counts and checks its
     range on its node and sends only the number); a query that needs few
     columns copies only those.
   * ``"python"``: ``mapInArrow`` runs :func:`raylog.read.read_range` in
     Spark's Python workers over a DataFrame of range numbers (RayDP's
     ``RayObjectRefRDD`` gives each its node as preferred location) and
     hands Arrow RecordBatches to Spark. It pays for Python workers (about
     0.3 s per job on a small machine, more than the whole JVM read of a
     million messages) and is the fallback when the JVM reader is missing.

   ``engine="auto"`` (the default) takes the JVM reader when the session
   loads it. ``value_format="json"`` parses the value column with Spark's
   ``from_json`` on either engine (:mod:`raylog_spark.json_values`).
   ``value_format="avro"`` decodes the values into typed columns where they
   are read: in the JVM reader (``org.raylog.spark.AvroReader``, with the
   Apache Avro library Spark ships) or, with the Python reader, in the
   Python workers (fastavro, :mod:`raylog_spark.avro_values`); both give the
   same columns and values.

The DataFrame is as repeatable as its plan: every action over it reads the
same ranges (unless retention deleted them meanwhile, see
``fail_on_data_loss``). Plan again (call ``read_topic`` again) to see new data.
Errors the executors meet (data lost since planning, a corrupt message, a
partition actor that moved) fail the Spark job with the raylog error's
name at the start of the message, e.g. ``DataLossError: ...``.

Columns (:mod:`raylog_spark.columns`), exactly Spark's Kafka source's on
either engine and for ``spark.read.format("raylog")``: ``key`` binary,
``value`` binary, ``topic`` string, ``partition`` int, ``offset`` long (the
byte offset; the i-th inner message of a compressed set or record batch at
``w`` carries ``w + i``), ``timestamp`` timestamp, ``timestampType`` int
(0 CreateTime; the JVM reader gives 1 for a record of a LogAppendTime
batch, the Python reader 0 for every record); with ``include_headers=True``
(Spark's ``includeHeaders``) then ``headers``
``array<struct<key: string, value: binary>>``; with
``include_next_offset=True`` (Spark option ``includeNextOffset``; JVM
reader only) last raylog's ``next_offset`` long, where to resume after the
message. With ``value_format="json"`` or ``"avro"`` the value's fields
replace ``value`` as top-level columns (``flatten=False``: one struct
column ``value``) beside ``key``, ``topic``, ``partition``, ``offset`` and
``timestamp``.
"""

from __future__ import annotations

import functools
import logging
from typing import Iterator

import pyarrow as pa

from raylog.errors import ConfigError
from raylog.read import FETCH_BYTES, ReadPlan, plan_read, read_range
from raylog_spark.avro_values import DEFAULT_SAMPLE, AvroColumns
from raylog_spark.columns import META_COLUMNS, spark_schema
from raylog_spark.json_values import parse_json
from raylog_spark.source import jvm_dataframe

log = logging.getLogger(__name__)

VALUE_FORMATS = ("binary", "json", "avro")
ENGINES = ("auto", "jvm", "python")


def check_formats(value_format: str, engine: str) -> None:
    """ConfigError for a value format or engine read_topic does not know."""
    if value_format not in VALUE_FORMATS:
        raise ConfigError(f"value_format must be one of {VALUE_FORMATS}, got {value_format!r}")
    if engine not in ENGINES:
        raise ConfigError(f"engine must be one of {ENGINES}, got {engine!r}")


def read_topic(
    spark,
    topic: str,
    starting_offsets="earliest",
    ending_offsets="latest",
    value_format: str = "binary",
    *,
    min_partitions: int | None = None,
    fail_on_data_loss: bool = True,
    client=None,
    settings=None,
    isolation_level: str = "read_uncommitted",
    **read_options,
):
    """``topic`` as a DataFrame: the messages between ``starting_offsets``
    and ``ending_offsets``, fixed when this is called.

    Offsets, ``min_partitions`` and ``fail_on_data_loss`` are those of
    :func:`raylog.read.plan_read`; ``client`` (a :class:`raylog.Client`) or
    ``settings`` (its ``client.settings``) say which cluster to read; with
    neither, the cluster ``raylog.connect()`` made in this process (or
    ``RAYLOG_ZOOKEEPER``, see :func:`raylog.read.default_settings`).
    ``read_options`` are the keyword arguments of :func:`plan_dataframe`:
    ``schema``, ``schema_id``, ``schema_subject``, ``schema_version``,
    ``json_options``, ``flatten``, ``sample``, ``locality``, ``fetch_bytes``, ``engine``, ``count_pushdown``,
    ``include_headers`` and ``include_next_offset``.

    ``value_format``:

    * ``"binary"``: the Kafka-source columns (see the module docstring),
      with ``headers`` when ``include_headers`` and ``next_offset`` last
      when ``include_next_offset`` (the JVM reader only: ConfigError with
      ``engine="python"``);
    * ``"json"``: values parsed with Spark's ``from_json``, under ``schema``
      (a StructType or DDL string) or a schema Spark infers from the first
      ``sample`` values; ``json_options`` go to ``from_json``;
    * ``"avro"``: values in Confluent framing decoded into typed columns of
      the registered schema ``schema_id``, or of version ``schema_version``
      (``"latest"``, the default, or a number) of ``schema_subject``
      (default: the schema of the first message). Values written under other
      schemas are resolved to it (Avro schema evolution).

    ``engine``: ``"jvm"`` (the Spark data source ``raylog``; ConfigError
    when the session cannot load it), ``"python"`` (``mapInArrow``) or
    ``"auto"`` (the JVM reader when the session loads it); see the module
    docstring. The engine used is ``df.raylog_engine``.

    ``isolation_level``: ``"read_uncommitted"`` (every record) or
    ``"read_committed"`` (those of committed transactions and plain writes,
    up to each partition's last stable offset: :func:`raylog.read.plan_read`).
    The Python reader reads ``read_committed`` (``engine="auto"`` picks it);
    the JVM reader does not yet (``engine="jvm"``: ConfigError).

    The plan is kept as ``df.raylog_plan`` (:class:`raylog.read.ReadPlan`:
    offsets, ranges and the lost ranges skipped). Errors that can be found
    on the driver are raised here: unknown topic, an offset off a message
    boundary or past the end, lost data, an unknown schema id.
    """
    check_formats(value_format, read_options.get("engine", "auto"))
    plan = plan_read(
        topic,
        starting_offsets,
        ending_offsets,
        min_partitions=min_partitions,
        fail_on_data_loss=fail_on_data_loss,
        client=client,
        settings=settings,
        isolation_level=isolation_level,
    )
    for gone in plan.lost:
        log.warning("read_topic(%r) skips %s", topic, gone.describe())
    df = plan_dataframe(spark, plan, value_format, client=client, **read_options)
    df.raylog_plan = plan
    return df


def plan_dataframe(
    spark,
    plan: ReadPlan,
    value_format: str = "binary",
    *,
    client=None,
    schema=None,
    schema_id: int | None = None,
    schema_subject: str | None = None,
    schema_version: int | str = "latest",
    json_options: dict | None = None,
    flatten: bool = True,
    sample: int = DEFAULT_SAMPLE,
    locality: bool = True,
    fetch_bytes: int = FETCH_BYTES,
    engine: str = "auto",
    count_pushdown: bool = True,
    include_headers: bool = False,
    include_next_offset: bool = False,
):
    """The DataFrame that reads ``plan`` (see :func:`read_topic`); the
    engine that reads it is ``df.raylog_engine``. ``count_pushdown=False``
    makes the JVM reader read every row of a bare ``count()`` instead of
    asking the partitions for the number."""
    check_formats(value_format, engine)
    committed = plan.isolation_level == "read_committed"
    if committed and engine == "jvm":
        raise ConfigError(
            "the JVM reader does not read read_committed yet (it would hand out aborted transactions' "
            "records); read with engine='python' (or 'auto'), which does"
        )
    if (include_headers or include_next_offset) and value_format != "binary":
        raise ConfigError(
            f"include_headers and include_next_offset add columns to a binary read; a {value_format} read has the "
            f"value's columns and {', '.join(META_COLUMNS)}"
        )
    if include_next_offset and (committed or not _use_jvm(spark, engine)):
        raise ConfigError(
            "include_next_offset needs the JVM reader (the Python reader does not give next_offset); read with "
            "engine='jvm' (read_uncommitted), or without include_next_offset"
        )
    options = {
        "fail_on_data_loss": plan.fail_on_data_loss,
        "fetch_bytes": fetch_bytes,
        "max_message_bytes": plan.max_message_bytes,
        "isolation_level": plan.isolation_level,
    }
    decoder = None
    if value_format == "avro":  # checked on the driver: schema ids, unions, column names
        decoder = AvroColumns.for_plan(plan, client=client, schema_id=schema_id, flatten=flatten, sample=sample,
                                       schema_subject=schema_subject, schema_version=schema_version)
    if not committed and _use_jvm(spark, engine):
        df = jvm_dataframe(
            spark, plan, locality=locality, fetch_bytes=fetch_bytes, avro=decoder, count_pushdown=count_pushdown,
            include_headers=include_headers, include_next_offset=include_next_offset,
        )
        used = "jvm"
    else:
        df = _ranges_dataframe(spark, plan, locality).mapInArrow(
            functools.partial(read_indexed_ranges, plan.ranges, plan.settings, options, decoder, include_headers),
            spark_schema(include_headers) if decoder is None else decoder.spark_schema,
        )
        used = "python"
    if value_format == "json":
        df = parse_json(spark, df, plan, schema, json_options, flatten, sample)
    df.raylog_engine = used
    return df


def _use_jvm(spark, engine: str) -> bool:
    if engine == "python":
        return False
    from raylog_spark import jvm  # not at the top: `python -m raylog_spark.jvm` runs it as a script

    if jvm.loadable(spark):
        return True
    if engine == "jvm":
        raise ConfigError(
            f"this Spark session cannot load the raylog data source ({jvm.SOURCE_CLASS}); start the session "
            f"with raylog_spark.init_spark (which adds its jar), add raylog_spark.jvm.jar_path() to spark.jars "
            f"and spark.driver.extraClassPath, or read with engine='python'"
        )
    log.info("the Spark session cannot load %s; reading with the Python reader", jvm.SOURCE_CLASS)
    return False


def _ranges_dataframe(spark, plan: ReadPlan, locality: bool):
    """One row (``idx``, the range's index) and one Spark partition per range,
    preferring the node that holds the range's partition."""
    from pyspark.sql import DataFrame  # heavy (Spark): imported when used

    count = len(plan.ranges)
    if count and locality and all(r.node_ip for r in plan.ranges):
        try:
            from ray.core.generated.common_pb2 import Address  # heavy (Ray): imported when used

            locations = [Address(ip_address=r.node_ip).SerializeToString() for r in plan.ranges]
            reader = spark.sparkContext._jvm.org.apache.spark.sql.raydp.ObjectStoreReader
            return DataFrame(reader.createRayObjectRefDF(spark._jsparkSession, locations), spark)
        except Exception as err:  # noqa: BLE001 - no RayDP reader class: read without a preference
            log.info("reading %s without locality preferences: %s", plan.topic, err)
    return spark.range(0, count, 1, max(1, count)).selectExpr("CAST(id AS INT) AS idx")


def read_indexed_ranges(ranges, settings, options: dict, decoder, include_headers: bool,
                        batches: Iterator[pa.RecordBatch]):
    """The ``mapInArrow`` function of a read: for each range index in the
    input, the range's messages as RecordBatches, typed by ``decoder`` or
    with :func:`kafka_columns`."""
    try:
        for batch in batches:
            for idx in batch.column(0).to_pylist():
                for out in read_range(ranges[idx], settings, **options):
                    yield kafka_columns(out, include_headers) if decoder is None else decoder.decode(out)
    finally:
        if decoder is not None:
            decoder.close()


def kafka_columns(batch: pa.RecordBatch, include_headers: bool) -> pa.RecordBatch:
    """A RecordBatch of :data:`raylog.read.ARROW_SCHEMA` with the columns of
    :func:`raylog_spark.columns.spark_schema`: ``timestampType`` added after
    ``timestamp`` (0, CreateTime: the Python reader's records carry no
    timestamp type), ``headers`` kept when ``include_headers``."""
    columns = [batch.column(i) for i in range(6)]  # key, value, topic, partition, offset, timestamp
    names = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    columns.append(pa.repeat(pa.scalar(0, pa.int32()), batch.num_rows))
    if include_headers:
        columns.append(batch.column(batch.schema.get_field_index("headers")))
        names.append("headers")
    return pa.RecordBatch.from_arrays(columns, names=names)
