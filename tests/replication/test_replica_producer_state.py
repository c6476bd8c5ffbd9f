"""Idempotent producers' sequences follow the bytes to a follower: a follower
that becomes leader answers a retry of a set its old leader stored with that
set's offset, and a truncation to a leader epoch's boundary forgets the sets
it cuts off (pure: two logs, the follower's fetch steps done by hand)."""

from __future__ import annotations

import pytest

from raylog.config import TopicConfig
from raylog.errors import DuplicateSequenceError, OutOfOrderSequenceError
from raylog.replication.follower import replicable, spanning, whole_messages
from raylog.storage.decoding import decode_messages
from raylog.storage.log import PartitionLog
from raylog.storage.message import encode_message_set
from raylog.storage.producer_state import RECORD_SIZE, parse_records

CONFIG = TopicConfig(flush_messages=10**9, flush_ms=10**9)
A, B = 7, 8


def put(plog: PartitionLog, value: bytes, sequence: int, pid: int = A, messages: int = 1) -> int:
    data = encode_message_set([value] * messages, timestamp_ms=1)
    return plog.append_sequenced(data, pid, 0, sequence, [len(data)], name="t-0")


def replicate(leader: PartitionLog, follower: PartitionLog, max_bytes: int = 1 << 20) -> int:
    """The follower's fetch loop, one round: the leader's bytes from the
    follower's end, then the producers' sets at or after it; returns the
    bytes appended."""
    leader.flush()
    offset = follower.log_end_offset
    data = leader.read(offset, max_bytes).tobytes()[:max_bytes]
    length = whole_messages(data)
    if not length:
        return 0
    sets = leader.producer_records(offset, max_bytes)
    records = parse_records(sets)
    length, sequences = replicable(offset, length, records, full=len(sets) + RECORD_SIZE > max_bytes)
    follower.append_replica(data[:length], offset, sequences, spanning(offset, length, records))
    follower.flush()
    return length


def replicate_all(leader, follower, max_bytes: int = 1 << 20) -> None:
    while replicate(leader, follower, max_bytes):
        pass
    assert follower.log_end_offset == leader.log_end_offset


def values(plog: PartitionLog) -> list[bytes]:
    plog.flush()
    data = plog.read(plog.log_start_offset, 1 << 24).tobytes()
    return [m[3] for m in decode_messages(data, plog.log_start_offset)[0]]


@pytest.fixture
def logs(tmp_path):
    opened = []

    def open_log(name: str) -> PartitionLog:
        plog = PartitionLog(tmp_path / name, CONFIG)
        opened.append(plog)
        return plog

    yield open_log
    for plog in opened:
        plog.close()


def test_a_follower_that_takes_over_answers_a_retry_with_the_offset_its_leader_stored(logs):
    leader, follower = logs("leader"), logs("follower")
    offsets = {(pid, seq): put(leader, b"%d-%d" % (pid, seq), seq, pid) for seq in range(5) for pid in (A, B)}
    replicate_all(leader, follower)

    # The leader is lost; the follower leads and the producers retry their last sets.
    for (pid, seq), offset in offsets.items():
        assert put(follower, b"retry", seq, pid) == offset
    assert values(follower) == values(leader)  # nothing stored twice
    with pytest.raises(OutOfOrderSequenceError):
        put(follower, b"gap", 7, A)
    assert put(follower, b"next", 5, A) == leader.log_end_offset
    assert follower.producer_records(0, 1 << 20) != b""


def test_the_replicated_sequences_survive_a_restart_of_the_follower(tmp_path):
    leader = PartitionLog(tmp_path / "leader", CONFIG)
    follower = PartitionLog(tmp_path / "follower", CONFIG)
    stored = [put(leader, b"v%d" % seq, seq) for seq in range(3)]
    replicate_all(leader, follower)
    follower.close()
    with PartitionLog(tmp_path / "follower", CONFIG) as again:
        assert put(again, b"retry", 2) == stored[2]
        assert values(again) == [b"v0", b"v1", b"v2"]
    leader.close()


def test_truncation_to_an_epoch_boundary_forgets_the_sets_it_cuts_off(tmp_path, logs):
    leader, follower = logs("leader"), logs("follower")
    stored = [put(leader, b"v%d" % seq, seq) for seq in range(5)]
    replicate_all(leader, follower)

    follower.truncate_replica(stored[3])  # sets 3 and 4 were of an older epoch past the boundary
    assert put(follower, b"v1-retry", 1) == stored[1]  # still remembered below the cut
    assert put(follower, b"v3-again", 3) == stored[3]  # stored anew at the boundary
    assert values(follower) == [b"v0", b"v1", b"v2", b"v3-again"]

    follower.truncate_replica(stored[1])  # the journal was rewritten: a reopen agrees
    follower.close()
    again = logs("follower")
    assert put(again, b"v0-retry", 0) == stored[0]
    assert put(again, b"v1-again", 1) == stored[1]
    assert values(again) == [b"v0", b"v1-again"]


