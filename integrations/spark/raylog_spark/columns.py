"""The columns of a read: exactly those of Spark's Kafka source, and the
value's typed columns beside the message's.

A binary read has :func:`spark_schema`'s columns: Spark's Kafka source's
(its ``KafkaRecordToRowConverter.kafkaSchema``), ``headers`` with
``include_headers`` (Spark's ``includeHeaders``), then raylog's
``next_offset`` with ``include_next_offset``. A typed read (JSON or Avro
values) has the value's fields as top-level columns followed by
:data:`META_COLUMNS` (``flatten=True``), or one struct column ``value``
followed by them (``flatten=False``).
"""

from __future__ import annotations

from raylog.errors import ConfigError

#: the columns every read returns besides the value
META_COLUMNS = ("key", "topic", "partition", "offset", "timestamp")


def spark_schema(include_headers: bool = False, include_next_offset: bool = False):
    """The Spark schema of a binary read: Spark's Kafka source's columns
    (``key`` binary, ``value`` binary, ``topic`` string, ``partition`` int,
    ``offset`` long, ``timestamp`` timestamp, ``timestampType`` int, all
    nullable), then ``headers`` (``array<struct<key: string, value:
    binary>>``) with ``include_headers``, then ``next_offset`` (long: where
    to resume after the message) with ``include_next_offset``."""
    from pyspark.sql import types as T  # heavy (Spark): imported when used

    fields = [
        T.StructField("key", T.BinaryType(), True),
        T.StructField("value", T.BinaryType(), True),
        T.StructField("topic", T.StringType(), True),
        T.StructField("partition", T.IntegerType(), True),
        T.StructField("offset", T.LongType(), True),
        T.StructField("timestamp", T.TimestampType(), True),
        T.StructField("timestampType", T.IntegerType(), True),
    ]
    if include_headers:
        fields.append(T.StructField("headers", headers_type(), True))
    if include_next_offset:
        fields.append(T.StructField("next_offset", T.LongType(), True))
    return T.StructType(fields)


def headers_type():
    """The type of the ``headers`` column (Spark's Kafka source's)."""
    from pyspark.sql import types as T  # heavy (Spark): imported when used

    return T.ArrayType(
        T.StructType([T.StructField("key", T.StringType(), True), T.StructField("value", T.BinaryType(), True)]),
        True,
    )


def check_flattened(value_fields) -> None:
    """ConfigError when a value field would take the name of a message column."""
    clash = sorted(set(value_fields) & set(META_COLUMNS))
    if clash:
        raise ConfigError(
            f"value fields {clash} have the names of the read's own columns; pass flatten=False "
            f"(the value as one struct column) and select what you need"
        )


def typed_schema(value_schema, flatten: bool):
    """The Spark schema of a typed read whose value has ``value_schema`` (a StructType)."""
    from pyspark.sql import types as T  # heavy (Spark): imported when used

    meta = [f for f in spark_schema().fields if f.name in META_COLUMNS]
    if not flatten:
        return T.StructType([T.StructField("value", value_schema, True), *meta])
    check_flattened(value_schema.fieldNames())
    return T.StructType([*value_schema.fields, *meta])


def typed_columns(value_schema, flatten: bool) -> list[str]:
    """The names of :func:`typed_schema`'s columns, in order."""
    return typed_schema(value_schema, flatten).fieldNames()
