"""Ray Data, the table view and COUNT on a compacted topic (docs/design.md
§3 and §6), on real Ray and ZooKeeper: a topic of 100 k records over 1 k keys
with tombstones (the acceptance's 1 M over 10 k, scaled down; bench/compaction.py
runs the full size), segments rolling, the partition actors' cleaners run.
A read of the whole topic returns exactly the records kept (gaps skipped, no
record twice), split into many tasks or not; ``read_table`` gives exactly
the latest value of each key before and after the cleaning; COUNT equals
the records read."""

from __future__ import annotations

import os
import time

import pytest

from raylog.read import read_raylog

pytestmark = pytest.mark.timeout(600)

RECORDS = 100_000
KEYS = 1_000
PARTITIONS = 2
#: keys whose last record is a tombstone
DELETED = {b"key-%d" % k for k in range(0, KEYS, 10)}


def _produce(client, topic: str) -> dict:
    producer = client.producer(acks=1)
    try:
        for i in range(RECORDS):
            producer.send(topic, b"value-%d" % i, key=b"key-%d" % (i % KEYS))  # partitioned by key
        for key in sorted(DELETED):
            producer.send(topic, None, key=key)
        producer.flush()
    finally:
        producer.close()
    latest = {b"key-%d" % k: b"value-%d" % (RECORDS - KEYS + k) for k in range(KEYS)}
    return {k: v for k, v in latest.items() if k not in DELETED}


def _rows(ds) -> list[dict]:
    table = ds.to_arrow_refs()
    import ray
    import pyarrow as pa

    tables = [t for t in ray.get(table) if t.num_rows]
    if not tables:
        return []
    return pa.concat_tables(tables).select(["key", "value", "partition", "offset"]).to_pylist()


def _check_records(rows: list[dict]) -> None:
    """Every record is one that was produced (its value belongs to its key), once."""
    seen = set()
    for row in rows:
        where = (row["partition"], row["offset"])
        assert where not in seen, f"record {where} read twice"
        seen.add(where)
        if row["value"] is not None:
            i = int(row["value"].split(b"-")[1])
            assert row["key"] == b"key-%d" % (i % KEYS), row


def _cleaned(client, topic: str) -> bool:
    return all(any(n.endswith(".index") for n in os.listdir(client.log_dir(topic, p))) for p in range(PARTITIONS))


def _files(client, topic: str):
    return [sorted(os.listdir(client.log_dir(topic, p))) for p in range(PARTITIONS)]


def _count(client, topic: str) -> int:
    total = 0
    for p in range(PARTITIONS):
        start, end = client.offsets(topic, p)
        total += client.count_messages(topic, p, start, end)
    return total


def test_ray_data_read_table_and_count_agree_on_a_compacted_topic_before_and_after_cleaning(raylog_client,
                                                                                           make_topic):
    topic = make_topic(partitions=PARTITIONS, cleanup_policy="compact", segment_bytes=256 * 1024,
                       max_message_bytes=128 * 1024, retention_check_ms=300, min_cleanable_dirty_ratio=0.01,
                       flush_ms=20)
    plain = make_topic(partitions=PARTITIONS, segment_bytes=256 * 1024, max_message_bytes=128 * 1024)
    latest = _produce(raylog_client, topic)
    assert _produce(raylog_client, plain) == latest

    # the table view is right before a cleaner has run too (it deduplicates itself): the same records in a
    # topic without a cleaner, and the compacted topic whether or not its cleaner has run yet
    for name in (plain, topic):
        rows = _rows(raylog_client.read_table(name))
        assert {r["key"]: r["value"] for r in rows} == latest
        assert len(rows) == len(latest)
    assert len(_rows(read_raylog(plain, client=raylog_client))) == RECORDS + len(DELETED)

    deadline = time.monotonic() + 300
    while not _cleaned(raylog_client, topic):
        assert time.monotonic() < deadline, f"the cleaner did not clean: {_files(raylog_client, topic)}"
        time.sleep(1)
    while True:  # until the cleaners rest (no new pass between the reads below)
        before = _files(raylog_client, topic)
        time.sleep(3)
        if _files(raylog_client, topic) == before:
            break
        assert time.monotonic() < deadline, "the cleaners do not come to rest"

    whole = _rows(read_raylog(topic, client=raylog_client))
    _check_records(whole)
    assert len(whole) < RECORDS // 2  # the cleaner removed most records: the read saw gaps
    table_of_whole = {}
    for row in whole:
        table_of_whole[row["key"]] = row["value"]
    assert {k: v for k, v in table_of_whole.items() if v is not None} == latest

    # split into many tasks (split points inside removed ranges): the same records, none lost or repeated
    split = _rows(read_raylog(topic, client=raylog_client, min_partitions=24))
    _check_records(split)
    key = lambda r: (r["partition"], r["offset"])  # noqa: E731
    assert sorted(split, key=key) == sorted(whole, key=key)

    # COUNT of each partition equals what the read returned
    assert _count(raylog_client, topic) == len(whole)

    rows = _rows(raylog_client.read_table(topic))
    assert {r["key"]: r["value"] for r in rows} == latest
    assert len(rows) == len(latest)


def test_the_table_view_example_runs_as_written(raylog_client, capsys):
    """The table view block (docs/howto/spark.md) on the module's client, its
    compacted topic "users" holding 5 keys written 4 times, one deleted."""
    from tests.doc_blocks import block, printed_lines

    raylog_client.create_topic("users", partitions=2, cleanup_policy="compact")
    producer = raylog_client.producer(acks="all", batch_size=3)
    for i in range(20):
        producer.send("users", b"v%d" % i, key=b"u%d" % (i % 5))
    producer.send("users", None, key=b"u0")
    producer.flush()
    producer.close()
    namespace = {"client": raylog_client}
    exec(compile(block("docs/howto/spark.md", "Compacted topics and the table view"), "spark.md", "exec"),
         namespace)
    assert int(printed_lines(capsys.readouterr().out)[-1]) == 4
    rows = namespace["table"].take_all()
    assert sorted((r["key"], r["value"]) for r in rows) == [(b"u%d" % k, b"v%d" % (15 + k)) for k in range(1, 5)]
