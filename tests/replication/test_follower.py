"""A follower that takes over while it holds only the first part of an
idempotent producer's set larger than one fetch cuts that part back first
(running: before it takes over; restarted: when its log reopens), so its
epoch begins at the set's start and the producer's retry of the set is
stored once, whole.

Real pieces: a real ZooKeeper (the leader with a session of its own, which
ends when the leader is gone), the leader's replication role serving its
log on a real data socket, and the follower's own fetch thread
(:class:`raylog.replication.follower.Follower`) fetching over it. The
leader stored the big set while the topic allowed larger sets than the
follower fetches at once (``max_message_bytes`` raised since the
follower's actor started). The leader's data server stops answering the
follower once the follower's log reaches into the big set (as a leader
whose host is cut off would), so the follower holds exactly a part of it
when the leader's session ends."""

from __future__ import annotations

import contextlib
import time

import pytest

from raylog.config import TopicConfig
from raylog.replication.follower import Follower
from raylog.replication.replica import ReplicaRole
from raylog.replication.state import create_state
from raylog.storage.decoding import decode_messages
from raylog.storage.log import PartitionLog
from raylog.storage.message import encode_message_set
from raylog.storage.producer_state import RECORD_SIZE, parse_records
from raylog.transfer.protocol import REPLICA_FETCH_SETS_MAX_BYTES
from raylog.transfer.server import DataServer
from raylog.zk.registry import Registry

TOKEN = b"follower-test-token"
#: one fetch of the follower is at most this many bytes: the big set needs several
CONFIG = TopicConfig(partitions=1, replication_factor=2, min_insync_replicas=1, max_message_bytes=1024)
#: the leader stored its sets while the topic allowed larger ones (max_message_bytes lowered since)
LEADER_CONFIG = CONFIG.replace(max_message_bytes=64 * 1024)
#: the test's own bound on every wait (generous: a shared machine)
WAIT_S = 60.0
PID = 42


def _wait(check, what: str):
    deadline = time.monotonic() + WAIT_S
    while not (found := check()):
        assert time.monotonic() < deadline, f"not within {WAIT_S} s: {what}"
        time.sleep(0.02)
    return found


def put(plog, value: bytes, sequence: int, messages: int = 1) -> int:
    data = encode_message_set([value] * messages, timestamp_ms=1)
    return plog.append_sequenced(data, PID, 0, sequence, [len(data)], name="big-0")


def values(plog) -> list[bytes]:
    plog.flush()
    data = plog.read(plog.log_start_offset, 1 << 24).tobytes()
    return [m[3] for m in decode_messages(data, plog.log_start_offset)[0]]


@pytest.mark.parametrize("restarted", [False, True], ids=["running", "restarted"])
def test_a_follower_taking_over_with_part_of_a_big_set_cuts_it_back_and_stores_the_retry_once(
        zk, registry, make_zk, tmp_path, restarted):
    registry.create_topic("big", CONFIG)
    create_state(zk, registry.paths, "big", 0, ["disk-a", "disk-b"])
    leader_zk = make_zk()
    leader_registry = Registry(leader_zk, registry.cluster)
    leader_log = PartitionLog(tmp_path / "a", LEADER_CONFIG)
    follower_log = PartitionLog(tmp_path / "b", CONFIG)
    role = ReplicaRole(leader_zk, leader_registry, "big", 0, "disk-a", leader_log, TOKEN)
    assert role.is_leader
    stored = [put(leader_log, b"s%d" % seq, seq) for seq in range(3)]
    stored.append(put(leader_log, b"x" * 100, 3, messages=20))  # ~2.4 KiB: more than one fetch
    big_end = leader_log.log_end_offset
    leader_log.flush()
    expected = values(leader_log)

    def gated(topic: str, partition: int):
        # the follower's fetches are answered until its log reaches into the big set
        if follower_log.log_end_offset > stored[3]:
            return None
        return role.resolve_replica(topic) if partition == 0 else None

    server = DataServer(lambda topic, partition: role.resolve(topic) if partition == 0 else None, token=TOKEN,
                        resolve_replica=gated)
    host, port = server.start()
    leader_registry.register_endpoint("big", 0, host, port, "leader", 0)
    role.register(host, port, "leader")
    promoted = []

    def follow(plog):
        return Follower(registry, "big", 0, "disk-b", plog, TOKEN,
                        on_promoted=lambda state, version: promoted.append(state))

    follower = follow(follower_log)
    follower.start()
    try:
        _wait(lambda: follower_log.log_end_offset > stored[3], "the follower fetches the big set's first part")
        assert follower_log.log_end_offset < big_end  # a part only
        if restarted:  # its process restarts (and reads the topic's raised limit) while the leader is away
            follower.stop()
            follower_log.close()
        # The leader is gone: its process and its session with it.
        server.stop()
        role.stop()
        leader_zk.stop()
        leader_zk.close()
        if restarted:
            follower_log = PartitionLog(tmp_path / "b", LEADER_CONFIG)
            assert follower_log.log_end_offset == stored[3]  # recovery cut the part back
            follower = follow(follower_log)
            follower.start()
        (state,) = _wait(lambda: promoted, "the follower takes over")
        assert state.leader == "disk-b" and state.leader_epoch == 1
        assert state.epochs == ((1, stored[3]),)  # its epoch begins where the big set begins
        assert follower_log.log_end_offset == stored[3]
        assert values(follower_log) == expected[:3]  # no part of the set the producer got no answer for
        if restarted:
            # The producer retries the set: stored once, whole; its retry again: a duplicate.
            assert put(follower_log, b"x" * 100, 3, messages=20) == stored[3]
            assert put(follower_log, b"x" * 100, 3, messages=20) == stored[3]
            assert values(follower_log) == expected
        assert put(follower_log, b"s0-retry", 0) == stored[0]
    finally:
        follower.stop()
        server.stop()
        role.stop()
        follower_log.close()
        leader_log.close()


