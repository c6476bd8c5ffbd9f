"""Preferred leaders (raylog.replication.preferred): which leads go back to
the first replica, and when a leader hands its lead back by itself."""

from __future__ import annotations

from raylog.replication.admin import leader_counts
from raylog.replication.drain import others_in_sync
from raylog.replication.preferred import PreferredWatch, preferred_moves
from raylog.replication.state import PartitionState

R = ("a", "b", "c")


def test_a_lead_goes_back_to_the_preferred_replica_only_when_it_runs_and_is_in_sync():
    rows = [
        ("t", 0, PartitionState("b", 1, R, R)),               # moves back to a
        ("t", 1, PartitionState("b", 1, R, ("b", "c", "a"))),  # b is preferred: stays
        ("t", 2, PartitionState("c", 1, ("b", "c"), R)),      # a out of sync: stays
        ("t", 3, PartitionState("c", 1, R, R)),               # a does not run: stays
        ("t", 4, PartitionState("c", 1, R, R, removing=("a",))),  # a on its way out: stays
    ]
    running = {("t", p): set(R) for p in range(5)}
    running[("t", 3)] = {"b", "c"}
    assert preferred_moves(rows, running) == [("t", 0, "a")]


def test_leader_counts_count_every_replica_node():
    rows = [("t", 0, PartitionState("b", 1, R, R)), ("t", 1, PartitionState("b", 1, R, R))]
    assert leader_counts(rows) == {"a": 0, "b": 2, "c": 0}


def test_the_leader_hands_back_after_a_quiet_period_without_a_break():
    watch = PreferredWatch(quiet_s=60)
    state = PartitionState("b", 1, R, R)
    assert watch.due(state, "b", R, now=0) is None
    assert watch.due(state, "b", R, now=30) is None
    out = PartitionState("b", 1, ("b", "c"), R)
    assert watch.due(out, "b", R, now=40) is None  # a left the ISR: the quiet period starts again
    assert watch.due(state, "b", R, now=50) is None
    assert watch.due(state, "b", R, now=109) is None
    assert watch.due(state, "b", R, now=110) == "a"
    assert PreferredWatch(0).due(PartitionState("a", 1, R, R), "a", R, now=0) is None  # a leads already


def test_a_drain_waits_for_the_other_replicas_to_be_in_sync():
    assert others_in_sync(PartitionState("a", 0, ("a", "b"), R), "c")
    assert not others_in_sync(PartitionState("a", 0, ("a", "b"), R), "b")
