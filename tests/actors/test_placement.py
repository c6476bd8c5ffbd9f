"""Placement: which nodes hold partitions and how actors are pinned to them
(pure logic over ``ray.nodes()``-shaped records)."""

from __future__ import annotations

import pytest

from raylog.actors.placement import DISK_RESOURCE, NODE_LABEL, disk_nodes, node_identity, scheduling_options, spread
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