@contextlib.contextmanager
def _replicating(zk, registry, make_zk, tmp_path, topic: str, config: TopicConfig, fill):
    """A leader's log (filled by ``fill(log)`` and flushed) served by a data
    server, and a follower of its own log replicating it: ``(leader log,
    follower log, role)``; everything stopped and closed on exit."""
    registry.create_topic(topic, config)
    create_state(zk, registry.paths, topic, 0, ["disk-a", "disk-b"])
    leader_zk = make_zk()
    leader_registry = Registry(leader_zk, registry.cluster)
    leader_log = PartitionLog(tmp_path / "a", config)
    follower_log = PartitionLog(tmp_path / "b", config)
    role = ReplicaRole(leader_zk, leader_registry, topic, 0, "disk-a", leader_log, TOKEN)
    fill(leader_log)
    leader_log.flush()
    server = DataServer(lambda topic, partition: role.resolve(topic), token=TOKEN,
                        resolve_replica=lambda topic, partition: role.resolve_replica(topic))
    host, port = server.start()
    leader_registry.register_endpoint(topic, 0, host, port, "leader", 0)
    role.register(host, port, "leader")
    follower = Follower(registry, topic, 0, "disk-b", follower_log, TOKEN)
    follower.start()
    try:
        yield leader_log, follower_log, role
    finally:
        follower.stop()
        server.stop()
        role.stop()
        follower_log.close()
        leader_log.close()


def test_a_follower_replicates_the_producers_sets_with_where_each_producer_was_learnt(
        zk, registry, make_zk, tmp_path):
    # The leader's REPLICA_FETCH answers carry the producers' sets of the bytes they hold, and the
    # sequence each producer was learnt at: the follower's producer state ends up the leader's.
    stored = []

    def fill(leader_log):
        stored.extend(put(leader_log, b"v%d" % seq, seq) for seq in range(40))
        leader_log.flush()
        assert [r[2] for r in parse_records(leader_log.producer_records(0, 1 << 20)) if not r[4]] == [0]

    with _replicating(zk, registry, make_zk, tmp_path, "sets", LEADER_CONFIG, fill) as (leader_log, follower_log,
                                                                                         role):
        _wait(lambda: follower_log.log_end_offset == leader_log.log_end_offset, "the follower catches up")
        assert follower_log.producer_records(0, 1 << 20) == leader_log.producer_records(0, 1 << 20)
        assert follower_log._producers.last_sequence(PID) == 39
        # its progress reached the leader by its own request: the committed offset covers everything
        _wait(lambda: role.leader.committed == leader_log.log_end_offset, "the leader learns the follower's end")
        assert role.leader.follower_ends() == {"disk-b": leader_log.log_end_offset}
    assert stored[-1] < follower_log.log_end_offset


def test_a_follower_catches_up_when_the_producers_sets_fill_more_than_a_reply_holds(
        zk, registry, make_zk, tmp_path):
    # Format-1 sets of 1,100 producers: their records (32 bytes each) are more than one replica fetch
    # reply carries beside its data (REPLICA_FETCH_SETS_MAX_BYTES); the follower keeps the bytes the
    # sets it got describe and asks again from there, so it neither stalls nor loses a sequence.
    config = LEADER_CONFIG.replace(max_producer_ids=5000)
    producers = 1100
    assert producers * RECORD_SIZE > REPLICA_FETCH_SETS_MAX_BYTES

    def fill(leader_log):
        for pid in range(1000, 1000 + producers):
            data = encode_message_set([b"p%d" % pid], timestamp_ms=1)
            leader_log.append_sequenced(data, pid, 0, 0, [len(data)], name="many-0")

    with _replicating(zk, registry, make_zk, tmp_path, "many", config, fill) as (leader_log, follower_log, _role):
        _wait(lambda: follower_log.log_end_offset == leader_log.log_end_offset, "the follower catches up")
        assert follower_log.producer_records(0, 1 << 20) == leader_log.producer_records(0, 1 << 20)
        assert values(follower_log) == values(leader_log)
