"""The replica fetch of its own (REPLICA_FETCH, raylog.transfer.protocol):
a follower's request is what tells the leader how far it reaches, recorded
explicitly by the leader's handler; a consumer's read changes nothing; no
special topic name reaches the replication state.

Real pieces: a partition log on disk, the leader's logic over it (without
ZooKeeper, the ISR staying as given; or the replica's role with a real
ZooKeeper), a real data server and real connections on 127.0.0.1."""

from __future__ import annotations

import threading

import pytest

from raylog.config import TopicConfig
from raylog.errors import NotOwnerError, ProtocolError
from raylog.replication.leader import ClientView, Leader
from raylog.replication.replica import ReplicaRole
from raylog.replication.state import PartitionState, create_state
from raylog.storage.decoding import decode_messages
from raylog.storage.log import PartitionLog
from raylog.storage.message import encode_message_set
from raylog.storage.producer_state import parse_records
from raylog.storage.record_batch import encode_batch
from raylog.transfer.connection import BrokerConnection
from raylog.transfer.requests import ReplicaFetchRequest, decode_request, encode_replica_fetch
from raylog.transfer.server import DataServer

REPLICAS = ("disk-a", "disk-b", "disk-c")
TOKEN = b"replica-fetch-test-token"
EPOCH = 2
PID = 7


@pytest.fixture
def served(tmp_path):
    """(log, leader, connection): the leader on disk-a serving ``t``/0."""
    log = PartitionLog(tmp_path / "t-0", TopicConfig(replication_factor=3, min_insync_replicas=2,
                                                      flush_messages=10**9, flush_ms=10**9))
    leader = Leader(None, None, "t", 0, "disk-a", log, PartitionState("disk-a", EPOCH, REPLICAS, REPLICAS), 0)
    view = ClientView(leader)
    server = DataServer(lambda topic, partition: view if (topic, partition) == ("t", 0) else None, token=TOKEN,
                        resolve_replica=lambda topic, partition: leader if (topic, partition) == ("t", 0) else None)
    host, port = server.start()
    conn = BrokerConnection(host, port, token=TOKEN)
    try:
        yield log, leader, conn
    finally:
        conn.close()
        server.stop()
        log.close()


def _put(log, values, sequence):
    data = encode_message_set(values, timestamp_ms=1)
    return log.append_sequenced(data, PID, 0, sequence, [len(data)], name="t-0")


