"""Reassignment checks and the lost-replica replacement choice (pure logic),
the stable ``origin`` identity in the ``state`` node, and the tombstones a
delete leaves for every replica's log (real ZooKeeper). The reassignment
itself runs across hosts: tests/replication/test_reassign_hosts.py."""

from __future__ import annotations

import json

import pytest

from raylog.config import TopicConfig
from raylog.errors import ConfigError, InvalidReassignmentError, UnknownPartitionError
from raylog.replication.assignment import replica_actor_name, replica_log_dir
from raylog.replication.reassign import check_target
from raylog.replication.repair import replace_lost, replacement_target
from raylog.replication.state import PartitionState, create_state, read_state

CONFIG = TopicConfig(partitions=2, replication_factor=3)
STATE = PartitionState("disk-a", 0, ("disk-a", "disk-b", "disk-c"), ("disk-a", "disk-b", "disk-c"))
ALIVE = {"disk-a", "disk-b", "disk-c", "disk-d"}


def test_a_valid_target_is_returned_as_is():
    assert check_target("t", 1, CONFIG, STATE, ["disk-d", "disk-b", "disk-c"], ALIVE) == ["disk-d", "disk-b",
                                                                                          "disk-c"]


@pytest.mark.parametrize(("partition", "config", "state", "target", "error", "match"), [
    (2, CONFIG, STATE, ["disk-a", "disk-b", "disk-d"], UnknownPartitionError, "partitions 0..1, not 2"),
    (0, TopicConfig(), None, ["disk-a"], InvalidReassignmentError, "is not replicated"),
    (0, CONFIG, None, ["disk-a", "disk-b", "disk-d"], InvalidReassignmentError, "is not replicated"),
    (0, CONFIG, STATE, ["disk-a", "disk-a", "disk-d"], InvalidReassignmentError, "disk-a more than once"),
    (0, CONFIG, STATE, ["disk-a", "disk-d"], InvalidReassignmentError, "2 target replicas .* replication_factor is 3"),
    (0, CONFIG, STATE, ["disk-a", "disk-b", "disk-z"], InvalidReassignmentError, "disk-z are not alive disk nodes"),
])
def test_a_bad_target_is_refused_with_a_typed_error(partition, config, state, target, error, match):
    with pytest.raises(error, match=match) as info:
        check_target("t", partition, config, state, target, ALIVE)
    assert not info.value.retriable
    if error is InvalidReassignmentError:
        assert isinstance(info.value, ConfigError)


def test_origin_stays_when_the_replicas_change_and_defaults_for_older_states():
    older = json.loads(STATE.to_json())
    del older["origin"], older["removing"]
    assert PartitionState.from_json(json.dumps(older).encode()).origin == "disk-a"  # written before it existed
    moved = PartitionState("disk-b", 1, ("disk-b", "disk-d"), ("disk-d", "disk-b", "disk-c"), ((1, 40),),
                           origin="disk-a", removing=("disk-c",))
    again = PartitionState.from_json(moved.to_json())
    assert again == moved and again.origin == "disk-a" and again.removing == ("disk-c",)
    # The names stay those of the create: disk-a's replica keeps the plain name even when it is not first.
    assert replica_actor_name("c/t/0", "disk-a", again.origin) == "c/t/0"
    assert replica_log_dir("/d/t-0", "disk-d", again.origin) == "/d/t-0@disk-d"


def test_a_lost_replica_goes_to_a_spare_node_chosen_the_same_way_every_time():
    target = replacement_target("t", 0, STATE, {"disk-a", "disk-b", "disk-d", "disk-e"}, {"disk-c"})
    assert target[:2] == ["disk-a", "disk-b"] and target[2] in ("disk-d", "disk-e")
    assert all(replacement_target("t", 0, STATE, {"disk-a", "disk-b", "disk-d", "disk-e"}, {"disk-c"}) == target
               for _ in range(3))
    # No spare node, the leader itself gone, or another replica gone but not for long enough: nothing.
    assert replacement_target("t", 0, STATE, {"disk-a", "disk-b"}, {"disk-c"}) is None
    assert replacement_target("t", 0, STATE, {"disk-b", "disk-c", "disk-d"}, {"disk-a"}) is None
    assert replacement_target("t", 0, STATE, {"disk-a", "disk-d", "disk-e"}, {"disk-c"}) is None


