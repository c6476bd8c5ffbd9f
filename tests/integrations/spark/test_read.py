"""raylog_spark.read_topic and read_raylog -> to_spark, on a real Spark through
RayDP, reading real partition actors over their data sockets.

One Spark session serves the whole module. Expected contents come from the
partitions' data sockets read directly (spark_helpers), not through the
code under test. The reads run with the default engine (the JVM reader,
which ``init_spark`` adds to the session); where it is cheap a test runs
with both engines (``engine``). The JVM reader's own cases are in
test_range_reader.py, typed Avro values in test_avro_values.py.
"""

from __future__ import annotations

import datetime
import logging

import pytest

import raylog_spark
from raylog.read import DataLossError, plan_read
from raylog.errors import (
    ConfigError,
    InvalidOffsetError,
    OffsetOutOfRangeError,
    UnknownPartitionError,
    UnknownTopicError,
)
from format2_log import format1_topic
from spark_helpers import as_tuples, log_messages, make_clicks, produce

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(params=["jvm", "python"])
def engine(request):
    return request.param


@pytest.fixture(scope="module")
def clicks(raylog_client):
    return make_clicks(raylog_client, "clicks-read")


# ---------------------------------------------------------------------------
# failures first: typed errors on the driver


def test_unknown_topic_is_a_typed_error(spark, raylog_client):
    with pytest.raises(UnknownTopicError):
        raylog_spark.read_topic(spark, "no-such-topic", client=raylog_client)


def test_offset_off_a_message_boundary_is_refused(spark, raylog_client):
    # format 1's rule (a log written before record batches): an offset inside a message is no offset
    topic = "read-format1"
    offsets = format1_topic(raylog_client, topic, [b"plain-%03d" % i for i in range(20)], partitions=2)
    with pytest.raises(InvalidOffsetError, match="not the start of a message"):
        raylog_spark.read_topic(spark, topic, starting_offsets={0: offsets[0][0] + 3}, client=raylog_client)
    end = raylog_client.offsets(topic, 1)[1]
    with pytest.raises(InvalidOffsetError):
        raylog_spark.read_topic(spark, topic, ending_offsets={1: end - 5}, client=raylog_client)


def test_offsets_past_the_end_and_bad_arguments_are_refused(spark, raylog_client, clicks):
    end = raylog_client.offsets(clicks, 0)[1]
    with pytest.raises(OffsetOutOfRangeError) as caught:
        raylog_spark.read_topic(spark, clicks, ending_offsets={0: end + 1000}, client=raylog_client)
    assert caught.value.latest == end
    with pytest.raises(UnknownPartitionError):
        raylog_spark.read_topic(spark, clicks, starting_offsets={7: 0}, client=raylog_client)
    with pytest.raises(ConfigError, match="after its ending offset"):
        raylog_spark.read_topic(
            spark, clicks, starting_offsets={0: "latest"}, ending_offsets={0: 0}, client=raylog_client
        )
    with pytest.raises(ConfigError, match="value_format"):
        raylog_spark.read_topic(spark, clicks, value_format="xml", client=raylog_client)
    with pytest.raises(ConfigError, match="min_partitions"):
        raylog_spark.read_topic(spark, clicks, min_partitions=0, client=raylog_client)


# ---------------------------------------------------------------------------
# contents


def test_read_topic_returns_every_message_with_its_partition_offset_key_and_time(
    spark, raylog_client, clicks, engine
):
    # no client=: the cluster of the client this process made (raylog_client)
    df = raylog_spark.read_topic(spark, clicks, engine=engine)
    assert df.raylog_engine == engine
    assert df.schema == raylog_spark.spark_schema()
    expected = sorted(log_messages(raylog_client, clicks))
    assert len(expected) == 600
    assert as_tuples(df.collect()) == expected
    assert set(df.select("topic").distinct().toPandas()["topic"]) == {clicks}
    counts = {r["partition"]: r["count"] for r in df.groupBy("partition").count().collect()}
    assert counts == {p: sum(1 for m in expected if m[0] == p) for p in range(3)}
    assert isinstance(df.first()["timestamp"], datetime.datetime)


def test_the_plan_is_fixed_when_read_topic_is_called(spark, raylog_client, make_topic):
    topic = make_topic(partitions=1)
    produce(raylog_client, topic, [(None, b"before-%d" % i) for i in range(20)])
    df = raylog_spark.read_topic(spark, topic, client=raylog_client)
    produce(raylog_client, topic, [(None, b"after-%d" % i) for i in range(20)])
    assert df.count() == 20 and df.count() == 20
    assert raylog_spark.read_topic(spark, topic, client=raylog_client).count() == 40


