"""The log cleaner (raylog.storage.cleaner) on a file log: the latest record
of each key is kept at its offset, older ones go, tombstones go once
delete_retention_ms has passed, readers see gaps and read on, the producer
state survives, a small map cleans in several passes, and a crash at each
step of the swap leaves the old segments or the new one."""

from __future__ import annotations

import os

import pytest

from raylog.config import TopicConfig
from raylog.errors import DuplicateSequenceError, InvalidMessageError, StorageError
from raylog.storage import cleaner, faults
from raylog.storage.counting import count_range
from raylog.storage.log import PartitionLog
from raylog.storage.offsetindex import index_name
from raylog.storage.offsetmap import ENTRY_BYTES
from raylog.storage.record_batch import decode_batch, encode_batch, iter_batches, next_offset_after

from conftest import crash, flip_byte

CONFIG = TopicConfig(cleanup_policy="compact", flush_messages=1, flush_ms=10**9, segment_bytes=512,
                     max_message_bytes=512, min_compaction_lag_ms=0, delete_retention_ms=1000)
NOW = 10**13  # every segment is old by then


def read_all(log, start=None):
    """(offset, key, value) of every record a reader from ``start`` gets, in
    order, reading as the consumer does (the next read at the last batch's next offset)."""
    out = []
    offset = log.log_start_offset if start is None else start
    while offset < log.high_watermark:
        piece = log.read(offset, 1 << 16)
        data = piece.tobytes()
        if not data:
            break
        for pos, header in iter_batches(data):
            if not header.control:
                out.extend((r.offset, r.key, r.value) for r in decode_batch(data, pos, from_offset=offset).records)
        offset = next_offset_after(data, len(data))
    return out


def latest(records):
    """The model: the last (offset, value) of each key."""
    table = {}
    for offset, key, value in records:
        table[key] = (offset, value)
    return table


def fill(log, rounds=6, keys=8, per_batch=4, tombstone_every=0):
    """Batches of records over ``keys`` keys; returns every (offset, key, value) written."""
    written = []
    n = 0
    for _ in range(rounds):
        for start in range(0, keys, per_batch):
            ks, vs = [], []
            for k in range(start, start + per_batch):
                n += 1
                ks.append(b"key-%d" % k)
                vs.append(None if tombstone_every and n % tombstone_every == 0 else b"value-%d" % n)
            base = log.append(encode_batch(vs, keys=ks, timestamp_ms=1000))
            written.extend((base + i, ks[i], vs[i]) for i in range(len(ks)))
    log.flush()
    return written


@pytest.fixture
def plog(tmp_path):
    log = PartitionLog(tmp_path / "p", CONFIG)
    yield log
    if not log.closed:
        log.close()


def test_the_latest_record_of_each_key_stays_at_its_offset(plog):
    written = fill(plog)
    assert len(plog.segment_bases) > 3
    before = plog.size_bytes
    result = plog.clean(now_ms=NOW)
    assert result is not None and result.records_removed > 0 and plog.size_bytes < before
    got = read_all(plog)
    model = latest(written)
    assert {key: (offset, value) for offset, key, value in got if latest(got)[key][0] == offset} == model
    # every record read is one written, at its offset; offsets only grow
    assert set(got) <= set(written)
    assert [o for o, _k, _v in got] == sorted({o for o, _k, _v in got})
    # the active segment is never cleaned: its records are all there
    active = plog.segment_bases[-1]
    assert [r for r in got if r[0] >= active] == [r for r in written if r[0] >= active]


def test_reads_at_removed_offsets_see_a_gap_and_go_on(plog):
    written = fill(plog)
    plog.clean(now_ms=NOW)
    kept = {o for o, _k, _v in read_all(plog)}
    removed = [o for o, _k, _v in written if o not in kept]
    assert removed
    for offset in removed[:20]:
        piece = plog.read(offset, 1)
        assert piece.offset > offset  # the next kept batch
        assert read_all(plog, offset)[0][0] == min(o for o in kept if o > offset)
    # COUNT over the cleaned range counts what a reader gets
    hw = plog.high_watermark
    total = 0
    pos = plog.log_start_offset
    while pos < hw:
        counted = count_range(plog, pos, hw, 1 << 20)
        total += counted.messages
        pos = counted.next_offset
    assert total == len(read_all(plog))


