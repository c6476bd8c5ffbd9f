"""Transactions on the partition's side (docs/design.md §6; raylog.storage.transactions,
markers, txnindex): markers only through the coordinator's method, ongoing
transactions and the last stable offset, fencing, KIP-890's verification,
the aborted-transactions index, read_committed reads -- across crashes,
rolls, retention and replica truncation."""

from __future__ import annotations

import os

import pytest

from raylog.config import TopicConfig
from raylog.errors import (
    ControlBatchError,
    InvalidProducerEpochError,
    InvalidTxnStateError,
    TransactionCoordinatorFencedError,
)
from raylog.storage import format_file
from raylog.storage.decoding import decode_messages
from raylog.storage.log import PartitionLog
from raylog.storage.markers import decode_marker, encode_marker
from raylog.storage.memory import MemoryLog
from raylog.storage.record_batch import decode_batch, encode_batch, iter_batches, read_header
from raylog.storage.transactions import AbortedTxn
from raylog.storage.txnindex import ENTRY, index_name

from conftest import committed_values, crash as _crash

_committed_values = committed_values

CONFIG = TopicConfig(flush_messages=10**9, flush_ms=10**9)


def _txn(values, pid=7, epoch=0, seq=0):
    return encode_batch(values, timestamp_ms=1, producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                        transactional=True)


def _plain(values):
    return encode_batch(values, timestamp_ms=1)


def _values(log, start=0, end=None):
    """Every record value in [start, end) (markers' records are not handed out)."""
    end = log.high_watermark if end is None else end
    out, offset = [], start
    while offset < end:
        chunk = log.read(offset, 1 << 20)
        records, consumed = decode_messages(chunk.tobytes(), chunk.offset)
        out.extend(r[3] for r in records if r[0] >= offset)
        offset = chunk.offset + consumed
    return out


@pytest.fixture(params=["file", "memory"])
def any_log(request, tmp_path):
    log = PartitionLog(tmp_path / "p", CONFIG) if request.param == "file" else MemoryLog(CONFIG)
    yield log
    if not log.closed:
        log.close()


# -- markers -----------------------------------------------------------------------------


def test_a_marker_is_kafkas_control_batch():
    batch = encode_marker(42, 3, commit=False, coordinator_epoch=9, timestamp_ms=5)
    header = read_header(batch)
    assert header.control and header.transactional
    assert (header.producer_id, header.producer_epoch, header.base_sequence, header.count) == (42, 3, -1, 1)
    record = decode_batch(batch).records[0]
    assert record.key == b"\x00\x00\x00\x00"  # version 0, type 0 (abort)
    assert record.value == b"\x00\x00\x00\x00\x00\x09"  # version 0, coordinator epoch 9
    assert decode_marker(batch) == (False, 9)
    assert decode_marker(encode_marker(42, 3, commit=True, coordinator_epoch=1)) == (True, 1)


def test_kafka_python_reads_the_marker_as_a_control_batch():
    from kafka.record.default_records import DefaultRecordBatch

    batch = DefaultRecordBatch(bytearray(encode_marker(42, 3, commit=True, coordinator_epoch=9)))
    assert batch.is_control_batch and batch.is_transactional
    assert batch.producer_id == 42 and batch.producer_epoch == 3
    assert batch.validate_crc()


def test_a_client_cannot_send_a_marker_and_the_stored_data_stays(any_log):
    """Seen red before the fix: the log stored a client's control batch."""
    first = any_log.append(_plain([b"a", b"b"]))
    for bad in (encode_marker(7, 0, True, 0), _plain([b"c"]) + encode_marker(7, 0, False, 0)):
        with pytest.raises(ControlBatchError) as info:
            any_log.append(bad)
        assert not info.value.retriable
    end = any_log.log_end_offset
    any_log.flush()
    assert _values(any_log) == [b"a", b"b"]
    assert end == first + len(_plain([b"a", b"b"]))
    marker = any_log.append_marker(7, 0, True, 0)  # the coordinator's way in
    any_log.append(_plain([b"d"]))
    any_log.flush()
    assert marker == end
    assert _values(any_log) == [b"a", b"b", b"d"]  # a marker's record is not handed out


# -- ongoing transactions, the last stable offset ------------------------------------------


