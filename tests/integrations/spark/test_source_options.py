"""The options of the Spark data source ``raylog`` held to Spark's
"Structured Streaming + Kafka Integration Guide": each option is either done
as the guide says or refused by name with a ConfigError saying what to use
instead; the sink takes the guide's own ``.save()``; lost data names
``failOnDataLoss``. On a real Spark through RayDP, one session for the
module. Expected contents come from the partitions' data sockets
(``spark_helpers.log_messages``), not from the code under test.
"""

from __future__ import annotations

import json
import time

import pytest

import raylog_spark
import spark_helpers

pytestmark = pytest.mark.timeout(900)


def produce(client, topic, values, keys=None):
    spark_helpers.produce(client, topic, [(None if keys is None else keys[i], v) for i, v in enumerate(values)])


def read(spark, **options):
    return spark.read.format("raylog").options(**options).load()


def values(rows) -> list[bytes]:
    return sorted(bytes(r["value"]) for r in rows)


def flush(client, topic):
    import ray

    ray.get([client.partition_actor(topic, p).flush.remote() for p in range(client.metadata.partitions(topic))])


@pytest.fixture(scope="module", autouse=True)
def cluster(spark, raylog_client):
    assert raylog_spark.use_cluster(spark, raylog_client)


@pytest.fixture(scope="module")
def timed(raylog_client):
    """A two-partition topic: 500 messages ``old-*``, then (after ``cut``, ms) 500 ``new-*``."""
    topic = f"opts-timed-{int(time.time())}"
    raylog_client.create_topic(topic, partitions=2)
    produce(raylog_client, topic, [b"old-%04d" % i for i in range(500)])
    time.sleep(0.05)
    cut = int(time.time() * 1000)
    time.sleep(0.05)
    produce(raylog_client, topic, [b"new-%04d" % i for i in range(500)])
    return topic, cut


def no_job_ran(spark, run) -> None:
    """``run()`` raises before Spark starts any job (so no task, and no task retry)."""
    sc = spark.sparkContext
    group = f"refused-{time.monotonic_ns()}"
    sc.setJobGroup(group, "an option refused on the driver")
    try:
        run()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    assert list(sc.statusTracker().getJobIdsForGroup(group)) == []


