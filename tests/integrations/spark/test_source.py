"""The Spark data source ``raylog`` by name, on a real Spark through RayDP:
``spark.read.format("raylog")`` and ``spark.readStream.format("raylog")``
planned in the JVM (ZooKeeper for topics and endpoints, the data sockets'
OFFSETS), with the Kafka source's option names. One Spark session for the
module; ``init_spark`` points the source at this process's cluster.

Expected contents come from the partitions' data sockets read directly here
(``spark_helpers.log_messages``), not through the code under test.
"""

from __future__ import annotations

import json
import time

import pytest

import raylog_spark
import spark_helpers
from format2_log import format1_topic

pytestmark = pytest.mark.timeout(900)


def produce(client, topic: str, values, compression=None, keys=None, timestamps=None) -> None:
    """Send the values with acks=1 and flush every partition (all below the high watermark)."""
    import ray

    producer = client.producer(acks=1, batch_size=50, linger_ms=1, compression=compression)
    for i, value in enumerate(values):
        producer.send(topic, value, None if keys is None else keys[i])
    producer.flush()
    producer.close()
    partitions = client.metadata.partitions(topic)
    ray.get([client.partition_actor(topic, p).flush.remote() for p in range(partitions)])


def log_messages(client, topic: str) -> list[tuple]:
    """Every message of ``topic`` as ``(partition, offset, value)``, read from the data sockets."""
    return sorted((p, o, v) for p, o, _key, v, _ts in spark_helpers.log_messages(client, topic))


def read(spark, **options):
    return spark.read.format("raylog").options(**options).load()


def values(rows) -> list[bytes]:
    return sorted(bytes(r["value"]) for r in rows)


@pytest.fixture(scope="module", autouse=True)
def cluster(spark, raylog_client):
    """The module's session reads the module's cluster by name (the session
    started before raylog_client, so init_spark could not point it there)."""
    assert raylog_spark.use_cluster(spark, raylog_client)


@pytest.fixture(scope="module")
def topics(raylog_client):
    """Two topics: ``a`` (2 partitions, plain) and ``b`` (1 partition, zstd wrappers)."""
    a, b = "source-a", "source-b"
    raylog_client.create_topic(a, partitions=2)
    raylog_client.create_topic(b, partitions=1)
    produce(raylog_client, a, [b"a-%04d" % i for i in range(400)], keys=[b"k%d" % (i % 7) for i in range(400)])
    produce(raylog_client, b, [b"b-%04d" % i for i in range(300)], compression="zstd")
    return a, b


def test_read_by_name_with_one_or_several_topics_and_a_pattern(spark, raylog_client, topics):
    a, b = topics
    df = read(spark, subscribe=a)
    assert df.columns == [
        "key", "value", "topic", "partition", "offset", "timestamp", "timestampType",
    ]
    expected_a = log_messages(raylog_client, a)
    assert sorted((r["partition"], r["offset"], bytes(r["value"])) for r in df.collect()) == expected_a
    both = read(spark, subscribe=f"{a},{b}")
    assert both.count() == 700
    assert {r["topic"]: r["count"] for r in both.groupBy("topic").count().collect()} == {a: 400, b: 300}
    # without spark.raylog.token the source derives the cluster token as raylog.auth does
    spark.conf.unset("spark.raylog.token")
    try:
        assert read(spark, subscribe=a).count() == 400
        with pytest.raises(Exception, match="AuthenticationError"):
            read(spark, subscribe=a, token="d3Jvbmc=").count()
    finally:
        raylog_spark.use_cluster(spark, raylog_client)
    pattern = read(spark, subscribePattern="source-.*")
    assert values(pattern.collect()) == values(both.collect())
    assert read(spark, subscribePattern="nothing-matches-.*").count() == 0


def zstd_wrappers(client, topic: str, sets: int = 3, per_set: int = 100) -> list[bytes]:
    """``sets`` zstd wrappers of ``per_set`` messages each in partition 0 of ``topic``."""
    import ray

    sent = []
    for s in range(sets):
        values = [b"z-%d-%03d" % (s, i) for i in range(per_set)]
        producer = client.producer(acks=1, batch_size=10**6, linger_ms=60_000, compression="zstd")
        for value in values:
            producer.send(topic, value)
        producer.flush()
        producer.close()
        sent.extend(values)
    ray.get(client.partition_actor(topic, 0).flush.remote())
    return sent


