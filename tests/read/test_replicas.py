"""Which replica a bounded read reads from (raylog.read.replicas and the
reader's choice), and a range read through a follower over real sockets:
byte-identical to the leader's, and falling back to the leader when the
follower is behind or gone, never reading past the range's end."""

from __future__ import annotations

import logging

import pytest

from raylog.config import TopicConfig
from raylog.metadata import ConnectionSettings
from raylog.read import ReadRange
from raylog.read.datasource import task_replicas
from raylog.read.ranges import ReadPlan
from raylog.read.reader import choose_replica, read_range
from raylog.read.replicas import Replica, assigned_replica, local_replica
from raylog.replication.follower_reads import FollowerView, ServedWatermark
from raylog.storage.decoding import decode_messages
from raylog.storage.log import PartitionLog
from raylog.storage.message import encode_message_set
from raylog.transfer.server import DataServer

LEADER = Replica("disk-a", "10.0.0.1", 9001, "node-a", "10.0.0.1", leader=True)
B = Replica("disk-b", "10.0.0.2", 9002, "node-b", "10.0.0.2")
C = Replica("disk-c", "10.0.0.3", 9003, "node-c", "10.0.0.3")


def test_local_replica_prefers_this_node_then_this_host_then_the_leader():
    candidates = (LEADER, B, C)
    assert local_replica(candidates, "node-c", "10.0.0.3") == C
    assert local_replica(candidates, "node-x", "10.0.0.2") == B
    assert local_replica(candidates, None, "10.9.9.9") == LEADER
    assert local_replica(candidates) == LEADER
    same_host = (LEADER, B._replace(host="10.0.0.1", node_ip="10.0.0.1"))
    assert local_replica(same_host, None, "10.0.0.1") == LEADER  # several on this host: the leader
    assert local_replica(same_host, "node-b", "10.0.0.1") == same_host[1]  # this very node: that one
    assert local_replica(()) is None


def test_assigned_replica_spreads_ranges_over_candidates_deterministically():
    candidates = (C, LEADER, B)
    picks = [assigned_replica(candidates, "t", p, 0).node for p in range(60)]
    assert {n: picks.count(n) for n in set(picks)}.keys() == {"disk-a", "disk-b", "disk-c"}
    assert min(picks.count(n) for n in set(picks)) >= 10  # spread, not all on one
    assert picks == [assigned_replica((B, C, LEADER), "t", p, 0).node for p in range(60)]  # any order
    pieces = {assigned_replica(candidates, "t", 0, piece).node for piece in range(30)}
    assert pieces == {"disk-a", "disk-b", "disk-c"}  # a split partition's pieces too
    assert assigned_replica((), "t", 0, 0) is None
    rng = ReadRange("t", 0, 0, 10, LEADER.host, LEADER.port, LEADER.node_id, LEADER.node_ip, (LEADER, B, C))
    ranges = (rng, rng._replace(start=10, end=20), rng._replace(partition=1))
    plan = ReadPlan("t", ConnectionSettings("zk:1", token=b"x"), ranges, {}, {}, {}, {})
    assert [r for _, r in task_replicas(plan)] == [
        assigned_replica(rng.replicas, "t", 0, 0), assigned_replica(rng.replicas, "t", 0, 1),
        assigned_replica(rng.replicas, "t", 1, 0)]


def test_choose_replica_names_a_follower_or_none_for_the_leader():
    rng = ReadRange("t", 0, 0, 10, LEADER.host, LEADER.port, LEADER.node_id, LEADER.node_ip, (LEADER, B, C))
    assert choose_replica(rng, "disk-b") == B
    assert choose_replica(rng, "disk-a") is None  # the leader
    assert choose_replica(rng, "disk-x") is None  # not a candidate: the leader
    assert choose_replica(rng, None) is None
    assert choose_replica(rng._replace(replicas=(LEADER,)), "disk-a") is None
    assert choose_replica(rng._replace(replicas=()), "local") is None


class _LinesOf(logging.Handler):
    """The formatted lines a logger emits, as ``text`` (``clear()`` forgets them)."""

    def __init__(self, logger):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def clear(self) -> None:
        self.lines.clear()


@pytest.fixture
def two_servers(tmp_path):
    """A leader's log and a follower's (same bytes) behind real data servers."""
    token = b"t" * 32
    leader = PartitionLog(tmp_path / "leader", TopicConfig())
    for i in range(40):
        leader.append(encode_message_set([b"v%03d" % i, b"w%03d" % i]))
    leader.flush()
    follower = PartitionLog(tmp_path / "follower", TopicConfig())
    follower.append_replica(leader.read(0, 1 << 20).tobytes(), 0)
    follower.flush()
    watermark = ServedWatermark()
    view = FollowerView(follower, watermark, "disk-b")
    servers = []
    for serve in (leader, view):
        server = DataServer(lambda topic, p, serve=serve: serve if (topic, p) == ("t", 0) else None, token=token)
        server.start()
        servers.append(server)
    try:
        yield leader, watermark, servers, token
    finally:
        for server in servers:
            server.stop()
        watermark.close()
        follower.close()
        leader.close()


def _range(servers, end):
    (lhost, lport), (fhost, fport) = (s.address for s in servers)
    replicas = (Replica("disk-a", lhost, lport, leader=True), Replica("disk-b", fhost, fport))
    return ReadRange("t", 0, 0, end, lhost, lport, None, None, replicas)


def _rows(batches):
    return [(o, k, v) for b in batches for o, k, v in zip(*(b.column(n).to_pylist() for n in ("offset", "key", "value")))]


def test_a_range_read_through_a_follower_matches_the_leader_and_falls_back(two_servers, monkeypatch, request):
    import raylog.read.reader as reader

    monkeypatch.setattr(reader, "FOLLOWER_WAIT_MS", 200)
    leader, watermark, servers, token = two_servers
    settings = ConnectionSettings("127.0.0.1:1", token=token)
    hw = leader.high_watermark
    middle, end = leader.message_boundaries(0, hw, [hw // 4, hw // 2])
    rng = _range(servers, end)
    from_leader = _rows(read_range(rng, settings, replica=None))
    assert from_leader and all(o < end for o, _, _ in from_leader) and from_leader[-1][0] < end
    # the reader's own lines, taken at its logger (what other tests of the process did to the
    # root logger's handlers does not reach them)
    caplog = _LinesOf(reader.log)
    request.addfinalizer(lambda level=reader.log.level: reader.log.setLevel(level))
    reader.log.setLevel(logging.INFO)  # setLevel: it also forgets the logger's cached answers
    monkeypatch.setattr(reader.log, "handlers", reader.log.handlers + [caplog])

    # The follower has learned nothing: it serves nothing (a bounded long poll), the leader serves all.
    assert _rows(read_range(rng, settings, replica="disk-b")) == from_leader
    assert "reading from the leader" in caplog.text

    # It learned up to the middle of the range: it serves that, the leader the rest.
    watermark.learn(middle)
    caplog.clear()
    assert _rows(read_range(rng, settings, replica="disk-b", batch_bytes=64)) == from_leader
    assert f"at {middle} from the follower" in caplog.text

    # It learned past the range's end: it serves the range alone, and nothing past its end.
    watermark.learn(hw)
    caplog.clear()
    assert _rows(read_range(rng, settings, replica="disk-b", batch_bytes=64)) == from_leader
    assert "reading from the leader" not in caplog.text

    # The follower is gone: the leader serves the whole range.
    servers[1].stop()
    caplog.clear()
    assert _rows(read_range(rng, settings, replica="disk-b")) == from_leader
    assert "reading from the leader" in caplog.text
