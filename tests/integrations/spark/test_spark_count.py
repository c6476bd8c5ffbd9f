"""COUNT(*) pushed down to the partitions, on a real Spark through RayDP:
``df.count()`` of ``read_topic`` and of ``spark.read.format("raylog")`` is
answered by the partition actors' COUNT (every message checked there, the
numbers sent back), equals the messages of the topic with and without the
push-down, and a count under a filter reads the rows (no push-down).

Expected numbers come from the partitions' data sockets read directly here
(``spark_helpers.log_messages``), not through the code under test.
"""

from __future__ import annotations

import glob
import os

import pytest

import raylog_spark
import spark_helpers
from raylog_spark.source import jvm_options

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module", autouse=True)
def cluster(spark, raylog_client):
    """The module's session reads the module's cluster by name."""
    assert raylog_spark.use_cluster(spark, raylog_client)


@pytest.fixture(scope="module")
def mixed(raylog_client):
    """Three partitions: plain sets, then zstd and gzip wrappers, keyed and not."""
    topic = "count-mixed"
    raylog_client.create_topic(topic, partitions=3)
    for i, compression in enumerate((None, "zstd", "gzip")):
        spark_helpers.produce(
            raylog_client,
            topic,
            [(None if j % 3 else b"k-%d" % j, b"m-%d-%05d:" % (i, j) + b"x" * (j % 50)) for j in range(700)],
            compression=compression,
        )
    return topic


def plan_text(df) -> str:
    return df._jdf.queryExecution().executedPlan().toString()


def by_name(spark, topic, **options):
    return spark.read.format("raylog").option("subscribe", topic).options(**options).load()


def test_count_equals_the_messages_with_and_without_push_down(spark, raylog_client, mixed):
    messages = spark_helpers.log_messages(raylog_client, mixed)
    assert len(messages) == 2100
    pushed = raylog_spark.read_topic(spark, mixed, client=raylog_client, engine="jvm")
    assert "COUNT(*) pushed down" in plan_text(pushed.groupBy().count())
    assert pushed.count() == len(messages)
    assert by_name(spark, mixed).count() == len(messages)
    assert "COUNT(*) pushed down" in plan_text(by_name(spark, mixed).groupBy().count())
    # the same counts with the push-down off: every row read
    off = by_name(spark, mixed, count_pushdown="false")
    assert "pushed down" not in plan_text(off.groupBy().count())
    assert off.count() == len(messages)
    plan = pushed.raylog_plan
    ranges = spark.read.format("raylog").options(**jvm_options(plan), count_pushdown="false").load()
    assert ranges.count() == len(messages)
    # and with the Python reader
    assert raylog_spark.read_topic(spark, mixed, client=raylog_client, engine="python").count() == len(messages)


def test_a_count_under_a_filter_reads_the_rows(spark, raylog_client, mixed):
    messages = spark_helpers.log_messages(raylog_client, mixed)
    keyed = sum(1 for m in messages if m[2] is not None)
    assert 0 < keyed < len(messages)
    for df in (raylog_spark.read_topic(spark, mixed, client=raylog_client, engine="jvm"), by_name(spark, mixed)):
        filtered = df.filter("key IS NOT NULL")
        assert "pushed down" not in plan_text(filtered.groupBy().count())
        assert filtered.count() == keyed
        assert df.filter("partition = 1").count() == sum(1 for m in messages if m[0] == 1)


def test_counts_of_offset_ranges_and_of_an_empty_read(spark, raylog_client, mixed, make_topic):
    messages = spark_helpers.log_messages(raylog_client, mixed)
    offsets = sorted({o for p, o, *_ in messages if p == 0})
    cut, stop = offsets[len(offsets) // 3], offsets[2 * len(offsets) // 3]
    df = raylog_spark.read_topic(spark, mixed, {0: cut}, {0: stop, 1: "earliest"}, client=raylog_client, engine="jvm")
    expected = sum(1 for p, o, *_ in messages if (p == 0 and cut <= o < stop) or p == 2)
    assert df.count() == expected == len(df.collect())
    empty = make_topic(partitions=2)
    assert raylog_spark.read_topic(spark, empty, client=raylog_client, engine="jvm").count() == 0
    assert by_name(spark, empty).count() == 0


def test_a_damaged_byte_fails_the_pushed_down_count(spark, raylog_client, make_topic):
    topic = make_topic(partitions=1)
    spark_helpers.produce(raylog_client, topic, [(None, b"d-%04d:" % i + b"y" * 80) for i in range(300)])
    df = raylog_spark.read_topic(spark, topic, client=raylog_client, engine="jvm")
    assert df.count() == 300
    (segment,) = glob.glob(os.path.join(raylog_client.data_dir, "**", f"{topic}-0", "*.log"), recursive=True)
    size = os.path.getsize(segment)
    assert size > 300 * 87  # record batches of plain records
    position = size // 2 + 101  # a byte of a record inside a batch (covered by its CRC; a batch starts at size // 2 here)
    flip(segment, position)
    try:
        with pytest.raises(Exception, match="CorruptMessageError"):
            df.count()
        with pytest.raises(Exception, match="CorruptMessageError"):
            by_name(spark, topic).count()
    finally:
        flip(segment, position)
    assert df.count() == 300


def flip(path: str, position: int) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)[0]
        f.seek(position)
        f.write(bytes([byte ^ 0x20]))


def test_reads_by_name_share_one_zookeeper_session(spark, raylog_client, mixed):
    sessions = spark.sparkContext._jvm.org.raylog.spark.RaylogSource.zooKeeperSessionIds
    assert by_name(spark, mixed).count() == 2100
    first = sorted(sessions())
    assert first  # kept open after the read, for the next one
    assert by_name(spark, mixed).count() == 2100
    assert len(by_name(spark, mixed, count_pushdown="false").collect()) == 2100
    assert sorted(sessions()) == first  # the same session: none opened and closed per read


def test_stopping_spark_closes_the_reads_zookeeper_sessions_nobody_holds(spark, raylog_client, mixed, zookeeper):
    """``stop_spark`` closes them first (else they outlive the session and
    log reconnection errors once the ZooKeeper stops): the server sees them
    go. A read afterwards opens a new one."""
    from raylog.zk.launcher import four_letter_word
    from raylog_spark.session import close_idle_zookeeper_sessions

    def on_the_server(session_id: int) -> bool:
        return f"sid=0x{session_id & (1 << 64) - 1:x}," in four_letter_word(zookeeper.port, "cons")

    sessions = spark.sparkContext._jvm.org.raylog.spark.RaylogSource.zooKeeperSessionIds
    assert by_name(spark, mixed).count() == 2100
    before = sorted(sessions())
    assert before and all(map(on_the_server, before))
    close_idle_zookeeper_sessions()  # (what stop_spark does before RayDP stops Spark)
    assert list(sessions()) == []
    assert not any(map(on_the_server, before))
    assert by_name(spark, mixed).count() == 2100
    after = sorted(sessions())
    assert after and after != before