def test_options_outside_the_guide_or_not_done_are_refused_by_name_on_the_driver(spark, raylog_client, timed):
    topic, _ = timed
    refused = {
        "includeHeaders": ("yes", "must be 'true' or 'false'"),
        "minOffsetsPerTrigger": ("10", "is for streaming reads"),
        "maxTriggerDelay": ("15m", "goes with minOffsetsPerTrigger"),
        "kafka.auto.offset.reset": ("earliest", "startingOffsets"),
        "kafka.group.id": ("g", "no consumer group"),
        "kafka.value.deserializer": ("x", "deserialize"),
        "kafka.enable.auto.commit": ("true", "commits no offsets"),
        "kafka.interceptor.classes": ("x", "interceptor"),
        "kafka.fetch.min.bytes": ("1", "kafka.fetch.min.bytes"),
        "startingOffset": ("earliest", "is not an option of the raylog source; its options are assign, "),  # a typo is not ignored
    }
    for name, (value, says) in refused.items():
        for stream in (False, True) if name in ("includeHeaders", "maxTriggerDelay", "kafka.group.id") else (False,):
            def run(name=name, value=value, stream=stream):
                if stream:
                    df = spark.readStream.format("raylog").option("subscribe", topic).option(name, value).load()
                    q = df.writeStream.format("memory").queryName("refused").trigger(availableNow=True).start()
                    q.awaitTermination(300)
                    raise q.exception() or AssertionError(f"{name} was accepted")
                read(spark, subscribe=topic, **{name: value}).collect()

            with pytest.raises(Exception, match=f"ConfigError: .*{name}.*{says}" if says != name else name) as e:
                no_job_ran(spark, run)
            assert "ConfigError" in str(e.value)
    # the guide's rules of batch queries and of the topic choice
    p1_start = raylog_client.offsets(topic, 1)[0]
    for options, says in [
        ({"startingOffsets": "latest"}, "can't be 'latest' for batch"),
        ({"startingOffsets": json.dumps({topic: {"0": -1}})}, "can't be -1"),
        ({"endingOffsets": "earliest"}, "can't be 'earliest'"),
        ({"endingOffsets": json.dumps({topic: {"0": -2, "1": p1_start}})}, "can't be -2"),
        ({"assign": json.dumps({topic: [0]})}, "only one of the options 'assign'"),
        ({"startingOffsetsByTimestampStrategy": "earliest"}, "must be 'error' or 'latest'"),
    ]:
        with pytest.raises(Exception, match="ConfigError: .*" + says):
            no_job_ran(spark, lambda o=options: read(spark, subscribe=topic, **o).collect())
    with pytest.raises(Exception, match="ConfigError: one of the options 'assign'"):
        read(spark).collect()
    # the sink: Kafka's refused serializers, and a 'headers' column of another type than Kafka's
    dst = f"{topic}-sink"
    raylog_client.create_topic(dst, partitions=1)
    df = spark.createDataFrame([("k", "v")], "key string, value string")
    with pytest.raises(Exception, match="ConfigError: option 'kafka.key.serializer'"):
        no_job_ran(spark, lambda: df.write.format("raylog").option("topic", dst)
                   .option("kafka.key.serializer", "x").mode("append").save())
    headers = spark.createDataFrame([("v", [("h", "1")])], "value string, headers array<struct<key:string,value:string>>")
    with pytest.raises(Exception, match="ConfigError: column 'headers' must be array<struct<key:string,value:binary>>"):
        no_job_ran(spark, lambda: headers.write.format("raylog").option("topic", dst).mode("append").save())
    flush(raylog_client, dst)
    assert read(spark, subscribe=dst).count() == 0  # nothing written by a refused write
    assert read(spark, subscribe=topic).count() == 1000  # and the data read is whole


def test_ending_timestamps_and_starting_timestamp_strategy(spark, raylog_client, timed):
    topic, cut = timed
    old = sorted(b"old-%04d" % i for i in range(500))
    new = sorted(b"new-%04d" % i for i in range(500))
    # each partition ends before its first message at or after the time
    assert values(read(spark, subscribe=topic, endingTimestamp=str(cut)).collect()) == old
    by_partition = json.dumps({topic: {"0": cut, "1": cut}})
    assert values(read(spark, subscribe=topic, endingOffsetsByTimestamp=by_partition).collect()) == old
    assert values(read(spark, subscribe=topic, startingOffsetsByTimestamp=by_partition).collect()) == new
    # an ending time with no message after it ends at latest, as the guide says
    future = str(int(time.time() * 1000) + 3_600_000)
    assert read(spark, subscribe=topic, endingTimestamp=future).count() == 1000
    # a starting time no message matches fails (strategy 'error', the default) or starts at the end ('latest')
    with pytest.raises(Exception, match="OffsetOutOfRangeError: startingTimestamp: no message .*"
                                        "startingOffsetsByTimestampStrategy"):
        read(spark, subscribe=topic, startingTimestamp=future).collect()
    assert read(spark, subscribe=topic, startingTimestamp=future, startingOffsetsByTimestampStrategy="latest"
                ).count() == 0
    with pytest.raises(Exception, match="ConfigError: option 'endingOffsetsByTimestamp' must give a time for every"):
        read(spark, subscribe=topic, endingOffsetsByTimestamp=json.dumps({topic: {"0": cut}})).collect()


