"""The JVM reader (the Spark data source ``raylog``, ``org.raylog.spark.RangeReader``)
handed read plans by ``read_topic``/``plan_dataframe``, on a real Spark
through RayDP: counts that read no column but check every message,
compressed wrappers, fetches that cut messages, errors that name the raylog
error, and the data sockets' token. Expected contents come from the data
sockets read directly (spark_helpers)."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

import raylog_spark
from raylog.errors import InvalidOffsetError
from raylog.read import plan_read
from spark_helpers import as_tuples, log_messages, make_clicks, ordered, produce

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def clicks(raylog_client):
    return make_clicks(raylog_client, "clicks-range-reader")


def test_a_count_reads_no_column_but_checks_every_message(spark, raylog_client, make_topic):
    topic = make_topic(partitions=1)
    produce(raylog_client, topic, [(b"k", b"value-%03d" % i) for i in range(50)])
    # without the count push-down (tests/integrations/spark/test_spark_count.py) the scan reads no column
    df = raylog_spark.read_topic(spark, topic, client=raylog_client, engine="jvm", count_pushdown=False)
    scan = [
        node
        for node in _plan_nodes(df.groupBy().count())
        if node.getClass().getSimpleName() == "BatchScanExec"
    ]
    assert [node.scan().readSchema().length() for node in scan] == [0]
    assert df.count() == 50
    # a flipped byte in a value fails the count too, pushed down or not: the CRC is still checked
    victim = log_messages(raylog_client, topic)[20]
    flip_byte(raylog_client, topic, 0, victim[1] + 30)
    for pushdown in (False, True):
        # the record batch holding the victim fails its CRC (refused by the partition, or by the reader)
        with pytest.raises(Exception, match=r"CorruptMessageError: (the )?batch at offset \d+ (is damaged|fails its CRC32C)"):
            raylog_spark.read_topic(spark, topic, client=raylog_client, engine="jvm", count_pushdown=pushdown).count()


def _plan_nodes(df):
    """The nodes of ``df``'s executed plan (JVM objects), adaptive plans unwrapped."""
    plan = df._jdf.queryExecution().executedPlan()
    if plan.getClass().getSimpleName() == "AdaptiveSparkPlanExec":
        plan = plan.executedPlan()
    nodes = []
    pending = [plan]
    while pending:
        node = pending.pop()
        nodes.append(node)
        children = node.children()
        pending.extend(children.apply(i) for i in range(children.size()))
    return nodes


