"""Spark on a compacted topic (docs/design.md §3 and §6), on real Spark
(RayDP), Ray and ZooKeeper: a topic of 100 k records over 1 k keys with
tombstones (the acceptance's 1 M over 10 k, scaled down; bench/read_table.py
runs the full size), the keys' latest records spread along the log, small
segments, the partition actors' cleaners run.

The JVM reader's batch and streaming reads return every kept record once
at its stored offset (the cleaner's gaps skipped, none read twice, no
endless loop), as the Python reader (``raylog.read.read_raylog``, tested on
cleaned logs in tests/read/test_read_compacted.py) returns them; COUNT
equals the rows read and ``maxOffsetsPerTrigger`` bounds each micro-batch
in records; ``raylog_spark.read_table`` gives exactly the latest value of
each key, as ``client.read_table`` does, before and after the cleaning.
"""

from __future__ import annotations

import os
import time

import pytest

import raylog_spark
from raylog.errors import ConfigError
from raylog.read import read_raylog

pytestmark = pytest.mark.timeout(900)

RECORDS = 100_000
KEYS = 1_000
PARTITIONS = 2
#: keys whose last record is a tombstone
DELETED = {b"key-%d" % k for k in range(0, KEYS, 10)}


def key_of(i: int) -> bytes:
    """The key of record ``i``: one of the keys still written at ``i`` (key
    ``k`` is written up to about record ``k * RECORDS / KEYS``), so that the
    keys' latest records, which the cleaner keeps, lie all along the log with
    removed stretches between them."""
    low = i * KEYS // RECORDS
    return b"key-%d" % (low + i % (KEYS - low))


def _produce(client, topic: str) -> dict:
    """``RECORDS`` records over ``KEYS`` keys (:func:`key_of`), then a
    tombstone of each key of DELETED; the latest value of each live key."""
    producer = client.producer(acks=1)
    latest = {}
    try:
        step = 10_000
        for first in range(0, RECORDS, step):
            n = min(step, RECORDS - first)
            keys = [key_of(first + i) for i in range(n)]
            values = [b"value-%d" % (first + i) for i in range(n)]
            producer.send_batch(topic, values, keys)
            latest.update(zip(keys, values))
        for key in sorted(DELETED):
            producer.send(topic, None, key=key)
        producer.flush()
    finally:
        producer.close()
    assert len(latest) == KEYS
    return {k: v for k, v in latest.items() if k not in DELETED}


def _files(client, topic: str):
    return [sorted(os.listdir(client.log_dir(topic, p))) for p in range(PARTITIONS)]


@pytest.fixture(scope="module")
def topics(raylog_client):
    """``(compacted, plain, latest)``: the same records in a compacted topic
    (its cleaner eager) and in one without a cleaner."""
    compacted, plain = "compacted-users", "plain-users"
    raylog_client.create_topic(compacted, partitions=PARTITIONS, cleanup_policy="compact", segment_bytes=256 * 1024,
                               max_message_bytes=128 * 1024, retention_check_ms=300, min_cleanable_dirty_ratio=0.01,
                               flush_ms=20)
    raylog_client.create_topic(plain, partitions=PARTITIONS, segment_bytes=256 * 1024, max_message_bytes=128 * 1024)
    latest = _produce(raylog_client, compacted)
    assert _produce(raylog_client, plain) == latest
    return compacted, plain, latest


@pytest.fixture(scope="module")
def cleaned(raylog_client, topics):
    """The compacted topic once every partition's cleaner has rewritten its
    closed segments and rests (no pass under way while a test reads)."""
    topic = topics[0]
    deadline = time.monotonic() + 300
    while not all(any(n.endswith(".index") for n in files) for files in _files(raylog_client, topic)):
        assert time.monotonic() < deadline, f"the cleaner did not clean: {_files(raylog_client, topic)}"
        time.sleep(1)
    while True:
        before = _files(raylog_client, topic)
        time.sleep(3)
        if _files(raylog_client, topic) == before:
            break
        assert time.monotonic() < deadline, "the cleaners do not come to rest"
    return topic