def test_tombstones_go_only_after_delete_retention(plog):
    written = fill(plog, tombstone_every=5)
    plog.clean(now_ms=1000 + CONFIG.delete_retention_ms - 1)  # the batches are 1000: not yet
    got = read_all(plog)
    cleaned_to = max(o for o, _k, _v in got if o < plog.segment_bases[-1])
    tombstones = [r for r in got if r[2] is None]
    assert tombstones
    plog.clean(now_ms=NOW, force=True)
    again = read_all(plog)
    assert not [r for r in again if r[2] is None and r[0] <= cleaned_to]
    # a key whose latest record is a tombstone is gone from the cleaned part; the others keep their latest
    model = latest(written)
    for key, (offset, value) in model.items():
        if offset < plog.segment_bases[-1]:
            assert ((offset, key, value) in again) == (value is not None)


def test_tombstones_stay_while_a_replica_may_lack_them(plog):
    """On a replicated partition a tombstone goes only below what every
    replica holds (``tombstone_limit``): a replica that has not copied it
    yet would otherwise never get it and keep the value it deleted. The
    older values it deletes go at once either way."""
    for key in (b"gone-1", b"gone-2"):
        plog.append(encode_batch([b"old"], keys=[key], timestamp_ms=1000))
        plog.append(encode_batch([None], keys=[key], timestamp_ms=1000))
    fill(plog)  # other keys after them: the tombstones end up in closed segments
    plog.tombstone_limit = lambda: 0  # a replica holds nothing yet
    plog.clean(now_ms=NOW, force=True)
    got = read_all(plog)
    for key in (b"gone-1", b"gone-2"):  # the tombstone is there; the older value is not
        assert [value for _offset, k, value in got if k == key] == [None]
    plog.tombstone_limit = lambda: plog.high_watermark  # every replica holds it all now
    fill(plog)  # more dirty records: a pass is due again
    plog.clean(now_ms=NOW, force=True)
    assert not [r for r in read_all(plog) if r[1] in (b"gone-1", b"gone-2")]


def test_the_cleaned_log_reopens_the_same_and_rebuilds_a_damaged_index(tmp_path):
    log = PartitionLog(tmp_path / "p", CONFIG)
    fill(log)
    log.clean(now_ms=NOW)
    got, bases = read_all(log), log.segment_bases
    log.close()
    with PartitionLog(tmp_path / "p", CONFIG) as again:
        assert read_all(again) == got and again.segment_bases == bases
    flip_byte(tmp_path / "p" / index_name(bases[0]), 20)
    with PartitionLog(tmp_path / "p", CONFIG) as again:
        assert read_all(again) == got
    os.unlink(tmp_path / "p" / index_name(bases[0]))
    with PartitionLog(tmp_path / "p", CONFIG) as again:
        assert read_all(again) == got


def test_appends_go_on_and_a_second_pass_cleans_the_new_records(plog):
    written = fill(plog)
    plog.clean(now_ms=NOW)
    written += fill(plog)
    plog.clean(now_ms=NOW, force=True)
    got = read_all(plog)
    model = latest(written)
    assert all((offset, key, value) in got for key, (offset, value) in model.items())
    assert len(got) < len(written)


def test_a_small_map_cleans_in_several_passes(plog):
    written = fill(plog, rounds=8, keys=16)
    passes = 0
    while plog.clean(now_ms=NOW, buffer_bytes=ENTRY_BYTES * 6, force=True) is not None:
        passes += 1
        assert passes < 200
    assert passes > 3  # the map (5 keys) could not take the dirty part at once
    got = read_all(plog)
    active = plog.segment_bases[-1]
    by_key = {}
    for offset, key, _value in got:
        if offset < active:
            by_key.setdefault(key, []).append(offset)
    model = latest(written)
    for key, (offset, value) in model.items():
        assert (offset, key, value) in got
    # every key of the cleaned part has one record there, or only newer ones after it
    assert all(len(offsets) == 1 for offsets in by_key.values())


