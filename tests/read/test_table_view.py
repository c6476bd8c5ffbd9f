"""The table view's deduplication (raylog.read.table.latest_per_key), pure
logic on Arrow tables: the last record of each key wins, a tombstone removes
its key, keyless records are left out, and reading in pieces (a read task's
batches) gives the same table as reading at once."""

from __future__ import annotations

import random

import pyarrow as pa

from raylog.read import latest_per_key, records_to_batch


def _table(records):
    return pa.Table.from_batches([records_to_batch(records, "t", 0)])


def test_the_latest_value_of_each_key_wins_and_tombstones_and_keyless_records_go():
    records = [(0, 1, b"a", b"1"), (1, 1, b"b", b"2"), (2, 1, b"a", None), (3, 1, None, b"x"),
               (4, 1, b"c", b"3"), (5, 1, b"b", b"4"), (6, 1, b"d", None)]
    table = latest_per_key([_table(records)])
    assert table.select(["key", "value", "offset"]).to_pylist() == [
        {"key": b"c", "value": b"3", "offset": 4},
        {"key": b"b", "value": b"4", "offset": 5},
    ]


def test_a_key_written_again_after_its_tombstone_is_back():
    table = latest_per_key([_table([(0, 1, b"a", b"1"), (1, 1, b"a", None), (2, 1, b"a", b"2")])])
    assert table.column("value").to_pylist() == [b"2"]


def test_pieces_give_the_same_table_as_one_read():
    rng = random.Random(7)
    records = [(i, 1, b"k%d" % rng.randrange(300), None if rng.random() < 0.1 else b"v%d" % i)
               for i in range(200_000)]
    model = {}
    for offset, _ts, key, value in records:
        model[key] = (offset, value)
    want = sorted((offset, key, value) for key, (offset, value) in model.items() if value is not None)
    whole = latest_per_key([_table(records)])
    pieces = latest_per_key(_table(records[i:i + 997]) for i in range(0, len(records), 997))
    for table in (whole, pieces):
        got = list(zip(table.column("offset").to_pylist(), table.column("key").to_pylist(),
                       table.column("value").to_pylist()))
        assert got == want
