"""Who may take over a partition whose leader is gone (a real ZooKeeper):
an ISR member always; a replica outside the ISR only with the topic's
``unclean_leader_election`` and only once no ISR member runs."""

from __future__ import annotations

import pytest

from raylog.config import TopicConfig
from raylog.errors import ConfigError
from raylog.replication.state import create_state, read_state, register_replica, take_over, compare_and_set

REPLICAS = ["disk-a", "disk-b", "disk-c"]


@pytest.fixture
def shrunk(registry, zk):
    """Partition t-0 led by disk-a (gone), ISR [disk-a, disk-b], disk-c out of the ISR."""
    paths = registry.paths
    state = create_state(zk, paths, "t", 0, REPLICAS)
    _, version = read_state(zk, paths, "t", 0)
    compare_and_set(zk, paths, "t", 0, state.with_isr(["disk-a", "disk-b"]), version)
    return paths


def test_an_isr_member_takes_over_with_the_next_epoch(zk, shrunk):
    state, _ = take_over(zk, shrunk, "t", 0, "disk-b", 500)
    assert (state.leader, state.leader_epoch, state.isr, state.epochs) == ("disk-b", 1, ("disk-b",), ((1, 500),))
    assert read_state(zk, shrunk, "t", 0)[0] == state


def test_a_replica_outside_the_isr_never_leads_by_default(zk, shrunk):
    assert take_over(zk, shrunk, "t", 0, "disk-c", 900) is None
    assert read_state(zk, shrunk, "t", 0)[0].leader == "disk-a"


def test_unclean_election_waits_while_an_isr_member_runs(zk, shrunk):
    register_replica(zk, shrunk, "t", 0, "disk-b", {"host": "127.0.0.1", "port": 1, "actor": "b"})
    assert take_over(zk, shrunk, "t", 0, "disk-c", 900, unclean=True) is None
    assert read_state(zk, shrunk, "t", 0)[0].leader == "disk-a"


def test_unclean_election_lets_an_out_of_sync_replica_lead_once_the_isr_is_gone(zk, shrunk):
    register_replica(zk, shrunk, "t", 0, "disk-c", {"host": "127.0.0.1", "port": 2, "actor": "c"})
    state, _ = take_over(zk, shrunk, "t", 0, "disk-c", 900, unclean=True)
    assert (state.leader, state.leader_epoch, state.isr, state.epochs) == ("disk-c", 1, ("disk-c",), ((1, 900),))


def test_no_one_takes_over_from_a_leader_that_runs(zk, shrunk):
    register_replica(zk, shrunk, "t", 0, "disk-a", {"host": "127.0.0.1", "port": 3, "actor": "a"})
    assert take_over(zk, shrunk, "t", 0, "disk-b", 500) is None
    assert take_over(zk, shrunk, "t", 0, "disk-c", 900, unclean=True) is None


def test_the_setting_is_a_boolean():
    assert TopicConfig().unclean_leader_election is False
    assert TopicConfig.from_json(TopicConfig(unclean_leader_election=True).to_json()).unclean_leader_election
    with pytest.raises(ConfigError, match="unclean_leader_election"):
        TopicConfig(unclean_leader_election="yes")
