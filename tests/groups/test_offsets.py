"""OffsetStore against a real ZooKeeper: round trips, isolation, failures."""

from __future__ import annotations

import pytest

from raylog.errors import ConfigError, ZooKeeperUnavailableError
from raylog.groups.offsets import OffsetStore
from raylog.zk.paths import Paths


def test_committed_is_none_before_any_commit(zk, cluster_name):
    store = OffsetStore(zk, cluster_name)
    assert store.committed("g", "clicks", 0) is None
    assert store.committed_all("g") == {}


def test_commit_then_committed_round_trip(zk, cluster_name):
    store = OffsetStore(zk, cluster_name)
    store.commit("g", "clicks", 3, 1234)
    assert store.committed("g", "clicks", 3) == 1234
    data, _ = zk.get(Paths(cluster_name).offset("g", "clicks", 3))
    assert data == b"1234"  # the layout of docs/design.md §4: ASCII digits


def test_a_later_commit_overwrites_and_may_move_back(zk, cluster_name):
    store = OffsetStore(zk, cluster_name)
    store.commit("g", "clicks", 0, 500)
    store.commit("g", "clicks", 0, 900)
    assert store.committed("g", "clicks", 0) == 900
    store.commit("g", "clicks", 0, 100)  # a seek back is the consumer's right
    assert store.committed("g", "clicks", 0) == 100


def test_committed_all_lists_every_topic_and_partition(zk, cluster_name):
    store = OffsetStore(zk, cluster_name)
    store.commit("g", "clicks", 0, 10)
    store.commit("g", "clicks", 1, 20)
    store.commit("g", "views", 0, 30)
    assert store.committed_all("g") == {("clicks", 0): 10, ("clicks", 1): 20, ("views", 0): 30}


def test_groups_do_not_see_each_others_offsets(zk, cluster_name):
    store = OffsetStore(zk, cluster_name)
    store.commit("a", "clicks", 0, 10)
    store.commit("b", "clicks", 0, 99)
    assert store.committed("a", "clicks", 0) == 10
    assert store.committed("b", "clicks", 0) == 99
    assert store.committed_all("a") == {("clicks", 0): 10}


def test_offsets_persist_across_sessions(make_zk, cluster_name):
    first = make_zk()
    OffsetStore(first, cluster_name).commit("g", "clicks", 2, 77)
    first.stop()
    second = make_zk()
    assert OffsetStore(second, cluster_name).committed("g", "clicks", 2) == 77


@pytest.mark.parametrize("bad", [-1, 1.5, "10", True, None])
def test_commit_rejects_what_is_not_a_byte_offset(zk, cluster_name, bad):
    with pytest.raises(ConfigError, match="non-negative integer"):
        OffsetStore(zk, cluster_name).commit("g", "clicks", 0, bad)


def test_an_unreadable_offset_node_is_reported(zk, cluster_name):
    zk.create(Paths(cluster_name).offset("g", "clicks", 0), b"twelve", makepath=True)
    with pytest.raises(ConfigError, match="not a decimal offset"):
        OffsetStore(zk, cluster_name).committed("g", "clicks", 0)


def test_a_disconnected_client_fails_fast_with_zookeeper_unavailable(make_zk, cluster_name):
    client = make_zk()
    store = OffsetStore(client, cluster_name)
    client.stop()
    with pytest.raises(ZooKeeperUnavailableError, match="cannot commit") as info:
        store.commit("g", "clicks", 0, 1)
    assert info.value.retriable
    with pytest.raises(ZooKeeperUnavailableError):
        store.committed("g", "clicks", 0)