def test_the_producer_state_survives_cleaning(tmp_path):
    log = PartitionLog(tmp_path / "p", CONFIG)
    first = None
    last_batch = None
    for seq in range(0, 40, 4):
        last_batch = encode_batch([b"v%d" % i for i in range(4)], keys=[b"k%d" % (i % 2) for i in range(4)],
                                  producer_id=7, producer_epoch=0, base_sequence=seq, timestamp_ms=1000)
        stored = log.append(last_batch)
        first = stored if first is None else first
    for i in range(30):  # other records roll the producer's batches into closed segments
        log.append(encode_batch([b"x" * 100], keys=[b"other-%d" % (i % 3)], timestamp_ms=1000))
    log.flush()
    last_offset = log.append(last_batch)  # a retry: the same offset
    log.clean(now_ms=NOW)
    log.close()
    with PartitionLog(tmp_path / "p", CONFIG) as again:
        assert again.append(last_batch) == last_offset  # still a duplicate after cleaning and reopening
        nxt = encode_batch([b"n"], keys=[b"k0"], producer_id=7, producer_epoch=0, base_sequence=40)
        assert again.append(nxt) >= again.log_end_offset - len(nxt)


def test_a_delete_topic_is_never_cleaned(tmp_path):
    with PartitionLog(tmp_path / "p", CONFIG.replace(cleanup_policy="delete")) as log:
        fill(log)
        assert log.clean(now_ms=NOW, force=True) is None


@pytest.fixture
def injected(monkeypatch):
    monkeypatch.setattr(cleaner._faults, "check", faults._check_files)


@pytest.mark.parametrize("point", ["clean-written", "clean-index-swap", "clean-swapped", "clean-deleted",
                                   "clean-index"])
def test_a_crash_at_each_step_of_the_swap_leaves_the_old_or_the_new(tmp_path, injected, point):
    directory = tmp_path / "p"
    log = PartitionLog(directory, CONFIG)
    written = fill(log)
    all_before = read_all(log)
    faults.arm(str(directory), point)
    with pytest.raises(StorageError):
        log.clean(now_ms=NOW)
    crash(log)
    with PartitionLog(directory, CONFIG) as again:
        got = read_all(again)
        leftovers = [n for n in os.listdir(directory) if n.endswith((".cleaned", ".swap"))]
        assert not leftovers
        committed = point in ("clean-swapped", "clean-deleted", "clean-index")
        if committed:
            assert len(got) < len(all_before)  # the new segment
        else:
            assert got == all_before  # the old ones
        model = latest(written)
        assert all((offset, key, value) in got for key, (offset, value) in model.items())
        # and the log cleans on from there
        again.clean(now_ms=NOW, force=True)
        assert all((offset, key, value) in read_all(again) for key, (offset, value) in model.items())


def test_boundaries_and_time_lookups_in_a_cleaned_segment(tmp_path):
    with PartitionLog(tmp_path / "p", CONFIG) as log:
        written = []
        for t in range(40):  # one batch a millisecond, each record its own time
            base = log.append(encode_batch([b"v%d" % t], keys=[b"k%d" % (t % 4)], timestamp_ms=1000 + t))
            written.append((base, 1000 + t))
        log.flush()
        log.clean(now_ms=NOW)
        kept = [o for o, _k, _v in read_all(log)]
        first_segment_end = log.segment_bases[1]
        removed = [o for o, _t in written if o not in kept and o < first_segment_end]
        assert removed and log.segment_bases[0] == 0
        # the first boundary at or after a removed offset: at most the next kept batch, and a
        # read from it starts at that batch
        targets = [o for o in removed if o > 0][:5]
        got = log.message_boundaries(log.log_start_offset, log.high_watermark, targets)
        for target, boundary in zip(targets, got):
            following = min(o for o in kept if o > target)
            assert target <= boundary <= following
            assert read_all(log, boundary)[0][0] == following
        # a time lookup lands on the first kept batch at or after the time
        for offset, ts in written[:10]:
            want = min(o for o, t in written if t >= ts and o in kept)
            assert log.offset_for_time(ts) == want