def test_min_partitions_and_assign(spark, raylog_client, timed):
    topic, _ = timed
    expected = sorted((p, o, v) for p, o, _k, v, _t in spark_helpers.log_messages(raylog_client, topic))
    df = read(spark, subscribe=topic, minPartitions="7")
    assert df.rdd.getNumPartitions() >= 7  # two raylog partitions cut into at least seven ranges
    rows = df.collect()
    assert sorted((r["partition"], r["offset"], bytes(r["value"])) for r in rows) == expected  # no message cut
    only_1 = read(spark, assign=json.dumps({topic: [1]})).collect()
    assert sorted((r["partition"], r["offset"], bytes(r["value"])) for r in only_1) == [m for m in expected
                                                                                        if m[0] == 1]
    with pytest.raises(Exception, match="UnknownPartitionError: option 'assign' names"):
        read(spark, assign=json.dumps({topic: [5]})).collect()


def test_the_guides_save_the_topic_option_wins_and_null_values(spark, raylog_client, make_topic, tmp_path):
    dst, other = make_topic(partitions=2), make_topic(partitions=1)
    rows = [(f"k{i}", f"v{i}", other) for i in range(100)]
    df = spark.createDataFrame(rows, "key string, value string, topic string").repartition(2)
    df.write.format("raylog").option("topic", dst).save()  # the guide's code: default save mode
    flush(raylog_client, dst)
    flush(raylog_client, other)
    # the option 'topic' overrides the 'topic' column
    assert values(read(spark, subscribe=dst).collect()) == sorted(f"v{i}".encode() for i in range(100))
    assert read(spark, subscribe=other).count() == 0
    with pytest.raises(Exception, match="ConfigError: save mode Overwrite is not allowed"):
        df.write.format("raylog").option("topic", dst).mode("overwrite").save()
    # a null value is a tombstone, as in Kafka's sink; headers go with their rows
    nulls = spark.createDataFrame(
        [(f"n{i}", None if i % 10 == 0 else f"n{i}", [("i", str(i).encode()), ("z", None)]) for i in range(50)],
        "key string, value string, headers array<struct<key:string,value:binary>>").repartition(2)
    nulls.write.format("raylog").option("topic", dst).mode("append").save()
    flush(raylog_client, dst)
    back = read(spark, subscribe=dst, includeHeaders="true").collect()
    assert sorted(bytes(r["value"]) for r in back if r["value"] is not None) == sorted(
        [f"v{i}".encode() for i in range(100)] + [f"n{i}".encode() for i in range(50) if i % 10])
    assert sorted(bytes(r["key"]).decode() for r in back if r["value"] is None) == [f"n{i}" for i in range(0, 50, 10)]
    written = {bytes(r["key"]).decode(): [(h["key"], h["value"] and bytes(h["value"])) for h in r["headers"]]
               for r in back if bytes(r["key"]).startswith(b"n")}
    assert written == {f"n{i}": [("i", str(i).encode()), ("z", None)] for i in range(50)}
    # a row with no topic cannot be written: counted and refused, the others written
    spare = make_topic(partitions=1)
    no_topic = spark.createDataFrame([("x", None), ("y", spare)], "value string, topic string").coalesce(1)
    with pytest.raises(Exception, match=r"ConfigError: 1 rows were not written, the first for a null topic.*"
                                        r"the other 1 rows were written"):
        no_topic.write.format("raylog").mode("append").save()
    # a stream's micro-batch: the same, the query failing on the driver
    produce(raylog_client, other, [b"s%d" % i for i in range(20)])
    stream_dst = make_topic(partitions=1)
    q = (spark.readStream.format("raylog").option("subscribe", other).option("startingOffsets", "earliest").load()
         .selectExpr("CASE WHEN value = CAST('s3' AS BINARY) THEN NULL ELSE value END AS value")
         .writeStream.format("raylog").option("topic", stream_dst)
         .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
    assert q.awaitTermination(300)
    flush(raylog_client, stream_dst)
    streamed = read(spark, subscribe=stream_dst).collect()
    assert values([r for r in streamed if r["value"] is not None]) == sorted(b"s%d" % i for i in range(20) if i != 3)
    assert [r["value"] for r in streamed if r["value"] is None] == [None]  # the tombstone


def driver_warnings(spark):
    """A log4j appender on the driver's root logger at WARN, and raylog's
    loggers at WARN (init_spark sets the driver's root at ERROR): ``(text(), remove())``."""
    jvm = spark._jvm
    core = jvm.org.apache.logging.log4j.core
    level = jvm.org.apache.logging.log4j.Level
    core.config.Configurator.setLevel("org.raylog.spark", level.WARN)
    ctx = jvm.org.apache.logging.log4j.LogManager.getContext(False)
    writer = jvm.java.io.StringWriter()
    layout = core.layout.PatternLayout.createDefaultLayout()
    appender = core.appender.WriterAppender.createAppender(layout, None, writer, "raylog-test-warnings", False, True)
    appender.start()
    config = ctx.getConfiguration()
    config.getRootLogger().addAppender(appender, level.WARN, None)
    ctx.updateLoggers()

    def remove():
        config.getRootLogger().removeAppender("raylog-test-warnings")
        core.config.Configurator.setLevel("org.raylog.spark", level.ERROR)
        ctx.updateLoggers()
        appender.stop()

    return writer.toString, remove


def wait_for(condition, what, timeout_s=180):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout_s} s"
        time.sleep(0.2)