def flip_byte(client, topic: str, partition: int, offset: int) -> None:
    """Flip one byte of a partition's log on disk, at log ``offset`` of its first segment."""
    folder = client.log_dir(topic, partition)
    segment = os.path.join(folder, sorted(n for n in os.listdir(folder) if n.endswith(".log"))[0])
    with open(segment, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


@pytest.mark.parametrize("compression", ["gzip", "zstd", "lz4"])
def test_compressed_topics_read_by_the_jvm_reader(spark, raylog_client, make_topic, compression):
    topic = make_topic(partitions=2)
    # values up to ~8 KiB: inner sets of ~200 KiB, several (linked) lz4 blocks each
    messages = [
        (None if i % 3 else b"key-%d" % (i % 5), b"%s-%04d:" % (compression.encode(), i) + b"yz%d" % (i % 7) * (i % 2700))
        for i in range(400)
    ]
    produce(raylog_client, topic, messages, compression=compression)
    expected = ordered(log_messages(raylog_client, topic))
    assert len(expected) == 400
    # every message has an offset of its own (inner message i of a wrapper: its offset + i)
    assert len({(m[0], m[1]) for m in expected}) == 400
    df = raylog_spark.read_topic(spark, topic, client=raylog_client, engine="jvm")
    assert as_tuples(df.collect()) == expected
    assert df.count() == 400
    # an explicit offset inside a wrapper (its second message), and min_partitions splits at boundaries
    first = [m for m in expected if m[0] == 0]
    start = sorted(m[1] for m in first)[1]
    part = raylog_spark.read_topic(spark, topic, {0: start}, client=raylog_client, engine="jvm")
    assert part.where("partition = 0").count() == sum(1 for m in first if m[1] >= start)
    split = raylog_spark.read_topic(spark, topic, min_partitions=5, client=raylog_client, engine="jvm")
    assert as_tuples(split.collect()) == expected


@pytest.mark.parametrize("fetch_bytes", [64, 1000])
def test_jvm_reader_with_small_fetches_refetches_cut_messages(spark, raylog_client, clicks, fetch_bytes):
    # replies smaller than a message (the server still sends one whole
    # message) or cutting most messages: every cut one is fetched again
    df = raylog_spark.read_topic(spark, clicks, client=raylog_client, engine="jvm", fetch_bytes=fetch_bytes)
    assert as_tuples(df.collect()) == sorted(log_messages(raylog_client, clicks))


def test_jvm_reader_walks_replies_of_many_pieces_and_stops_at_a_range_end_inside_one(spark, raylog_client, make_topic):
    # a reply of several MiB is read and walked in pieces (FetchClient.WALK_PIECE, 256 KiB):
    # messages of odd sizes straddle every piece boundary; a range that ends inside the
    # reply returns the messages before its end only
    topic = make_topic(partitions=1)
    produce(raylog_client, topic, [(None, b"%06d:" % i + b"v" * (1000 + i % 331)) for i in range(4000)])
    expected = sorted(log_messages(raylog_client, topic))
    assert expected[-1][1] > 3 * (256 << 10)  # more than three pieces in one 8 MiB reply
    df = raylog_spark.read_topic(spark, topic, client=raylog_client, engine="jvm")
    assert as_tuples(df.collect()) == expected
    end = expected[2500][1]  # the offset of message 2500: a message boundary inside the reply
    part = raylog_spark.read_topic(spark, topic, starting_offsets={0: 0}, ending_offsets={0: end},
                                   client=raylog_client, engine="jvm")
    assert as_tuples(part.collect()) == expected[:2500]


def _with_ranges(plan, **changes):
    """``plan`` with every range changed by ``changes`` (for reads the planner would refuse)."""
    return dataclasses.replace(plan, ranges=tuple(r._replace(**changes) for r in plan.ranges))


def test_jvm_reader_errors_name_the_raylog_error(spark, raylog_client, clicks):
    from raylog_spark.reader import plan_dataframe
    from raylog_spark.source import jvm_options

    plan = plan_read(clicks, {0: "earliest", 1: "latest", 2: "latest"}, client=raylog_client)
    (rng,) = plan.ranges
    # a start at the second record of the first record batch: the read starts there (docs/design.md §2)
    whole = plan_dataframe(spark, plan, engine="jvm").count()
    inside = _with_ranges(plan, start=rng.start + 1)
    assert plan_dataframe(spark, inside, engine="jvm").count() == whole - 1
    # a range past the end of the log: the data that the plan promises is not there
    past = _with_ranges(plan, start=rng.end + 1000, end=rng.end + 2000)
    with pytest.raises(Exception, match=r"DataLossError: %s-0 ends at %d" % (clicks, rng.end)):
        plan_dataframe(spark, past, engine="jvm").count()
    # a socket where no partition actor listens: the reader looks the partition up in ZooKeeper and
    # reads on at its endpoint; without ZooKeeper to ask, the task fails naming the error
    closed = _with_ranges(plan, port=1)
    assert plan_dataframe(spark, closed, engine="jvm").count() == plan_dataframe(spark, plan, engine="jvm").count()
    options = jvm_options(closed)
    del options["zookeeper"]
    with pytest.raises(Exception, match=r"BrokerUnavailableError: cannot connect to the data socket 127.0.0.1:1"):
        spark.read.format("raylog").options(**options).load().count()


def test_jvm_reader_authenticates_with_the_token(spark, zookeeper, ray_local, tmp_path):
    import raylog
    from raylog.metadata import ConnectionSettings

    secured = raylog.Client(
        zookeeper=zookeeper.connect_string,
        cluster="spark-secured",
        data_dir=str(tmp_path),
        data_host="127.0.0.1",
    )  # the cluster's token, derived (raylog.auth)
    assert secured.settings.token
    try:
        secured.create_topic("secured", partitions=1)
        produce(secured, "secured", [(None, b"private-%d" % i) for i in range(10)])
        df = raylog_spark.read_topic(spark, "secured", client=secured, engine="jvm")
        assert sorted(bytes(r["value"]) for r in df.collect()) == sorted(b"private-%d" % i for i in range(10))
        from raylog_spark.reader import plan_dataframe

        wrong = dataclasses.replace(df.raylog_plan, settings=ConnectionSettings(secured.settings.zookeeper, "spark-secured", b"guess"))
        with pytest.raises(Exception, match="AuthenticationError"):
            plan_dataframe(spark, wrong, engine="jvm").count()
    finally:
        secured.delete_topic("secured")
        secured.close()


def test_jvm_reader_reads_from_the_follower_on_its_host_and_falls_back_to_the_leader(
    spark, raylog_client, clicks, tmp_path
):
    # A follower of partition 0 (its log a copy of the leader's bytes) that learned the high watermark only
    # up to the middle of the range, on the executor's host: the JVM reader reads from it what it serves,
    # then the rest from the leader; Spark prefers both hosts. One that is gone: the leader serves it all.
    from raylog.config import TopicConfig
    from raylog.read.replicas import Replica
    from raylog.replication.follower_reads import FollowerView, ServedWatermark
    from raylog.storage.log import PartitionLog
    from raylog.transfer.server import DataServer
    from raylog_spark.reader import plan_dataframe
    from raylog_spark.source import jvm_options

    plan = plan_read(clicks, {0: "earliest", 1: "latest", 2: "latest"}, client=raylog_client)
    (rng,) = plan.ranges
    expected = as_tuples(plan_dataframe(spark, plan, engine="jvm").collect())
    log = PartitionLog(tmp_path / "follower", TopicConfig())
    watermark = ServedWatermark()
    server = None
    try:
        with plan.settings.broker_connection(rng.host, rng.port) as conn:
            log.append_replica(bytes(conn.fetch(clicks, 0, rng.start, rng.size).data), rng.start)
        log.flush()
        middle = log.message_boundaries(rng.start, rng.end, [(rng.start + rng.end) // 2])[0]
        watermark.learn(middle)
        view = FollowerView(log, watermark, "disk-f")
        server = DataServer(lambda topic, p: view if (topic, p) == (clicks, 0) else None, token=plan.settings.token)
        host, port = server.start()
        executors = {e.host() for e in spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()}
        assert len(executors) == 1, executors  # one host: the driver's and the executors'
        here = executors.pop()
        replicas = (Replica("disk-l", "leader.invalid", rng.port, None, "leader.invalid", leader=True),
                    Replica("disk-f", host, port, None, here))
        follower_plan = _with_ranges(plan, replicas=replicas)
        ranges = json.loads(jvm_options(follower_plan)["ranges"])
        assert [r["location"] for r in ranges[0]["replicas"]] == ["leader.invalid", here]
        assert as_tuples(plan_dataframe(spark, follower_plan, engine="jvm").collect()) == expected
        served = server.stats()["bytes_out"]
        assert middle - rng.start <= served < rng.size  # the follower served its part, and no more
        server.stop()
        assert as_tuples(plan_dataframe(spark, follower_plan, engine="jvm").collect()) == expected
    finally:
        if server is not None:
            server.stop()
        watermark.close()
        log.close()


def test_jvm_reader_reads_a_message_that_fails_its_crc_at_the_follower_from_the_leader(
    spark, raylog_client, clicks, tmp_path
):
    # The follower on the executor's host holds a copy of partition 0 with one byte flipped in a message
    # in the middle (its disk damaged it): the reader reads up to that message from the follower, then
    # that message and the rest from the leader, and the task does not fail.
    from raylog.config import TopicConfig
    from raylog.read.replicas import Replica
    from raylog.replication.follower_reads import FollowerView, ServedWatermark
    from raylog.storage.log import PartitionLog
    from raylog.storage.segment import segment_name
    from raylog.transfer.server import DataServer
    from raylog_spark.reader import plan_dataframe

    plan = plan_read(clicks, {0: "earliest", 1: "latest", 2: "latest"}, client=raylog_client)
    (rng,) = plan.ranges
    assert rng.start == 0
    expected = as_tuples(plan_dataframe(spark, plan, engine="jvm").collect())
    log = PartitionLog(tmp_path / "follower", TopicConfig())
    watermark = ServedWatermark()
    server = None
    try:
        with plan.settings.broker_connection(rng.host, rng.port) as conn:
            log.append_replica(bytes(conn.fetch(clicks, 0, rng.start, rng.size).data), rng.start)
        log.flush()
        watermark.learn(log.log_end_offset)  # it serves the whole range
        victim, after = log.message_boundaries(rng.start, rng.end, [(rng.start + rng.end) // 2, rng.end - 1])
        assert rng.start < victim < after
        with open(tmp_path / "follower" / segment_name(0), "r+b") as f:
            f.seek(victim + 30)
            byte = f.read(1)
            f.seek(victim + 30)
            f.write(bytes([byte[0] ^ 0x5A]))
        view = FollowerView(log, watermark, "disk-f")
        server = DataServer(lambda topic, p: view if (topic, p) == (clicks, 0) else None, token=plan.settings.token)
        host, port = server.start()
        executors = {e.host() for e in spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()}
        assert len(executors) == 1, executors
        here = executors.pop()
        replicas = (Replica("disk-l", "leader.invalid", rng.port, None, "leader.invalid", leader=True),
                    Replica("disk-f", host, port, None, here))
        follower_plan = _with_ranges(plan, replicas=replicas)
        assert as_tuples(plan_dataframe(spark, follower_plan, engine="jvm").collect()) == expected
        assert server.stats()["bytes_out"] > victim - rng.start  # the follower served up to the damage
    finally:
        if server is not None:
            server.stop()
        watermark.close()
        log.close()