def test_the_producer_state_is_rebuilt_from_cleaned_segments_without_snapshots(tmp_path):
    log = PartitionLog(tmp_path / "p", CONFIG)
    batch = None
    for seq in range(0, 40, 4):
        batch = encode_batch([b"v%d" % i for i in range(4)], keys=[b"k%d" % (i % 2) for i in range(4)],
                             producer_id=9, producer_epoch=0, base_sequence=seq, timestamp_ms=1000)
        first = log.append(batch)
    for i in range(30):
        log.append(encode_batch([b"x" * 100], keys=[b"other-%d" % (i % 3)], timestamp_ms=1000))
    log.flush()
    log.clean(now_ms=NOW)
    assert first < log.segment_bases[-1]  # the producer's last batch lies in a cleaned segment
    log.close()
    for name in os.listdir(tmp_path / "p"):
        if name.endswith(".producers"):
            os.unlink(tmp_path / "p" / name)  # rebuilt from the log's batches alone
    with PartitionLog(tmp_path / "p", CONFIG) as again:
        # the producer's sequence is rebuilt from the cleaned batches: a retry of its last batch (cut by the
        # cleaner into the run of its kept records) is not stored again, and its next batch goes in order
        with pytest.raises(DuplicateSequenceError):
            again.append(batch)
        following = encode_batch([b"next"], keys=[b"k0"], producer_id=9, producer_epoch=0, base_sequence=40,
                                 timestamp_ms=1000)
        at = again.append(following)
        again.flush()
        assert at > first and read_all(again, at) == [(at, b"k0", b"next")]


def _producer_batch(values, keys, producer_id, sequence, timestamp_ms=1000):
    return encode_batch(values, keys=keys, producer_id=producer_id, producer_epoch=0, base_sequence=sequence,
                        timestamp_ms=timestamp_ms)


def test_a_producers_last_batch_loses_its_stale_records_and_keeps_its_sequence_in_an_empty_batch(tmp_path):
    # Producer 1's last batch writes "k"; producer 2 then deletes "k". Once the tombstone's retention passed,
    # nothing of "k" may be read: producer 1's last batch is cleaned like any batch (an empty batch keeps its
    # sequence), not kept whole with its stale value (which came back before).
    log = PartitionLog(tmp_path / "p", CONFIG)
    log.append(_producer_batch([b"old-0", b"old-1"], [b"k", b"j"], 1, 0))
    log.append(_producer_batch([b"k-by-1", b"j-by-1"], [b"k", b"j"], 1, 2))  # producer 1's last batch
    log.append(_producer_batch([None, None], [b"k", b"j"], 2, 0))  # producer 2's tombstones
    for i in range(30):
        log.append(encode_batch([b"x" * 100], keys=[b"other-%d" % (i % 3)], timestamp_ms=1000))
    log.flush()
    log.clean(now_ms=NOW)  # every tombstone is older than delete_retention_ms by then
    got = read_all(log)
    assert [r for r in got if r[1] in (b"k", b"j")] == []
    empties = [h for s in log.segment_bases[:-1] for _p, h in iter_batches(log.read(s, 1 << 20).tobytes())
               if h.count == 0]
    assert [(h.producer_id, h.base_sequence, h.last_sequence) for h in empties] == [(1, 2, 3), (2, 0, 1)]
    total, pos = 0, log.log_start_offset
    while pos < log.high_watermark:  # COUNT passes over the empty batches as readers do
        counted = count_range(log, pos, log.high_watermark, 1 << 20)
        total, pos = total + counted.messages, counted.next_offset
    assert total == len(got)
    log.close()
    for name in os.listdir(tmp_path / "p"):
        if name.endswith(".producers"):
            os.unlink(tmp_path / "p" / name)
    with PartitionLog(tmp_path / "p", CONFIG) as again:  # rebuilt from the cleaned log alone
        with pytest.raises(DuplicateSequenceError):
            again.append(_producer_batch([b"again"], [b"k"], 1, 3))  # sequence 3 was stored
        at = again.append(_producer_batch([b"new"], [b"k"], 1, 4))  # in order after it
        again.flush()
        assert read_all(again, at) == [(at, b"k", b"new")]
        # a second pass keeps each empty batch while it is its producer's last; producer 1 wrote again
        again.clean(now_ms=NOW)
        assert [r for r in read_all(again) if r[1] in (b"k", b"j")] == [(at, b"k", b"new")]


