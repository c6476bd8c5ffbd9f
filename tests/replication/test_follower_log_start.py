"""A follower takes its leader's log start (records deleted at the leader,
``client.delete_records``): from the ``log_start_offset`` of the leader's
REPLICA_FETCH answers, kept on its own disk, the segments wholly below it
deleted; a new follower of a leader whose start lies inside a later segment
copies from that segment on and starts where the leader does.

Real pieces: a real ZooKeeper, the leader's replication role serving its
log on a real data socket, and the follower's own fetch thread
(:class:`raylog.replication.follower.Follower`) fetching over it (as in
test_follower.py). A replicated partition on several Ray nodes is what
tests/replication/*_hosts.py run; this one needs only the two logs."""

from __future__ import annotations

import contextlib
import time

from raylog.config import TopicConfig
from raylog.replication.follower import Follower
from raylog.replication.replica import ReplicaRole
from raylog.replication.state import create_state
from raylog.storage import log_start
from raylog.storage.decoding import decode_messages
from raylog.storage.log import PartitionLog
from raylog.storage.record_batch import encode_batch
from raylog.transfer.server import DataServer
from raylog.zk.registry import Registry

TOKEN = b"follower-log-start-token"
CONFIG = TopicConfig(partitions=1, replication_factor=2, min_insync_replicas=1, segment_bytes=2048,
                     max_message_bytes=1024)
WAIT_S = 60.0


def _wait(check, what: str):
    deadline = time.monotonic() + WAIT_S
    while not (found := check()):
        assert time.monotonic() < deadline, f"not within {WAIT_S} s: {what}"
        time.sleep(0.02)
    return found


def _fill(plog, batches: int = 20) -> list[int]:
    bases = [plog.append(encode_batch([b"%02d-%d" % (b, r) + b"." * 80 for r in range(5)], timestamp_ms=1))
             for b in range(batches)]
    plog.flush()
    return bases


def _records(plog, offset: int) -> list:
    got, pos = [], offset
    while pos < plog.high_watermark:
        chunk = plog.read(pos, 1 << 20)
        records, consumed = decode_messages(chunk.tobytes(), chunk.offset)
        got += [(o, v) for o, _ts, _k, v in records if o >= offset]
        pos = chunk.offset + consumed
    return got


@contextlib.contextmanager
def _replicating(zk, registry, make_zk, tmp_path, topic: str, before_follower=None):
    """A leader's log served by its replication role on a data server and a
    follower replicating it: ``(leader log, follower log, role)``."""
    registry.create_topic(topic, CONFIG)
    create_state(zk, registry.paths, topic, 0, ["disk-a", "disk-b"])
    leader_zk = make_zk()
    leader_registry = Registry(leader_zk, registry.cluster)
    leader_log = PartitionLog(tmp_path / "a", CONFIG)
    follower_log = PartitionLog(tmp_path / "b", CONFIG)
    role = ReplicaRole(leader_zk, leader_registry, topic, 0, "disk-a", leader_log, TOKEN)
    if before_follower is not None:
        before_follower(leader_log)
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


def test_a_follower_moves_its_start_to_the_leaders_and_keeps_it(zk, registry, make_zk, tmp_path):
    with _replicating(zk, registry, make_zk, tmp_path, "starts") as (leader_log, follower_log, role):
        bases = _fill(leader_log)
        _wait(lambda: follower_log.log_end_offset == leader_log.log_end_offset, "the follower catches up")
        _wait(lambda: role.leader.committed == leader_log.log_end_offset, "the leader learns the follower's end")
        segments = follower_log.segment_bases
        target = bases[9] + 2  # inside a batch, in a later segment
        assert leader_log.delete_records_before(target, high_watermark=role.leader.committed) == target
        leader_log.append(encode_batch([b"after"], timestamp_ms=1))  # a fetch answers at once
        leader_log.flush()
        _wait(lambda: follower_log.log_start_offset == target, "the follower takes the leader's start")
        assert follower_log.segment_bases[0] > segments[0]  # its segments wholly below the start are gone
        assert log_start.read(follower_log.directory) == target
        _wait(lambda: follower_log.high_watermark == leader_log.high_watermark, "the follower has it all")
        assert _records(follower_log, target) == _records(leader_log, target)
    with PartitionLog(tmp_path / "b", CONFIG) as reopened:  # what it leads with, would it take over
        assert reopened.log_start_offset == target


def test_a_new_follower_copies_from_the_segment_that_holds_the_leaders_start(zk, registry, make_zk, tmp_path):
    kept = {}

    def delete_first(leader_log):
        bases = _fill(leader_log)
        kept["start"] = leader_log.delete_records_before(bases[12] + 1)
        kept["first"] = leader_log.segment_bases[0]
        assert kept["first"] > 0

    with _replicating(zk, registry, make_zk, tmp_path, "new", delete_first) as (leader_log, follower_log, role):
        _wait(lambda: follower_log.log_end_offset == leader_log.log_end_offset, "the follower catches up")
        _wait(lambda: follower_log.log_start_offset == kept["start"], "the follower starts where the leader does")
        assert follower_log.segment_bases[0] == kept["first"]
        _wait(lambda: follower_log.high_watermark == leader_log.high_watermark, "the follower has it all")
        assert _records(follower_log, kept["start"]) == _records(leader_log, kept["start"])
