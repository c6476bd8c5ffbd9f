"""raylog.read reads format 2 beside format 1 (docs/design.md §2): the range
reader and the Ray Data source give a log of format-1 segments followed by
format-2 batches with their headers and null values, in ARROW_SCHEMA's
``headers`` column and nullable ``value``, and a range that starts at a
record's offset inside a batch gives exactly the records from there. Real
ZooKeeper, Ray, a partition actor and sockets (the log: tests/format2_log.py)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from format2_log import BATCH_A, BATCH_B, expected, mixed_log
from raylog.read import ARROW_SCHEMA, plan_read, read_range, read_raylog

pytestmark = pytest.mark.timeout(300)


def _rows(batches) -> list[tuple]:
    table = pa.Table.from_batches(list(batches), schema=ARROW_SCHEMA)
    return [(r["offset"], r["key"], r["value"], [(h["key"], h["value"]) for h in r["headers"]])
            for r in table.to_pylist()]


def test_schema_grows_a_headers_column_last():
    assert ARROW_SCHEMA.names == ["key", "value", "topic", "partition", "offset", "timestamp", "headers"]
    assert ARROW_SCHEMA.field("headers").type == pa.list_(
        pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
    assert ARROW_SCHEMA.field("value").nullable


def test_range_reader_gives_both_formats_headers_and_nulls(raylog_client, make_topic):
    topic = make_topic(partitions=1)
    plain, positions = mixed_log(raylog_client, topic)
    want = expected(plain, positions)
    plan = plan_read(topic, client=raylog_client)
    batches = list(read_range(plan.ranges[0], plan.settings))
    assert all(b.schema == ARROW_SCHEMA for b in batches)
    assert _rows(batches) == want
    table = pa.Table.from_batches(batches)
    stamps = [round(t.timestamp() * 1000) for t in table.column("timestamp").to_pylist()]
    assert stamps[len(plain):] == [r[3] for r in BATCH_A + BATCH_B]
    values = table.column("value").to_pylist()
    assert values[len(plain) + 1] is None and values[len(plain) + 2] == b""  # a tombstone, an empty value


def test_a_range_from_every_record_offset_inside_a_batch(raylog_client, make_topic):
    topic = make_topic(partitions=1)
    plain, positions = mixed_log(raylog_client, topic)
    want = expected(plain, positions)
    plan = plan_read(topic, client=raylog_client)
    whole = plan.ranges[0]
    for i, (offset, *_rest) in enumerate(want):
        rows = _rows(read_range(whole._replace(start=offset), plan.settings, batch_bytes=1))
        assert rows == want[i:], f"from {offset}"
    # a range that ends inside a batch: the records before its end
    inside = positions[1] + 2
    assert _rows(read_range(whole._replace(start=positions[0] + 1, end=inside), plan.settings)) == [
        r for r in want if positions[0] + 1 <= r[0] < inside]


def test_ray_data_reads_both_formats_with_headers(raylog_client, make_topic):
    topic = make_topic(partitions=1)
    plain, positions = mixed_log(raylog_client, topic)
    want = expected(plain, positions)
    ds = read_raylog(topic, client=raylog_client, min_partitions=3)
    assert ds.schema().names == ARROW_SCHEMA.names
    rows = sorted(((r["offset"], r["key"], r["value"], [(h["key"], h["value"]) for h in r["headers"]])
                   for r in ds.iter_rows()), key=lambda r: r[0])
    assert rows == want