def test_the_jvm_reader_is_the_default_in_a_session_of_init_spark(spark, raylog_client, clicks):
    assert raylog_spark.read_topic(spark, clicks, client=raylog_client).raylog_engine == "jvm"
    with pytest.raises(ConfigError, match="engine"):
        raylog_spark.read_topic(spark, clicks, client=raylog_client, engine="scala")


def test_explicit_offset_ranges(spark, raylog_client, clicks, engine):
    expected = sorted(log_messages(raylog_client, clicks))
    by_partition = {p: [m for m in expected if m[0] == p] for p in range(3)}
    starts = {0: by_partition[0][10][1], 2: by_partition[2][5][1]}
    ends = {0: by_partition[0][30][1], 1: by_partition[1][7][1]}
    df = raylog_spark.read_topic(spark, clicks, starts, ends, client=raylog_client, engine=engine)
    want = by_partition[0][10:30] + by_partition[1][:7] + by_partition[2][5:]
    assert as_tuples(df.collect()) == sorted(want)
    assert df.raylog_plan.start_offsets == {0: starts[0], 1: by_partition[1][0][1], 2: starts[2]}
    # "latest" to "latest" is empty; "earliest"/"latest" as values work too
    assert raylog_spark.read_topic(spark, clicks, "latest", client=raylog_client).count() == 0
    only_one = raylog_spark.read_topic(
        spark, clicks, {0: "earliest", 1: "latest", 2: "latest"}, client=raylog_client
    )
    assert only_one.count() == len(by_partition[0])


def test_min_partitions_splits_never_cut_a_message(spark, raylog_client, clicks, engine):
    expected = sorted(log_messages(raylog_client, clicks))
    boundaries = {(m[0], m[1]) for m in expected}
    ends = {p: raylog_client.offsets(clicks, p)[1] for p in range(3)}
    df = raylog_spark.read_topic(spark, clicks, min_partitions=11, client=raylog_client, engine=engine)
    plan = df.raylog_plan
    assert len(plan.ranges) >= 11
    assert df.rdd.getNumPartitions() == len(plan.ranges)
    for rng in plan.ranges:
        assert rng.start < rng.end
        assert (rng.partition, rng.start) in boundaries
        assert (rng.partition, rng.end) in boundaries or rng.end == ends[rng.partition]
    # the pieces tile each partition exactly
    for p in range(3):
        pieces = sorted((r.start, r.end) for r in plan.ranges if r.partition == p)
        assert pieces[0][0] == raylog_client.offsets(clicks, p)[0] and pieces[-1][1] == ends[p]
        assert all(a[1] == b[0] for a, b in zip(pieces, pieces[1:]))
    assert as_tuples(df.collect()) == expected


def test_reads_prefer_the_node_of_their_partition(spark, raylog_client, clicks, engine):
    import ray

    df = raylog_spark.read_topic(spark, clicks, client=raylog_client, engine=engine)
    node_ip = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
    rdd = df._jdf.queryExecution().toRdd()
    sc = spark.sparkContext._jsc.sc()
    for i, rng in enumerate(df.raylog_plan.ranges):
        assert rng.node_ip == node_ip[rng.node_id]
        assert rng.node_ip in sc.getPreferredLocs(rdd, i).toString()
    # without locality the same rows come back
    plain = raylog_spark.read_topic(spark, clicks, client=raylog_client, locality=False, engine=engine)
    assert plain.count() == df.count()


def test_read_with_connection_settings_only(spark, raylog_client, clicks):
    df = raylog_spark.read_topic(spark, clicks, settings=raylog_client.settings)
    assert df.count() == 600


# ---------------------------------------------------------------------------
# data loss


@pytest.fixture
def trimmed(raylog_client, make_topic):
    """A one-partition topic whose first segments retention deleted: ``(topic,
    the messages produced, the messages left)``."""
    import ray

    topic = make_topic(partitions=1, segment_bytes=4096, max_message_bytes=2048, retention_bytes=4096)
    produce(raylog_client, topic, [(None, b"m-%04d:" % i + b"z" * 90) for i in range(200)])
    produced = log_messages(raylog_client, topic)
    deleted = ray.get(raylog_client.partition_actor(topic, 0).delete_old_segments.remote())
    assert deleted, "retention deleted nothing"
    return topic, produced, log_messages(raylog_client, topic)


def test_fail_on_data_loss_names_the_lost_range(spark, raylog_client, trimmed):
    topic, produced, left = trimmed
    log_start = raylog_client.offsets(topic, 0)[0]
    with pytest.raises(DataLossError) as caught:
        raylog_spark.read_topic(spark, topic, starting_offsets={0: 0}, client=raylog_client)
    err = caught.value
    assert isinstance(err, OffsetOutOfRangeError)
    assert (err.partition, err.lost_start, err.lost_end, err.earliest) == (0, 0, log_start, log_start)
    assert f"{topic}-0 [0, {log_start})" in str(err)


