"""The coordinator's transitions (raylog.zk.transaction_states), one by one:
pure functions over a record, with Kafka's errors."""

from __future__ import annotations

import itertools

import pytest

from raylog.errors import (
    ConcurrentTransactionsError,
    ConfigError,
    InvalidProducerEpochError,
    InvalidProducerIdMappingError,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    ProducerFencedError,
)
from raylog.zk import transaction_states as s
from raylog.zk.transactions import (
    COMPLETE_ABORT,
    COMPLETE_COMMIT,
    EMPTY,
    ONGOING,
    PREPARE_ABORT,
    PREPARE_COMMIT,
)

TID = "tx"


@pytest.fixture
def ids():
    counter = itertools.count(100)
    return lambda: next(counter)


def _init(record, ids, timeout_ms=1000, now_ms=0):
    return s.init_producer_id(record, TID, timeout_ms=timeout_ms, now_ms=now_ms, new_producer_id=ids)


def _ongoing(ids, now_ms=0):
    step = _init(None, ids)
    pid, epoch = step.reply
    added = s.add_partitions(step.record, TID, pid, epoch, [("t", 0), ("t", 1)], now_ms=now_ms).record
    return added, pid, epoch


def test_a_new_transactional_id_gets_a_new_producer_id_and_epoch_0(ids):
    step = _init(None, ids)
    assert step.reply == (100, 0)
    assert (step.record.state, step.record.producer_id, step.record.producer_epoch) == (EMPTY, 100, 0)


def test_init_again_bumps_the_epoch_and_fences_the_older_one(ids):
    first = _init(None, ids).record
    second = _init(first, ids)
    assert second.reply == (100, 1)
    with pytest.raises(ProducerFencedError, match="close this producer"):
        s.add_partitions(second.record, TID, 100, 0, [("t", 0)], now_ms=1)
    with pytest.raises(ProducerFencedError):
        s.end_transaction(second.record, TID, 100, 0, True, now_ms=1, new_producer_id=ids)


def test_init_while_a_transaction_is_ongoing_aborts_it_first_with_a_bumped_epoch(ids):
    ongoing, pid, epoch = _ongoing(ids)
    step = _init(ongoing, ids)
    assert step.init_again and step.reply is None
    assert step.record.state == PREPARE_ABORT
    assert step.markers == s.Markers((("t", 0), ("t", 1)), pid, epoch + 1, commit=False)
    done = s.complete(step.record, now_ms=2)
    again = _init(done, ids)
    assert again.reply == (pid, epoch + 2) and again.record.state == EMPTY
    # the fenced epoch's end is refused, commit or abort
    for commit in (True, False):
        with pytest.raises(ProducerFencedError):
            s.end_transaction(again.record, TID, pid, epoch, commit, now_ms=3, new_producer_id=ids)


def test_init_during_a_completion_is_told_to_retry(ids):
    ongoing, pid, epoch = _ongoing(ids)
    prepared = s.end_transaction(ongoing, TID, pid, epoch, True, now_ms=1, new_producer_id=ids).record
    with pytest.raises(ConcurrentTransactionsError) as err:
        _init(prepared, ids)
    assert err.value.retriable


def test_end_bumps_the_epoch_and_answers_the_next_identity_kip_890(ids):
    ongoing, pid, epoch = _ongoing(ids)
    step = s.end_transaction(ongoing, TID, pid, epoch, True, now_ms=5, new_producer_id=ids)
    assert step.record.state == PREPARE_COMMIT
    assert step.reply == (pid, epoch + 1)
    assert step.markers == s.Markers((("t", 0), ("t", 1)), pid, epoch + 1, commit=True)
    done = s.complete(step.record, now_ms=6)
    assert (done.state, done.producer_id, done.producer_epoch, done.partitions) == (COMPLETE_COMMIT, pid, epoch + 1, ())
    # the ended transaction's epoch may write nothing more
    with pytest.raises(ProducerFencedError):
        s.verify_partition(done, TID, pid, epoch, "t", 0)
    # the next transaction goes on with the answered identity
    nxt = s.add_partitions(done, TID, pid, epoch + 1, [("u", 0)], now_ms=7).record
    assert (nxt.state, nxt.partitions, nxt.started_ms) == (ONGOING, (("u", 0),), 7)