def test_the_followers_requests_move_the_committed_offset_and_the_reply_carries_bytes_and_sets(served):
    log, leader, conn = served
    _put(log, [b"a", b"bb"], 0)
    _put(log, [b"ccc"], 1)
    end = log.log_end_offset
    # unflushed on the leader: the follower copies it all the same (its sync overlaps the leader's)
    reply = conn.replica_fetch("t", 0, "disk-b", EPOCH, 0, 0, 1 << 20)
    assert bytes(reply.data) == log.read_unflushed(0, 1 << 20).tobytes() and len(reply.data) == end
    assert [m[3] for m in decode_messages(bytes(reply.data), 0)[0]] == [b"a", b"bb", b"ccc"]
    assert [(r[0], r[2]) for r in parse_records(reply.sets) if r[4]] == [(PID, 0), (PID, 1)]
    assert reply.leader_epoch == EPOCH and reply.high_watermark == 0 and reply.log_start_offset == 0
    log.flush()
    assert leader.committed == 0  # nobody said they hold anything yet
    # disk-b has it all, synced; disk-c too, but synced only in part: acks="all" counts synced bytes
    conn.replica_fetch("t", 0, "disk-b", EPOCH, end, end, 1 << 20)
    conn.replica_fetch("t", 0, "disk-c", EPOCH, end, end // 2, 1 << 20)
    assert leader.committed == end // 2
    reply = conn.replica_fetch("t", 0, "disk-c", EPOCH, end, end, 1 << 20)
    assert leader.committed == end and len(reply.data) == 0 and reply.sets == b""
    assert conn.offsets("t", 0) == (0, end)  # consumers see the committed offset


def test_a_consumer_read_or_an_old_special_topic_name_records_no_progress(zk, registry, tmp_path):
    # What the partition actor's data server serves, through the replica's role (real ZooKeeper): the
    # names followers once fetched under are unknown topics, and reading them tells the leader nothing.
    registry.create_topic("t", TopicConfig(replication_factor=3, min_insync_replicas=2))
    create_state(zk, registry.paths, "t", 0, list(REPLICAS))
    log = PartitionLog(tmp_path / "t-0", TopicConfig(replication_factor=3, min_insync_replicas=2))
    role = ReplicaRole(zk, registry, "t", 0, "disk-a", log, TOKEN)
    server = DataServer(lambda topic, partition: role.resolve(topic) if partition == 0 else None, token=TOKEN,
                        resolve_replica=lambda topic, partition: role.resolve_replica(topic))
    host, port = server.start()
    conn = BrokerConnection(host, port, token=TOKEN)
    try:
        _put(log, [b"x" * 50], 0)
        log.flush()
        end = log.log_end_offset
        for name in ("__replica__/disk-b/t", "__producers-learnt__/disk-b/t", "__producers__/disk-b/t"):
            with pytest.raises(NotOwnerError):
                conn.fetch(name, 0, end, 1 << 20)
        assert conn.fetch("t", 0, 0, 1 << 20).data == b""  # nothing committed yet: nothing handed out
        assert role.leader.follower_ends() == {"disk-b": None, "disk-c": None} and role.leader.committed == 0
    finally:
        conn.close()
        server.stop()
        role.stop()
        log.close()


def test_a_wrong_epoch_or_a_stranger_replica_is_refused_and_changes_nothing(served):
    log, leader, conn = served
    _put(log, [b"kept"], 0)
    log.flush()
    end = log.log_end_offset
    with pytest.raises(NotOwnerError, match="leader epoch 1, this leader's is 2"):
        conn.replica_fetch("t", 0, "disk-b", EPOCH - 1, end, end, 1 << 20)
    with pytest.raises(NotOwnerError, match="not a follower"):
        conn.replica_fetch("t", 0, "disk-z", EPOCH, end, end, 1 << 20)
    with pytest.raises(NotOwnerError, match="does not lead"):
        conn.replica_fetch("other", 0, "disk-b", EPOCH, end, end, 1 << 20)
    assert leader.follower_ends() == {"disk-b": None, "disk-c": None} and leader.committed == 0
    # the connection goes on serving, and the accepted data is intact
    reply = conn.replica_fetch("t", 0, "disk-b", EPOCH, 0, 0, 1 << 20)
    assert [m[3] for m in decode_messages(bytes(reply.data), 0)[0]] == [b"kept"]
    assert log.log_end_offset == end


def test_the_long_poll_ends_when_an_append_arrives(served):
    log, _leader, conn = served
    appended = threading.Timer(0.2, _put, args=(log, [b"late"], 0))
    appended.start()
    try:
        # (a wait far longer than the append's delay: the reply comes with the append, not at the wait's end)
        reply = conn.replica_fetch("t", 0, "disk-b", EPOCH, 0, 0, 1 << 20, max_wait_ms=30_000)
    finally:
        appended.join()
    assert [m[3] for m in decode_messages(bytes(reply.data), 0)[0]] == [b"late"]


def test_a_replica_fetch_frame_decodes_and_a_flushed_end_past_the_log_end_is_malformed():
    frame = encode_replica_fetch(5, "t", 3, "disk-b", 4, 100, 90, 1 << 20, 500)
    assert decode_request(memoryview(frame), 0, len(frame) - 4) == ReplicaFetchRequest(
        5, "t", 3, "disk-b", 4, 100, 90, 1 << 20, 500)
    bad = encode_replica_fetch(6, "t", 3, "disk-b", 4, 100, 101, 1 << 20, 500)
    with pytest.raises(ProtocolError, match="flushed 101"):
        decode_request(memoryview(bad), 0, len(bad) - 4)
    with pytest.raises(ProtocolError, match="REPLICA_FETCH"):
        decode_request(memoryview(frame[:-3]), 0, len(frame) - 7)


def test_record_batches_come_without_sets_and_the_replica_remembers_their_producers_from_them(served, tmp_path):
    # Format 2 carries each batch's producer id and sequence: the leader answers no sets (nor takes its
    # writer's lock for them), and a replica that takes over still answers a retry with the first store.
    log, _leader, conn = served
    batches = [encode_batch([b"r%d" % i], timestamp_ms=1, producer_id=PID, producer_epoch=0, base_sequence=i)
               for i in range(3)]
    bases = [log.append(batch) for batch in batches]
    reply = conn.replica_fetch("t", 0, "disk-b", EPOCH, 0, 0, 1 << 20)
    assert reply.sets == b"" and len(reply.data) == log.log_end_offset
    replica = PartitionLog(tmp_path / "replica", TopicConfig(flush_messages=10**9, flush_ms=10**9))
    try:
        replica.append_replica(bytes(reply.data), 0)
        assert replica.append(batches[1]) == bases[1]  # a retry: the first store's offset, nothing appended
        assert replica.log_end_offset == log.log_end_offset
    finally:
        replica.close()


def test_a_replica_id_cut_short_is_named_in_the_error():
    frame = bytearray(encode_replica_fetch(8, "t", 0, "disk-b", 4, 100, 90, 1 << 20, 500))
    at = 4 + 8 + 2 + 1 + 4  # size, header, topic length and "t", partition: the replica id's length
    frame[at:at + 2] = (200).to_bytes(2, "big")
    with pytest.raises(ProtocolError, match="replica id length 200 runs past the frame"):
        decode_request(memoryview(frame), 0, len(frame) - 4)