def test_every_row_of_a_compressed_topic_has_its_own_offset(spark, raylog_client, make_topic):
    topic = make_topic(partitions=1)
    sent = zstd_wrappers(raylog_client, topic)
    stored = spark_helpers.log_messages(raylog_client, topic)
    assert len({o for _p, o, *_ in stored}) == 300
    rows = sorted(read(spark, subscribe=topic, includeNextOffset="true").collect(), key=lambda r: r["offset"])
    assert [bytes(r["value"]) for r in rows] == sent
    offsets = [r["offset"] for r in rows]
    assert len(set(offsets)) == 300 and offsets == sorted(offsets)  # 300 distinct, increasing
    assert [(0, o, bytes(r["value"])) for o, r in zip(offsets, rows)] == [(p, o, v) for p, o, _k, v, _t in stored]
    wrappers = [o for i, o in enumerate(offsets) if i % 100 == 0]
    assert offsets == [w + i for w in wrappers for i in range(100)]  # inner message i: wrapper offset + i
    end = raylog_client.offsets(topic, 0)[1]
    for i, r in enumerate(rows):  # the resume point: the next row's offset, the wrapper's end after its last
        assert r["next_offset"] == (offsets[i + 1] if i + 1 < len(rows) else end)
        assert r["timestampType"] == 0
    # a batch read from an offset inside a wrapper starts at that message, ending inside another
    inner = json.dumps({topic: {"0": offsets[150]}})
    ending = json.dumps({topic: {"0": offsets[250]}})
    part = read(spark, subscribe=topic, startingOffsets=inner, endingOffsets=ending)
    assert values(part.collect()) == sorted(sent[150:250])
    assert part.count() == 100  # the pushed-down count agrees
    # a stream from there too
    out = spark.readStream.format("raylog").option("subscribe", topic).option("startingOffsets", inner).load()
    q = out.writeStream.format("memory").queryName("inside_wrapper").trigger(availableNow=True).start()
    assert q.awaitTermination(300)
    streamed = spark.sql("SELECT offset, value FROM inside_wrapper").collect()
    assert sorted(r["offset"] for r in streamed) == offsets[150:]
    assert values(streamed) == sorted(sent[150:])


def test_an_offset_inside_a_plain_message_stays_an_error(spark, raylog_client):
    # format 1's rule (a log written before record batches): an offset inside a message is no offset
    topic = "source-format1"
    offsets = format1_topic(raylog_client, topic, [b"plain-%03d" % i for i in range(20)])
    with pytest.raises(Exception, match="InvalidOffsetError"):
        read(spark, subscribe=topic, startingOffsets=json.dumps({topic: {"0": offsets[0][0] + 3}})).count()


def test_starting_and_ending_offsets(spark, raylog_client, topics):
    a, _ = topics
    expected = log_messages(raylog_client, a)
    p0 = [m for m in expected if m[0] == 0]
    start, stop = p0[10][1], p0[50][1]
    df = read(
        spark,
        subscribe=a,
        startingOffsets=json.dumps({a: {"0": start, "1": -2}}),
        endingOffsets=json.dumps({a: {"0": stop, "1": raylog_client.offsets(a, 1)[0]}}),
    )
    rows = df.collect()
    assert sorted((r["partition"], r["offset"], bytes(r["value"])) for r in rows) == p0[10:50]
    assert read(spark, subscribe=a, minPartitions="4", failOnDataLoss="false").count() == 400


def test_bad_options_are_raylog_errors(spark, raylog_client, topics):
    a, _ = topics
    with pytest.raises(Exception, match="UnknownTopicError"):
        read(spark, subscribe="no-such-topic").count()
    with pytest.raises(Exception, match="ConfigError: .*subscribe"):
        read(spark).count()
    with pytest.raises(Exception, match="InvalidOffsetError"):  # inside a format-1 message
        plain = "source-format1-bad"
        offsets = format1_topic(raylog_client, plain, [b"plain-0", b"plain-1"])
        read(spark, subscribe=plain, startingOffsets=json.dumps({plain: {"0": offsets[0][0] + 3}})).count()
    with pytest.raises(Exception, match="OffsetOutOfRangeError"):
        read(spark, subscribe=a, endingOffsets=json.dumps({a: {"0": 10**9, "1": -1}})).count()
    with pytest.raises(Exception, match="UnknownPartitionError"):
        read(spark, subscribe=a, startingOffsets=json.dumps({a: {"5": 0}})).count()