def test_a_retried_end_is_answered_as_the_first_was(ids):
    ongoing, pid, epoch = _ongoing(ids)
    first = s.end_transaction(ongoing, TID, pid, epoch, True, now_ms=5, new_producer_id=ids)
    for record in (first.record, s.complete(first.record, now_ms=6)):
        retry = s.end_transaction(record, TID, pid, epoch, True, now_ms=7, new_producer_id=ids)
        assert retry.record is None and retry.reply == first.reply
        with pytest.raises(InvalidTxnStateError, match="already committed"):
            s.end_transaction(record, TID, pid, epoch, False, now_ms=7, new_producer_id=ids)


def test_end_without_a_transaction_is_an_invalid_state(ids):
    step = _init(None, ids)
    with pytest.raises(InvalidTxnStateError, match="no transaction is ongoing") as err:
        s.end_transaction(step.record, TID, *step.reply, True, now_ms=1, new_producer_id=ids)
    assert err.value.state == EMPTY


def test_calls_of_an_unknown_id_or_another_producer_id_are_refused(ids):
    with pytest.raises(InvalidProducerIdMappingError, match="init_producer_id first"):
        s.add_partitions(None, TID, 1, 0, [("t", 0)], now_ms=0)
    record = _init(None, ids).record
    with pytest.raises(InvalidProducerIdMappingError):
        s.add_offsets(record, TID, 999, 0, "g", {("t", 0): 1}, now_ms=0)
    with pytest.raises(InvalidProducerEpochError, match="never handed out"):
        s.add_partitions(record, TID, 100, 7, [("t", 0)], now_ms=0)


def test_a_timed_out_transaction_is_aborted_and_its_producer_told_so(ids):
    ongoing, pid, epoch = _ongoing(ids, now_ms=10)
    assert s.expire(ongoing, now_ms=10 + 999, new_producer_id=ids).record is None
    step = s.expire(ongoing, now_ms=10 + 1000, new_producer_id=ids)
    assert step.record.state == PREPARE_ABORT and step.markers.commit is False
    assert step.markers.producer_epoch == epoch + 1
    done = s.complete(step.record, now_ms=2000)
    with pytest.raises(InvalidProducerEpochError, match="passed its timeout"):
        s.end_transaction(done, TID, pid, epoch, True, now_ms=2001, new_producer_id=ids)
    with pytest.raises(InvalidProducerEpochError, match="passed its timeout"):
        s.add_partitions(done, TID, pid, epoch, [("t", 0)], now_ms=2001)
    # its own abort is answered as done, with the identity to go on with
    assert s.end_transaction(done, TID, pid, epoch, False, now_ms=2001, new_producer_id=ids).reply == (pid, epoch + 1)


def test_offsets_are_pending_in_the_record_until_the_commit(ids):
    step = _init(None, ids)
    pid, epoch = step.reply
    record = s.add_offsets(step.record, TID, pid, epoch, "g", {("t", 0): 5}, now_ms=1).record
    record = s.add_offsets(record, TID, pid, epoch, "g", {("t", 0): 9, ("t", 1): 2}, now_ms=2).record
    assert record.state == ONGOING and record.group_offsets == {"g": {("t", 0): 9, ("t", 1): 2}}
    prepared = s.end_transaction(record, TID, pid, epoch, True, now_ms=3, new_producer_id=ids).record
    assert prepared.group_offsets == {"g": {("t", 0): 9, ("t", 1): 2}}
    assert s.markers_of(prepared).partitions == ()  # offsets only: no marker to write
    assert s.complete(prepared, now_ms=4).groups == ()


def test_verify_partition_accepts_only_an_added_partition_of_an_ongoing_transaction(ids):
    ongoing, pid, epoch = _ongoing(ids)
    s.verify_partition(ongoing, TID, pid, epoch, "t", 1)
    with pytest.raises(InvalidTxnStateError, match="did not add that partition"):
        s.verify_partition(ongoing, TID, pid, epoch, "t", 2)
    prepared = s.end_transaction(ongoing, TID, pid, epoch, False, now_ms=1, new_producer_id=ids).record
    with pytest.raises(InvalidTxnStateError):
        s.verify_partition(prepared, TID, *s.next_identity(prepared), "t", 1)


