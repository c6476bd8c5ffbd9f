"""The columns of a read: those of Spark's Kafka source, and the value's
typed columns beside the message's.

A binary read has :func:`spark_schema`'s columns. A typed read (JSON or
Avro values) has the value's fields as top-level columns followed by
:data:`META_COLUMNS` (``flatten=True``), or one struct column ``value``
followed by them (``flatten=False``).
"""

from __future__ import annotations

from raylog.errors import ConfigError

#: the columns every read returns besides the value
META_COLUMNS = ("key", "topic", "partition", "offset", "timestamp")


def spark_schema():
    """The Spark schema of a binary read (Spark's Kafka source)."""
    from pyspark.sql import types as T  # heavy (Spark): imported when used

    return T.StructType(
        [
            T.StructField("key", T.BinaryType(), True),
            T.StructField("value", T.BinaryType(), True),
            T.StructField("topic", T.StringType(), True),
            T.StructField("partition", T.IntegerType(), True),
            T.StructField("offset", T.LongType(), True),
            T.StructField("timestamp", T.TimestampType(), True),
        ]
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
