"""The replicated leader's served view answers read_committed reads from
its committed offset (the high watermark clients see): a transaction whose
marker the in-sync replicas do not all hold yet is still open to readers;
once a follower's progress covers the marker, the reader gets past it. A
real ZooKeeper of the test's own and a real partition log; the leader's
logic without its actor."""

from __future__ import annotations

import dataclasses

import pytest

from raylog.config import TopicConfig
from raylog.errors import OffsetOutOfRangeError
from raylog.replication.leader import ClientView, Leader
from raylog.replication.state import compare_and_set, create_state, read_state
from raylog.storage.record_batch import encode_batch
from raylog.storage.log import PartitionLog
from raylog.zk.paths import Paths

REPLICAS = ("disk-a", "disk-b")


@pytest.fixture
def leader_view(private_zookeeper, make_zk, tmp_path):
    """A leader of ``t``/0 on ``disk-a`` with ``disk-b`` in its ISR, and its served view."""
    zk = make_zk(private_zookeeper.connect_string, timeout=4.0)
    paths = Paths("rc")
    create_state(zk, paths, "t", 0, list(REPLICAS))
    state, version = read_state(zk, paths, "t", 0)
    state = dataclasses.replace(state, isr=REPLICAS)
    version = compare_and_set(zk, paths, "t", 0, state, version)
    log = PartitionLog(tmp_path / "leader", TopicConfig(replication_factor=2, min_insync_replicas=1))
    leader = Leader(zk, paths, "t", 0, "disk-a", log, state, version)
    try:
        yield leader, ClientView(leader), log
    finally:
        leader.stop()
        log.close()


def test_read_committed_counts_from_the_committed_offset(leader_view):
    leader, view, log = leader_view
    epoch = leader.state.leader_epoch
    view.append(encode_batch([b"plain"], timestamp_ms=1))
    txn = view.append(encode_batch([b"t"], timestamp_ms=1, producer_id=5, producer_epoch=0, base_sequence=0,
                                   transactional=True))
    log.flush()
    leader.record_progress("disk-b", epoch, txn, txn)  # the follower holds the plain write alone
    assert view.high_watermark == txn
    log.append_marker(5, 0, True, 0)
    log.flush()
    # the leader's own log has the marker: stable there, not yet for clients
    assert log.read_committed(0, 1 << 20).last_stable_offset == log.high_watermark
    read = view.read_committed(0, 1 << 20)
    assert read.last_stable_offset == txn and read.slice.length == txn
    with pytest.raises(OffsetOutOfRangeError):
        view.read_committed(log.high_watermark + 1, 1 << 20)
    end = log.log_end_offset
    leader.record_progress("disk-b", epoch, end, end)  # the follower has the marker too
    read = view.read_committed(txn, 1 << 20)
    assert read.last_stable_offset == view.high_watermark == end
    assert read.slice.length > 0 and read.aborted == []