def _records(rows) -> list[tuple]:
    """``(partition, offset, key, value)`` of rows (Spark Rows or dicts), sorted."""
    return sorted((r["partition"], r["offset"], bytes(r["key"]), None if r["value"] is None else bytes(r["value"]))
                  for r in rows)


def _python_read(client, topic: str) -> list[tuple]:
    import pyarrow as pa
    import ray

    tables = [t for t in ray.get(read_raylog(topic, client=client).to_arrow_refs()) if t.num_rows]
    return _records(pa.concat_tables(tables).select(["key", "value", "partition", "offset"]).to_pylist())


def _check_once(records: list[tuple]) -> None:
    """No record twice, and each record's value is one its key was written with."""
    assert len({(p, o) for p, o, _k, _v in records}) == len(records), "a record was read twice"
    for _p, _o, key, value in records:
        if value is not None:
            assert key == key_of(int(value.split(b"-")[1]))


def _table(rows) -> dict:
    table = {}
    for _p, _o, key, value in rows:  # in offset order within a partition; a key lives in one partition
        table[key] = value
    return {k: v for k, v in table.items() if v is not None}


def test_read_table_gives_the_latest_value_per_key_before_the_cleaning(spark, raylog_client, topics):
    compacted, plain, latest = topics
    for name in (plain, compacted):  # no cleaner; a cleaner that may or may not have run yet
        rows = raylog_spark.read_table(spark, name, client=raylog_client).collect()
        assert len(rows) == len(latest)
        assert {bytes(r["key"]): bytes(r["value"]) for r in rows} == latest
    rows = raylog_spark.read_table(spark, plain, client=raylog_client, engine="python").collect()
    assert {bytes(r["key"]): bytes(r["value"]) for r in rows} == latest and len(rows) == len(latest)


