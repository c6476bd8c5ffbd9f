"""Who gets which partition: the paper's range assignment, as a pure function
(the ``range`` assignor of :mod:`raylog.groups.assignors`, which holds the
pluggable interface and the other assignors), the moves of a cooperative
rebalance, and the reading of the nodes the assignment is computed from.

Every member of a group computes the same assignment from the same read of
ZooKeeper (the member ids with their subscriptions, and each subscribed
topic's partition count), so no leader is needed (docs/design.md §4).

For each topic, the members subscribed to it are sorted by id and the
partitions by number; member ``i`` of ``C`` takes a contiguous range of
``P // C`` partitions, plus one if ``i < P % C``.

:func:`moves` compares two assignments: what a member must give up
(``revoke``) and what it must take (``claim``). A cooperative rebalance
revokes only the first and claims only the second; everything else stays
owned and keeps flowing through the change.

Pure and stateless: no ZooKeeper, no threads, no clock.
"""

from __future__ import annotations

import json
from typing import Iterable, Mapping, NamedTuple

from raylog.config import TopicConfig
from raylog.errors import ConfigError

TopicPartition = tuple[str, int]
Assignment = frozenset[TopicPartition]


def range_assignment(
    partition_counts: Mapping[str, int],
    subscriptions: Mapping[str, Iterable[str]],
) -> dict[str, Assignment]:
    """``{member id: frozenset((topic, p))}`` for every member of ``subscriptions``.

    A topic missing from ``partition_counts`` has no partitions; a member
    may get nothing (more members than partitions).
    """
    subs = {member: frozenset(topics) for member, topics in subscriptions.items()}
    owned: dict[str, set[TopicPartition]] = {member: set() for member in subs}
    for topic in sorted({t for topics in subs.values() for t in topics}):
        members = sorted(m for m, ts in subs.items() if topic in ts)
        share, extra = divmod(max(0, partition_counts.get(topic, 0)), len(members))
        start = 0
        for i, member in enumerate(members):
            n = share + (1 if i < extra else 0)
            owned[member].update((topic, p) for p in range(start, start + n))
            start += n
    return {member: frozenset(parts) for member, parts in owned.items()}


class Moves(NamedTuple):
    """What one member does to go from ``held`` to ``wanted``."""

    keep: Assignment    # owned before and after: never unowned by the change
    revoke: Assignment  # to give up (commit, then release)
    claim: Assignment   # to take (once the previous owner released it)


def moves(held: Iterable[TopicPartition], wanted: Iterable[TopicPartition]) -> Moves:
    held, wanted = frozenset(held), frozenset(wanted)
    return Moves(keep=held & wanted, revoke=held - wanted, claim=wanted - held)


def partition_count(data: bytes | None) -> int:
    """The partition count in a topic node's JSON (0 for a missing node)."""
    if not data:
        return 0
    try:
        return TopicConfig.from_json(data).partitions
    except ConfigError:
        # Settings this version does not know; the count is all we need.
        count = json.loads(data).get("partitions")
        if not isinstance(count, int) or count < 0:
            raise
        return count


def parse_assignors(data: bytes | None) -> tuple[str, ...]:
    """The assignors a member's ``ids/<id>`` node lists, most preferred first:
    ``("range",)`` when it lists none (a member of an older version) or the
    list is unreadable."""
    try:
        names = json.loads(data).get("assignors")
    except (ValueError, AttributeError, TypeError):
        return ("range",)
    if isinstance(names, list) and names and all(isinstance(n, str) and n for n in names):
        return tuple(names)
    return ("range",)


def parse_subscription(data: bytes | None) -> list[str] | None:
    """The topics in a member's ``ids/<id>`` node, or None if unreadable."""
    try:
        topics = json.loads(data)["topics"]
    except (ValueError, KeyError, TypeError):
        return None
    if isinstance(topics, list) and all(isinstance(t, str) for t in topics):
        return topics
    return None
