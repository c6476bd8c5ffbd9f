"""The table view of a topic as a Spark DataFrame: the latest value of each
key, tombstones removed (:func:`read_table`), as ``client.read_table`` gives
it as a Ray Dataset (:mod:`raylog.read.table`, whose semantics these are).

How it runs: a read of the whole topic up to ``ending_offsets``
(:func:`raylog_spark.read_topic`, either engine; the gaps a log cleaner left
are skipped by the readers), then one aggregation in Spark: per
``(partition, key)`` the row of the highest offset (``max_by`` over the
offset), tombstones (a null value) dropped after. Spark aggregates each
read task's rows before the shuffle (a partial aggregation), so what
crosses the shuffle is about one row per key and task, not every record:
the cost grows with the records read and the memory with the keys. The
read deduplicates by itself, so the table is right before the cleaner of a
compacted topic has run as after.

A key lives in one partition when the topic is written by a key-hashing
partitioner (raylog's producer, Kafka clients); a key written to several
partitions explicitly has one row per partition that holds it (offsets of
different partitions do not order records). Records without a key belong to
no row.

Thread-safety: the functions keep no state; any thread (Spark sessions are
thread-safe for building DataFrames).
"""

from __future__ import annotations

from raylog.errors import ConfigError
from raylog.read import plan_read
from raylog_spark.avro_values import DEFAULT_SAMPLE
from raylog_spark.columns import META_COLUMNS, check_flattened
from raylog_spark.json_values import parse_json
from raylog_spark.reader import check_formats, plan_dataframe

#: the column that holds each key's latest row while the table is built
_LATEST = "__latest"
#: the options of a JSON read, applied to the table's values once deduplicated
_JSON_OPTIONS = ("schema", "json_options", "flatten", "sample")


def latest_per_key(df):
    """The table view of ``df`` (a read with the columns ``key``,
    ``partition``, ``offset`` and ``value``, binary or an Avro struct, among
    others): for each non-null key of each partition the row of its highest
    offset, unless its value is null (a tombstone); the columns of ``df`` in
    their order."""
    from pyspark.sql import functions as F  # heavy (Spark): imported when used

    carried = [c for c in df.columns if c not in ("key", "partition")]
    latest = (
        df.where(F.col("key").isNotNull())
        .groupBy("partition", "key")
        .agg(F.max_by(F.struct(*carried), F.col("offset")).alias(_LATEST))
        .where(F.col(f"{_LATEST}.value").isNotNull())
    )
    return latest.select(*[F.col(c) if c in ("key", "partition") else F.col(f"{_LATEST}.{c}").alias(c)
                           for c in df.columns])


def read_table(spark, topic: str, ending_offsets="latest", value_format: str = "binary", *,
               fail_on_data_loss: bool = True, client=None, settings=None, **read_options):
    """The latest value of each key of ``topic``, tombstones removed, as a
    DataFrame: one row per key (per partition that holds it, see the module
    docstring), with the columns of :func:`raylog_spark.read_topic` (the
    row of the key's latest record).

    Read from each partition's log start up to ``ending_offsets``
    (``"latest"``: the high watermarks now, or ``{partition: offset}``),
    fixed when this is called (the plan is ``df.raylog_plan``); right
    whether or not the log cleaner of a compacted topic has run.
    ``value_format`` ``"json"`` parses the latest values (after the
    deduplication; ``schema``, ``json_options``, ``flatten``, ``sample`` as
    in ``read_topic``); ``"avro"`` decodes them by their registered schema
    (``schema_id``, ``schema_subject``, ``schema_version``, ``flatten``).
    ``fail_on_data_loss``, ``client``, ``settings`` and the other
    ``read_options`` (``engine``, ``locality``, ``fetch_bytes``,
    ``min_partitions``) are those of ``read_topic``. Errors are theirs:
    ConfigError for an unknown value format or option, UnknownTopicError,
    DataLossError.
    """
    engine = read_options.get("engine", "auto")
    check_formats(value_format, engine)
    json_args = {name: read_options.pop(name) for name in _JSON_OPTIONS if name in read_options}
    if value_format != "json" and set(json_args) - {"flatten"}:
        raise ConfigError(f"{sorted(set(json_args) - {'flatten'})} apply to value_format='json' only")
    flatten = json_args.pop("flatten", True)
    min_partitions = read_options.pop("min_partitions", None)
    plan = plan_read(topic, "earliest", ending_offsets, min_partitions=min_partitions,
                     fail_on_data_loss=fail_on_data_loss, client=client, settings=settings)
    if value_format == "avro":  # tombstones are rows whose value struct is null
        df = plan_dataframe(spark, plan, "avro", client=client, flatten=False, **read_options)
    else:
        df = plan_dataframe(spark, plan, "binary", client=client, **read_options)
    table = latest_per_key(df)
    if value_format == "json":
        table = parse_json(spark, table, plan, json_args.get("schema"), json_args.get("json_options"), flatten,
                           json_args.get("sample", DEFAULT_SAMPLE))
    elif value_format == "avro" and flatten:
        value_fields = table.schema["value"].dataType.fieldNames()
        check_flattened(value_fields)
        table = table.select("value.*", *META_COLUMNS)
    table.raylog_plan = plan
    table.raylog_engine = df.raylog_engine
    return table