def test_truncation_past_every_remembered_set_keeps_refusing_older_retries(logs):
    leader, follower = logs("leader"), logs("follower")
    stored = []
    for seq in range(40):  # replicated as they come: the follower knows the producer from 0
        stored.append(put(leader, b"v%d" % seq, seq))
        replicate_all(leader, follower)
    # 32 remembered (8..39), all cut off: the last sequence below the cut (7) is still known
    follower.truncate_replica(stored[8])
    with pytest.raises(DuplicateSequenceError):
        put(follower, b"old", 3)
    assert put(follower, b"v8-again", 8) == stored[8]
    assert values(follower)[-1] == b"v8-again"


def test_a_producer_learnt_at_a_cut_set_is_forgotten(logs):
    leader, follower = logs("leader"), logs("follower")
    leader.append(encode_message_set([b"plain"]))
    stored = [put(leader, b"b%d" % seq, seq, B) for seq in (10, 11)]
    replicate_all(leader, follower)
    follower.truncate_replica(stored[0])
    assert put(follower, b"any", 4, B) == stored[0]  # unknown again: any sequence starts it


def test_records_after_an_offset_come_in_log_order_after_a_truncation_reordered_producers(logs):
    plog = logs("p")
    stored = {}
    for seq in range(3):
        stored[A, seq] = put(plog, b"a", seq, A)
    stored[B, 0] = put(plog, b"b", 0, B)
    stored[A, 3] = put(plog, b"a", 3, A)  # A appended last
    plog.truncate_replica(stored[A, 3])  # now B's set is the last one in the log
    records = parse_records(plog.producer_records(stored[A, 2], 1 << 20))
    assert [(r[0], r[2], r[3]) for r in records] == [(A, 2, stored[A, 2]), (B, 0, stored[B, 0])]
    assert [r[0] for r in parse_records(plog.producer_records(stored[B, 0], 1 << 20))] == [B]
    # from inside B's set (a follower that fetched part of it): B's set still; from its end: none
    assert [r[0] for r in parse_records(plog.producer_records(stored[B, 0] + 1, 1 << 20))] == [B]
    assert parse_records(plog.producer_records(stored[A, 3], 1 << 20)) == []


def test_a_set_larger_than_a_fetch_is_remembered_with_the_fetch_that_completes_it(logs):
    leader, follower = logs("leader"), logs("follower")
    small = [put(leader, b"s", seq) for seq in range(3)]
    big = put(leader, b"x" * 100, 3, messages=20)  # one set of 20 messages
    last = put(leader, b"t", 4)
    leader.flush()
    records = parse_records(leader.producer_records(0, 1 << 20))
    # A fetch that ends inside the big set: the bytes stop before it (replicas hold whole sets).
    length, sequences = replicable(0, big + 500, records, False)
    assert length == big and [r[2] for r in sequences] == [0, 1, 2]
    # A fetch from the big set that does not hold all of it: a part, its record with the rest.
    assert replicable(big, 500, records[3:], False) == (500, [])
    length, sequences = replicable(big + 500, last + 10 - big - 500, records[3:], False)
    assert length == last - big - 500 and [r[2] for r in sequences] == [3]
    # Records cut short (room for two): the bytes stop after the second set.
    length, sequences = replicable(0, big, parse_records(leader.producer_records(0, 2 * RECORD_SIZE)), True)
    assert length == small[2] and [r[2] for r in sequences] == [0, 1]
    # Fetches smaller than the big set: every set keeps its record.
    replicate_all(leader, follower, max_bytes=600)
    assert put(follower, b"retry", 3) == big  # the big set's retry after a failover is not stored again
    assert put(follower, b"retry", 4) == last
    assert values(follower) == values(leader)


def holding_part_of_a_big_set(leader, follower):
    """The leader stores sets 0..2, a set 3 larger than a fetch, and 4; the
    follower fetches (600 bytes at a time) until it holds only the first
    part of set 3. Returns the leader's base offsets of the sets."""
    stored = [put(leader, b"s%d" % seq, seq) for seq in range(3)]
    stored.append(put(leader, b"x" * 100, 3, messages=20))
    stored.append(put(leader, b"t", 4))
    while follower.log_end_offset <= stored[3]:
        assert replicate(leader, follower, max_bytes=600)
    assert stored[3] < follower.log_end_offset < stored[4]
    return stored


def test_a_follower_promoted_holding_part_of_a_big_set_stores_its_retry_once(logs):
    leader, follower = logs("leader"), logs("follower")
    stored = holding_part_of_a_big_set(leader, follower)
    expected = values(leader)[:-1]  # everything but set 4, which the follower never got

    # The leader is lost; the follower cuts the part back before it takes over.
    assert follower.cut_partial_replica_set() == stored[3]
    assert follower.log_end_offset == stored[3]
    assert put(follower, b"x" * 100, 3, messages=20) == stored[3]  # the retry of set 3, stored whole once
    assert put(follower, b"x" * 100, 3, messages=20) == stored[3]  # and a second retry is a duplicate
    assert values(follower) == expected
    assert put(follower, b"t", 4) == stored[4]
    assert values(follower) == values(leader)
    assert follower.cut_partial_replica_set() is None