def test_an_exhausted_epoch_moves_the_producer_to_a_new_id(ids):
    ongoing, pid, _ = _ongoing(ids)
    import dataclasses

    near = dataclasses.replace(ongoing, producer_epoch=s.MAX_EPOCH - 2)
    step = s.end_transaction(near, TID, pid, s.MAX_EPOCH - 2, True, now_ms=1, new_producer_id=ids)
    assert step.markers.producer_epoch == s.MAX_EPOCH - 1  # the markers still fit an i16
    assert step.reply == (101, 0)
    done = s.complete(step.record, now_ms=2)
    assert (done.producer_id, done.producer_epoch) == (101, 0)
    # a retry of the end under the old id is still recognised
    assert s.end_transaction(done, TID, pid, s.MAX_EPOCH - 2, True, now_ms=3, new_producer_id=ids).reply == (101, 0)
    # and so is init at the edge
    empty = dataclasses.replace(done, producer_id=pid, producer_epoch=s.MAX_EPOCH - 2, state=COMPLETE_ABORT)
    assert _init(empty, ids).reply == (102, 0)


@pytest.mark.parametrize("timeout_ms", [0, -1, s.MAX_TIMEOUT_MS + 1, 1.5, True, "60000"])
def test_a_bad_timeout_is_refused_before_anything_is_decided(ids, timeout_ms):
    with pytest.raises(InvalidTransactionTimeoutError):
        _init(None, ids, timeout_ms=timeout_ms)


@pytest.mark.parametrize("partitions", [[("t",)], [("", 0)], [("t", -1)], [("t", "0")], ["t0"]])
def test_bad_partitions_are_a_config_error(ids, partitions):
    step = _init(None, ids)
    with pytest.raises(ConfigError):
        s.add_partitions(step.record, TID, *step.reply, partitions, now_ms=0)


def test_an_end_without_bump_keeps_the_epoch_for_kafka_clients_of_transaction_version_1(ids):
    ongoing, pid, epoch = _ongoing(ids)
    step = s.end_transaction(ongoing, TID, pid, epoch, True, now_ms=5, new_producer_id=ids, bump=False)
    assert step.record.state == PREPARE_COMMIT and step.reply == (pid, epoch)
    # the markers carry the transaction's own epoch
    assert step.markers == s.Markers((("t", 0), ("t", 1)), pid, epoch, commit=True)
    # a retry while the markers are written is told to wait; once complete, it is answered as done
    with pytest.raises(ConcurrentTransactionsError):
        s.end_transaction(step.record, TID, pid, epoch, True, now_ms=6, new_producer_id=ids, bump=False)
    done = s.complete(step.record, now_ms=6)
    assert (done.state, done.producer_id, done.producer_epoch) == (COMPLETE_COMMIT, pid, epoch)
    retry = s.end_transaction(done, TID, pid, epoch, True, now_ms=7, new_producer_id=ids, bump=False)
    assert retry.record is None and retry.reply == (pid, epoch)
    with pytest.raises(InvalidTxnStateError):
        s.end_transaction(done, TID, pid, epoch, False, now_ms=7, new_producer_id=ids, bump=False)
    # the next transaction goes on with the same epoch, and aborts without a bump too
    nxt = s.add_partitions(done, TID, pid, epoch, [("u", 0)], now_ms=8).record
    aborting = s.end_transaction(nxt, TID, pid, epoch, False, now_ms=9, new_producer_id=ids, bump=False)
    assert aborting.markers == s.Markers((("u", 0),), pid, epoch, commit=False)
    aborted = s.complete(aborting.record, now_ms=10)
    assert (aborted.state, aborted.producer_epoch) == (COMPLETE_ABORT, epoch)
    # fencing still bumps: a second producer's init fences the first, which may do nothing more
    fenced = _init(aborted, ids)
    assert fenced.reply == (pid, epoch + 1)
    with pytest.raises(ProducerFencedError):
        s.add_partitions(fenced.record, TID, pid, epoch, [("t", 0)], now_ms=11)
    with pytest.raises(ProducerFencedError):
        s.end_transaction(fenced.record, TID, pid, epoch, True, now_ms=11, new_producer_id=ids, bump=False)


def test_init_fencing_an_ongoing_transaction_of_version_1_aborts_it_with_a_bumped_epoch(ids):
    ongoing, pid, epoch = _ongoing(ids)
    done = s.complete(s.end_transaction(ongoing, TID, pid, epoch, True, now_ms=1, new_producer_id=ids,
                                        bump=False).record, now_ms=2)
    second = s.add_partitions(done, TID, pid, epoch, [("t", 0)], now_ms=3).record
    step = _init(second, ids)
    assert step.init_again and step.markers == s.Markers((("t", 0),), pid, epoch + 1, commit=False)