#: replace_lost's actors, never used here: nothing is gone long enough to move
NO_ACTORS = object()


def test_lost_since_is_kept_per_replica_and_forgotten_once_the_node_is_back(registry, zk):
    config = TopicConfig(partitions=1, replication_factor=3, replica_replace_after_s=3600)
    registry.create_topic("lost", config)
    registry.set_placement("lost", 0, "disk-a", "/d/lost-0")
    create_state(zk, registry.paths, "lost", 0, ["disk-a", "disk-b", "disk-c"])
    lost_since: dict = {}
    rows = replace_lost(registry, "unused", [], {"disk-a", "disk-b", "disk-d"}, lost_since, actors=NO_ACTORS, now=100.0)
    assert rows == [] and lost_since == {("lost", 0, "disk-c"): 100.0}
    replace_lost(registry, "unused", [], {"disk-a", "disk-b", "disk-d"}, lost_since, actors=NO_ACTORS, now=200.0)
    assert lost_since == {("lost", 0, "disk-c"): 100.0}  # the first time it was seen gone stays
    replace_lost(registry, "unused", [], {"disk-a", "disk-b", "disk-c"}, lost_since, actors=NO_ACTORS, now=300.0)
    assert lost_since == {}
    assert read_state(zk, registry.paths, "lost", 0)[0] == STATE


def test_a_delete_leaves_a_tombstone_for_every_replicas_log(registry, zk):
    registry.create_topic("gone", TopicConfig(partitions=1, replication_factor=3))
    registry.set_placement("gone", 0, "disk-a", "/d/gone-0")
    create_state(zk, registry.paths, "gone", 0, ["disk-a", "disk-b", "disk-c"])
    registry.delete_topic("gone")
    logs = sorted((s["node"], s["log_dir"]) for s in registry.tombstones().values())
    assert logs == [("disk-a", "/d/gone-0"), ("disk-b", "/d/gone-0@disk-b"), ("disk-c", "/d/gone-0@disk-c")]
    registry.add_tombstone("other", 0, "disk-d", "/d/other-0@disk-d")
    stone = registry.tombstone("disk-d", "/d/other-0@disk-d")
    assert stone["reassigned"] and stone["partition"] == 0


# ---------------------------------------------------------------- retries


def test_a_lost_compare_and_set_is_redone_and_any_other_error_is_not_retried(registry, zk, monkeypatch):
    import dataclasses

    from raylog.errors import ReassignmentTimeoutError
    from raylog.replication import reassign
    from raylog.retry import RetryPolicy

    registry.create_topic("cas", TopicConfig(partitions=1, replication_factor=3))
    create_state(zk, registry.paths, "cas", 0, ["disk-a", "disk-b", "disk-c"])
    calls = []

    def add_d(state):
        calls.append(state)
        if len(calls) == 1:  # another writer gets there first, once
            other = dataclasses.replace(state, isr=state.isr[:2])
            zk.set(reassign.state_path(registry.paths, "cas", 0), other.to_json())
        return dataclasses.replace(state, replicas=state.replicas + ("disk-d",))

    written = reassign._update(zk, registry.paths, "cas", 0, add_d)
    assert len(calls) == 2 and written.replicas[-1] == "disk-d" and written.isr == ("disk-a", "disk-b")
    assert read_state(zk, registry.paths, "cas", 0)[0] == written

    calls.clear()

    def broken(state):
        calls.append(state)
        raise InvalidReassignmentError("not a matter of time")

    with pytest.raises(InvalidReassignmentError, match="not a matter of time"):
        reassign._update(zk, registry.paths, "cas", 0, broken)
    assert len(calls) == 1  # tried once: not retried
    assert read_state(zk, registry.paths, "cas", 0)[0] == written  # nothing changed

    calls.clear()

    def always_loses(state):
        calls.append(state)
        zk.set(reassign.state_path(registry.paths, "cas", 0), state.to_json())  # a new version each time
        return dataclasses.replace(state, leader_epoch=state.leader_epoch + 1)

    with pytest.raises(ReassignmentTimeoutError, match="kept changing under 3 writes") as info:
        reassign._update(zk, registry.paths, "cas", 0, always_loses,
                         retry=RetryPolicy(max_tries=3, delay_s=0.001, deadline_s=None))
    assert len(calls) == 3 and info.value.retriable


