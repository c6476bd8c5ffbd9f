"""The partition's transactions against a model (hypothesis): random
interleavings of transactional writes, commits, aborts, epoch bumps with a
zombie's write, plain writes, flushes, rolls, crashes and clean reopenings.
After every step the log's ongoing transactions, last stable offset and
aborted transactions equal the model's, and a read_committed reader gets
exactly the model's committed records: never an aborted one, never one of
an open transaction, never one past the first open transaction."""

from __future__ import annotations

import shutil
import tempfile
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raylog.config import TopicConfig
from raylog.errors import InvalidProducerEpochError, InvalidTxnStateError
from raylog.storage.log import PartitionLog
from raylog.storage.record_batch import encode_batch

from conftest import committed_values, crash

CONFIG = TopicConfig(flush_messages=10**9, flush_ms=10**9, segment_bytes=400, max_message_bytes=400)
PIDS = [1, 2, 3]

_op = st.one_of(
    st.tuples(st.just("txn"), st.sampled_from(PIDS), st.integers(1, 3)),
    st.tuples(st.just("plain"), st.integers(1, 3)),
    st.tuples(st.just("commit"), st.sampled_from(PIDS)),
    st.tuples(st.just("abort"), st.sampled_from(PIDS)),
    st.tuples(st.just("bump"), st.sampled_from(PIDS)),
    st.tuples(st.just("flush")),
    st.tuples(st.just("roll")),
    st.tuples(st.just("crash")),
    st.tuples(st.just("reopen")),
)


class Model:
    """What the partition should hold: every record with its producer's
    transaction, the open transactions, their epochs and sequences."""

    def __init__(self):
        self.records = []  # (value, transaction key or None), in offset order
        self.outcome = {}  # transaction key -> "commit" / "abort"
        self.ongoing = {}  # pid -> (transaction key, first offset)
        self.epoch = {pid: 0 for pid in PIDS}
        self.seq = {pid: 0 for pid in PIDS}
        self.aborted = []  # (pid, first offset), in marker order
        self.unstable_markers = []  # (first offset, marker offset) not yet below the high watermark
        self.serial = 0

    def lso(self, hw):
        firsts = [first for _key, first in self.ongoing.values()]
        firsts += [first for first, marker in self.unstable_markers if marker >= hw]
        return min([hw] + firsts)

    def committed(self, lso_index):
        return [value for value, key in self.records[:lso_index]
                if key is None or self.outcome.get(key) == "commit"]


def _value(model):
    model.serial += 1
    return b"v%d" % model.serial


def _check(log, model, offsets):
    hw = log.high_watermark
    lso = model.lso(hw)
    assert log.last_stable_offset == lso
    assert log.ongoing_transactions() == {pid: first for pid, (_key, first) in model.ongoing.items()}
    assert [(t.producer_id, t.first_offset) for t in log.aborted_transactions(0, hw)] == \
        [a for a in model.aborted if a[1] < hw]
    below = sum(1 for offset in offsets if offset < lso)
    got = committed_values(log)
    assert got == model.committed(below)
    aborted_values = {value for value, key in model.records if key is not None and model.outcome.get(key) == "abort"}
    assert not aborted_values & set(got)


@pytest.mark.parametrize("verify", [False, True])
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(_op, min_size=1, max_size=30))
def test_transactions_match_the_model(verify, ops):
    """``verify``: the log checks each transaction's first batch against a
    guard (KIP-890); the model asks for one before each, and a guard taken
    before an abort lets nothing in after it."""
    directory = tempfile.mkdtemp(prefix="txn-model-")
    log = PartitionLog(directory + "/p", CONFIG, verify_transactions=verify)
    model = Model()
    offsets = []  # the offset of each record of model.records
    try:
        for op in ops:
            kind = op[0]
            if kind == "txn":
                _kind, pid, n = op
                values = [_value(model) for _ in range(n)]
                guard = log.start_transaction_verification(pid, model.epoch[pid]) if verify else None
                assert (guard is None) == (not verify or pid in model.ongoing)
                at = log.append(encode_batch(values, timestamp_ms=1, producer_id=pid, producer_epoch=model.epoch[pid],
                                             base_sequence=model.seq[pid], transactional=True), verification=guard)
                model.seq[pid] += n
                if pid not in model.ongoing:
                    model.ongoing[pid] = (("txn", pid, at), at)
                key = model.ongoing[pid][0]
                model.records.extend((v, key) for v in values)
                offsets.extend(at + i for i in range(n))
            elif kind == "plain":
                values = [_value(model) for _ in range(op[1])]
                at = log.append(encode_batch(values, timestamp_ms=1))
                model.records.extend((v, None) for v in values)
                offsets.extend(at + i for i in range(len(values)))
            elif kind in ("commit", "abort", "bump"):
                pid = op[1]
                stale = log.start_transaction_verification(pid, model.epoch[pid]) if verify else None
                if kind == "bump":  # a new producer fences the old: its coordinator aborts with the next epoch
                    model.epoch[pid] += 1
                    model.seq[pid] = 0
                marker = log.append_marker(pid, model.epoch[pid], kind == "commit", 0)
                if pid in model.ongoing:
                    key, first = model.ongoing.pop(pid)
                    model.outcome[key] = "commit" if kind == "commit" else "abort"
                    model.unstable_markers.append((first, marker))
                    if kind != "commit":
                        model.aborted.append((pid, first))
                if kind == "bump":
                    end = log.log_end_offset
                    with pytest.raises(InvalidProducerEpochError):  # the zombie's late write
                        log.append(encode_batch([b"zombie"], timestamp_ms=1, producer_id=pid,
                                                producer_epoch=model.epoch[pid] - 1, base_sequence=99,
                                                transactional=True))
                    assert log.log_end_offset == end
                elif stale is not None:  # a write verified before the marker, arriving after it
                    end = log.log_end_offset
                    with pytest.raises(InvalidTxnStateError):
                        log.append(encode_batch([b"late"], timestamp_ms=1, producer_id=pid,
                                                producer_epoch=model.epoch[pid], base_sequence=model.seq[pid],
                                                transactional=True), verification=stale)
                    assert log.log_end_offset == end
            elif kind == "flush":
                log.flush()
            elif kind == "roll":
                log.maybe_roll(now=time.time() + 10**9)
            elif kind in ("crash", "reopen"):
                if kind == "crash":
                    crash(log)
                else:
                    log.close()
                log = PartitionLog(directory + "/p", CONFIG, verify_transactions=verify)
                assert log.recovery_reports == [] or kind == "crash"
                model.unstable_markers = []  # reopened: everything recovered is below the high watermark
            if kind != "flush":
                log.flush()
            model.unstable_markers = [(f, m) for f, m in model.unstable_markers if m >= log.high_watermark]
            _check(log, model, offsets)
    finally:
        if not log.closed:
            log.close()
        shutil.rmtree(directory, ignore_errors=True)