def test_a_deleted_topic_fails_a_stream_naming_fail_on_data_loss_or_is_skipped_with_a_driver_warning(
        spark, raylog_client, make_topic):
    kept, gone, strict_kept, strict_gone = (make_topic(partitions=1) for _ in range(4))
    for t in (kept, gone, strict_kept, strict_gone):
        produce(raylog_client, t, [b"%s-%03d" % (t.encode(), i) for i in range(50)])

    def start(topics, name, **options):
        df = (spark.readStream.format("raylog").option("subscribe", ",".join(topics))
              .option("startingOffsets", "earliest").options(**options).load())
        return df.selectExpr("topic", "value").writeStream.format("memory").queryName(name) \
            .trigger(processingTime="200 milliseconds").start()

    warnings, remove = driver_warnings(spark)
    lenient = start([kept, gone], "lenient", failOnDataLoss="false")
    strict = start([strict_kept, strict_gone], "strict")
    try:
        wait_for(lambda: spark.table("lenient").count() == 100 and spark.table("strict").count() == 100,
                 "both streams read their first 100 messages")
        raylog_client.delete_topic(gone)
        raylog_client.delete_topic(strict_gone)
        produce(raylog_client, kept, [b"after-%03d" % i for i in range(30)])
        wait_for(lambda: lenient.exception() is not None or spark.table("lenient").count() == 130,
                 "the lenient stream read on")
        assert lenient.exception() is None and lenient.isActive
        assert values(spark.table("lenient").where(f"topic = '{kept}'").collect()) == sorted(
            [b"%s-%03d" % (kept.encode(), i) for i in range(50)] + [b"after-%03d" % i for i in range(30)])
        assert f"topic {gone} was deleted" in warnings() and "failOnDataLoss=false" in warnings()
        wait_for(lambda: strict.exception() is not None, "the strict stream failed")
        assert "DataLossError" in str(strict.exception()) and "failOnDataLoss" in str(strict.exception())
    finally:
        lenient.stop()
        strict.stop()
        remove()


def produce_to(client, topic, partition, values, compression):
    """Send ``values`` to one partition in sets of up to 50 (compressed with ``compression``)."""
    producer = client.producer(acks=1, batch_size=50, linger_ms=20, compression=compression)
    for v in values:
        producer.send(topic, v, partition=partition)
    producer.flush()
    producer.close()


def records_between(log, partition, start, end):
    """The records of ``log`` (``spark_helpers.log_messages``) of ``partition`` in ``[start, end)``."""
    return sum(1 for p, o, *_ in log if p == partition and start <= o < end)