def test_the_last_stable_offset_stops_at_the_first_open_transaction(tmp_path):
    log = PartitionLog(tmp_path / "p", CONFIG)
    log.append(_plain([b"p0"]))
    t7 = log.append(_txn([b"t7a"], pid=7))
    t8 = log.append(_txn([b"t8a"], pid=8))
    log.append(_txn([b"t7b"], pid=7, seq=1))
    log.flush()
    assert log.ongoing_transactions() == {7: t7, 8: t8}
    assert log.last_stable_offset == t7
    marker = log.append_marker(7, 0, True, 0)
    assert log.last_stable_offset == t7  # the marker is not below the high watermark yet
    log.flush()
    assert log.last_stable_offset == t8
    assert log.ongoing_transactions() == {8: t8}
    log.append_marker(8, 0, False, 0)
    log.flush()
    assert log.last_stable_offset == log.high_watermark
    assert log.aborted_transactions(0, log.high_watermark) == [
        AbortedTxn(8, t8, log.high_watermark - len(encode_marker(8, 0, False, 0)), log.high_watermark)]
    assert marker > t8
    assert _committed_values(log) == [b"p0", b"t7a", b"t7b"]
    log.close()


def test_a_read_committed_read_stops_at_the_last_stable_offset(tmp_path):
    log = PartitionLog(tmp_path / "p", CONFIG)
    log.append(_plain([b"p0"]))
    t7 = log.append(_txn([b"t7a"]))
    log.append(_plain([b"p1"]))
    log.flush()
    read = log.read_committed(0, 1 << 20)
    assert read.last_stable_offset == t7 and read.slice.offset + read.slice.length == t7
    assert read.aborted == []
    empty = log.read_committed(log.high_watermark, 1 << 20)  # past the LSO, up to the HW: nothing yet
    assert empty.slice.length == 0
    log.append_marker(7, 0, False, 0)
    log.flush()
    read = log.read_committed(t7, 1 << 20)
    assert [t.producer_id for t in read.aborted] == [7]
    assert _committed_values(log) == [b"p0", b"p1"]
    log.close()


# -- fencing and verification --------------------------------------------------------------


def test_an_older_epoch_is_fenced_and_nothing_of_it_is_stored(tmp_path):
    """Seen red before the fix: the log stored the old epoch's batch."""
    log = PartitionLog(tmp_path / "p", CONFIG)
    log.append(_txn([b"e1"], epoch=1))
    end = log.log_end_offset
    with pytest.raises(InvalidProducerEpochError) as info:
        log.append(_txn([b"zombie"], epoch=0, seq=5))
    assert info.value.details["current_epoch"] == 1 and not info.value.retriable
    assert log.log_end_offset == end
    log.append_marker(7, 1, True, 0)
    end = log.log_end_offset
    with pytest.raises(InvalidProducerEpochError):
        log.append(_txn([b"zombie"], epoch=0, seq=5))
    with pytest.raises(InvalidProducerEpochError):
        log.append_marker(7, 0, False, 0)
    with pytest.raises(TransactionCoordinatorFencedError):
        log.append_marker(7, 1, False, -1)
    assert log.log_end_offset == end
    log.append(_txn([b"e1b"], epoch=1, seq=1))
    log.flush()
    assert _committed_values(log) == [b"e1"]  # e1b's transaction is open
    assert _values(log) == [b"e1", b"e1b"]
    log.close()


def test_a_plain_batch_of_a_producer_in_a_transaction_is_refused(tmp_path):
    log = PartitionLog(tmp_path / "p", CONFIG)
    log.append(_txn([b"t"]))
    with pytest.raises(InvalidTxnStateError):
        log.append(encode_batch([b"plain"], timestamp_ms=1, producer_id=7, producer_epoch=0, base_sequence=1))
    log.append_marker(7, 0, True, 0)
    log.append(encode_batch([b"plain"], timestamp_ms=1, producer_id=7, producer_epoch=0, base_sequence=1))
    log.flush()
    assert _values(log) == [b"t", b"plain"]
    log.close()


