"""The raylog sink (``df.write.format("raylog")``) as durable as raylog's
producer: Kafka's producer options ``kafka.acks``, ``kafka.compression.type``,
``kafka.linger.ms`` and ``kafka.batch.size`` accepted with Kafka's meaning
(bad values refused by name, nothing written); acks=all by default; batches
compressed with the codec asked for, as seen in the log; idempotent batches,
so that a task that fails after some of its batches were acknowledged and is
retried by Spark stores each row exactly once.

On a real Spark through RayDP, with a session of this module's own that
retries a failed task (``spark.task.maxFailures`` 4; the folder's shared
session fails a job at the first failed task). What the log holds is read
from the partitions' data sockets, not through the code under test. The
local Ray of the tests has one disk node, so topics here have one replica:
acks=all is seen as "readable at once" (the reply comes once the batch is
flushed and below the high watermark).
"""

from __future__ import annotations

import pytest
import ray

import raylog_spark
import spark_helpers
from raylog.storage.record_batch import KAFKA_CODECS, iter_batches
from raylog.transfer.connection import BrokerConnection

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def spark(ray_local, raylog_client):
    raylog_spark.stop_spark()  # the folder's shared session (conftest), if it runs: started again after
    try:
        session = raylog_spark.init_spark(
            app_name="raylog-test-sink",
            num_executors=1,
            executor_cores=1,
            executor_memory="512M",
            configs={"spark.task.maxFailures": "4"},
        )
        assert raylog_spark.use_cluster(session, raylog_client)
        yield session
    finally:
        raylog_spark.stop_spark()


def save(df, topic, **options):
    writer = df.write.format("raylog").option("topic", topic).mode("append")
    for name, value in options.items():
        writer = writer.option(name, value)
    writer.save()


def batches(client, topic):
    """``(partition, header)`` of every record batch in ``topic``'s log, from the data sockets."""
    out = []
    for p in range(client.metadata.partitions(topic)):
        start, end = client.offsets(topic, p)
        host, port = client.metadata.endpoint(topic, p, refresh=True)
        with BrokerConnection(host, port, token=client.settings.token) as conn:
            offset = start
            while offset < end:
                data = conn.fetch(topic, p, offset, 1 << 20).data
                for _, header in iter_batches(data):
                    out.append((p, header))
                    offset = header.base_offset + header.size
    return out


def stored(client, topic, flush=True):
    """``(key, value)`` of every message of ``topic`` (after a flush of its
    partitions, unless not ``flush``), sorted (keys and values as bytes or None)."""
    if flush:
        partitions = client.metadata.partitions(topic)
        ray.get([client.partition_actor(topic, p).flush.remote() for p in range(partitions)])
    return sorted(((k, v) for _p, _o, k, v, _t in spark_helpers.log_messages(client, topic)),
                  key=lambda m: (m[0] or b"", m[1] or b""))


def test_kafka_producer_options_are_taken_and_bad_values_refused(spark, raylog_client, make_topic):
    topic = make_topic(partitions=1)
    df = spark.createDataFrame([("k", "v")], "key string, value string").coalesce(1)
    good = [
        {"kafka.acks": "all"}, {"kafka.acks": "-1"}, {"kafka.acks": "1"}, {"kafka.acks": "0"},
        {"kafka.compression.type": "none"}, {"kafka.compression.type": "GZIP"},
        {"kafka.linger.ms": "5"}, {"kafka.batch.size": "0"}, {"kafka.batch.size": "16384", "batch_bytes": "16384"},
    ]
    for options in good:
        save(df, topic, **options)
    bad = [
        ({"kafka.acks": "2"}, "option 'kafka.acks' must be all"),
        ({"kafka.acks": "leader"}, "option 'kafka.acks' must be all"),
        ({"kafka.compression.type": "brotli"}, "option 'kafka.compression.type' must be none, gzip"),
        ({"kafka.linger.ms": "-1"}, "option 'kafka.linger.ms' must be between 0"),
        ({"kafka.linger.ms": "soon"}, "option 'kafka.linger.ms' must be a whole number"),
        ({"kafka.batch.size": "16k"}, "option 'kafka.batch.size' must be a whole number"),
        ({"kafka.batch.size": "100", "batch_bytes": "200"}, "options 'kafka.batch.size' .* and 'batch_bytes'"),
        ({"kafka.retries": "3"}, "option 'kafka.retries' is not supported"),
    ]
    for options, says in bad:
        with pytest.raises(Exception, match="ConfigError: " + says):
            save(df, topic, **options)
    # the good writes wrote one message each (acks=0's is sent too), the refused ones nothing
    assert stored(raylog_client, topic) == [(b"k", b"v")] * len(good)


