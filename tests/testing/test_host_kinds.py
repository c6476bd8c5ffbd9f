"""Which fault kinds a run schedules on the hosts kit and off it (pure)."""

from __future__ import annotations

from raylog.testing.nemesis import (
    FAULT_KINDS, HOST_KINDS, KILL_LEADER, REMOVE_NODE, ZOMBIE_LEADER, Nemesis, Target, plan,
)
from raylog.testing.runner import RunOptions, run_kinds



def test_a_hosts_run_adds_the_network_faults_and_drops_remove_node():
    kinds = run_kinds(RunOptions(hosts=5, replication_factor=3))
    assert set(HOST_KINDS) <= set(kinds) and KILL_LEADER in kinds
    assert REMOVE_NODE not in kinds
    assert set(FAULT_KINDS) - {REMOVE_NODE} <= set(kinds)


def test_a_run_without_hosts_has_no_network_fault():
    kinds = run_kinds(RunOptions(nodes=3, replication_factor=3))
    assert not set(HOST_KINDS) & set(kinds)
    assert run_kinds(RunOptions(nodes=3, faults=(ZOMBIE_LEADER, KILL_LEADER), replication_factor=3)) == (KILL_LEADER,)


def test_the_plan_takes_every_host_kind_once():
    schedule = plan(3, 120, HOST_KINDS)
    assert {kind for _, kind in schedule} == set(HOST_KINDS)


def test_a_network_fault_without_hosts_is_recorded_as_not_made():
    class Recorder:
        def record(self, *a, **kw):
            raise AssertionError("nothing was injected")

    target = Target(client=None, topic="t", partitions=1, zookeeper=None, consumers=[], history_dir="/nonexistent")
    nemesis = Nemesis(target, [], Recorder(), 1)
    for kind in HOST_KINDS:
        assert nemesis._inject(kind) is False
    assert len(nemesis.errors) == len(HOST_KINDS)
    assert all("hosts kit" in e for e in nemesis.errors)