def test_verification_keeps_a_late_write_from_opening_a_transaction_nothing_ends(tmp_path):
    """KIP-890: the first batch of a transaction needs the guard handed out
    before the coordinator was asked; a marker meanwhile voids it (a write of
    the aborted transaction arriving late would otherwise hang the LSO)."""
    log = PartitionLog(tmp_path / "p", CONFIG, verify_transactions=True)
    with pytest.raises(InvalidTxnStateError):
        log.append(_txn([b"unverified"]))
    guard = log.start_transaction_verification(7, 0)
    log.append(_txn([b"a"]), verification=guard)
    assert log.start_transaction_verification(7, 0) is None  # ongoing: nothing to verify
    log.append(_txn([b"b"], seq=1))
    log.append_marker(7, 0, True, 0)
    late = log.start_transaction_verification(7, 0)
    log.append_marker(7, 0, False, 0)  # the coordinator aborted it meanwhile (a timeout)
    end = log.log_end_offset
    with pytest.raises(InvalidTxnStateError):
        log.append(_txn([b"late"], seq=2), verification=late)
    assert log.log_end_offset == end and log.ongoing_transactions() == {}
    log.flush()
    assert log.last_stable_offset == log.high_watermark
    assert _committed_values(log) == [b"a", b"b"]
    log.close()


# -- crashes and reopening -----------------------------------------------------------------


@pytest.mark.parametrize("roll", [False, True])
def test_the_transactions_survive_a_crash_at_every_step(tmp_path, roll):
    """After each step the log is crashed and opened again: ongoing
    transactions, the LSO and the aborted ranges are what they were (with
    rolls: rebuilt from the newest snapshot, without: from the log)."""
    config = CONFIG.replace(segment_bytes=160, max_message_bytes=160) if roll else CONFIG
    path = tmp_path / "p"
    log = PartitionLog(path, config)
    steps = [
        lambda lg: lg.append(_plain([b"p0"])),
        lambda lg: lg.append(_txn([b"a0"], pid=1)),
        lambda lg: lg.append(_txn([b"b0"], pid=2)),
        lambda lg: lg.append(_txn([b"a1"], pid=1, seq=1)),
        lambda lg: lg.append_marker(1, 0, False, 0),
        lambda lg: lg.append(_plain([b"p1"])),
        lambda lg: lg.append(_txn([b"c0"], pid=3)),
        lambda lg: lg.append_marker(2, 0, True, 0),
        lambda lg: lg.append_marker(3, 0, False, 0),
        lambda lg: lg.append(_txn([b"a2"], pid=1, seq=2)),
    ]
    for step in steps:
        step(log)
        log.flush()
        before = (log.ongoing_transactions(), log.last_stable_offset,
                  log.aborted_transactions(0, log.high_watermark), _committed_values(log))
        _crash(log)
        log = PartitionLog(path, config)
        after = (log.ongoing_transactions(), log.last_stable_offset,
                 log.aborted_transactions(0, log.high_watermark), _committed_values(log))
        assert after == before
    assert _committed_values(log) == [b"p0", b"b0", b"p1"]
    if roll:
        assert len(log.segment_bases) > 3
    log.close()
    assert format_file.check_directory(str(path)).segments == 3