def test_starting_timestamp_and_offsets_for_times_land_on_the_first_message_at_or_after_it(
    spark, raylog_client, make_topic
):
    topic = make_topic(partitions=2)
    produce(raylog_client, topic, [b"old-%03d" % i for i in range(200)])
    time.sleep(0.05)
    cut = int(time.time() * 1000)
    time.sleep(0.05)
    produce(raylog_client, topic, [b"new-%03d" % i for i in range(100)], compression="gzip")
    offsets = raylog_client.offsets_for_times(topic, cut)
    rows = read(spark, subscribe=topic).collect()
    first_new = {}
    for r in rows:
        if bytes(r["value"]).startswith(b"new-"):
            p = r["partition"]
            first_new[p] = min(first_new.get(p, r["offset"]), r["offset"])
    for p in range(2):  # a partition with no new message answers its end
        assert offsets[p] == first_new.get(p, raylog_client.offsets(topic, p)[1])
    assert raylog_client.offsets_for_times(topic, 0) == {p: raylog_client.offsets(topic, p)[0] for p in range(2)}
    consumer = raylog_client.consumer(topic, auto_offset_reset="earliest")
    try:
        assert consumer.seek_to_timestamp(cut) == {(topic, p): offsets[p] for p in range(2)}
        got, deadline = [], time.monotonic() + 60
        while len(got) < 100 and time.monotonic() < deadline:
            got += consumer.poll(timeout_ms=500)
        assert sorted(m.value for m in got) == sorted(b"new-%03d" % i for i in range(100))
    finally:
        consumer.close()
    later = read(spark, subscribe=topic, startingTimestamp=str(cut)).collect()
    assert values(later) == sorted(b"new-%03d" % i for i in range(100))
    stream = (
        spark.readStream.format("raylog").option("subscribe", topic).option("startingTimestamp", str(cut)).load()
    )
    q = stream.writeStream.format("memory").queryName("from_time").trigger(availableNow=True).start()
    assert q.awaitTermination(300)
    assert values(spark.table("from_time").collect()) == sorted(b"new-%03d" % i for i in range(100))


# ---------------------------------------------------------------------------
# streaming


def stream_into_parquet(spark, topic, out, checkpoint, **options):
    """A readStream query of ``topic`` into Parquet files, with a checkpoint."""
    df = spark.readStream.format("raylog").option("subscribe", topic).options(**options).load()
    return (
        df.selectExpr("partition", "offset", "CAST(value AS STRING) AS value")
        .writeStream.format("parquet")
        .option("checkpointLocation", str(checkpoint))
        .option("path", str(out))
    )


def test_available_now_reads_to_the_end_and_stops(spark, raylog_client, make_topic, tmp_path):
    topic = make_topic(partitions=2)
    produce(raylog_client, topic, [b"s-%04d" % i for i in range(500)], compression="lz4")
    query = stream_into_parquet(
        spark, topic, tmp_path / "out", tmp_path / "ckpt", startingOffsets="earliest", maxOffsetsPerTrigger="100"
    ).trigger(availableNow=True).start()
    assert query.awaitTermination(300), "an AvailableNow query stops by itself at the end"
    assert query.exception() is None
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    assert sorted(r["value"] for r in rows) == sorted("s-%04d" % i for i in range(500))
    progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
    assert len(progress) > 1  # maxOffsetsPerTrigger cut the backlog into several batches


def kill_partition_actor(client, topic: str, partition: int) -> None:
    """Kill the partition's actor and wait until Ray restarted it (a new process on a new port)."""
    import ray

    actor = client.partition_actor(topic, partition)
    old_pid = ray.get(actor.pid.remote())
    ray.kill(actor, no_restart=False)
    deadline = time.monotonic() + 120
    while True:  # until Ray restarted it
        try:
            if ray.get(actor.pid.remote(), timeout=10) != old_pid:
                return
        except ray.exceptions.RayError:
            pass
        assert time.monotonic() < deadline, "the partition actor restarted within 120 s"
        time.sleep(0.2)


def wait_for(condition, what: str, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout_s} s"
        time.sleep(0.2)


