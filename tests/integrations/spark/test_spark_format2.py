"""Spark's Java reader on a log of both formats (docs/design.md §2): format-1
messages from raylog's producer, then format-2 record batches (headers, a
tombstone, an empty value; uncompressed and in each of Kafka's codecs) put
through the data channel's PRODUCE. Read by name (``format("raylog")``), in
batch and as a stream, with and without ``includeHeaders``.

Expected contents come from the batches as encoded here, not through the
code under test."""

from __future__ import annotations

import json

import pytest

import raylog_spark
from format2_log import BATCH_A, BATCH_B, PLAIN, expected, mixed_log
from raylog.storage.record_batch import encode_records
from raylog.transfer.connection import BrokerConnection

pytestmark = pytest.mark.timeout(900)

CODECS = ["gzip", "snappy", "lz4", "zstd"]


@pytest.fixture(scope="module", autouse=True)
def cluster(spark, raylog_client):
    assert raylog_spark.use_cluster(spark, raylog_client)


@pytest.fixture(scope="module")
def mixed(raylog_client):
    """A one-partition topic: PLAIN format-1 messages, then BATCH_A and BATCH_B as record batches."""
    topic = "spark-format2"
    raylog_client.create_topic(topic, partitions=1)
    plain, positions = mixed_log(raylog_client, topic)
    return topic, expected(plain, positions)


def _rows(df) -> list[tuple]:
    rows = sorted(df.collect(), key=lambda r: r["offset"])
    return [
        (
            r["offset"],
            None if r["key"] is None else bytes(r["key"]),
            None if r["value"] is None else bytes(r["value"]),
            [(h["key"], None if h["value"] is None else bytes(h["value"])) for h in (r["headers"] or [])]
            if "headers" in r.asDict() else None,
        )
        for r in rows
    ]


def test_a_mixed_log_reads_every_record_with_its_headers_and_nulls(spark, mixed):
    topic, want = mixed
    df = spark.read.format("raylog").option("subscribe", topic).option("includeHeaders", "true").load()
    assert df.schema["headers"].dataType.simpleString() == "array<struct<key:string,value:binary>>"
    got = _rows(df)
    assert got == [(o, k, v, h) for o, k, v, h in want]
    tombstone = [r for r in got if r[1] is None and r[2] is None and r[0] > want[PLAIN - 1][0]]
    assert len(tombstone) == 1  # the tombstone's value is null, not empty
    assert got[PLAIN + 2][2] == b""  # BATCH_A's empty value stays empty
    # without includeHeaders: Kafka's columns, no headers column
    plain = spark.read.format("raylog").option("subscribe", topic).load()
    assert "headers" not in plain.columns
    assert [(o, k, v) for o, k, v, _h in _rows(plain)] == [(o, k, v) for o, k, v, _h in want]
    assert plain.count() == len(want)  # the pushed-down count


def test_next_offsets_and_a_read_from_a_record_inside_a_batch(spark, mixed):
    topic, want = mixed
    df = spark.read.format("raylog").option("subscribe", topic).option("includeNextOffset", "true").load()
    rows = sorted(df.collect(), key=lambda r: r["offset"])
    offsets = [r["offset"] for r in rows]
    assert offsets == [o for o, *_ in want]
    for i, r in enumerate(rows[:-1]):
        assert r["next_offset"] == offsets[i + 1]  # record i + 1 of a batch, or the next batch's position
    # from the second record of BATCH_A (an offset inside the batch) to the third of BATCH_B
    inside = offsets[PLAIN + 1]
    ending = offsets[PLAIN + len(BATCH_A) + 2]
    part = (
        spark.read.format("raylog").option("subscribe", topic).option("includeHeaders", "true")
        .option("startingOffsets", json.dumps({topic: {"0": inside}}))
        .option("endingOffsets", json.dumps({topic: {"0": ending}}))
        .load()
    )
    assert _rows(part) == [tuple(w) for w in want[PLAIN + 1 : PLAIN + len(BATCH_A) + 2]]
    assert part.count() == len(BATCH_A) - 1 + 2
    # and a stream from there
    stream = (
        spark.readStream.format("raylog").option("subscribe", topic).option("includeHeaders", "true")
        .option("startingOffsets", json.dumps({topic: {"0": inside}})).load()
    )
    q = stream.writeStream.format("memory").queryName("format2_inside").trigger(availableNow=True).start()
    assert q.awaitTermination(300)
    streamed = _rows(spark.sql("SELECT * FROM format2_inside"))
    assert streamed == [tuple(w) for w in want[PLAIN + 1 :]]


@pytest.mark.parametrize("codec", CODECS)
def test_compressed_record_batches_read_in_every_kafka_codec(spark, raylog_client, make_topic, codec):
    topic = make_topic(partitions=1)
    records = [(b"k%d" % i, None if i % 5 == 4 else b"value-%04d" % i, [("n", b"%d" % i)], 5000 + i)
               for i in range(300)]
    host, port = raylog_client.metadata.endpoint(topic, 0, refresh=True, wait_s=10.0)
    with BrokerConnection(host, port, token=raylog_client.settings.token, timeout_s=10) as conn:
        first = conn.produce(topic, 0, encode_records(records[:150], compression=codec))
        second = conn.produce(topic, 0, encode_records(records[150:], compression=codec))
    import ray

    ray.get(raylog_client.partition_actor(topic, 0).flush.remote())
    df = spark.read.format("raylog").option("subscribe", topic).option("includeHeaders", "true").load()
    got = _rows(df)
    assert [g[0] for g in got] == [first + i for i in range(150)] + [second + i for i in range(150)]
    assert [(k, v, h) for _o, k, v, h in got] == [(k, v, h) for k, v, h, _ts in records]
    times = sorted(df.select("offset", "timestamp", "timestampType").collect())
    assert [int(r["timestamp"].timestamp() * 1000) for r in times] == [ts for *_x, ts in records]
    assert {r["timestampType"] for r in times} == {0}


def test_a_bad_includeheaders_value_is_a_clear_error(spark, mixed):
    topic, _ = mixed
    with pytest.raises(Exception, match="includeHeaders"):
        spark.read.format("raylog").option("subscribe", topic).option("includeHeaders", "yes").load().count()
