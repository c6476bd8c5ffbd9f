"""Placement: which nodes hold partitions and how actors are pinned to them
(pure logic over ``ray.nodes()``-shaped records)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from crc32c import crc32c

import raylog.actors.placement as placement
from raylog.actors.placement import (
    DISK_RESOURCE,
    NODE_LABEL,
    DiskNode,
    disk_nodes,
    node_identity,
    place_topic,
    scheduling_options,
    spread,
)
from raylog.errors import ConfigError


def _node(node_id, address="10.0.0.1", disk=1, label=None, alive=True):
    return {
        "NodeID": node_id,
        "NodeManagerAddress": address,
        "Alive": alive,
        "Resources": {"CPU": 2.0, **({DISK_RESOURCE: disk} if disk else {})},
        "Labels": {NODE_LABEL: label} if label else {},
    }


def test_two_nodes_with_one_identity_are_refused():
    nodes = [_node("a", label="disk-a"), _node("b", label="disk-a")]
    with pytest.raises(ConfigError, match="share one raylog identity"):
        disk_nodes(nodes)


def test_no_disk_node_is_a_clear_error():
    with pytest.raises(ConfigError, match="raylog_disk"):
        spread(4, disk_nodes([_node("a", disk=0)]))


def test_a_dead_node_of_an_address_identity_cannot_be_scheduled():
    with pytest.raises(ConfigError, match="not alive"):
        scheduling_options("ip:10.0.0.9", [_node("a", address="10.0.0.9", alive=False)])


def test_only_alive_nodes_with_disk_count_sorted_by_identity():
    nodes = [
        _node("c", label="disk-c"),
        _node("x", label="compute", disk=0),
        _node("a", label="disk-a"),
        _node("d", label="disk-d", alive=False),
        _node("b", address="10.0.0.2"),
    ]
    assert [n.identity for n in disk_nodes(nodes)] == ["disk-a", "disk-c", "ip:10.0.0.2"]


def test_partitions_spread_round_robin_from_an_offset():
    nodes = disk_nodes([_node("a", label="a"), _node("b", label="b"), _node("c", label="c")])
    assert [n.identity for n in spread(5, nodes)] == ["a", "b", "c", "a", "b"]
    assert [n.identity for n in spread(3, nodes, offset=1)] == ["b", "c", "a"]


def test_labelled_nodes_are_pinned_by_label_and_others_by_hard_affinity():
    assert scheduling_options("disk-a", []) == {"label_selector": {NODE_LABEL: "disk-a"}}
    node_id = "ab" * 28  # Ray checks the hex form of node ids
    options = scheduling_options("ip:10.0.0.2", [_node(node_id, address="10.0.0.2")])
    strategy = options["scheduling_strategy"]
    assert strategy.node_id == node_id and strategy.soft is False


def test_identity_prefers_the_label():
    assert node_identity(_node("a", label="disk-a")) == "disk-a"
    assert node_identity(_node("a", address="10.1.2.3")) == "ip:10.1.2.3"


DISKS = [DiskNode(identity=f"disk-{i}", node_id=f"n{i}", address=f"10.0.0.{i}", labelled=True) for i in range(3)]


def test_the_first_partition_goes_where_the_names_crc32c_points_and_the_rest_follow_round_robin():
    for topic in ("clicks", "views", "orders", "a", "b"):
        start = crc32c(topic.encode()) % len(DISKS)
        placed = place_topic(topic, 5, DISKS)
        assert [[d.identity for d in replicas] for replicas in placed] == [
            [DISKS[(start + p) % 3].identity] for p in range(5)
        ]


def test_placement_is_the_same_in_every_process():
    code = (
        "from raylog.actors.placement import DiskNode, place_topic\n"
        "disks = [DiskNode(f'disk-{i}', f'n{i}', f'10.0.0.{i}', True) for i in range(3)]\n"
        "print([r[0].identity for r in place_topic('clicks-and-views', 4, disks)])\n"
    )
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    assert runs == {str([r[0].identity for r in place_topic("clicks-and-views", 4, DISKS)]) + "\n"}


def test_one_replica_is_placed_without_replication(monkeypatch):
    """Replication factor 1 never reaches raylog.replication's assignment."""

    def refuse(*args, **kwargs):
        raise AssertionError("replication's assignment was asked to place an unreplicated topic")

    monkeypatch.setattr(placement, "assign_replicas", refuse)
    assert [len(r) for r in place_topic("clicks", 4, DISKS)] == [1, 1, 1, 1]
    with pytest.raises(AssertionError, match="unreplicated"):
        place_topic("clicks", 4, DISKS, replication_factor=2)


def test_replicas_start_at_the_partitions_own_node_on_distinct_nodes():
    unreplicated = place_topic("orders", 4, DISKS)
    for single, replicas in zip(unreplicated, place_topic("orders", 4, DISKS, replication_factor=3)):
        assert replicas[0] == single[0]
        assert len({d.identity for d in replicas}) == 3


def test_placing_without_enough_disk_nodes_is_a_clear_error():
    with pytest.raises(ConfigError, match="no alive Ray node offers local disk"):
        place_topic("clicks", 2, [])
    with pytest.raises(ConfigError, match="replication_factor 4 needs as many alive disk nodes"):
        place_topic("clicks", 2, DISKS, replication_factor=4)