def test_a_stream_stopped_and_restarted_writes_every_message_once(spark, raylog_client, make_topic, tmp_path):
    topic = make_topic(partitions=2)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    sent = []

    def send(n):
        batch = [b"m-%05d" % (len(sent) + i) for i in range(n)]
        produce(raylog_client, topic, batch)
        sent.extend(batch)

    send(300)
    query = stream_into_parquet(spark, topic, out, ckpt, startingOffsets="earliest", maxOffsetsPerTrigger="50")
    q = query.trigger(processingTime="200 milliseconds").start()
    wait_for(lambda: any(p["numInputRows"] > 0 for p in q.recentProgress), "the stream read something")
    q.stop()  # mid-way: maxOffsetsPerTrigger leaves a backlog
    assert spark.read.parquet(str(out)).count() < 300
    send(200)
    # the partition actor of partition 0 restarts (new process, new port) before the query does
    kill_partition_actor(raylog_client, topic, 0)
    send(100)
    q = stream_into_parquet(spark, topic, out, ckpt).trigger(availableNow=True).start()
    assert q.awaitTermination(300)
    assert q.exception() is None
    rows = spark.read.parquet(str(out)).collect()
    assert sorted(r["value"].encode() for r in rows) == sorted(sent)  # every message, exactly once
    keys = [(r["partition"], r["offset"]) for r in rows]
    assert len(keys) == len(set(keys))


