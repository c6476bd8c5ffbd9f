"""The columns of a read held to Spark's Kafka source's schema, written out
here as Spark's ``KafkaRecordToRowConverter.kafkaSchema(includeHeaders)``
defines it (spark-sql-kafka-0-10, Spark 3.5): ``spark.read.format("raylog")``,
``spark.readStream.format("raylog")`` and ``raylog_spark.read_topic`` on
both engines, with and without headers; a raylog DataFrame and one built
with that schema union by name; ``next_offset`` only with
``includeNextOffset``. On a real Spark through RayDP, one session for the
module. Expected contents come from the batches as encoded by
``format2_log``, not through the code under test.
"""

from __future__ import annotations

import datetime

import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

import raylog_spark
from format2_log import expected, mixed_log
from raylog.errors import ConfigError

pytestmark = pytest.mark.timeout(900)


def kafka_schema(include_headers: bool) -> StructType:
    """Spark's Kafka source schema, as KafkaRecordToRowConverter writes it
    (StructField's nullable and ArrayType's containsNull default to true)."""
    headers_type = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))
    without = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    return StructType(without + [StructField("headers", headers_type)] if include_headers else without)


@pytest.fixture(scope="module", autouse=True)
def cluster(spark, raylog_client):
    assert raylog_spark.use_cluster(spark, raylog_client)


@pytest.fixture(scope="module")
def mixed(raylog_client):
    """A one-partition topic of format-1 messages then record batches with headers, and its expected records."""
    topic = "columns-mixed"
    raylog_client.create_topic(topic, partitions=1)
    plain, positions = mixed_log(raylog_client, topic)
    return topic, expected(plain, positions)


def by_name(spark, topic, stream=False, **options):
    reader = spark.readStream if stream else spark.read
    return reader.format("raylog").option("subscribe", topic).options(**options).load()


def records(df) -> list[tuple]:
    """(offset, key, value, headers or None) of every row, by offset."""
    out = []
    for r in sorted(df.collect(), key=lambda r: r["offset"]):
        d = r.asDict()
        headers = None
        if "headers" in d:
            headers = [(h["key"], None if h["value"] is None else bytes(h["value"])) for h in d["headers"]]
        out.append((r["offset"], None if r["key"] is None else bytes(r["key"]),
                    None if r["value"] is None else bytes(r["value"]), headers))
    return out


@pytest.mark.parametrize("headers", [False, True])
def test_every_read_has_exactly_the_kafka_source_schema(spark, raylog_client, mixed, headers):
    topic, want = mixed
    flag = "true" if headers else "false"
    assert by_name(spark, topic, includeHeaders=flag).schema == kafka_schema(headers)
    assert by_name(spark, topic, stream=True, includeHeaders=flag).schema == kafka_schema(headers)
    for engine in ("jvm", "python"):
        df = raylog_spark.read_topic(spark, topic, client=raylog_client, engine=engine, include_headers=headers)
        assert df.raylog_engine == engine
        assert df.schema == kafka_schema(headers), engine
        got = records(df)
        assert [(o, k, v) for o, k, v, _h in got] == [(o, k, v) for o, k, v, _h in want], engine
        if headers:
            assert [h for *_r, h in got] == [h for *_r, h in want], engine
        assert {r["timestampType"] for r in df.select("timestampType").collect()} == {0}  # CreateTime
    assert raylog_spark.spark_schema(headers) == kafka_schema(headers)


@pytest.mark.parametrize("headers", [False, True])
def test_a_raylog_dataframe_unions_by_name_with_one_of_the_kafka_schema(spark, raylog_client, mixed, headers):
    topic, want = mixed
    row = (b"k", b"v", "from-kafka", 3, 7, datetime.datetime(2024, 1, 1), 0) + (([("h", b"1")],) if headers else ())
    kafka = spark.createDataFrame([row], kafka_schema(headers))
    empty = spark.createDataFrame([], kafka_schema(headers))
    flag = "true" if headers else "false"
    for raylog in (
        by_name(spark, topic, includeHeaders=flag),
        raylog_spark.read_topic(spark, topic, client=raylog_client, engine="python", include_headers=headers),
        raylog_spark.read_topic(spark, topic, client=raylog_client, engine="jvm", include_headers=headers),
    ):
        both = raylog.unionByName(kafka)
        assert both.schema == kafka_schema(headers)
        assert both.count() == len(want) + 1
        assert both.where("topic = 'from-kafka'").collect()[0]["offset"] == 7
        assert empty.unionByName(raylog).count() == len(want)
        assert kafka.union(raylog).count() == len(want) + 1  # by position too: same order


def test_next_offset_only_when_asked_for_and_last(spark, raylog_client, mixed):
    topic, want = mixed
    assert "next_offset" not in by_name(spark, topic).columns
    for stream in (False, True):
        plain = by_name(spark, topic, stream=stream, includeNextOffset="true")
        assert plain.schema == StructType(kafka_schema(False).fields + [StructField("next_offset", LongType())])
        headed = by_name(spark, topic, stream=stream, includeHeaders="true", includeNextOffset="TRUE")
        assert headed.columns == kafka_schema(True).fieldNames() + ["next_offset"]
        assert by_name(spark, topic, stream=stream, includeNextOffset="false").schema == kafka_schema(False)
    rows = sorted(by_name(spark, topic, includeNextOffset="true").collect(), key=lambda r: r["offset"])
    offsets = [o for o, *_ in want]
    assert [r["offset"] for r in rows] == offsets
    assert [r["next_offset"] for r in rows[:-1]] == offsets[1:]  # each resumes at the next record
    assert rows[-1]["next_offset"] == raylog_client.offsets(topic, 0)[1]
    jvm = raylog_spark.read_topic(spark, topic, client=raylog_client, engine="jvm", include_next_offset=True)
    assert jvm.columns == kafka_schema(False).fieldNames() + ["next_offset"]
    assert sorted((r["offset"], r["next_offset"]) for r in jvm.collect()) == [(r["offset"], r["next_offset"])
                                                                              for r in rows]
    with pytest.raises(Exception, match="ConfigError: option 'includeNextOffset' must be 'true' or 'false'"):
        by_name(spark, topic, includeNextOffset="yes").collect()
    with pytest.raises(ConfigError, match="include_next_offset needs the JVM reader"):
        raylog_spark.read_topic(spark, topic, client=raylog_client, engine="python", include_next_offset=True)
    assert by_name(spark, topic).count() == len(want)  # nothing lost by the refusals