def test_a_lost_or_torn_transaction_index_is_restored_from_the_log(tmp_path):
    path = tmp_path / "p"
    log = PartitionLog(path, CONFIG)
    t1 = log.append(_txn([b"x"], pid=1))
    log.append_marker(1, 0, False, 0)
    t2 = log.append(_txn([b"y"], pid=2))
    log.append_marker(2, 0, False, 0)
    log.flush()
    want = log.aborted_transactions(0, log.high_watermark)
    assert [(t.producer_id, t.first_offset) for t in want] == [(1, t1), (2, t2)]
    log.close()
    index = path / index_name(0)
    assert index.stat().st_size == 2 * ENTRY.size
    with open(index, "r+b") as f:  # a torn tail: half of the second entry
        f.truncate(ENTRY.size + ENTRY.size // 2)
    log = PartitionLog(path, CONFIG)
    assert log.aborted_transactions(0, log.high_watermark) == want
    log.close()
    os.unlink(index)
    log = PartitionLog(path, CONFIG)
    assert log.aborted_transactions(0, log.high_watermark) == want
    assert _committed_values(log) == []
    log.close()


def test_a_crash_with_the_abort_cut_off_leaves_the_transaction_open(tmp_path):
    """The marker never became durable (cut by recovery as a torn tail): the
    index loses its entry and the transaction is open again (its coordinator
    writes the marker again)."""
    path = tmp_path / "p"
    log = PartitionLog(path, CONFIG)
    t1 = log.append(_txn([b"x"], pid=1))
    log.flush()
    marker = log.append_marker(1, 0, False, 0)
    _crash(log)
    with open(path / "00000000000000000000.log", "r+b") as f:
        f.truncate(marker + 10)  # the marker torn
    log = PartitionLog(path, CONFIG)
    assert log.recovery_reports and log.log_end_offset == marker
    assert log.ongoing_transactions() == {1: t1}
    assert log.aborted_transactions(0, log.log_end_offset) == []
    assert os.path.getsize(path / index_name(0)) == 0
    log.append_marker(1, 0, False, 0)
    log.flush()
    assert [t.first_offset for t in log.aborted_transactions(0, log.high_watermark)] == [t1]
    log.close()


# -- retention, truncation, replicas -------------------------------------------------------


def test_retention_deletes_a_transaction_index_with_its_segment(tmp_path):
    config = CONFIG.replace(segment_bytes=400, max_message_bytes=400, retention_ms=10**12)
    log = PartitionLog(tmp_path / "p", config)
    log.append(_txn([b"x" * 250], pid=1))
    log.append_marker(1, 0, False, 0)
    log.append(_plain([b"y" * 300]))
    log.append(_plain([b"z" * 300]))
    log.flush()
    assert (tmp_path / "p" / index_name(0)).exists()
    deleted = log.delete_old_segments(now_ms=10**13)
    assert deleted and deleted[0][0] == 0
    assert not (tmp_path / "p" / index_name(0)).exists()
    assert log.aborted_transactions(log.log_start_offset, log.high_watermark) == []
    log.close()


def test_retention_past_an_open_transaction_leaves_the_lso_at_the_log_start(tmp_path):
    """Retention deletes a segment holding an open transaction's first batch
    (as Kafka's does): the last stable offset is then the log start and a
    read_committed reader there waits for the transaction's end."""
    config = CONFIG.replace(segment_bytes=400, max_message_bytes=400, retention_ms=10**12)
    log = PartitionLog(tmp_path / "p", config)
    log.append(_txn([b"x" * 250], pid=1))
    log.append(_plain([b"y" * 300]))
    log.append(_plain([b"z" * 300]))
    log.flush()
    assert log.delete_old_segments(now_ms=10**13)
    start = log.log_start_offset
    assert log.last_stable_offset == start > 0
    assert log.read_committed(start, 1 << 20).slice.length == 0
    log.append_marker(1, 0, True, 0)
    log.flush()
    assert log.last_stable_offset == log.high_watermark
    assert _committed_values(log, start) == _values(log, start) == [b"z" * 300]  # (y went with retention too)
    log.close()


def test_a_replica_follows_the_leaders_transactions_and_truncates_them(tmp_path):
    leader = PartitionLog(tmp_path / "leader", CONFIG)
    follower = PartitionLog(tmp_path / "follower", CONFIG)
    leader.append(_txn([b"a"], pid=1))
    leader.append(_txn([b"b"], pid=2))
    cut = leader.append_marker(1, 0, False, 0)
    leader.append_marker(2, 0, True, 0)
    leader.flush()
    offset = 0
    while offset < leader.high_watermark:
        chunk = leader.read(offset, 100)
        data = chunk.tobytes()
        whole = sum(h.size for _p, h in iter_batches(data))
        follower.append_replica(data[:whole], offset)
        offset += whole
    follower.flush()
    assert follower.aborted_transactions(0, follower.high_watermark) == \
        leader.aborted_transactions(0, leader.high_watermark)
    assert follower.last_stable_offset == leader.last_stable_offset == leader.high_watermark
    follower.truncate_replica(cut)  # the aborts after the cut go with it
    assert follower.aborted_transactions(0, follower.log_end_offset) == []
    assert follower.ongoing_transactions() == {1: 0, 2: leader.ongoing_transactions().get(2, len(_txn([b"a"], pid=1)))}
    follower.close()
    follower = PartitionLog(tmp_path / "follower", CONFIG)
    assert sorted(follower.ongoing_transactions()) == [1, 2]
    follower.close()
    leader.close()


def test_cleaning_keeps_markers_transactions_and_the_index(tmp_path):
    """A compacted topic: the cleaner merges segments below the last stable
    offset (keeping markers; compacting committed transactions' records, so
    that of key k1 only its latest committed value stays; removing aborted
    ones); the aborted ranges, the committed reads (but for k1's older
    values) and the ongoing transaction are the same after it and after a
    reopening (a merged segment keeps its old segments' index files)."""
    config = TopicConfig(cleanup_policy="compact", flush_messages=10**9, flush_ms=10**9, segment_bytes=300,
                         max_message_bytes=300, min_compaction_lag_ms=0)
    path = tmp_path / "p"
    log = PartitionLog(path, config)
    seq = {1: 0, 2: 0}
    for round_ in range(6):
        for pid in (1, 2):
            log.append(encode_batch([b"t%d-%d" % (pid, round_)], keys=[b"k%d" % pid], timestamp_ms=1,
                                    producer_id=pid, producer_epoch=0, base_sequence=seq[pid], transactional=True))
            seq[pid] += 1
        log.append(encode_batch([b"p%d" % round_], keys=[b"plain-%d" % round_], timestamp_ms=1))
        log.append_marker(1, 0, round_ % 2 == 0, 0)  # producer 1: commit, abort, commit, ...
        if round_ < 5:
            log.append_marker(2, 0, False, 0)  # producer 2's last transaction stays open
    log.flush()
    before = (log.aborted_transactions(0, log.high_watermark), committed_values(log), log.ongoing_transactions(),
              log.last_stable_offset)
    bases = log.segment_bases
    assert len(bases) > 4
    log.close()
    config = config.replace(segment_bytes=1000)  # cleaned segments merge up to this
    log = PartitionLog(path, config)
    result = log.clean(now_ms=10**13, force=True)
    assert result is not None and len(log.segment_bases) < len(bases)
    # k1's committed values before its latest (t1-4) are compacted away
    after = (before[0], [v for v in before[1] if v not in (b"t1-0", b"t1-2")], before[2], before[3])
    assert (log.aborted_transactions(0, log.high_watermark), committed_values(log), log.ongoing_transactions(),
            log.last_stable_offset) == after
    log.close()
    log = PartitionLog(path, config)
    assert (log.aborted_transactions(0, log.high_watermark), committed_values(log), log.ongoing_transactions(),
            log.last_stable_offset) == after
    assert b"t1-1" not in committed_values(log) and b"t1-4" in committed_values(log)
    log.close()


def test_a_snapshot_of_version_1_still_loads(tmp_path):
    """A snapshot written before transactions (version 1, no transactions'
    section) is read, not taken for damage: the producers it holds are kept
    when the segments before it are gone (retention)."""
    import struct

    from crc32c import crc32c

    from raylog.storage.batch_producers import snapshot_name

    config = CONFIG.replace(segment_bytes=200, max_message_bytes=200)
    path = tmp_path / "p"
    log = PartitionLog(path, config)
    batch = encode_batch([b"x" * 80], timestamp_ms=1, producer_id=5, producer_epoch=0, base_sequence=0)
    first = log.append(batch)
    log.append(encode_batch([b"y" * 80], timestamp_ms=1, producer_id=5, producer_epoch=0, base_sequence=1))
    log.append(_plain([b"z" * 80]))
    log.close()
    snapshots = sorted(p for p in path.iterdir() if p.name.endswith(".producers"))
    assert snapshots
    for snap in snapshots:  # rewritten as version 1: without the (empty) transactions' section
        body = bytearray(snap.read_bytes()[4:-4])
        assert snap.read_bytes()[-4:] == b"\x00\x00\x00\x00"
        struct.pack_into(">H", body, 0, 1)
        snap.write_bytes(crc32c(bytes(body)).to_bytes(4, "big") + bytes(body))
    newest = int(snapshots[-1].name[:20])
    for seg in path.iterdir():  # retention took the segments before the newest snapshot
        if seg.name.endswith(".log") and int(seg.name[:20]) < newest:
            seg.unlink()
    log = PartitionLog(path, config)
    assert (path / snapshot_name(newest)).exists()
    assert log._batch_producers.last_sequence(5) == 1  # noqa: SLF001
    assert first == 0
    log.close()
