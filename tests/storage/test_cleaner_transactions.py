"""The cleaner on a log that holds transactions (docs/design.md §3 and §6):
the records of committed transactions are compacted as any, those of
aborted transactions never hide another record and are removed, nothing at
or past the last stable offset (an open transaction) is cleaned, and a
read_committed reader gets, before and after cleaning and after the log
opens again (with or without its producer snapshots), the latest committed
value of each key."""

from __future__ import annotations

import os

import pytest

from raylog.config import TopicConfig
from raylog.storage.log import PartitionLog
from raylog.storage.record_batch import decode_batch, encode_batch, iter_batches, next_offset_after

CONFIG = TopicConfig(cleanup_policy="compact", flush_messages=1, flush_ms=10**9, segment_bytes=512,
                     max_message_bytes=512, delete_retention_ms=1000)
NOW = 10**13


def read_committed(log) -> list[tuple[int, bytes, bytes | None]]:
    """What a read_committed reader gets from the log start: (offset, key, value)."""
    out = []
    offset = log.log_start_offset
    while True:
        answer = log.read_committed(offset, 1 << 16)
        data = answer.slice.tobytes()
        if not data:
            return out
        spans: dict[int, list[tuple[int, int]]] = {}
        for txn in answer.aborted:
            spans.setdefault(txn.producer_id, []).append((txn.first_offset, txn.last_offset))
        for pos, header in iter_batches(data):
            if header.control or (header.transactional and any(
                    a <= header.base_offset < b for a, b in spans.get(header.producer_id, ()))):
                continue
            out.extend((r.offset, r.key, r.value) for r in decode_batch(data, pos, from_offset=offset).records)
        offset = next_offset_after(data, len(data))


class Writer:
    """A transactional producer's batches, written straight to the log, and the coordinator's markers."""

    def __init__(self, log, producer_id: int):
        self.log, self.producer_id, self.sequence = log, producer_id, 0

    def send(self, keys, values) -> int:
        at = self.log.append(encode_batch(values, keys=keys, producer_id=self.producer_id, producer_epoch=0,
                                          base_sequence=self.sequence, transactional=True, timestamp_ms=1000))
        self.sequence += len(keys)
        return at

    def end(self, commit: bool) -> None:
        self.log.append_marker(self.producer_id, 0, commit, 0)


def fill(log) -> None:
    for i in range(30):  # other keys: the segments roll and the cleaner has closed segments to clean
        log.append(encode_batch([b"z" * 100], keys=[b"other-%d" % (i % 3)], timestamp_ms=1000))


@pytest.fixture
def plog(tmp_path):
    log = PartitionLog(tmp_path / "p", CONFIG)
    yield log
    if not log.closed:
        log.close()


def test_committed_records_are_compacted_and_aborted_ones_removed(plog, tmp_path):
    plog.append(encode_batch([b"plain-1", b"plain-j"], keys=[b"k", b"j"], timestamp_ms=1000))
    a = Writer(plog, 7)
    a.send([b"k", b"m"], [b"committed-1", b"m-1"])
    a.end(commit=True)
    a.send([b"k", b"j"], [b"aborted", b"aborted-j"])  # would hide k=committed-1 and j=plain-j
    a.end(commit=False)
    a.send([b"m"], [b"m-2"])  # a later committed value of m
    a.end(commit=True)
    fill(plog)
    plog.flush()
    before = read_committed(plog)
    assert [(k, v) for _o, k, v in before if not k.startswith(b"other")] == [
        (b"k", b"plain-1"), (b"j", b"plain-j"), (b"k", b"committed-1"), (b"m", b"m-1"), (b"m", b"m-2")]
    assert plog.clean(now_ms=NOW) is not None
    after = read_committed(plog)
    mine = [(k, v) for _o, k, v in after if not k.startswith(b"other")]
    assert mine == [(b"j", b"plain-j"), (b"k", b"committed-1"), (b"m", b"m-2")]
    # the aborted records are gone from the log itself (a read_uncommitted reader no longer sees them)
    everything = []
    offset = plog.log_start_offset
    while offset < plog.high_watermark:
        data = plog.read(offset, 1 << 16).tobytes()
        for pos, header in iter_batches(data):
            if not header.control:
                everything += [r.value for r in decode_batch(data, pos, from_offset=offset).records]
        offset = next_offset_after(data, len(data))
    assert b"aborted" not in everything and b"aborted-j" not in everything and b"m-1" not in everything
    plog.close()
    for snapshots in (True, False):  # opened again: the same reads, the producer goes on in order
        if not snapshots:
            for name in os.listdir(tmp_path / "p"):
                if name.endswith(".producers"):
                    os.unlink(tmp_path / "p" / name)
        with PartitionLog(tmp_path / "p", CONFIG) as again:
            assert read_committed(again) == after
            assert again.last_stable_offset == again.high_watermark


def test_an_open_transaction_and_what_follows_it_are_not_cleaned(plog):
    a = Writer(plog, 8)
    first = a.send([b"k"], [b"open-1"])
    fill(plog)
    plog.append(encode_batch([b"plain-after"], keys=[b"k"], timestamp_ms=1000))
    fill(plog)
    plog.flush()
    assert plog.last_stable_offset == first
    plog.clean(now_ms=NOW, force=True)
    # nothing at or past the last stable offset was touched: the open transaction's record is still there
    data = plog.read(first, 1 << 16).tobytes()
    assert decode_batch(data, 0).records[0].value == b"open-1"
    a.end(commit=False)
    plog.flush()
    plog.clean(now_ms=NOW, force=True)
    got = [(k, v) for _o, k, v in read_committed(plog) if k == b"k"]
    assert got == [(b"k", b"plain-after")]
