"""The range assignment and the moves of a cooperative rebalance, table-driven."""

from __future__ import annotations

import pytest

from raylog.groups.assignment import Moves, moves, parse_subscription, partition_count, range_assignment
from raylog.config import TopicConfig


def tps(topic, *ps):
    return frozenset((topic, p) for p in ps)


@pytest.mark.parametrize(
    "partitions, members, sizes",
    [
        (16, 2, [8, 8]),
        (16, 3, [6, 5, 5]),
        (16, 5, [4, 3, 3, 3, 3]),
        (8, 8, [1] * 8),
        (2, 3, [1, 1, 0]),
        (0, 2, [0, 0]),
        (1, 1, [1]),
    ],
)
def test_contiguous_ranges_in_member_order(partitions, members, sizes):
    ids = [f"c{i}" for i in range(members)]
    result = range_assignment({"t": partitions}, {m: ["t"] for m in reversed(ids)})
    start = 0
    for member, size in zip(ids, sizes):
        assert result[member] == tps("t", *range(start, start + size))
        start += size
    assert start == partitions


@pytest.mark.parametrize(
    "counts, subscriptions, expected",
    [
        # each topic divided among its own subscribers
        ({"a": 4, "b": 2}, {"x": ["a", "b"], "y": ["a"]},
         {"x": tps("a", 0, 1) | tps("b", 0, 1), "y": tps("a", 2, 3)}),
        # a topic that does not exist gives nothing
        ({}, {"x": ["gone"]}, {"x": frozenset()}),
        # a member without topics gets nothing and is still listed
        ({"a": 2}, {"x": ["a"], "y": []}, {"x": tps("a", 0, 1), "y": frozenset()}),
        # duplicate subscriptions count once
        ({"a": 2}, {"x": ["a", "a"], "y": ["a"]}, {"x": tps("a", 0), "y": tps("a", 1)}),
    ],
)
def test_assignment_table(counts, subscriptions, expected):
    assert range_assignment(counts, subscriptions) == expected


def test_every_partition_has_exactly_one_member():
    for members in range(1, 12):
        for partitions in range(0, 40, 3):
            result = range_assignment({"t": partitions}, {f"m{i:02d}": ["t"] for i in range(members)})
            union = [tp for parts in result.values() for tp in parts]
            assert sorted(union) == sorted(tps("t", *range(partitions)))


@pytest.mark.parametrize(
    "held, wanted, expected",
    [
        (tps("t", 0, 1, 2), tps("t", 0, 1, 2), Moves(tps("t", 0, 1, 2), frozenset(), frozenset())),
        (tps("t", 0, 1, 2, 3), tps("t", 0, 1), Moves(tps("t", 0, 1), tps("t", 2, 3), frozenset())),
        (tps("t", 0, 1), tps("t", 1, 2), Moves(tps("t", 1), tps("t", 0), tps("t", 2))),
        (frozenset(), tps("t", 5), Moves(frozenset(), frozenset(), tps("t", 5))),
    ],
)
def test_moves_keep_what_stays(held, wanted, expected):
    assert moves(held, wanted) == expected


def test_a_join_moves_only_part_of_the_partitions():
    before = range_assignment({"t": 32}, {f"m{i:02d}": ["t"] for i in range(4)})
    after = range_assignment({"t": 32}, {f"m{i:02d}": ["t"] for i in range(5)})
    moved = sum(len(moves(before.get(m, frozenset()), after[m]).claim) for m in after)
    assert 0 < moved < 32


def test_partition_count_and_subscription_parsing():
    assert partition_count(None) == 0
    assert partition_count(TopicConfig(partitions=7).to_json()) == 7
    assert partition_count(b'{"partitions": 3, "a_future_setting": 1}') == 3
    assert parse_subscription(b'{"topics": ["a", "b"]}') == ["a", "b"]
    assert parse_subscription(b"not json") is None
    assert parse_subscription(b'{"topics": [1]}') is None
