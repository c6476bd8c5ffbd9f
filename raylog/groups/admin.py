"""Administering consumer groups: list, describe, delete, reset offsets
(Kafka's ``kafka-consumer-groups``), from any ZooKeeper client of the cluster.

::

    list_groups(zk, "default")                              # ['analytics', 'billing']
    describe_group(zk, "default", "analytics", partition_info=info, timeout_s=5)
    delete_group(zk, "default", "analytics")                # refused while members are alive
    plan = reset_offsets(zk, "default", "analytics", "clicks", targets)   # dry run: the plan only
    reset_offsets(zk, "default", "analytics", "clicks", targets, dry_run=False)
    delete_group_offsets(zk, "default", "analytics", {("clicks", 0)})   # refused while a member reads clicks

This module reads and writes ZooKeeper only. What only the partitions' data
servers know (a partition's end, an estimate of message sizes, the offset
for a timestamp) comes in through callbacks, which :class:`raylog.Client`
provides.

:func:`describe_group` returns one row (a dict) per partition of every topic
the group subscribes to, owns or has committed offsets for:

============================  ==============================================================
key                           value
============================  ==============================================================
``group``                     the group name
``topic``, ``partition``      the partition
``topic_exists``              False for a topic deleted since the group committed
``owner``                     the consumer id holding the partition's owner node, or None
``committed``                 the committed byte offset (the next offset to read), or None
``end_offset``                the partition's high watermark, None if it did not answer in time
``lag_bytes``                 ``end_offset - committed`` in **bytes** (not clamped: a negative
                              value means the committed offset is past the end)
``lag_messages``              the lag in **messages**, counted by the partition: the records a
                              reader from the committed offset gets up to ``end_offset`` (from
                              the log start when the committed offset is before it; 0 past the
                              end), from its segments' record counts (COUNT,
                              :mod:`raylog.storage.countindex`); None without a committed
                              offset or when the count failed
``lag_messages_estimate``     an **estimate** of the lag in messages: ``lag_bytes`` divided by
                              the mean size of the messages at the committed offset (a sample)
``members``                   the group's live members subscribed to the topic
============================  ==============================================================

A group of Kafka clients (coordinated by a Kafka listener,
:mod:`raylog.groups.kafka_members`) is described the same way: its members
with the topics of their subscriptions, a partition's ``owner`` the member
its leader assigned it to; :func:`list_groups` lists it while it has
members, before any commit.

followed by one row per live member that owns no partition (``topic`` and
``partition`` None). Data-server queries run concurrently under one overall
deadline (``timeout_s``); a partition that does not answer in time shows
``None`` rather than delaying the others. A snapshot, not a transaction.

Thread-safety: stateless functions; kazoo's client is thread-safe.
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Callable, Mapping

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError, NotEmptyError

from raylog.errors import ConfigError, GroupActiveError, UnknownGroupError
from raylog.groups import kafka_members
from raylog.groups.assignment import parse_subscription, partition_count
from raylog.groups.offsets import OffsetStore, REQUEST_TIMEOUT_S
from raylog.zk.errors import ensure_connected, zookeeper_errors
from raylog.zk.paths import Paths

#: the most partitions queried at once by describe_group
DESCRIBE_CONCURRENCY = 16

TopicPartition = tuple[str, int]


def _children(zk: KazooClient, path: str) -> list[str]:
    try:
        return zk.get_children_async(path).get(timeout=REQUEST_TIMEOUT_S)
    except NoNodeError:
        return []


def _get_many(zk: KazooClient, paths: list[str]) -> list:
    """Read several nodes at once; a missing node comes back as None."""
    requests = [zk.get_async(p) for p in paths]
    out = []
    for request in requests:
        try:
            out.append(request.get(timeout=REQUEST_TIMEOUT_S))
        except NoNodeError:
            out.append(None)
    return out


def list_groups(zk: KazooClient, cluster: str) -> list[str]:
    """The names of the cluster's consumer groups (with members or committed offsets), sorted."""
    paths = Paths(cluster)
    what = f"list the consumer groups of cluster {cluster!r}"
    ensure_connected(zk, what)
    with zookeeper_errors(zk, what):
        groups = []
        for group in _children(zk, paths.groups):
            if (_children(zk, paths.ids(group)) or _children(zk, paths.all_offsets(group))
                    or _children(zk, paths.kafka_members(group))):
                groups.append(group)
    return sorted(groups)


