"""The transaction coordinator's actor on real Ray and a real ZooKeeper:
producer ids, fencing, offsets visible with the commit, the timeout abort,
and a coordinator killed between its decision and its completion."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from raylog import auth
from raylog.actors.transaction_coordinator import start_transaction_coordinator, stop_transaction_coordinator
from raylog.config import TopicConfig
from raylog.errors import (
    ConcurrentTransactionsError,
    InvalidProducerEpochError,
    InvalidTxnStateError,
    ProducerFencedError,
)
from raylog.groups.offsets import OffsetStore
from raylog.zk.registry import Registry
from raylog.zk.session import connect_kazoo
from raylog.zk.transactions import TransactionStore

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def cluster(zookeeper, ray_local):
    if not zookeeper.running:
        zookeeper.start()
    name = f"txn-{uuid.uuid4().hex[:12]}"
    try:
        yield name
    finally:
        stop_transaction_coordinator(name)


@pytest.fixture
def session(zookeeper, cluster):
    zk = connect_kazoo(zookeeper.connect_string, token=auth.cluster_token(cluster), cluster=cluster)
    try:
        yield zk
    finally:
        zk.stop()
        zk.close()


def _start(zookeeper, cluster, **options):
    return start_transaction_coordinator(zookeeper.connect_string, cluster, **options)


def _wait_for(what, fn, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while True:
        value = fn()
        if value:
            return value
        assert time.monotonic() < deadline, f"no {what} within {timeout_s:g} s"
        time.sleep(0.1)


def test_producer_ids_come_from_blocks_never_handed_out_twice_across_a_restart(ray_local, zookeeper, cluster,
                                                                               session):
    import ray

    coord = _start(zookeeper, cluster, block_size=10)
    first = [ray.get(coord.init_producer_id.remote(f"t{i}", 10_000)) for i in range(3)]
    assert first == [(0, 0), (1, 0), (2, 0)]
    old_pid = ray.get(coord.status.remote())["pid"]
    ray.kill(coord, no_restart=False)  # Ray starts it again; the rest of its block is never used
    _wait_for("restarted coordinator", lambda: _pid(coord) not in (None, old_pid))
    assert ray.get(coord.init_producer_id.remote("t3", 10_000)) == (10, 0)
    assert json.loads(session.get(f"/raylog/{cluster}/producer-ids")[0]) == {"next": 20}
    # a known transactional id keeps its id, with the epoch bumped
    assert ray.get(coord.init_producer_id.remote("t0", 10_000)) == (0, 1)


def _pid(coord):
    import ray

    try:
        return ray.get(coord.status.remote(), timeout=5)["pid"]
    except Exception:  # noqa: BLE001 - restarting
        return None


def test_a_new_producer_fences_the_old_one_and_aborts_its_transaction(ray_local, zookeeper, cluster, session):
    import ray

    coord = _start(zookeeper, cluster)
    pid, epoch = ray.get(coord.init_producer_id.remote("app", 10_000))
    ray.get(coord.add_offsets.remote("app", pid, epoch, "g", {("t", 0): 42}))
    assert ray.get(coord.describe.remote("app"))["state"] == "Ongoing"

    assert ray.get(coord.init_producer_id.remote("app", 10_000)) == (pid, epoch + 2)
    with pytest.raises(ProducerFencedError, match="close this producer"):
        ray.get(coord.end_transaction.remote("app", pid, epoch, True))
    with pytest.raises(ProducerFencedError):
        ray.get(coord.add_offsets.remote("app", pid, epoch, "g", {("t", 0): 50}))
    record = ray.get(coord.describe.remote("app"))
    assert (record["state"], record["producer_epoch"], record["groups"]) == ("Empty", epoch + 2, {})
    # the fenced transaction's offsets never became visible
    assert OffsetStore(session, cluster).committed("g", "t", 0) is None


def test_offsets_become_visible_with_the_commit_and_never_with_an_abort(ray_local, zookeeper, cluster, session):
    import ray

    coord = _start(zookeeper, cluster)
    offsets = OffsetStore(session, cluster)
    pid, epoch = ray.get(coord.init_producer_id.remote("app", 10_000))
    ray.get(coord.add_offsets.remote("app", pid, epoch, "g", {("t", 0): 42, ("t", 1): 7}))
    assert offsets.committed_all("g") == {}
    pid, epoch = ray.get(coord.end_transaction.remote("app", pid, epoch, True))
    assert epoch == 1  # KIP-890: the end bumped it
    assert offsets.committed_all("g") == {("t", 0): 42, ("t", 1): 7}

    ray.get(coord.add_offsets.remote("app", pid, epoch, "g", {("t", 0): 99}))
    assert ray.get(coord.end_transaction.remote("app", pid, epoch, False)) == (pid, epoch + 1)
    assert offsets.committed_all("g") == {("t", 0): 42, ("t", 1): 7}
    # a retried abort is answered as the first; a commit of it is refused
    assert ray.get(coord.end_transaction.remote("app", pid, epoch, False)) == (pid, epoch + 1)
    with pytest.raises(InvalidTxnStateError):
        ray.get(coord.end_transaction.remote("app", pid, epoch, True))


def test_a_transaction_past_its_timeout_is_aborted_by_the_coordinator(ray_local, zookeeper, cluster, session):
    import ray

    coord = _start(zookeeper, cluster, check_interval_s=0.2)
    pid, epoch = ray.get(coord.init_producer_id.remote("slow", 500))
    ray.get(coord.add_offsets.remote("slow", pid, epoch, "g", {("t", 0): 42}))
    _wait_for("timeout abort", lambda: ray.get(coord.describe.remote("slow"))["state"] == "CompleteAbort")
    with pytest.raises(InvalidProducerEpochError, match="passed its timeout"):
        ray.get(coord.end_transaction.remote("slow", pid, epoch, True))
    assert OffsetStore(session, cluster).committed("g", "t", 0) is None
    # the producer starts again and goes on
    pid2, epoch2 = ray.get(coord.init_producer_id.remote("slow", 10_000))
    assert (pid2, epoch2) == (pid, epoch + 2)
    ray.get(coord.add_offsets.remote("slow", pid2, epoch2, "g", {("t", 0): 43}))
    ray.get(coord.end_transaction.remote("slow", pid2, epoch2, True))
    assert OffsetStore(session, cluster).committed("g", "t", 0) == 43


def test_a_coordinator_killed_after_prepare_commit_is_replaced_and_completes_it(ray_local, zookeeper, cluster,
                                                                                 session, tmp_path):
    import ray

    fault = tmp_path / "exit-after-prepare"
    coord = _start(zookeeper, cluster, fault_file=str(fault), check_interval_s=3600)
    pid, epoch = ray.get(coord.init_producer_id.remote("app", 10_000))
    ray.get(coord.add_offsets.remote("app", pid, epoch, "g", {("t", 0): 42}))
    old_pid = ray.get(coord.status.remote())["pid"]
    fault.touch()
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(coord.end_transaction.remote("app", pid, epoch, True))
    assert not fault.exists(), "the coordinator did not die after writing its decision"
    # Ray starts it again; on start it completes the commit (its pass timer is an hour away)
    _wait_for("restarted coordinator", lambda: _pid(coord) not in (None, old_pid))
    record, _ = TransactionStore(session, cluster).read("app")
    assert (record.state, record.producer_epoch) == ("CompleteCommit", epoch + 1)
    assert OffsetStore(session, cluster).committed("g", "t", 0) == 42
    # the producer's retry of its end (its answer was lost with the coordinator) succeeds
    assert ray.get(coord.end_transaction.remote("app", pid, epoch, True)) == (pid, epoch + 1)


def test_a_commit_whose_partition_cannot_take_its_marker_stays_prepared(ray_local, zookeeper, cluster, session):
    """The decision stands (the end is answered), but nothing of the commit is
    visible and the producer's next transaction waits (retriable) until the
    partition takes its marker."""
    import ray

    Registry(session, cluster).create_topic("clicks", TopicConfig(partitions=1))  # no partition actor serves it
    coord = _start(zookeeper, cluster, check_interval_s=0.2)
    pid, epoch = ray.get(coord.init_producer_id.remote("app", 10_000))
    ray.get(coord.add_partitions.remote("app", pid, epoch, [("clicks", 0)]))
    ray.get(coord.verify_partition.remote("app", pid, epoch, "clicks", 0))
    ray.get(coord.add_offsets.remote("app", pid, epoch, "g", {("clicks", 0): 42}))
    nxt = ray.get(coord.end_transaction.remote("app", pid, epoch, True))
    assert nxt == (pid, epoch + 1)
    time.sleep(1.0)  # a few passes
    assert ray.get(coord.describe.remote("app"))["state"] == "PrepareCommit"
    assert "app" in ray.get(coord.status.remote())["last"]["pending"]
    assert OffsetStore(session, cluster).committed("g", "clicks", 0) is None
    with pytest.raises(ConcurrentTransactionsError) as err:
        ray.get(coord.add_partitions.remote("app", *nxt, [("clicks", 0)]))
    assert err.value.retriable
    with pytest.raises(ConcurrentTransactionsError):
        ray.get(coord.init_producer_id.remote("app", 10_000))
