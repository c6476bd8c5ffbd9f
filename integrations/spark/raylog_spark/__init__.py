"""raylog for Spark: a Spark session on the Ray cluster (through RayDP),
topics read as DataFrames and DataFrames written into topics.

::

    import raylog, raylog_spark
    client = raylog.connect()
    spark = raylog_spark.init_spark(num_executors=1, executor_cores=1)
    df = raylog_spark.read_topic(spark, "clicks", client=client)      # key, value, topic, partition, offset, timestamp
    events = raylog_spark.read_topic(spark, "clicks", value_format="json", client=client)
    users = raylog_spark.read_table(spark, "users", client=client)      # the latest value per key
    raylog_spark.write_topic(df, "clicks-copy", key_col="key", client=client)
    df, load = raylog_spark.load_incremental(spark, "clicks", "warehouse", client=client)
    ...; load.commit()
    raylog_spark.stop_spark()

See :mod:`raylog_spark.session` for what :func:`init_spark` configures,
:mod:`raylog_spark.reader` for how reads run (a fixed plan of byte ranges,
read by the Spark data source ``raylog`` in the executors' JVMs or by
Python workers, locality), :mod:`raylog_spark.table` for the table view, :mod:`raylog_spark.columns`,
:mod:`raylog_spark.json_values` and :mod:`raylog_spark.avro_values` for
typed values, :mod:`raylog_spark.functions` for Avro column functions (``from_avro``,
``to_avro`` with Spark's semantics, and their Confluent-framed variants),
:mod:`raylog_spark.source` for the data source's options,
:mod:`raylog_spark.jvm` for how that data source's jar is built, :mod:`raylog_spark.writer` and
:mod:`raylog_spark.loader`.
"""

from raylog.errors import ConcurrentLoadError
from raylog_spark.columns import spark_schema
from raylog_spark.loader import IncrementalLoad, load_incremental
from raylog_spark.reader import plan_dataframe, read_topic
from raylog_spark.session import init_spark, stop_spark
from raylog_spark.source import use_cluster
from raylog_spark.table import read_table
from raylog_spark.writer import write_topic

__all__ = [
    "init_spark",
    "stop_spark",
    "read_topic",
    "read_table",
    "plan_dataframe",
    "spark_schema",
    "use_cluster",
    "write_topic",
    "load_incremental",
    "IncrementalLoad",
    "ConcurrentLoadError",
]
