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


def test_lost_since_is_kept_per_replica_and_forgotten_once_the_node_is_back(registry, zk):
    config = TopicConfig(partitions=1, replication_factor=3, replica_replace_after_s=3600)
    registry.create_topic("lost", config)
    registry.set_placement("lost", 0, "disk-a", "/d/lost-0")
    create_state(zk, registry.paths, "lost", 0, ["disk-a", "disk-b", "disk-c"])
    lost_since: dict = {}
    rows = replace_lost(registry, "unused", [], {"disk-a", "disk-b", "disk-d"}, lost_since, now=100.0)
    assert rows == [] and lost_since == {("lost", 0, "disk-c"): 100.0}
    replace_lost(registry, "unused", [], {"disk-a", "disk-b", "disk-d"}, lost_since, now=200.0)
    assert lost_since == {("lost", 0, "disk-c"): 100.0}  # the first time it was seen gone stays
    replace_lost(registry, "unused", [], {"disk-a", "disk-b", "disk-c"}, lost_since, now=300.0)
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