def live_members(zk: KazooClient, cluster: str, group: str) -> dict[str, list[str]]:
    """``{member id: subscribed topics}`` of the group's live members."""
    paths = Paths(cluster)
    with zookeeper_errors(zk, f"read the members of group {group!r}"):
        names = sorted(_children(zk, paths.ids(group)))
        results = _get_many(zk, [paths.member(group, m) for m in names])
    return {m: (parse_subscription(r[0]) or []) for m, r in zip(names, results) if r is not None}


def describe_group(
    zk: KazooClient,
    cluster: str,
    group: str,
    partition_info: Callable[[str, int, int | None], tuple[int | None, float | None]] | None = None,
    *,
    timeout_s: float = 5.0,
) -> list[dict]:
    """Rows describing ``group`` (see the module docstring).

    ``partition_info(topic, partition, committed)`` returns ``(end offset,
    mean message size in bytes or None, messages from committed to the end
    or None)``; with it, rows carry ``end_offset``, ``lag_bytes``,
    ``lag_messages`` and ``lag_messages_estimate``. All calls
    share one deadline of ``timeout_s``. Raises
    :class:`raylog.UnknownGroupError` for a group with neither live members
    nor committed offsets.
    """
    paths = Paths(cluster)
    what = f"describe consumer group {group!r}"
    ensure_connected(zk, what)
    deadline = time.monotonic() + timeout_s
    members = live_members(zk, cluster, group)
    with zookeeper_errors(zk, what):
        # a group of Kafka clients (through the Kafka listener): its members,
        # their subscriptions and assignments as the coordinating listener shows them
        kafka = kafka_members.details(zk, paths, group)
        members.update((m, d["topics"]) for m, d in kafka.items())
        committed = OffsetStore(zk, cluster).committed_all(group)
        if not members and not committed:
            raise UnknownGroupError(
                f"consumer group {group!r} of cluster {cluster!r} has no members and no committed "
                f"offsets; see list_groups() for the groups that exist",
                group=group,
            )
        topics = {t for ts in members.values() for t in ts}
        topics |= {t for t, _ in committed}
        topics |= set(_children(zk, paths.all_owners(group)))
        topics |= {t for d in kafka.values() for t, _ in d["assigned"]}
        topics = sorted(topics)
        configs = dict(zip(topics, _get_many(zk, [paths.topic(t) for t in topics])))
        partitions: set[TopicPartition] = set(committed)
        for topic, result in configs.items():
            if result is not None:
                partitions.update((topic, p) for p in range(partition_count(result[0])))
        owner_names = {t: _children(zk, paths.owners(group, t)) for t in topics}
        owner_tps = [(t, int(n)) for t, names in owner_names.items() for n in names if n.isdigit()]
        owners = {
            tp: r[0].decode(errors="replace")
            for tp, r in zip(owner_tps, _get_many(zk, [paths.owner(group, *tp) for tp in owner_tps]))
            if r is not None
        }
        for member, d in kafka.items():
            for tp in d["assigned"]:
                owners.setdefault(tp, member)
        partitions |= set(owners)

    info: dict[TopicPartition, tuple] = {}
    if partition_info is not None and partitions:
        # Every partition at once (bounded), one deadline for all.
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(DESCRIBE_CONCURRENCY, len(partitions)))
        try:
            futures = {
                pool.submit(partition_info, t, p, committed.get((t, p))): (t, p)
                for t, p in sorted(partitions) if configs.get(t) is not None
            }
            done, _ = concurrent.futures.wait(futures, timeout=max(0.0, deadline - time.monotonic()))
            for future in done:
                if future.exception() is None:
                    info[futures[future]] = future.result()
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    rows = []
    for topic, partition in sorted(partitions):
        offset = committed.get((topic, partition))
        row = {
            "group": group,
            "topic": topic,
            "partition": partition,
            "topic_exists": configs.get(topic) is not None,
            "owner": owners.get((topic, partition)),
            "committed": offset,
            "members": sorted(m for m, ts in members.items() if topic in ts),
        }
        if partition_info is not None:
            end, mean_size, counted = info.get((topic, partition), (None, None, None))
            lag = None if offset is None or end is None else end - offset
            row["end_offset"] = end
            row["lag_bytes"] = lag
            row["lag_messages"] = None if offset is None else counted
            row["lag_messages_estimate"] = (
                None if lag is None or not mean_size else (0 if lag <= 0 else max(1, round(lag / mean_size))))
        rows.append(row)
    busy = set(owners.values())
    for member in sorted(members):
        if member not in busy:
            row = {"group": group, "topic": None, "partition": None, "topic_exists": None, "owner": member,
                   "committed": None, "members": sorted(members)}
            if partition_info is not None:
                row.update(end_offset=None, lag_bytes=None, lag_messages=None, lag_messages_estimate=None)
            rows.append(row)
    return rows