def test_a_follower_reopened_holding_part_of_a_big_set_cuts_it_back(tmp_path, logs):
    leader = logs("leader")
    follower = PartitionLog(tmp_path / "follower", CONFIG)
    stored = holding_part_of_a_big_set(leader, follower)
    follower.close()
    again = logs("follower")  # the follower's process restarted: recovery cuts the part
    assert again.log_end_offset == stored[3]
    assert any("resends it whole" in report.reason for report in again.recovery_reports)
    assert put(again, b"x" * 100, 3, messages=20) == stored[3]
    assert values(again) == values(leader)[:-1]


def test_a_big_set_completed_after_a_journal_compaction_and_reopen_is_remembered_once(tmp_path, logs):
    leader = logs("leader")
    follower = PartitionLog(tmp_path / "follower", CONFIG)
    stored = holding_part_of_a_big_set(leader, follower)
    follower._producers._rewrite()  # a compaction while the set is held in part keeps its record
    replicate_all(leader, follower, max_bytes=600)
    follower.close()
    again = logs("follower")
    assert again.recovery_reports == [] and again.log_end_offset == leader.log_end_offset
    assert again.producer_records(0, 1 << 20) == leader.producer_records(0, 1 << 20)
    assert put(again, b"retry", 3) == stored[3] and put(again, b"retry", 4) == stored[4]
    assert put(again, b"s5", 5) == leader.log_end_offset
    assert values(again)[:-1] == values(leader)


def batch(plog: PartitionLog, pid: int, first_sequence: int, sizes) -> int:
    """One append of several sets of one producer (a producer's batch)."""
    sets = [encode_message_set([b"%d" % pid * 90] * n, timestamp_ms=1) for n in sizes]
    return plog.append_sequenced(b"".join(sets), pid, 0, first_sequence, [len(s) for s in sets], name="t-0")


@pytest.mark.parametrize("fetch_bytes", [200, 333, 600, 1000, 4096, 1 << 20])
def test_a_follower_has_its_leaders_sequences_after_any_fetch_sizes(logs, fetch_bytes):
    leader, follower = logs("leader"), logs("follower")
    C = 9
    sequences = {A: 0, B: 0, C: 0}
    for round_ in range(12):
        for pid, sizes in ((A, [1, 7, 2]), (B, [15]), (C, [3] * (1 + round_ % 4))):
            batch(leader, pid, sequences[pid], sizes)
            sequences[pid] += len(sizes)
        leader.append(encode_message_set([b"plain"], timestamp_ms=1))
        if round_ % 3 == 2:  # replicated now and then, at the end of the run too
            replicate_all(leader, follower, fetch_bytes)
    replicate_all(leader, follower, fetch_bytes)

    assert follower.producer_records(0, 1 << 20) == leader.producer_records(0, 1 << 20)
    for pid, next_sequence in sequences.items():
        assert follower._producers.last_sequence(pid) == leader._producers.last_sequence(pid) == next_sequence - 1
    # The follower takes over: a retry of each producer's last set is answered, not stored again.
    for pid, next_sequence in sequences.items():
        stored = leader.append_sequenced(b"", pid, 0, next_sequence - 1, [1], name="t-0")
        assert put(follower, b"retry", next_sequence - 1, pid) == stored
    assert values(follower) == values(leader)


@pytest.mark.parametrize("fetch_bytes", [600, 1 << 20])
@pytest.mark.parametrize("reopened", [False, True], ids=["running", "reopened"])
def test_a_follower_more_than_32_sets_behind_learns_a_producer_where_its_leader_did(tmp_path, logs, fetch_bytes,
                                                                                      reopened):
    leader, follower = logs("leader"), PartitionLog(tmp_path / "follower", CONFIG)
    stored = [put(leader, b"v%d" % seq, seq) for seq in range(40)]  # the leader remembers 8..39 of 40
    put(leader, b"b0", 0, B)
    replicate_all(leader, follower, fetch_bytes)  # all 40 sets in one catch-up
    assert follower.producer_records(0, 1 << 20) == leader.producer_records(0, 1 << 20)
    if reopened:  # the journals' snapshots keep it too
        follower.close()
        leader.close()
        leader = logs("leader")
        follower = PartitionLog(tmp_path / "follower", CONFIG)
        assert follower.producer_records(0, 1 << 20) == leader.producer_records(0, 1 << 20)
    try:
        assert put(follower, b"retry", 39) == stored[39] and put(follower, b"retry", 8) == stored[8]
        with pytest.raises(DuplicateSequenceError):
            put(follower, b"retry", 7)  # stored, no longer remembered: refused on both
        # A truncation that cuts every remembered set off (the follower follows
        # a new leader whose epoch began at set 8): the producer, learnt at 0,
        # stays known on both, so an old retry is refused, not stored again.
        for plog in (leader, follower):
            plog.truncate_replica(stored[8])
            with pytest.raises(DuplicateSequenceError):
                put(plog, b"old", 3)
            assert put(plog, b"v8-again", 8) == stored[8]
        assert values(follower) == values(leader)
    finally:
        follower.close()
