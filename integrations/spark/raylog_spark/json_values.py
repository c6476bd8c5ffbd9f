"""JSON values as typed columns: the ``value`` column parsed with Spark's
``from_json``, under a given schema or one Spark infers from the first
values of the read (either engine reads the binary values first)."""

from __future__ import annotations

from raylog.errors import ConfigError, SchemaError
from raylog.read import ReadPlan, head_values
from raylog_spark.columns import META_COLUMNS, check_flattened


def parse_json(spark, df, plan: ReadPlan, schema, json_options, flatten: bool, sample: int):
    """``df`` (a binary read of ``plan``) with its values parsed as JSON
    objects of ``schema`` (a StructType, a DDL string, or None: inferred
    from the first ``sample`` values; ConfigError when there are none,
    SchemaError when they are not all JSON objects)."""
    from pyspark.sql import functions as F  # heavy (Spark): imported when used
    from pyspark.sql import types as T  # heavy (Spark): imported when used

    if schema is None:
        values = [v.decode("utf-8", "replace") for v in head_values(plan, sample)]
        if not values:
            raise ConfigError(
                f"no messages to infer a JSON schema from in the read of {plan.topic!r}; pass schema="
            )
        schema = spark.read.json(spark.sparkContext.parallelize(values, 1)).schema
        if "_corrupt_record" in schema.fieldNames():
            raise SchemaError(
                f"the first values of {plan.topic!r} are not all JSON objects; pass schema= "
                f"(a StructType or DDL string) or read value_format='binary'"
            )
    elif isinstance(schema, str):
        schema = T._parse_datatype_string(schema)
    if not isinstance(schema, T.StructType):
        raise ConfigError(f"a JSON schema must be a StructType or a DDL string, got {type(schema).__name__}")
    parsed = F.from_json(F.col("value").cast("string"), schema, json_options or {})
    df = df.select(parsed.alias("value"), *META_COLUMNS)
    if not flatten:
        return df
    check_flattened(schema.fieldNames())
    return df.select("value.*", *META_COLUMNS)