def owners(zk: KazooClient, cluster: str, group: str) -> dict[TopicPartition, str]:
    """``{(topic, partition): consumer id}`` of the partitions the group's
    raylog members own right now (their owner nodes)."""
    paths = Paths(cluster)
    with zookeeper_errors(zk, f"read the partition owners of group {group!r}"):
        tps = [(t, int(n)) for t in _children(zk, paths.all_owners(group))
               for n in _children(zk, paths.owners(group, t)) if n.isdigit()]
        return {tp: r[0].decode(errors="replace")
                for tp, r in zip(tps, _get_many(zk, [paths.owner(group, *tp) for tp in tps])) if r is not None}


def has_offsets(zk: KazooClient, cluster: str, group: str) -> bool:
    """Whether the group has a committed offset (one node read per topic at most)."""
    paths = Paths(cluster)
    with zookeeper_errors(zk, f"read the committed offsets of group {group!r}"):
        return any(_children(zk, paths.offsets(group, t)) for t in _children(zk, paths.all_offsets(group)))


def refuse_if_active(zk: KazooClient, cluster: str, group: str, doing: str) -> None:
    """Raise :class:`raylog.GroupActiveError` if ``group`` has live members
    (raylog's, or Kafka clients' through the Kafka listener)."""
    members = live_members(zk, cluster, group)
    with zookeeper_errors(zk, f"read the Kafka members of group {group!r}"):
        members.update((m, []) for ms in kafka_members.live(zk, Paths(cluster), group).values() for m in ms)
    if members:
        raise GroupActiveError(
            f"cannot {doing} consumer group {group!r}: it has {len(members)} live member(s) "
            f"({', '.join(sorted(members))}); stop them first (their commits would race with this)",
            group=group, members=sorted(members),
        )


def delete_group(zk: KazooClient, cluster: str, group: str) -> None:
    """Delete a group's committed offsets and nodes. Refused
    (:class:`raylog.GroupActiveError`) while it has live members;
    :class:`raylog.UnknownGroupError` if there is no such group."""
    paths = Paths(cluster)
    what = f"delete consumer group {group!r}"
    ensure_connected(zk, what)
    refuse_if_active(zk, cluster, group, "delete")
    with zookeeper_errors(zk, what):
        if not zk.exists(paths.group(group)):
            raise UnknownGroupError(f"consumer group {group!r} of cluster {cluster!r} does not exist; "
                                    f"see list_groups()", group=group)
        for child in ("offsets", "owners"):
            try:
                zk.delete(f"{paths.group(group)}/{child}", recursive=True)
            except NoNodeError:
                pass
        try:
            zk.delete(paths.kafka_members(group))  # left empty by Kafka members gone
        except NoNodeError:
            pass
        except NotEmptyError:
            raise GroupActiveError(f"a Kafka client joined consumer group {group!r} while it was being deleted; "
                                   f"its offsets are gone, the group lives on", group=group) from None
        try:
            try:
                zk.delete(paths.ids(group))
            except NoNodeError:  # a group of Kafka clients, or of commits alone, never had one
                pass
            zk.delete(paths.group(group))
        except NoNodeError:
            pass
        except NotEmptyError:
            raise GroupActiveError(f"a member joined consumer group {group!r} while it was being deleted; "
                                   f"its offsets are gone, the group lives on", group=group) from None


def consumed_topics(zk: KazooClient, cluster: str, group: str) -> dict[str, list[str]]:
    """``{topic: [member id, ...]}`` of the topics the group's live members
    read: raylog members' subscriptions, Kafka members' subscriptions and
    assigned partitions (as their coordinating listener publishes them)."""
    paths = Paths(cluster)
    found: dict[str, set[str]] = {}
    for member, topics in live_members(zk, cluster, group).items():
        for topic in topics:
            found.setdefault(topic, set()).add(member)
    with zookeeper_errors(zk, f"read the Kafka members of group {group!r}"):
        for member, d in kafka_members.details(zk, paths, group).items():
            for topic in set(d["topics"]) | {t for t, _ in d["assigned"]}:
                found.setdefault(topic, set()).add(member)
    return {topic: sorted(members) for topic, members in sorted(found.items())}