def test_without_fail_on_data_loss_lost_data_is_skipped_and_reported(spark, raylog_client, trimmed, caplog):
    topic, produced, left = trimmed
    log_start = raylog_client.offsets(topic, 0)[0]
    with caplog.at_level(logging.WARNING):
        df = raylog_spark.read_topic(
            spark, topic, starting_offsets={0: 0}, fail_on_data_loss=False, client=raylog_client
        )
    assert [(g.start, g.end) for g in df.raylog_plan.lost] == [(0, log_start)]
    assert any(f"[0, {log_start})" in r.getMessage() for r in caplog.records)
    assert as_tuples(df.collect()) == sorted(left)
    assert len(left) < len(produced)


def test_retention_after_planning_is_handled_by_the_readers(spark, raylog_client, make_topic, engine):
    import ray

    topic = make_topic(partitions=1, segment_bytes=4096, max_message_bytes=2048, retention_bytes=4096)
    produce(raylog_client, topic, [(None, b"r-%04d:" % i + b"z" * 90) for i in range(200)])
    strict = raylog_spark.read_topic(spark, topic, client=raylog_client, engine=engine)
    lenient = raylog_spark.read_topic(spark, topic, fail_on_data_loss=False, client=raylog_client, engine=engine)
    assert ray.get(raylog_client.partition_actor(topic, 0).delete_old_segments.remote())
    left = log_messages(raylog_client, topic)
    with pytest.raises(Exception, match="DataLossError"):
        strict.collect()
    assert as_tuples(lenient.collect()) == sorted(left)
    assert lenient.count() == len(left)


# ---------------------------------------------------------------------------
# JSON and Avro values


def test_json_values_parsed_with_a_given_or_inferred_schema(spark, raylog_client, make_topic):
    import json

    topic = make_topic(partitions=2)
    produce(
        raylog_client,
        topic,
        [(b"k%d" % (i % 3), json.dumps({"page": f"/p{i % 4}", "n": i}).encode()) for i in range(100)],
    )
    inferred = raylog_spark.read_topic(spark, topic, value_format="json", client=raylog_client)
    assert inferred.columns == ["n", "page", "key", "topic", "partition", "offset", "timestamp"]
    assert inferred.agg({"n": "sum"}).collect()[0][0] == sum(range(100))
    given = raylog_spark.read_topic(
        spark, topic, value_format="json", schema="page STRING, n INT", flatten=False, client=raylog_client
    )
    assert given.columns == ["value", "key", "topic", "partition", "offset", "timestamp"]
    pages = {r["page"]: r["count"] for r in given.groupBy("value.page").count().collect()}
    assert pages == {f"/p{k}": 25 for k in range(4)}


# ---------------------------------------------------------------------------
# Ray Data


def test_read_raylog_converts_to_spark(spark, raylog_client, clicks):
    from raylog.read import read_raylog

    ds = read_raylog(clicks, client=raylog_client, min_partitions=4)
    assert ds.count() == 600
    df = ds.to_spark(spark)
    # Ray Data's columns (raylog.read.ARROW_SCHEMA): the source's with headers, but no timestampType
    kafka = raylog_spark.spark_schema(include_headers=True).fieldNames()
    assert sorted(df.columns) == sorted(c for c in kafka if c != "timestampType")
    assert as_tuples(df.collect()) == sorted(log_messages(raylog_client, clicks))


def test_plan_read_is_shared_by_spark_and_ray_data(raylog_client, clicks):
    plan = plan_read(clicks, client=raylog_client)
    assert sorted(plan.end_offsets) == [0, 1, 2]
    assert plan.total_bytes == sum(e - s for s, e in (raylog_client.offsets(clicks, p) for p in range(3)))


def test_acks_all_flush_then_read_topic_counts_everything_sent(spark, raylog_client, make_topic):
    """Read-your-writes through Spark: with acks="all", producer.flush()
    returns only when every message is fsynced and below the high watermark,
    so a read_topic right after it counts them all, although the topic
    would not flush on its own for a minute."""
    topic = make_topic(partitions=3, flush_ms=60_000, flush_messages=1_000_000)
    producer = raylog_client.producer(acks="all", batch_size=50, linger_ms=5)
    try:
        for i in range(1_000):
            producer.send(topic, b"v-%04d" % i, key=b"k-%d" % (i % 17))
        producer.flush()
    finally:
        producer.close()
    df = raylog_spark.read_topic(spark, topic, starting_offsets="earliest", ending_offsets="latest")
    assert df.count() == 1_000