def test_acks_all_by_default_rows_are_readable_when_the_write_returns(spark, raylog_client, make_topic):
    topic = make_topic(partitions=2, flush_messages=1_000_000, flush_ms=600_000)
    rows = [(f"k{i}", f"v{i}") for i in range(400)]
    save(spark.createDataFrame(rows, "key string, value string").repartition(2), topic)
    # no flush here: acks=all answers once a batch is flushed and below the high watermark
    assert stored(raylog_client, topic, flush=False) == sorted((k.encode(), v.encode()) for k, v in rows)


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_batches_read_back_with_the_codec_in_the_log(spark, raylog_client, make_topic, codec):
    topic = make_topic(partitions=2)
    rows = [(f"user-{i % 7}", None if i % 50 == 0 else f"event-{i:05d} " + "abc" * (i % 40)) for i in range(600)]
    save(spark.createDataFrame(rows, "key string, value string").coalesce(1), topic,
         **{"kafka.compression.type": codec, "kafka.batch.size": "4096"})
    expected = sorted(((k.encode(), None if v is None else v.encode()) for k, v in rows),
                      key=lambda m: (m[0], m[1] or b""))
    assert stored(raylog_client, topic) == expected  # null values are tombstones, compressed with the others
    read = raylog_spark.read_topic(spark, topic, client=raylog_client).collect()
    assert sorted(((bytes(r["key"]), None if r["value"] is None else bytes(r["value"])) for r in read),
                  key=lambda m: (m[0], m[1] or b"")) == expected
    headers = batches(raylog_client, topic)
    assert len(headers) > 2  # kafka.batch.size cut the rows into several batches per partition
    assert {KAFKA_CODECS[h.codec] for _p, h in headers} == {codec}
    for p in (0, 1):  # one producer id per task; sequences from 0, each batch's following the last
        mine = [h for q, h in headers if q == p]
        assert len({h.producer_id for h in mine}) == 1 and mine[0].producer_id >= 0
        assert [h.base_sequence for h in mine] == [sum(h.count for h in mine[:i]) for i in range(len(mine))]


def fail_once_at(marker: str, row: int):
    """A Python UDF passing values through that fails the first attempt of
    Spark partition 0 at value ``row`` (writing ``marker`` first)."""
    from pyspark.sql import functions as F

    def passthrough(value: str) -> str:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx.partitionId() == 0 and ctx.attemptNumber() == 0 and value == f"v{row:05d}":
            open(marker, "w").close()
            raise RuntimeError(f"fail the first attempt at {value}")
        return value

    return F.udf(passthrough, "string")


@pytest.mark.parametrize("acks", ["all", "1"])
def test_a_retried_task_stores_each_row_once(spark, raylog_client, make_topic, tmp_path, acks):
    topic = make_topic(partitions=2)
    rows = [(f"k{i % 11}", f"v{i:05d}") for i in range(3000)]
    df = spark.sparkContext.parallelize(rows, 2).toDF("key string, value string")
    marker = tmp_path / "failed"
    udf = fail_once_at(str(marker), 800)  # partition 0 holds v00000 .. v01023
    # 256-byte batches: about 6 rows each, so that partition 0's first
    # attempt had well over 32 batches per raylog partition acknowledged
    # (more than a partition remembers the offsets of) before it failed
    save(df.select("key", udf("value").alias("value")), topic, **{"kafka.batch.size": "256", "kafka.acks": acks})
    assert marker.exists()  # the first attempt failed, and Spark's retry wrote the task's rows
    assert stored(raylog_client, topic) == sorted((k.encode(), v.encode()) for k, v in rows)