def test_a_batch_read_of_a_cleaned_topic_returns_every_kept_record_once(spark, raylog_client, topics, cleaned):
    expected = _python_read(raylog_client, cleaned)
    _check_once(expected)
    assert len(expected) < RECORDS // 2  # the cleaner removed most records: the reads cross gaps
    assert _table(expected) == topics[2]

    df = (
        spark.read.format("raylog").option("subscribe", cleaned).option("startingOffsets", "earliest")
        .option("includeNextOffset", "true").load()
    )
    rows = df.select("partition", "offset", "key", "value", "next_offset").collect()
    assert _records(rows) == expected
    for p in range(PARTITIONS):  # each row's next offset lies past it and at or before the next row
        mine = sorted((r["offset"], r["next_offset"]) for r in rows if r["partition"] == p)
        for (offset, after), (following, _) in zip(mine, mine[1:]):
            assert offset < after <= following
    assert df.count() == len(expected)  # COUNT pushed down to the partitions

    # starting and ending offsets inside removed stretches: the kept records between them
    mine = sorted((r["offset"], r["next_offset"]) for r in rows if r["partition"] == 0)
    gaps = [(after + following) // 2 for (_o, after), (following, _n) in zip(mine, mine[1:]) if following - after > 2]
    assert len(gaps) > 4, "the cleaner left gaps between kept batches"
    start, end = gaps[len(gaps) // 4], gaps[3 * len(gaps) // 4]
    between = spark.read.format("raylog").option("subscribe", cleaned).option(
        "startingOffsets", '{"%s": {"0": %d, "1": -2}}' % (cleaned, start)).option(
        "endingOffsets", '{"%s": {"0": %d, "1": -1}}' % (cleaned, end)).load()
    assert _records(between.collect()) == [r for r in expected if r[0] == 1 or start <= r[1] < end]

    # split into many tasks (split points in removed ranges), and COUNT read row by row
    split = raylog_spark.read_topic(spark, cleaned, client=raylog_client, min_partitions=24, engine="jvm")
    assert _records(split.collect()) == expected
    assert split.count() == len(expected)
    by_rows = raylog_spark.read_topic(spark, cleaned, client=raylog_client, min_partitions=7, count_pushdown=False)
    assert by_rows.count() == len(expected)


def test_a_stream_of_a_cleaned_topic_reads_every_kept_record_once_within_its_trigger_limit(spark, raylog_client,
                                                                                            topics, cleaned):
    expected = _python_read(raylog_client, cleaned)
    limit = len(expected) // 5
    query = (
        spark.readStream.format("raylog").option("subscribe", cleaned).option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(limit)).load()
        .select("partition", "offset", "key", "value")
        .writeStream.format("memory").queryName("cleaned_stream").trigger(availableNow=True).start()
    )
    try:
        assert query.awaitTermination(300), "an AvailableNow query stops by itself at the end"
        assert query.exception() is None
        rows = spark.sql("SELECT * FROM cleaned_stream").collect()
    finally:
        query.stop()
    assert _records(rows) == expected
    counts = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"] > 0]
    assert sum(counts) == len(expected)
    assert len(counts) >= 5  # the limit cut the backlog, in records (not bytes)
    assert max(counts) <= limit + PARTITIONS  # a share under one record is rounded up, as Kafka's source does


def test_read_table_of_a_cleaned_topic_is_the_latest_value_per_key_as_client_read_table(spark, raylog_client,
                                                                                       topics, cleaned):
    latest = topics[2]
    rows = raylog_spark.read_table(spark, cleaned, client=raylog_client).collect()
    assert len(rows) == len(latest)
    assert {bytes(r["key"]): bytes(r["value"]) for r in rows} == latest
    ray_rows = raylog_client.read_table(cleaned).take_all()
    assert sorted((r["partition"], r["offset"], r["key"], r["value"]) for r in ray_rows) == \
        sorted((r["partition"], r["offset"], bytes(r["key"]), bytes(r["value"])) for r in rows)
    python = raylog_spark.read_table(spark, cleaned, client=raylog_client, engine="python").collect()
    assert sorted(map(tuple, python)) == sorted(map(tuple, rows))


def test_read_table_refuses_a_bad_value_format_and_reads_on(spark, raylog_client, topics):
    compacted, _plain, latest = topics
    with pytest.raises(ConfigError, match="value_format"):
        raylog_spark.read_table(spark, compacted, "latest", "xml", client=raylog_client)
    with pytest.raises(ConfigError, match="value_format='json'"):
        raylog_spark.read_table(spark, compacted, client=raylog_client, schema="a INT")
    assert raylog_spark.read_table(spark, compacted, client=raylog_client).count() == len(latest)


def test_read_table_of_json_values_parses_the_latest_values(spark, raylog_client, make_topic):
    topic = make_topic(partitions=2, cleanup_policy="compact")
    producer = raylog_client.producer(acks=1)
    for i in range(30):
        producer.send(topic, b'{"user": "u%d", "visits": %d}' % (i % 5, i), key=b"u%d" % (i % 5))
    producer.send(topic, None, key=b"u0")
    producer.flush()
    producer.close()
    rows = raylog_spark.read_table(spark, topic, value_format="json", client=raylog_client,
                                   schema="user STRING, visits INT").collect()
    assert sorted((r["user"], r["visits"], bytes(r["key"])) for r in rows) == \
        [("u%d" % k, 25 + k, b"u%d" % k) for k in range(1, 5)]


def test_the_spark_table_view_example_runs_as_written(spark, raylog_client, capsys):
    """The Spark table view block (docs/howto/spark.md) on the module's
    cluster, its compacted topic "users" holding 5 keys written 4 times, one
    deleted."""
    from tests.doc_blocks import block, printed_lines

    raylog_client.create_topic("users", partitions=2, cleanup_policy="compact")
    producer = raylog_client.producer(acks="all", batch_size=3)
    for i in range(20):
        producer.send("users", b"v%d" % i, key=b"u%d" % (i % 5))
    producer.send("users", None, key=b"u0")
    producer.flush()
    producer.close()
    namespace = {"client": raylog_client, "spark": spark, "raylog_spark": raylog_spark}
    exec(compile(block("docs/howto/spark.md", "The table view in Spark"), "spark.md", "exec"), namespace)
    assert int(printed_lines(capsys.readouterr().out)[-1]) == 4
    rows = namespace["users"].collect()
    assert sorted((bytes(r["key"]), bytes(r["value"])) for r in rows) == [(b"u%d" % k, b"v%d" % (15 + k))
                                                                          for k in range(1, 5)]


@pytest.mark.parametrize("engine", ["jvm", "python"])
def test_read_table_of_avro_values_decodes_the_latest_values(spark, raylog_client, make_topic, engine):
    from raylog.avro import AvroSerializer
    from raylog.zk.schemas import SchemaRegistry

    schema = {"type": "record", "name": "User", "fields": [{"name": "user", "type": "string"},
                                                           {"name": "visits", "type": "long"}]}
    serialize = AvroSerializer(SchemaRegistry(raylog_client.metadata.zk, raylog_client.settings.cluster), schema)
    topic = make_topic(partitions=2, cleanup_policy="compact")
    producer = raylog_client.producer(acks=1)
    for i in range(30):
        producer.send(topic, serialize({"user": "u%d" % (i % 5), "visits": i}), key=b"u%d" % (i % 5))
    producer.send(topic, None, key=b"u0")
    producer.flush()
    producer.close()
    table = raylog_spark.read_table(spark, topic, value_format="avro", client=raylog_client, engine=engine)
    assert table.raylog_engine == engine
    assert table.columns == ["user", "visits", "key", "topic", "partition", "offset", "timestamp"]
    assert sorted((r["user"], r["visits"], bytes(r["key"])) for r in table.collect()) == \
        [("u%d" % k, 25 + k, b"u%d" % k) for k in range(1, 5)]


def _empty_batches(client, topic: str) -> int:
    from raylog.storage.record_batch import iter_batches

    directory = client.log_dir(topic, 0)
    found = 0
    for name in os.listdir(directory):
        if name.endswith(".log"):
            with open(os.path.join(directory, name), "rb") as f:
                found += sum(1 for _pos, header in iter_batches(f.read()) if header.count == 0)
    return found


def test_the_jvm_reader_passes_over_the_empty_batch_of_a_cleaned_producer(spark, raylog_client, make_topic):
    """One producer writes ten keys, a second one writes them again, then other keys roll the segments: the
    cleaner keeps an empty batch of the first producer's last batch (every record of it rewritten), which
    the JVM reader passes over (rows, COUNT and the Python reader agree)."""
    topic = make_topic(partitions=1, cleanup_policy="compact", segment_bytes=4096, max_message_bytes=2048,
                       retention_check_ms=300, min_cleanable_dirty_ratio=0.01, flush_ms=20)
    keys = [b"k%d" % k for k in range(10)]
    for values in ([b"first-%d" % k for k in range(10)], [b"second-%d" % k for k in range(10)]):
        producer = raylog_client.producer(acks=1)
        producer.send_batch(topic, values, keys)
        producer.flush()
        producer.close()
    producer = raylog_client.producer(acks=1)
    for i in range(200):
        producer.send(topic, b"f" * 100, key=b"filler-%d" % (i % 3))
    producer.flush()
    producer.close()
    deadline = time.monotonic() + 120
    while _empty_batches(raylog_client, topic) == 0:
        assert time.monotonic() < deadline, "the cleaner left no empty batch"
        time.sleep(0.5)
    directory = raylog_client.log_dir(topic, 0)
    while True:  # the cleaner at rest: no pass under way while the readers read
        before = sorted((n, os.path.getsize(os.path.join(directory, n))) for n in os.listdir(directory))
        time.sleep(2)
        if sorted((n, os.path.getsize(os.path.join(directory, n))) for n in os.listdir(directory)) == before:
            break
        assert time.monotonic() < deadline, "the cleaner does not come to rest"
    expected = _python_read(raylog_client, topic)
    assert [(k, v) for _p, _o, k, v in expected if k in keys] == [(k, b"second-%d" % i) for i, k in enumerate(keys)]
    df = spark.read.format("raylog").option("subscribe", topic).option("startingOffsets", "earliest").load()
    assert _records(df.collect()) == expected
    assert df.count() == len(expected)
