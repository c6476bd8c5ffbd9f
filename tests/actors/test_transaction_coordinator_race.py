"""Two coordinators on one real ZooKeeper (a replaced one that still runs:
a zombie) deciding the same transaction at once: the compare-and-set lets
exactly one decision through, and the other coordinator reads again and
answers by what was decided. The transactions hold consumer offsets only
(no partition, so no marker to write)."""

from __future__ import annotations

import random
import threading
import time

from raylog.actors.transaction_coordinator import TransactionCoordinator
from raylog.errors import InvalidProducerEpochError
from raylog.groups.offsets import OffsetStore
from raylog.zk.paths import Paths
from raylog.zk.producer_ids import ProducerIdBlocks
from raylog.zk.transactions import TransactionStore


class NoMarkers:
    def write_markers(self, *args, **kwargs):
        raise AssertionError("a transaction of offsets only writes no marker")


def test_a_commit_racing_a_timeout_abort_is_decided_once(make_zk, cluster_name):
    paths = Paths(cluster_name)
    clock = {"now": 0}

    def coordinator():
        zk = make_zk()
        return TransactionCoordinator(TransactionStore(zk, paths), ProducerIdBlocks(zk, paths).next_id, NoMarkers(),
                                      clock_ms=lambda: clock["now"])

    producer_side, zombie = coordinator(), coordinator()
    offsets = OffsetStore(make_zk(), cluster_name)
    outcomes = {"committed": 0, "aborted": 0}
    pid, epoch = producer_side.init_producer_id("app", 1000)
    for round_ in range(40):
        clock["now"] = round_ * 10_000
        producer_side.add_offsets("app", pid, epoch, "g", {("t", 0): round_ + 1})
        clock["now"] += 5_000  # past the timeout: the zombie's pass aborts it, if it gets there first
        start = threading.Barrier(2)
        result: dict = {}

        def commit():
            start.wait()
            time.sleep(random.uniform(0, 0.03))  # either may get there first
            try:
                result["commit"] = producer_side.end_transaction("app", pid, epoch, True)
            except InvalidProducerEpochError as err:
                result["commit"] = err

        def expire():
            start.wait()
            result["expire"] = zombie.check()

        threads = [threading.Thread(target=commit), threading.Thread(target=expire)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        record, _ = TransactionStore(make_zk(), paths).read("app")
        stored = offsets.committed("g", "t", 0)
        if isinstance(result["commit"], InvalidProducerEpochError):
            # the abort won: the commit was refused and nothing of it is visible
            assert record.state == "CompleteAbort" and "app" in result["expire"]["expired"]
            assert stored != round_ + 1
            outcomes["aborted"] += 1
            pid, epoch = producer_side.init_producer_id("app", 1000)
        else:
            assert record.state == "CompleteCommit" and "app" not in result["expire"]["expired"]
            assert stored == round_ + 1
            outcomes["committed"] += 1
            pid, epoch = result["commit"]
    assert sum(outcomes.values()) == 40
