"""Inspecting consumer groups: which groups exist, who owns what, how far behind.

Read-only; works from any ZooKeeper client of the cluster (no membership)::

    list_groups(zk, "default")                   # ['analytics', 'billing']
    describe_group(zk, "default", "analytics", end_offsets=client_end_offset)

:func:`describe_group` returns one row (a dict) per partition of every topic
the group subscribes to, owns or has committed offsets for:

=============  ==============================================================
key            value
=============  ==============================================================
``group``      the group name
``topic``      the topic
``partition``  the partition number
``owner``      the consumer id holding the partition's owner node, or None
``committed``  the committed offset (the next offset to read), or None
``end_offset`` ``end_offsets(topic, partition)`` (only with ``end_offsets``)
``lag``        ``end_offset - committed``, None when nothing is committed
               (only with ``end_offsets``)
``members``    the ids of the group's live members subscribed to the topic
               (all live members on an idle member's row)
=============  ==============================================================

followed by one row per live member that owns no partition (``topic`` and
``partition`` None, ``owner`` the member id), so idle members show too, as in
Kafka's ``ConsumerGroupCommand``. A snapshot, not a transaction: during a
rebalance some partitions may show no owner.
"""

from __future__ import annotations

import json
from typing import Callable

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from raylog.errors import UnknownGroupError
from raylog.groups.assignment import partition_count
from raylog.groups.offsets import OffsetStore
from raylog.groups.zkerrors import ensure_connected, zookeeper_errors
from raylog.groups.paths import Paths


def _children(zk: KazooClient, path: str) -> list[str]:
    try:
        return zk.get_children(path)
    except NoNodeError:
        return []


def list_groups(zk: KazooClient, cluster: str) -> list[str]:
    """The names of the cluster's consumer groups (with members or committed offsets), sorted."""
    paths = Paths(cluster)
    what = f"list the consumer groups of cluster {cluster!r}"
    ensure_connected(zk, what)
    with zookeeper_errors(zk, what):
        groups = []
        for group in _children(zk, paths.groups):
            if _children(zk, paths.ids(group)) or _children(zk, f"{paths.group(group)}/offsets"):
                groups.append(group)
    return sorted(groups)


def describe_group(
    zk: KazooClient,
    cluster: str,
    group: str,
    end_offsets: Callable[[str, int], int] | None = None,
) -> list[dict]:
    """Rows describing ``group`` (see the module docstring).

    ``end_offsets(topic, partition)`` gives a partition's end (the offset
    the next message will get); with it, rows carry ``end_offset`` and
    ``lag``. Raises :class:`raylog.UnknownGroupError` for a group with
    neither live members nor committed offsets.
    """
    paths = Paths(cluster)
    what = f"describe consumer group {group!r}"
    ensure_connected(zk, what)
    with zookeeper_errors(zk, what):
        members: dict[str, list[str]] = {}
        for member in _children(zk, paths.ids(group)):
            try:
                data, _ = zk.get(paths.member(group, member))
            except NoNodeError:
                continue
            try:
                topics = json.loads(data)["topics"]
            except (ValueError, KeyError, TypeError):
                topics = []
            members[member] = [t for t in topics if isinstance(t, str)]
        committed = OffsetStore(zk, cluster).committed_all(group)
        if not members and not committed:
            raise UnknownGroupError(
                f"consumer group {group!r} of cluster {cluster!r} has no members and no committed "
                f"offsets; see list_groups() for the groups that exist",
                group=group,
            )

        topics = {t for ts in members.values() for t in ts}
        topics |= {t for t, _ in committed}
        owners_root = f"{paths.group(group)}/owners"
        topics |= set(_children(zk, owners_root))

        owners: dict[tuple[str, int], str] = {}
        partitions: set[tuple[str, int]] = set(committed)
        for topic in topics:
            try:
                data, _ = zk.get(paths.topic(topic))
                partitions.update((topic, p) for p in range(partition_count(data)))
            except NoNodeError:
                pass  # deleted topic: still show what the group has for it
            for name in _children(zk, paths.owners(group, topic)):
                if not name.isdigit():
                    continue
                try:
                    data, _ = zk.get(paths.owner(group, topic, int(name)))
                except NoNodeError:
                    continue
                owners[(topic, int(name))] = data.decode(errors="replace")
                partitions.add((topic, int(name)))

    rows = []
    for topic, partition in sorted(partitions):
        offset = committed.get((topic, partition))
        row = {
            "group": group,
            "topic": topic,
            "partition": partition,
            "owner": owners.get((topic, partition)),
            "committed": offset,
            "members": sorted(m for m, ts in members.items() if topic in ts),
        }
        if end_offsets is not None:
            end = end_offsets(topic, partition)  # None: the partition is unreachable now
            row["end_offset"] = end
            row["lag"] = None if offset is None or end is None else max(0, end - offset)
        rows.append(row)
    busy = set(owners.values())
    for member in sorted(members):
        if member not in busy:
            row = {"group": group, "topic": None, "partition": None, "owner": member,
                   "committed": None, "members": sorted(members)}
            if end_offsets is not None:
                row["end_offset"] = None
                row["lag"] = None
            rows.append(row)
    return rows