def test_a_running_stream_goes_on_when_its_partition_actor_is_killed(spark, raylog_client, make_topic, tmp_path):
    """The actor of partition 0 dies mid-run and Ray restarts it on a new
    port: the running query's readers and planner find it again in
    ZooKeeper, and the output holds every message exactly once."""
    topic = make_topic(partitions=2)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    sent = [b"r-%05d" % i for i in range(600)]
    produce(raylog_client, topic, sent[:400])
    q = (
        stream_into_parquet(spark, topic, out, ckpt, startingOffsets="earliest", maxOffsetsPerTrigger="100")
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        wait_for(lambda: any(p["numInputRows"] > 0 for p in q.recentProgress), "the stream read something")
        kill_partition_actor(raylog_client, topic, 0)  # while batches run: maxOffsetsPerTrigger leaves a backlog
        produce(raylog_client, topic, sent[400:])  # written to the restarted actor
        wait_for(
            lambda: q.exception() is not None or sum(p["numInputRows"] for p in q.recentProgress) >= 600,
            "the stream read every message",
        )
        assert q.exception() is None
        assert q.isActive
    finally:
        q.stop()
    rows = spark.read.parquet(str(out)).collect()
    assert sorted(r["value"].encode() for r in rows) == sorted(sent)  # nothing lost, nothing twice
    keys = [(r["partition"], r["offset"]) for r in rows]
    assert len(keys) == len(set(keys))


def flush(client, topic):
    import ray

    ray.get([client.partition_actor(topic, p).flush.remote() for p in range(client.metadata.partitions(topic))])


def test_batch_and_streaming_writes_into_a_topic(spark, raylog_client, make_topic, tmp_path):
    from raylog.producer.partitioner import partition_for_key

    src, dst = make_topic(partitions=2), make_topic(partitions=3)
    rows = [(f"user-{i % 5}", f"event-{i}") for i in range(300)]
    df = spark.createDataFrame(rows, "key string, value string").repartition(2)
    df.write.format("raylog").option("topic", dst).mode("append").save()
    flush(raylog_client, dst)
    back = read(spark, subscribe=dst).collect()
    assert sorted((bytes(r["key"]).decode(), bytes(r["value"]).decode()) for r in back) == sorted(rows)
    for r in back:  # keyed rows go to their partition by the producer's stable hash
        assert r["partition"] == partition_for_key(bytes(r["key"]), 3)

    produce(raylog_client, src, [b"s-%03d" % i for i in range(200)])
    query = (
        spark.readStream.format("raylog").option("subscribe", src).option("startingOffsets", "earliest").load()
        .selectExpr("value")
        .writeStream.format("raylog")
        .option("topic", dst)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(300)
    assert query.exception() is None
    flush(raylog_client, dst)
    got = values(read(spark, subscribe=dst).collect())
    assert got == sorted([v.encode() for _, v in rows] + [b"s-%03d" % i for i in range(200)])

    with pytest.raises(Exception, match="ConfigError: .*'value' column"):
        spark.createDataFrame([("a",)], "k string").write.format("raylog").option("topic", dst).mode("append").save()
    with pytest.raises(Exception, match="UnknownTopicError"):
        df.write.format("raylog").option("topic", "no-such-topic").mode("append").save()
    flush(raylog_client, dst)
    assert read(spark, subscribe=dst).count() == 500  # the refused writes added nothing


def _follower_of(raylog_client, topic: str, tmp_path, host: str):
    """A follower of ``topic``-0 serving on ``host``: a copy of the leader's
    bytes and the leader's high watermark, and the partition's ``state``
    (leader ``disk-l``, in-sync follower ``disk-f``) with both replicas'
    endpoints, as a replicated partition's are. Returns ``(server, close)``."""
    from raylog.config import TopicConfig
    from raylog.replication.follower_reads import FollowerView, ServedWatermark
    from raylog.replication.state import create_state, register_replica
    from raylog.storage.log import PartitionLog
    from raylog.transfer.server import DataServer

    registry = raylog_client.registry
    endpoint = registry.endpoint(topic, 0)
    log = PartitionLog(tmp_path / "follower", TopicConfig())
    watermark = ServedWatermark()
    with raylog_client.settings.broker_connection(endpoint["host"], endpoint["port"]) as conn:
        data = bytes(conn.fetch(topic, 0, 0, 1 << 20).data)
    log.append_replica(data, 0)
    log.flush()
    watermark.learn(log.log_end_offset)
    view = FollowerView(log, watermark, "disk-f")
    server = DataServer(lambda t, p: view if (t, p) == (topic, 0) else None, host=host,
                        token=raylog_client.settings.token)
    fhost, fport = server.start()
    create_state(registry.zk, registry.paths, topic, 0, ["disk-l", "disk-f"])
    register_replica(registry.zk, registry.paths, topic, 0, "disk-l", endpoint)
    register_replica(registry.zk, registry.paths, topic, 0, "disk-f", {"host": fhost, "port": fport, "actor": "f"})

    def close():
        server.stop()
        watermark.close()
        log.close()

    return server, close


def test_a_read_by_name_prefers_the_executors_host_for_partitions_served_on_loopback(spark, raylog_client, make_topic):
    """Issue: reads by name preferred 127.0.0.1 (the endpoints' address on a
    one-machine cluster) while the executors register by the node's address,
    so no task ever ran where Spark thought the data was."""
    from raylog_spark.source import LOCAL_HOST_CONF

    topic = make_topic(partitions=2)
    produce(raylog_client, topic, [b"l-%03d" % i for i in range(40)], keys=[b"k%d" % i for i in range(40)])
    assert {raylog_client.registry.endpoint(topic, p)["host"] for p in range(2)} == {"127.0.0.1"}
    executors = {e.host() for e in spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()}
    assert spark.conf.get(LOCAL_HOST_CONF) in executors, (spark.conf.get(LOCAL_HOST_CONF), executors)
    rdd = read(spark, subscribe=topic)._jdf.queryExecution().toRdd()
    while rdd.getClass().getSimpleName() != "DataSourceRDD":  # down to the scan's own RDD
        rdd = rdd.dependencies().head().rdd()
    converters = spark.sparkContext._jvm.scala.collection.JavaConverters
    preferred = [list(converters.seqAsJavaList(rdd.preferredLocations(part))) for part in rdd.partitions()]
    assert len(preferred) == 2
    assert all(locations and set(locations) <= executors for locations in preferred), (preferred, executors)
    assert sorted(values(read(spark, subscribe=topic).collect())) == [b"l-%03d" % i for i in range(40)]


def test_a_read_by_name_reads_from_the_in_sync_follower_on_its_host_and_falls_back_to_the_leader(
        spark, raylog_client, make_topic, tmp_path):
    import socket

    topic = make_topic(partitions=1)
    produce(raylog_client, topic, [b"r-%04d" % i for i in range(300)])
    expected = values(read(spark, subscribe=topic).collect())
    assert len(expected) == 300
    executors = {e.host() for e in spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()}
    assert len(executors) == 1, executors  # one host: the driver's and the executors'
    here = socket.gethostbyname(executors.pop())
    leader_host = raylog_client.registry.endpoint(topic, 0)["host"]
    if here == leader_host:
        pytest.skip(f"the executor's address {here} is the leader's: no follower is preferred to it")
    server, close = _follower_of(raylog_client, topic, tmp_path, here)
    # the leader stands for one on another host: its loopback address is not
    # taken for this machine's (as use_cluster's spark.raylog.localHost would)
    from raylog_spark.source import LOCAL_HOST_CONF

    local = spark.conf.get(LOCAL_HOST_CONF, None)
    spark.conf.unset(LOCAL_HOST_CONF)
    try:
        # the follower on the executor's host serves the read (as read_topic's would)
        assert values(read(spark, subscribe=topic).collect()) == expected
        assert server.stats()["bytes_out"] > 0
        server.stop()  # gone: the reader falls back to the leader
        assert values(read(spark, subscribe=topic).collect()) == expected
    finally:
        if local:
            spark.conf.set(LOCAL_HOST_CONF, local)
        close()