def test_max_offsets_per_trigger_counts_records_split_by_backlog_with_lag_in_progress(
        spark, raylog_client, make_topic):
    """The guide: maxOffsetsPerTrigger is a "rate limit on maximum number of
    offsets processed per trigger interval. The specified total number of
    offsets will be proportionally split across topicPartitions of different
    volume." Progress carries latestOffset and the records behind it
    (min/avg/maxOffsetsBehindLatest). Partition 0 holds 600 records, partition
    1 400, each in plain and zstd sets: every batch is 100 rows, 60 + 40."""
    topic = make_topic(partitions=2)
    for partition, n in ((0, 600), (1, 400)):
        half = n // 2
        produce_to(raylog_client, topic, partition, [b"p%d-%04d" % (partition, i) for i in range(half)], None)
        produce_to(raylog_client, topic, partition, [b"p%d-%04d" % (partition, i) for i in range(half, n)], "zstd")
    flush(raylog_client, topic)
    log = spark_helpers.log_messages(raylog_client, topic)
    assert len(log) == 1000 and len({(p, o) for p, o, *_ in log}) == 1000
    q = (spark.readStream.format("raylog").option("subscribe", topic).option("startingOffsets", "earliest")
         .option("maxOffsetsPerTrigger", "100").load()
         .writeStream.format("memory").queryName("max_records").trigger(availableNow=True).start())
    assert q.awaitTermination(600), "an AvailableNow query stops by itself at the end"
    assert q.exception() is None
    rows = spark.table("max_records").collect()
    assert values(rows) == sorted(v for *_, v, _ts in log)
    assert len({(r["partition"], r["offset"]) for r in rows}) == 1000
    batches = [p for p in q.recentProgress if p["numInputRows"] > 0]
    assert [b["numInputRows"] for b in batches] == [100] * 10
    latest = {topic: {"0": raylog_client.offsets(topic, 0)[1], "1": raylog_client.offsets(topic, 1)[1]}}
    earliest = {topic: {"0": raylog_client.offsets(topic, 0)[0], "1": raylog_client.offsets(topic, 1)[0]}}
    for k, b in enumerate(batches, 1):
        source = b["sources"][0]
        start, end = source["startOffset"] or earliest, source["endOffset"]  # the first batch's start: null
        taken = [records_between(log, p, start[topic][str(p)], end[topic][str(p)]) for p in (0, 1)]
        assert taken == [60, 40], (k, taken)
        assert source["latestOffset"] == latest
        metrics = source["metrics"]
        assert int(metrics["maxOffsetsBehindLatest"]) == 600 - 60 * k
        assert int(metrics["minOffsetsBehindLatest"]) == 400 - 40 * k
        assert float(metrics["avgOffsetsBehindLatest"]) == 500 - 50 * k


def test_the_split_is_kafka_s_rate_limit(spark):
    """Shares proportional to each backlog, rounded down; a share under one
    record rounded up; nothing over a backlog; everything under the limit."""
    gateway = spark.sparkContext._gateway

    def split(backlogs, limit):
        arr = gateway.new_array(gateway.jvm.long, len(backlogs))
        for i, b in enumerate(backlogs):
            arr[i] = b
        return list(spark._jvm.org.raylog.spark.TriggerLimits.split(arr, limit))

    assert split([600, 400], 100) == [60, 40]
    assert split([333, 333, 334], 100) == [33, 33, 33]
    assert split([10_000, 1, 0], 100) == [99, 1, 0]  # the small partition is not starved
    assert split([30, 20], 100) == [30, 20]  # all of it when it fits
    assert split([7, 0, 5], 3) == [1, 0, 1]
    assert split([], 100) == []