def delete_group_offsets(zk: KazooClient, cluster: str, group: str, partitions) -> list[TopicPartition]:
    """Delete the group's committed offsets of ``partitions`` (an iterable
    of ``(topic, partition)``; Kafka's OffsetDelete). Returns the pairs that
    had one, sorted; a pair without one is no error. Refused as a whole
    (:class:`raylog.GroupActiveError`, nothing deleted) when a live member
    reads one of the topics named; :class:`raylog.UnknownGroupError` for a
    group with neither live members nor committed offsets; a pair that is
    not ``(str, int >= 0)`` is a :class:`raylog.ConfigError`."""
    pairs = set()
    for pair in partitions:
        if (not isinstance(pair, tuple) or len(pair) != 2 or not isinstance(pair[0], str) or not pair[0]
                or not isinstance(pair[1], int) or isinstance(pair[1], bool) or pair[1] < 0):
            raise ConfigError(f"a partition is a (topic, partition number) pair, got {pair!r}")
        pairs.add(pair)
    what = f"delete committed offsets of consumer group {group!r}"
    ensure_connected(zk, what)
    paths = Paths(cluster)
    consumed = consumed_topics(zk, cluster, group)
    busy = sorted({t for t, _ in pairs} & set(consumed))
    if busy:
        members = sorted({m for t in busy for m in consumed[t]})
        raise GroupActiveError(
            f"cannot delete the committed offsets of consumer group {group!r} for topic(s) {', '.join(busy)}: "
            f"live member(s) {', '.join(members)} read them; stop them first (nothing was deleted)",
            group=group, members=members, topics=busy)
    committed = OffsetStore(zk, cluster).committed_all(group)
    if not committed and not consumed and not live_members(zk, cluster, group):
        raise UnknownGroupError(f"consumer group {group!r} of cluster {cluster!r} has no members and no committed "
                                f"offsets; see list_groups()", group=group)
    deleted = []
    with zookeeper_errors(zk, what):
        for topic, partition in sorted(pairs):
            if (topic, partition) not in committed:
                continue
            try:
                zk.delete(paths.offset(group, topic, partition))
                deleted.append((topic, partition))
            except NoNodeError:
                pass
        for topic in sorted({t for t, _ in deleted}):
            try:
                zk.delete(paths.offsets(group, topic))  # the topic's last offset gone: its node too
            except (NoNodeError, NotEmptyError):
                pass
    return deleted


def reset_offsets(
    zk: KazooClient,
    cluster: str,
    group: str,
    topic: str,
    targets: Mapping[int, int],
    *,
    dry_run: bool = True,
) -> list[dict]:
    """Set the group's committed offsets of ``topic`` to ``targets``
    (``{partition: offset}``, resolved by the caller from earliest / latest /
    a timestamp / an offset). Returns one row per partition: ``partition``,
    ``current`` (committed now, or None) and ``new``. With ``dry_run`` (the
    default) nothing is written. Refused (:class:`raylog.GroupActiveError`)
    while the group has live members."""
    what = f"reset the offsets of consumer group {group!r}"
    ensure_connected(zk, what)
    refuse_if_active(zk, cluster, group, "reset the offsets of")
    store = OffsetStore(zk, cluster)
    for partition, offset in targets.items():
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise ConfigError(f"partition {partition}: an offset is a non-negative byte position, got {offset!r}")
    current = store.committed_all(group)
    rows = [{"group": group, "topic": topic, "partition": p, "current": current.get((topic, p)), "new": offset}
            for p, offset in sorted(targets.items())]
    if not dry_run:
        for row in rows:
            store.commit(group, topic, row["partition"], row["new"])
    return rows


def delete_topic_offsets(zk: KazooClient, cluster: str, topic: str) -> list[str]:
    """Delete every group's committed offsets of ``topic`` (a deleted topic:
    its byte offsets would point mid-message in a re-created one). Returns
    the groups that had some."""
    paths = Paths(cluster)
    what = f"delete the committed offsets of topic {topic!r}"
    ensure_connected(zk, what)
    cleared = []
    with zookeeper_errors(zk, what):
        for group in _children(zk, paths.groups):
            try:
                zk.delete(paths.offsets(group, topic), recursive=True)
                cleared.append(group)
            except NoNodeError:
                pass
    return sorted(cleared)
