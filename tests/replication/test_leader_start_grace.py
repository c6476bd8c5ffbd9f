"""A follower does not replace a new leader that has not served yet before
the start grace (``LEADER_START_GRACE_MS``, or the topic's
``replica_lag_ms`` when longer): a leader actor slow to start on a busy host
keeps its lead at the topic's birth. A real ZooKeeper and a real log; the
leader never starts, so the follower does take over once the grace is up."""

from __future__ import annotations

import threading
import time

from raylog.config import TopicConfig
from raylog.replication import follower as follower_module
from raylog.replication.follower import Follower
from raylog.replication.state import create_state, read_state
from raylog.storage.log import PartitionLog

GRACE_MS = 3000


def test_a_leader_that_never_served_is_replaced_only_after_the_start_grace(zk, registry, tmp_path, monkeypatch):
    monkeypatch.setattr(follower_module, "LEADER_START_GRACE_MS", GRACE_MS)
    config = TopicConfig(partitions=1, replication_factor=2, replica_lag_ms=100)
    registry.create_topic("t", config)
    create_state(zk, registry.paths, "t", 0, ["disk-a", "disk-b"])  # disk-a leads, and never starts
    promoted = threading.Event()
    log = PartitionLog(tmp_path / "b", config)
    follower = Follower(registry, "t", 0, "disk-b", log, token=b"t" * 32,
                        on_promoted=lambda state, version: promoted.set())
    started = time.monotonic()
    follower.start()
    try:
        # far past replica_lag_ms (100 ms), still inside the grace: the leader keeps its lead
        assert not promoted.wait(GRACE_MS / 1000 / 2)
        assert read_state(zk, registry.paths, "t", 0)[0].leader == "disk-a"
        assert promoted.wait(60), "the follower never took over from a leader that never started"
        assert time.monotonic() - started >= GRACE_MS / 1000
        state = read_state(zk, registry.paths, "t", 0)[0]
        assert (state.leader, state.leader_epoch) == ("disk-b", 1)
    finally:
        follower.stop()
        log.close()