def test_an_empty_batch_is_refused_at_append(plog):
    from raylog.storage.cleaner import empty_batch
    from raylog.storage.record_batch import read_header

    plog.append(encode_batch([b"kept"], keys=[b"k"], timestamp_ms=1000))
    batch = _producer_batch([b"a", b"b"], [b"k", b"j"], 7, 0)
    empty = empty_batch(read_header(batch, 0), 0)
    with pytest.raises(InvalidMessageError, match="holds no records"):
        plog.append(empty)
    plog.flush()
    assert [(k, v) for _o, k, v in read_all(plog)] == [(b"k", b"kept")]


@pytest.mark.parametrize("compression", ["gzip", "zstd", "lz4", "snappy"])
def test_compressed_batches_are_cleaned_too(plog, compression):
    written = []
    for round_ in range(12):
        ks = [b"key-%d" % k for k in range(6)]
        vs = [b"value-%d-%d" % (round_, k) * 3 for k in range(6)]
        base = plog.append(encode_batch(vs, keys=ks, compression=compression, timestamp_ms=1000))
        written.extend((base + i, ks[i], vs[i]) for i in range(6))
    plog.flush()
    plog.clean(now_ms=NOW)
    got = read_all(plog)
    assert set(got) <= set(written) and len(got) < len(written)
    assert all((offset, key, value) in got for key, (offset, value) in latest(written).items())


def test_records_of_transactions_never_hide_earlier_records(plog):
    plain = plog.append(encode_batch([b"committed"], keys=[b"k"], timestamp_ms=1000))
    txn = plog.append(encode_batch([b"maybe-aborted", b"x"], keys=[b"k", b"j"], producer_id=5, producer_epoch=0,
                                   base_sequence=0, transactional=True, timestamp_ms=1000))
    for i in range(30):
        plog.append(encode_batch([b"y" * 100], keys=[b"other-%d" % (i % 3)], timestamp_ms=1000))
    plog.flush()
    plog.clean(now_ms=NOW)
    got = read_all(plog)
    assert (plain, b"k", b"committed") in got  # the transaction's k may be aborted: the plain one stays
    assert (txn, b"k", b"maybe-aborted") in got and (txn + 1, b"j", b"x") in got  # kept whole


def test_appends_and_reads_during_cleaning_lose_nothing(plog):
    import threading

    written = []
    done = threading.Event()

    def produce():
        try:
            for n in range(600):
                key = b"key-%d" % (n % 7)
                base = plog.append(encode_batch([b"value-%d" % n], keys=[key], timestamp_ms=1000))
                written.append((base, key, b"value-%d" % n))
        finally:
            done.set()

    producer = threading.Thread(target=produce)
    producer.start()
    passes = 0
    while not done.is_set():
        if plog.clean(now_ms=NOW, force=True) is not None:
            passes += 1
        got = read_all(plog)  # a reader meanwhile: offsets grow, every record one written there
        assert [o for o, _k, _v in got] == sorted({o for o, _k, _v in got})
    producer.join()
    plog.flush()
    plog.clean(now_ms=NOW, force=True)
    got = read_all(plog)
    assert passes and set(got) <= set(written)
    assert all((offset, key, value) in got for key, (offset, value) in latest(written).items())


def _mtime_ms(log) -> int:
    return max(os.stat(os.path.join(log.directory, n)).st_mtime_ns // 1_000_000
               for n in os.listdir(log.directory) if n.endswith(".log"))


def test_when_a_pass_is_due(tmp_path):
    config = CONFIG.replace(min_compaction_lag_ms=60_000, min_cleanable_dirty_ratio=0.7,
                            max_compaction_lag_ms=3_600_000)
    with PartitionLog(tmp_path / "p", config) as log:
        fill(log)
        newest = _mtime_ms(log)
        assert log.clean(now_ms=newest + 59_000) is None  # younger than min_compaction_lag_ms
        assert log.clean(now_ms=newest + 61_000) is not None  # all dirty: ratio 1
        fill(log, rounds=1)
        later = _mtime_ms(log) + 61_000
        assert log.clean(now_ms=later) is None  # a little dirty beside much clean: below the ratio
        assert log.clean(now_ms=later + 3_600_000) is not None  # older than max_compaction_lag_ms: forced
