"""A leader that starts over data it already holds (restarted on its node,
or a follower promoted) shows consumers only what the other in-sync
replicas confirm by fetching: a leader lost again right away must not have
served, or acknowledged to acks="all", bytes that no follower holds."""

from __future__ import annotations

from raylog.config import TopicConfig
from raylog.replication.leader import ClientView, Leader
from raylog.replication.state import PartitionState
from raylog.storage.log import PartitionLog
from raylog.storage.message import encode_message_set

REPLICAS = ("disk-a", "disk-b", "disk-c")


def started_leader(tmp_path, isr=REPLICAS):
    log = PartitionLog(tmp_path / "leader", TopicConfig(replication_factor=3, min_insync_replicas=2))
    log.append(encode_message_set([b"a", b"bb"]))
    log.flush()  # flushed before the restart: on this replica's disk only, as far as it knows
    state = PartitionState("disk-a", 0, isr, REPLICAS)
    leader = Leader(None, None, "t", 0, "disk-a", log, state, 0)  # no ZooKeeper call until maintain()
    return log, leader, ClientView(leader)


def test_a_started_leader_shows_nothing_the_isr_has_not_confirmed(tmp_path):
    log, leader, view = started_leader(tmp_path)
    end = log.high_watermark
    assert end > 0
    assert view.high_watermark == 0
    assert view.read(0, 1 << 20).length == 0
    # a consumer that read up to ``end`` before the restart gets nothing yet, not an out-of-range error
    assert view.read(end, 1 << 20).length == 0
    assert not view.wait_for_data(0, 0.01)
    leader.record_progress("disk-b", 0, end, end)
    assert view.high_watermark == 0  # disk-c has not said how far it reaches
    leader.record_progress("disk-c", 0, end, end)
    assert view.high_watermark == end and view.read(0, 1 << 20).length == end
    log.close()


def test_a_started_leader_alone_in_the_isr_shows_what_it_flushed(tmp_path):
    log, _leader, view = started_leader(tmp_path, isr=("disk-a",))
    assert view.high_watermark == log.high_watermark > 0
    log.close()