def test_min_offsets_per_trigger_waits_for_records_or_max_trigger_delay(spark, raylog_client, make_topic):
    """The guide: with minOffsetsPerTrigger a trigger is "delayed until
    minOffsetsPerTrigger is reached or maxTriggerDelay has passed" (the first
    trigger runs, as in Kafka's source)."""
    waiting, delayed = make_topic(partitions=2), make_topic(partitions=1)
    produce(raylog_client, waiting, [b"w-first-%03d" % i for i in range(20)])
    produce(raylog_client, delayed, [b"d-first-%03d" % i for i in range(20)])

    def start(topic, name, **options):
        return (spark.readStream.format("raylog").option("subscribe", topic).option("startingOffsets", "earliest")
                .options(**options).load().writeStream.format("memory").queryName(name)
                .trigger(processingTime="200 milliseconds").start())

    def batches(q):
        return [p["numInputRows"] for p in q.recentProgress if p["numInputRows"] > 0]

    q_wait = start(waiting, "min_wait", minOffsetsPerTrigger="300", maxTriggerDelay="1h")
    q_delay = start(delayed, "min_delay", minOffsetsPerTrigger="10000", maxTriggerDelay="3s")
    try:
        wait_for(lambda: batches(q_wait) == [20] and batches(q_delay) == [20], "the first triggers ran")
        produce(raylog_client, waiting, [b"w-mid-%03d" % i for i in range(100)])
        produce(raylog_client, delayed, [b"d-late-%03d" % i for i in range(50)])
        # the delayed stream never sees 10,000 records: maxTriggerDelay lets the 50 through
        wait_for(lambda: q_delay.exception() is not None or sum(batches(q_delay)) == 70, "the delay passed")
        assert q_delay.exception() is None
        assert values(spark.table("min_delay").collect()) == sorted(
            [b"d-first-%03d" % i for i in range(20)] + [b"d-late-%03d" % i for i in range(50)])
        # meanwhile (seconds of 200 ms triggers, and two more) 100 < 300 records ran no batch
        time.sleep(1)
        assert q_wait.exception() is None and batches(q_wait) == [20]
        assert spark.table("min_wait").count() == 20
        produce(raylog_client, waiting, [b"w-last-%03d" % i for i in range(250)])
        wait_for(lambda: q_wait.exception() is not None or len(batches(q_wait)) > 1, "the 300 records arrived")
        assert q_wait.exception() is None
        second = batches(q_wait)[1]
        assert 300 <= second <= 350  # at least minOffsetsPerTrigger, all there was
        assert spark.table("min_wait").count() == 20 + second
    finally:
        q_wait.stop()
        q_delay.stop()
    # Trigger.AvailableNow reads to its end without waiting for more (with maxOffsetsPerTrigger: 30, 30, 10)
    q_now = (spark.readStream.format("raylog").option("subscribe", delayed).option("startingOffsets", "earliest")
             .option("minOffsetsPerTrigger", "10000").option("maxOffsetsPerTrigger", "30").load()
             .writeStream.format("memory").queryName("min_now").trigger(availableNow=True).start())
    assert q_now.awaitTermination(300) and q_now.exception() is None
    assert batches(q_now) == [30, 30, 10]
    assert spark.table("min_now").count() == 70


def test_json_offsets_name_every_partition_read_as_spark_requires(spark, raylog_client, timed):
    topic, _ = timed
    for name, edge in (("startingOffsets", -2), ("endingOffsets", -1)):
        partial = json.dumps({topic: {"0": edge}})
        with pytest.raises(Exception, match=f"ConfigError: option '{name}' gives specific offsets, so it must name "
                                            f"every partition the query reads .*; it leaves out {topic}-1"):
            no_job_ran(spark, lambda n=name, o=partial: read(spark, subscribe=topic, **{n: o}).collect())
    # a stream's start too
    stream = (spark.readStream.format("raylog").option("subscribe", topic)
              .option("startingOffsets", json.dumps({topic: {"1": -2}})).load())
    q = stream.writeStream.format("memory").queryName("partial_start").trigger(availableNow=True).start()
    with pytest.raises(Exception, match=f"ConfigError: option 'startingOffsets' .*; it leaves out {topic}-0"):
        q.awaitTermination(300)
    # every partition named, -2 earliest and -1 latest as Spark's: the whole topic, nothing lost
    whole = read(spark, subscribe=topic, startingOffsets=json.dumps({topic: {"0": -2, "1": -2}}),
                 endingOffsets=json.dumps({topic: {"0": -1, "1": -1}}))
    assert whole.count() == 1000


