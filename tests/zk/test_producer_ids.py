"""Producer-id blocks (raylog.zk.producer_ids) on a real ZooKeeper: never
an id twice, even with coordinators racing on threads of their own."""

from __future__ import annotations

import json
import threading

import pytest

from raylog.errors import ProducerIdsExhaustedError, TransactionStateConflictError
from raylog.retry import RetryPolicy
from raylog.zk.paths import Paths
from raylog.zk.producer_ids import MAX_PRODUCER_ID, ProducerIdBlocks, take_block


def test_blocks_follow_each_other_from_zero(zk, cluster_name):
    paths = Paths(cluster_name)
    assert take_block(zk, paths, 10) == range(0, 10)
    assert take_block(zk, paths, 5) == range(10, 15)
    assert json.loads(zk.get(paths.producer_ids)[0]) == {"next": 15}


def test_racing_coordinators_never_hand_out_an_id_twice(make_zk, cluster_name):
    """Eight coordinators (each its own ZooKeeper session and block cache),
    each on its own thread, take ids from blocks of 7 at once: every id is
    handed out once, and the blocks taken leave no id behind."""
    paths = Paths(cluster_name)
    coordinators = [ProducerIdBlocks(make_zk(), paths, block_size=7) for _ in range(8)]
    taken: list[list[int]] = [[] for _ in coordinators]
    start = threading.Barrier(len(coordinators))

    def run(i):
        start.wait()
        for _ in range(60):
            taken[i].append(coordinators[i].next_id())

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(coordinators))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    ids = [pid for ids in taken for pid in ids]
    assert len(ids) == 8 * 60
    assert len(set(ids)) == len(ids), "an id was handed out twice"
    # 60 ids from blocks of 7 is 9 blocks per coordinator: 72 blocks, in one run of ids
    assert json.loads(make_zk().get(paths.producer_ids)[0]) == {"next": 8 * 9 * 7}
    assert set(ids) <= set(range(8 * 9 * 7))


def test_threads_of_one_coordinator_share_its_blocks(zk, cluster_name):
    blocks = ProducerIdBlocks(zk, Paths(cluster_name), block_size=3)
    out: list[int] = []
    lock = threading.Lock()

    def run():
        for _ in range(20):
            pid = blocks.next_id()
            with lock:
                out.append(pid)

    threads = [threading.Thread(target=run) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(out) == list(range(120))


def test_a_block_past_the_largest_id_is_refused_and_nothing_taken(zk, cluster_name):
    paths = Paths(cluster_name)
    near = MAX_PRODUCER_ID - 5
    zk.create(paths.producer_ids, json.dumps({"next": near}).encode(), makepath=True)
    with pytest.raises(ProducerIdsExhaustedError, match="no id was taken"):
        take_block(zk, paths, 10)
    assert json.loads(zk.get(paths.producer_ids)[0]) == {"next": near}
    assert take_block(zk, paths, 6) == range(near, MAX_PRODUCER_ID + 1)


def test_a_damaged_node_is_a_typed_error_and_left_as_it_is(zk, cluster_name):
    paths = Paths(cluster_name)
    zk.create(paths.producer_ids, b"garbage", makepath=True)
    with pytest.raises(ProducerIdsExhaustedError, match="not a block record") as err:
        take_block(zk, paths, 10)
    assert err.value.path == paths.producer_ids
    assert zk.get(paths.producer_ids)[0] == b"garbage"


def test_a_coordinator_that_always_loses_the_race_gets_a_retriable_error(zk, cluster_name, make_zk):
    """The compare-and-set is what refuses the loser: with another writer
    moving the node between every read and write, take_block gives up with
    a retriable TransactionStateConflictError, and what the other wrote stays."""
    paths = Paths(cluster_name)
    take_block(zk, paths, 1)
    other = make_zk()
    real_get = zk.get

    class Racing:
        """The session of the test, with another coordinator taking a block
        right after each of its reads."""

        def __getattr__(self, name):
            return getattr(zk, name)

        def get(self, path, *a, **kw):
            found = real_get(path, *a, **kw)
            take_block(other, paths, 100)
            return found

    with pytest.raises(TransactionStateConflictError) as err:
        take_block(Racing(), paths, 5, retry=RetryPolicy(max_tries=3, delay_s=0.001, deadline_s=10))
    assert err.value.retriable
    assert json.loads(zk.get(paths.producer_ids)[0]) == {"next": 1 + 3 * 100}
