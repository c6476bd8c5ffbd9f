"""raylog_spark.write_topic on a real Spark through RayDP: DataFrames written
by the executors, read back with read_topic. One Spark session per module."""

from __future__ import annotations

import json

import pytest

import raylog_spark
import spark_helpers
from raylog.errors import ConfigError, UnknownTopicError
from raylog.producer.partitioner import partition_for_key

pytestmark = pytest.mark.timeout(600)


def read_back(spark, client, topic):
    import ray

    partitions = client.metadata.partitions(topic)
    ray.get([client.partition_actor(topic, p).flush.remote() for p in range(partitions)])
    return raylog_spark.read_topic(spark, topic, client=client).collect()


def test_write_to_an_unknown_topic_fails_before_any_job(spark, raylog_client):
    df = spark.createDataFrame([("a",)], "value string")
    with pytest.raises(UnknownTopicError):
        raylog_spark.write_topic(df, "no-such-topic", client=raylog_client)


def test_missing_columns_are_refused_and_null_values_are_tombstones(spark, raylog_client, make_topic):
    topic = make_topic(partitions=1)
    df = spark.createDataFrame([("a", "b")], "k string, v string")
    with pytest.raises(ConfigError, match="no column 'value'"):
        raylog_spark.write_topic(df, topic, client=raylog_client)
    with pytest.raises(ConfigError, match="no column 'user'"):
        raylog_spark.write_topic(df, topic, key_col="user", value_col="v", client=raylog_client)
    nulls = spark.createDataFrame([("a", None), ("b", "x"), (None, None)], "k string, v string")
    assert raylog_spark.write_topic(nulls, topic, key_col="k", value_col="v", client=raylog_client) == 3
    stored = sorted(((k, v) for _p, _o, k, v, _t in spark_helpers.log_messages(raylog_client, topic)),
                    key=lambda m: (m[0] or b"", m[1] or b""))
    assert stored == [(None, None), (b"a", None), (b"b", b"x")]


def test_write_then_read_round_trip_with_keys(spark, raylog_client, make_topic):
    topic = make_topic(partitions=3)
    rows = [(f"user-{i % 13}", f"event-{i}") for i in range(500)]
    df = spark.createDataFrame(rows, "user string, payload string").repartition(3)
    assert raylog_spark.write_topic(df, topic, key_col="user", value_col="payload") == 500  # no client=: this process's
    back = read_back(spark, raylog_client, topic)
    assert sorted((bytes(r["key"]).decode(), bytes(r["value"]).decode()) for r in back) == sorted(rows)
    for r in back:  # keys went to their partition by the producer's stable hash
        assert r["partition"] == partition_for_key(bytes(r["key"]), 3)


def test_binary_struct_and_keyless_values(spark, raylog_client, make_topic):
    topic = make_topic(partitions=2)
    binary = spark.createDataFrame([(bytearray(b"\x00\x01raw"),)], "value binary")
    assert raylog_spark.write_topic(binary, topic, client=raylog_client) == 1
    structs = spark.createDataFrame([(i, f"/p{i}") for i in range(10)], "n int, page string")
    doc = structs.selectExpr("struct(n, page) AS doc", "n")
    assert raylog_spark.write_topic(doc, topic, value_col="doc", key_col="n", client=raylog_client) == 10
    back = read_back(spark, raylog_client, topic)
    values = sorted(bytes(r["value"]) for r in back)
    assert b"\x00\x01raw" in values
    docs = sorted((json.loads(v) for v in values if v.startswith(b"{")), key=lambda d: d["n"])
    assert docs == [{"n": i, "page": f"/p{i}"} for i in range(10)]
    assert sorted(bytes(r["key"]) for r in back if r["key"] is not None) == sorted(str(i).encode() for i in range(10))


def test_partition_column_chooses_the_partition(spark, raylog_client, make_topic):
    topic = make_topic(partitions=4)
    df = spark.createDataFrame([(f"v{i}", i % 4) for i in range(40)], "value string, p int")
    assert raylog_spark.write_topic(df, topic, partition_col="p", settings=raylog_client.settings) == 40
    back = read_back(spark, raylog_client, topic)
    assert sorted((r["partition"], bytes(r["value"]).decode()) for r in back) == sorted(
        (i % 4, f"v{i}") for i in range(40)
    )
    bad = spark.createDataFrame([("v", 9)], "value string, p int")
    with pytest.raises(Exception, match="partition 9"):
        raylog_spark.write_topic(bad, topic, partition_col="p", client=raylog_client)
