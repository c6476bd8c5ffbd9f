"""The producers' runs of an append (raylog.storage.batch_producers.producer_runs
and its compiled twin ``batches_runs``): judging and remembering by runs
gives what judging and remembering batch by batch gives."""

from __future__ import annotations

from collections import OrderedDict, deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raylog.errors import OutOfOrderSequenceError
from raylog.storage import record_batch
from raylog.storage.batch_producers import BATCHES_REMEMBERED, BatchProducerState, producer_runs
from raylog.storage.batch_validation import prepare_append, stamp_batches
from raylog.storage.record_batch import encode_batch

_MASK = 0x7FFFFFFF

# one batch: (producer id or -1, epoch, base sequence or -1, records, control)
_batch = st.tuples(
    st.sampled_from([-1, 5, 6]),
    st.sampled_from([0, 1]),
    st.sampled_from([-1, 0, 1, 2, 3, 7, _MASK]),
    st.integers(1, 3),
    st.booleans(),
)


def _encode(spec) -> bytes:
    pid, epoch, seq, records, control = spec
    if pid < 0:
        epoch = seq = -1
    values = [b"\x00\x00\x00\x00"] if control else [b"v"] * records
    return encode_batch(values, producer_id=pid, producer_epoch=epoch, base_sequence=seq, control=control)


def _chain(draw_specs):
    """Mostly sequences that follow one another (what producers send), some not."""
    out, next_seq = [], {}
    for pid, epoch, seq, records, control, follow in draw_specs:
        if follow and pid >= 0 and not control and (pid, epoch) in next_seq:
            seq = next_seq[(pid, epoch)]
        out.append((pid, epoch, seq, records, control))
        if pid >= 0 and seq >= 0 and not control:
            next_seq[(pid, epoch)] = (seq + records) & _MASK
    return out


_specs = st.lists(st.tuples(*_batch.wrapped_strategy.element_strategies, st.booleans()), min_size=1, max_size=40)


class _PerBatch:
    """The state a partition kept before runs: each batch judged and remembered alone."""

    def __init__(self, state: BatchProducerState):
        self.producers: OrderedDict[int, tuple[int, deque]] = OrderedDict(
            (pid, (p.epoch, deque(p.batches, maxlen=BATCHES_REMEMBERED))) for pid, p in state._producers.items()
        )

    def judge(self, headers):
        expected = {}
        for _pos, h in headers:
            if h.producer_id < 0 or h.base_sequence < 0 or h.control:
                continue
            known = self.producers.get(h.producer_id)
            known = expected.get(h.producer_id) or (None if known is None else (known[0], known[1][-1][1]))
            if known is not None and known[0] == h.producer_epoch and h.base_sequence != (known[1] + 1) & _MASK:
                return ("out of order", h.producer_id, h.base_sequence, (known[1] + 1) & _MASK)
            expected[h.producer_id] = (h.producer_epoch, h.last_sequence)
        return None

    def remember(self, batches):
        for offset, h in batches:
            if h.producer_id < 0 or h.base_sequence < 0 or h.control:
                continue
            known = self.producers.get(h.producer_id)
            if known is None or known[0] != h.producer_epoch:
                known = self.producers[h.producer_id] = (h.producer_epoch, deque(maxlen=BATCHES_REMEMBERED))
            self.producers.move_to_end(h.producer_id)
            known[1].append((h.base_sequence, h.last_sequence, offset))

    def view(self):
        return [(pid, epoch, list(window)) for pid, (epoch, window) in self.producers.items()]


def _view(state: BatchProducerState):
    return [(pid, p.epoch, list(p.batches)) for pid, p in state._producers.items()]


@settings(max_examples=300, deadline=None)
@given(_specs, _specs)
def test_runs_judge_and_remember_as_batch_by_batch(first, second):
    """Two appends of many batches: the compiled runs equal the reference's,
    and the state (and every refusal) equals the batch-by-batch rules."""
    state = BatchProducerState(None)
    model = _PerBatch(state)
    base = 0
    for specs in (_chain(first), _chain(second)):
        data = b"".join(_encode(spec) for spec in specs)
        prepared = prepare_append(data, allow_control=True)  # (replicas store the leader's markers)
        assert prepared.runs is None or prepared.runs == producer_runs(prepared.headers)
        if len(prepared.headers) > 1 and record_batch._speedups is not None:
            assert record_batch._speedups.batches_runs(data, 0, len(data)) == producer_runs(prepared.headers)
        want = model.judge(prepared.headers) if len(prepared.headers) > 1 else None
        if want is not None:
            with pytest.raises(OutOfOrderSequenceError) as raised:
                state.judge(prepared.headers, runs=prepared.runs)
            details = raised.value.details
            assert ("out of order", details["producer_id"], details["sequence"], details["expected"]) == want
            continue
        if len(prepared.headers) > 1:
            assert state.judge(prepared.headers, runs=prepared.runs) is None
        batches = stamp_batches(prepared, base)
        state.remember(batches, prepared.runs)
        model.remember(batches)
        assert _view(state) == model.view()
        base += len(prepared.data)


def test_a_long_run_is_remembered_by_its_last_batches():
    """A run of 200 batches of one producer: its window holds the last
    BATCHES_REMEMBERED, the retry of one of them answers its offset."""
    data = b"".join(encode_batch([b"v"], producer_id=9, producer_epoch=0, base_sequence=i) for i in range(200))
    prepared = prepare_append(data)
    assert prepared.runs == [(9, 0, 0, 199, 0, 200)]
    state = BatchProducerState(None)
    batches = stamp_batches(prepared, 1000)
    state.remember(batches, prepared.runs)
    assert [first for first, _last, _offset in state._producers[9].batches] == list(range(200 - BATCHES_REMEMBERED, 200))
    retry = prepare_append(encode_batch([b"v"], producer_id=9, producer_epoch=0, base_sequence=190))
    assert state.judge(retry.headers) == batches[190][0]