def test_a_starting_or_ending_timestamp_wins_over_offsets_by_timestamp_as_in_spark(spark, raylog_client, timed):
    topic, cut = timed
    old = sorted(b"old-%04d" % i for i in range(500))
    new = sorted(b"new-%04d" % i for i in range(500))
    from_zero = json.dumps({topic: {"0": 0, "1": 0}})
    assert values(read(spark, subscribe=topic, startingTimestamp=str(cut), startingOffsetsByTimestamp=from_zero,
                       startingOffsets=json.dumps({topic: {"0": -1, "1": -1}})).collect()) == new
    future = json.dumps({topic: {"0": cut + 3_600_000, "1": cut + 3_600_000}})
    ended = read(spark, subscribe=topic, endingTimestamp=str(cut), endingOffsetsByTimestamp=future)
    assert values(ended.collect()) == old
    # the option that loses is not used at all (Spark does not read it): not even one naming one partition
    assert values(read(spark, subscribe=topic, startingTimestamp=str(cut),
                       startingOffsetsByTimestamp=json.dumps({topic: {"0": 0}})).collect()) == new
    # and by timestamp wins over plain offsets
    assert values(read(spark, subscribe=topic, startingOffsetsByTimestamp=json.dumps({topic: {"0": cut, "1": cut}}),
                       startingOffsets="earliest").collect()) == new
    stream = (spark.readStream.format("raylog").option("subscribe", topic).option("startingTimestamp", str(cut))
              .option("startingOffsetsByTimestamp", from_zero).load())
    q = stream.writeStream.format("memory").queryName("timestamp_wins").trigger(availableNow=True).start()
    assert q.awaitTermination(300) and q.exception() is None
    assert values(spark.sql("SELECT value FROM timestamp_wins").collect()) == new


def test_kafka_bootstrap_servers_is_taken_when_it_names_the_clusters_listeners(spark, raylog_client, timed):
    topic, _ = timed
    option = "kafka.bootstrap.servers"
    with pytest.raises(Exception, match=f"ConfigError: option '{option}' names 127.0.0.1:9, which is not a Kafka "
                                        "listener of the raylog cluster .*(it runs none)"):
        no_job_ran(spark, lambda: read(spark, subscribe=topic, **{option: "127.0.0.1:9"}).collect())
    with pytest.raises(Exception, match=f"ConfigError: option '{option}' must be host:port entries"):
        no_job_ran(spark, lambda: read(spark, subscribe=topic, **{option: "no-port"}).collect())
    entries = raylog_client.start_kafka_listeners()
    servers = ",".join(f"{e['host']}:{e['port']}" for e in entries)
    assert read(spark, subscribe=topic, **{option: servers}).count() == 1000
    stream = spark.readStream.format("raylog").option("subscribe", topic).option(option, servers).option(
        "startingOffsets", "earliest").load()
    q = stream.writeStream.format("memory").queryName("bootstrap_ok").trigger(availableNow=True).start()
    assert q.awaitTermination(300) and q.exception() is None
    assert spark.sql("SELECT * FROM bootstrap_ok").count() == 1000
    ports = {e["port"] for e in entries}
    elsewhere = f"{entries[0]['host']}:{max(ports) + 1}"
    listed = ", ".join(f"{e['host']}:{e['port']}" for e in entries)
    with pytest.raises(Exception, match=f"ConfigError: option '{option}' names {elsewhere}, which is not a Kafka "
                                        f"listener of .*; its listeners are {listed}"):
        no_job_ran(spark, lambda: read(spark, subscribe=topic, **{option: f"{servers},{elsewhere}"}).collect())
    other_host = f"198.51.100.7:{entries[0]['port']}"  # a listener's port on another host (TEST-NET-2)
    with pytest.raises(Exception, match=f"ConfigError: option '{option}' names {other_host}, which is not a Kafka"):
        no_job_ran(spark, lambda: read(spark, subscribe=topic, **{option: other_host}).collect())
    assert read(spark, subscribe=topic).count() == 1000  # the data is whole