def test_only_a_replica_start_that_may_succeed_later_is_retriable():
    import ray.exceptions

    from raylog.errors import AuthenticationError, BrokerUnavailableError
    from raylog.replication.reassign import start_failure_retriable

    assert start_failure_retriable(ray.exceptions.GetTimeoutError("no answer"))
    assert start_failure_retriable(ray.exceptions.RayActorError())
    assert start_failure_retriable(BrokerUnavailableError("gone for now"))
    assert not start_failure_retriable(AuthenticationError("bad token"))
    assert not start_failure_retriable(ConfigError("bad config"))
    assert not start_failure_retriable(ValueError("a bug"))


@pytest.mark.parametrize("fails_with, raised", [
    (ConfigError("the replica's config is refused"), ConfigError),
    (ValueError("a bug in the start"), ValueError),
    ("timeout", "ReassignmentTimeoutError"),
])
def test_a_replica_that_does_not_start_rolls_back_and_only_a_retriable_cause_becomes_a_timeout(
        registry, zk, monkeypatch, fails_with, raised):
    import ray.exceptions

    from raylog.errors import ReassignmentTimeoutError
    from raylog.replication import reassign

    registry.create_topic("mv", TopicConfig(partitions=1, replication_factor=3))
    registry.set_placement("mv", 0, "disk-a", "/d/mv-0")
    before = create_state(zk, registry.paths, "mv", 0, ["disk-a", "disk-b", "disk-c"])
    nodes = [{"identity": n, "resources": {}} for n in ("disk-a", "disk-b", "disk-c", "disk-d")]
    alive_nodes = type("Actors", (), {"alive": lambda self, nodes: {n["identity"] for n in nodes}})()
    err = ray.exceptions.GetTimeoutError("no answer") if fails_with == "timeout" else fails_with
    starts = []

    def start(self, node, origin, deadline):
        starts.append(node)
        raise err

    removed = []
    monkeypatch.setattr(reassign.Reassignment, "_start", start)
    monkeypatch.setattr(reassign.Reassignment, "_remove", lambda self, node, origin, alive: removed.append(node))
    run = reassign.Reassignment(zk, registry, zookeeper="unused", topic="mv", partition=0, nodes=nodes,
                                host=None, token=None, actors=alive_nodes)
    expected = ReassignmentTimeoutError if raised == "ReassignmentTimeoutError" else raised
    with pytest.raises(expected) as info:
        run.run(["disk-a", "disk-b", "disk-d"], timeout_s=30)
    if expected is ReassignmentTimeoutError:
        assert info.value.retriable and info.value.__cause__ is err
    else:
        assert info.value is err  # as it is: its own type and advice, not made retriable
    assert starts == ["disk-d"] and removed == ["disk-d"]  # rolled back either way
    assert read_state(zk, registry.paths, "mv", 0)[0] == before


def test_a_wait_on_the_state_node_ends_when_a_watch_sees_the_change(registry, zk):
    import dataclasses
    import threading
    import time

    from raylog.replication import reassign

    registry.create_topic("w", TopicConfig(partitions=1, replication_factor=3))
    state = create_state(zk, registry.paths, "w", 0, ["disk-a", "disk-b", "disk-c"])
    changer = threading.Timer(0.5, lambda: zk.set(reassign.state_path(registry.paths, "w", 0),
                                                  dataclasses.replace(state, isr=("disk-a",)).to_json()))
    changer.start()
    try:
        seen = reassign._wait_state(zk, registry.paths, "w", 0, lambda s: s.isr == ("disk-a",),
                                    time.monotonic() + 120)
    finally:
        changer.join()
    assert seen.isr == ("disk-a",)
    # and at the deadline, the state as it is
    assert reassign._wait_state(zk, registry.paths, "w", 0, lambda s: False, time.monotonic() + 0.2) == seen
