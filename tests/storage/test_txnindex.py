"""The aborted-transactions index (raylog.storage.txnindex): the file's
entries, torn and damaged tails, the order rule, and the collection of the
aborted transactions of a range as Kafka's collectAbortedTxns does."""

from __future__ import annotations

import os

from raylog.storage.transactions import AbortedTxn
from raylog.storage.txnindex import ENTRY, TxnIndex, TxnIndexes, index_name

from conftest import flip_byte


def _indexes(tmp_path, entries_by_base):
    indexes = TxnIndexes(str(tmp_path))
    for base, entries in entries_by_base.items():
        for txn in entries:
            indexes.append(base, txn)
    indexes.sync()
    return indexes


def test_entries_are_written_field_by_field_and_read_back(tmp_path):
    txn = AbortedTxn(producer_id=5, first_offset=100, last_offset=300, last_stable_offset=378)
    indexes = _indexes(tmp_path, {0: [txn]})
    raw = (tmp_path / index_name(0)).read_bytes()
    assert len(raw) == ENTRY.size == 36
    assert ENTRY.unpack(raw)[:4] == (5, 100, 300, 378)
    indexes.close()
    again, notes = TxnIndexes.open(str(tmp_path), 0, 1000)
    assert again.aborted(0, 1000) == [txn] and notes == []
    again.close()


def test_a_torn_or_damaged_tail_is_dropped_and_the_file_rewritten(tmp_path):
    txns = [AbortedTxn(1, 10 * i, 10 * i + 5, 10 * i + 6) for i in range(1, 5)]
    _indexes(tmp_path, {0: txns}).close()
    path = tmp_path / index_name(0)
    flip_byte(path, 2 * ENTRY.size + 3)  # the third entry damaged
    with open(path, "ab") as f:
        f.write(b"\x00" * 7)  # and a torn one after the last
    index, dropped = TxnIndex.open(str(tmp_path), 0, 1000)
    assert index.entries == txns[:2] and dropped == 3
    assert os.path.getsize(path) == 2 * ENTRY.size
    index.close()


def test_entries_past_the_log_end_or_out_of_order_are_not_kept(tmp_path):
    _indexes(tmp_path, {0: [AbortedTxn(1, 0, 50, 60), AbortedTxn(2, 0, 90, 100)]}).close()
    index, dropped = TxnIndex.open(str(tmp_path), 0, 80)  # the log ends at 80 now
    assert [t.last_offset for t in index.entries] == [50] and dropped == 1
    index.append(AbortedTxn(3, 0, 40, 45))  # an earlier marker (a restore): kept in marker order
    index.sync()
    index.close()
    again, _ = TxnIndex.open(str(tmp_path), 0, 80)
    assert [t.last_offset for t in again.entries] == [40, 50]
    again.close()


def test_files_outside_the_log_are_deleted_on_open(tmp_path):
    _indexes(tmp_path, {0: [AbortedTxn(1, 0, 50, 60)], 100: [AbortedTxn(1, 100, 150, 160)],
                        200: [AbortedTxn(1, 200, 250, 260)]}).close()
    (tmp_path / (index_name(100) + ".tmp")).write_bytes(b"half a rewrite")
    indexes, _ = TxnIndexes.open(str(tmp_path), 100, 200)  # retention took [0, 100), a truncation [200, ...)
    assert sorted(os.listdir(tmp_path)) == [index_name(100)]
    assert indexes.aborted(0, 1000) == [AbortedTxn(1, 100, 150, 160)]
    indexes.close()


def test_collection_takes_overlapping_aborts_and_stops_at_the_last_stable_offset(tmp_path):
    """Kafka's collectAbortedTxns: from the file of the range's start on, an
    abort overlaps [start, upper) when its marker is at or after start and it
    began before upper; the walk stops at the first entry whose last stable
    offset reaches upper (every later abort began after it)."""
    a = AbortedTxn(1, 10, 150, 120)   # aborted while b was open (from 120): its LSO is b's first offset
    b = AbortedTxn(2, 120, 180, 190)
    c = AbortedTxn(3, 300, 350, 360)  # begins after the ranges below
    indexes = _indexes(tmp_path, {100: [a, b], 300: [c]})
    assert indexes.aborted(0, 130) == [a, b]
    assert indexes.aborted(155, 400) == [b, c]   # a's marker lies before 155
    assert indexes.aborted(0, 100) == [a]        # b began at 120
    assert indexes.aborted(200, 300) == []
    indexes.truncate(180)
    assert indexes.aborted(0, 1000) == [a]
    assert sorted(os.listdir(tmp_path)) == [index_name(100)]
    indexes.delete_below(300)
    assert indexes.aborted(0, 1000) == [] and os.listdir(tmp_path) == []
    indexes.close()
