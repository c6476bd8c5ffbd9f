"""raylog_spark.load_incremental on a real Spark through RayDP: the paper's
load job, which tracks its own offsets in ZooKeeper. One Spark session per
module."""

from __future__ import annotations

import pytest

import raylog_spark
from raylog.read import DataLossError
from raylog.errors import UnknownTopicError
from raylog.groups.offsets import OffsetStore

pytestmark = pytest.mark.timeout(600)


def produce(client, topic, values):
    import ray

    producer = client.producer(acks=1, batch_size=25)
    for value in values:
        producer.send(topic, value)
    producer.flush()
    producer.close()
    ray.get([client.partition_actor(topic, p).flush.remote() for p in range(client.metadata.partitions(topic))])


def values_of(df) -> list[bytes]:
    return sorted(bytes(r["value"]) for r in df.select("value").collect())


def test_unknown_topic_is_a_typed_error(spark, raylog_client):
    with pytest.raises(UnknownTopicError):
        raylog_spark.load_incremental(spark, "no-such-topic", "g", client=raylog_client)


def test_each_message_is_loaded_once_across_successful_runs(spark, raylog_client, make_topic, tmp_path):
    topic = make_topic(partitions=2)
    first = [b"a-%03d" % i for i in range(120)]
    produce(raylog_client, topic, first)

    df, load = raylog_spark.load_incremental(spark, topic, "warehouse", client=raylog_client)
    assert load.committed_before == {0: None, 1: None}
    df.write.parquet(str(tmp_path / "run1"))  # the job's output, then the commit
    assert load.commit() == load.end_offsets
    assert load.commit() == load.end_offsets  # idempotent

    second = [b"b-%03d" % i for i in range(80)]
    produce(raylog_client, topic, second)
    df2, load2 = raylog_spark.load_incremental(spark, topic, "warehouse", client=raylog_client)
    assert load2.start_offsets == load.end_offsets
    df2.write.parquet(str(tmp_path / "run2"))
    load2.commit()

    loaded = values_of(spark.read.parquet(str(tmp_path / "run1"))) + values_of(spark.read.parquet(str(tmp_path / "run2")))
    assert sorted(loaded) == sorted(first + second)  # each once, none twice

    df3, load3 = raylog_spark.load_incremental(spark, topic, "warehouse", client=raylog_client)
    assert df3.count() == 0 and load3.bytes == 0
    store = OffsetStore(raylog_client.metadata.zk, raylog_client.settings.cluster)
    assert {p: store.committed("warehouse", topic, p) for p in range(2)} == load2.end_offsets


def test_a_failed_run_is_read_again(spark, raylog_client, make_topic):
    topic = make_topic(partitions=2)
    produce(raylog_client, topic, [b"x-%03d" % i for i in range(60)])
    df, load = raylog_spark.load_incremental(spark, topic, "etl", client=raylog_client)
    committed = load.end_offsets
    load.commit()

    produce(raylog_client, topic, [b"y-%03d" % i for i in range(40)])
    failed_df, failed = raylog_spark.load_incremental(spark, topic, "etl", client=raylog_client)
    assert len(values_of(failed_df)) == 40
    # ... the job dies before writing its output: no commit

    produce(raylog_client, topic, [b"z-%03d" % i for i in range(10)])
    retry_df, retry = raylog_spark.load_incremental(spark, topic, "etl", client=raylog_client)
    assert retry.start_offsets == committed == failed.start_offsets
    assert values_of(retry_df) == sorted([b"y-%03d" % i for i in range(40)] + [b"z-%03d" % i for i in range(10)])
    retry.commit()


def test_commit_refuses_offsets_that_moved_meanwhile(spark, raylog_client, make_topic):
    topic = make_topic(partitions=1)
    produce(raylog_client, topic, [b"c-%d" % i for i in range(10)])
    _, slow = raylog_spark.load_incremental(spark, topic, "twice", client=raylog_client)
    _, fast = raylog_spark.load_incremental(spark, topic, "twice", client=raylog_client)
    fast.commit()
    with pytest.raises(raylog_spark.ConcurrentLoadError, match="changed while this load ran"):
        slow.commit()
    assert not slow.committed


def test_a_committed_offset_deleted_by_retention(spark, raylog_client, make_topic):
    import ray

    topic = make_topic(partitions=1, segment_bytes=4096, max_message_bytes=2048, retention_bytes=4096)
    store = OffsetStore(raylog_client.metadata.zk, raylog_client.settings.cluster)
    store.commit("late", topic, 0, 0)
    produce(raylog_client, topic, [b"d-%04d" % i + b"." * 100 for i in range(150)])
    assert ray.get(raylog_client.partition_actor(topic, 0).delete_old_segments.remote())
    log_start = raylog_client.offsets(topic, 0)[0]
    with pytest.raises(DataLossError) as caught:
        raylog_spark.load_incremental(spark, topic, "late", client=raylog_client)
    assert (caught.value.lost_start, caught.value.lost_end) == (0, log_start)
    df, load = raylog_spark.load_incremental(spark, topic, "late", fail_on_data_loss=False, client=raylog_client)
    assert [(g.start, g.end) for g in load.plan.lost] == [(0, log_start)]
    assert load.start_offsets == {0: log_start}
    assert df.count() > 0
    load.commit()
