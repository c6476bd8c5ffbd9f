"""A group's Kafka-protocol members, as ZooKeeper shows them.

Kafka clients that ``subscribe()`` through the Kafka listener are members
of a group coordinated in the memory of one listener
(:mod:`raylog.kafka.coordinator`). So that raylog's own consumers see them,
that listener keeps one ephemeral node per group while the group has
members there: ``consumers/<group>/kafka/<node>`` (:meth:`raylog.zk.paths.Paths.kafka_member_node`)
holding JSON::

    {"members": ["rdkafka-5c1e...", ...],          # member ids, sorted
     "details": {"rdkafka-5c1e...": {"client_id": "rdkafka",
                                     "topics": ["clicks"],            # its subscription
                                     "assigned": [["clicks", 0], ...]}}}  # its partitions

(``details`` and each of its fields may be missing: older listeners wrote
only ``members``). It goes away with the listener's ZooKeeper session, so a
listener that dies takes its members with it. :func:`details` is what
``describe_group`` shows of them.

A group is coordinated either by raylog (members under ``ids/``) or by the
Kafka protocol (members under ``kafka/``), never both:
:func:`check_no_kafka_members` is what a raylog member calls before it
joins, and the Kafka coordinator refuses a JoinGroup while ``ids/`` has
children. The two checks are not one transaction: a raylog consumer and a
Kafka client starting within the same few milliseconds can both get in.

Thread-safety: the functions keep no state; kazoo clients are thread-safe.
"""

from __future__ import annotations

import json

from kazoo.exceptions import NodeExistsError, NoNodeError

from raylog.errors import MixedGroupError


def publish(zk, paths, group: str, node: str, members) -> None:
    """Create or update the node of ``node``'s Kafka members of ``group``:
    ``members`` is a list of member ids or ``{member id: details}``."""
    path = paths.kafka_member_node(group, node)
    record = {"members": sorted(members)}
    if isinstance(members, dict):
        record["details"] = {m: members[m] for m in sorted(members)}
    data = json.dumps(record, sort_keys=True).encode()
    try:
        if zk.get(path)[0] != data:  # a read, not a write, when nothing changed
            zk.set(path, data)
        return
    except NoNodeError:
        pass
    try:
        zk.create(path, data, ephemeral=True, makepath=True)
    except NodeExistsError:
        zk.set(path, data)


def withdraw(zk, paths, group: str, node: str) -> None:
    """Delete the node: ``node`` coordinates no Kafka member of ``group`` now."""
    try:
        zk.delete(paths.kafka_member_node(group, node))
    except NoNodeError:
        pass


def _records(zk, paths, group: str) -> dict[str, dict]:
    """``{listener node: its record}`` (see the module docstring); a record
    that does not parse counts as having no members."""
    try:
        nodes = zk.get_children(paths.kafka_members(group))
    except NoNodeError:
        return {}
    found = {}
    for node in sorted(nodes):
        try:
            data, _ = zk.get(paths.kafka_member_node(group, node))
            record = json.loads(data)
        except NoNodeError:
            continue
        except ValueError:
            record = {}
        found[node] = record if isinstance(record, dict) else {}
    return found


def live(zk, paths, group: str) -> dict[str, list[str]]:
    """``{listener node: [member id, ...]}`` of the group's live Kafka members."""
    found = {}
    for node, record in _records(zk, paths, group).items():
        members = record.get("members")
        found[node] = [m for m in members if isinstance(m, str)] if isinstance(members, list) else []
    return {node: members for node, members in found.items() if members}


def details(zk, paths, group: str) -> dict[str, dict]:
    """``{member id: {"client_id", "topics", "assigned", "listener"}}`` of
    the group's live Kafka members (``topics``: its subscription;
    ``assigned``: ``[(topic, partition), ...]``; both empty when the
    listener did not say)."""
    out = {}
    for node, record in _records(zk, paths, group).items():
        members = record.get("members")
        extra = record.get("details") if isinstance(record.get("details"), dict) else {}
        for member in members if isinstance(members, list) else []:
            if not isinstance(member, str):
                continue
            d = extra.get(member) if isinstance(extra.get(member), dict) else {}
            topics = d.get("topics") if isinstance(d.get("topics"), list) else []
            assigned = d.get("assigned") if isinstance(d.get("assigned"), list) else []
            out[member] = {
                "client_id": d.get("client_id") if isinstance(d.get("client_id"), str) else None,
                "topics": sorted(t for t in topics if isinstance(t, str)),
                "assigned": sorted((a[0], a[1]) for a in assigned
                                   if isinstance(a, list) and len(a) == 2 and isinstance(a[0], str)
                                   and isinstance(a[1], int)),
                "listener": node,
            }
    return out


def check_no_kafka_members(zk, paths, group: str) -> None:
    """Raise :class:`raylog.errors.MixedGroupError` if the group has live
    Kafka-protocol members."""
    found = live(zk, paths, group)
    if found:
        count = sum(len(m) for m in found.values())
        raise MixedGroupError(
            f"consumer group {group!r} has {count} live Kafka-protocol member(s) (Kafka clients joined "
            f"through the Kafka listener); a raylog consumer cannot join it. Use another group name, or "
            f"close those Kafka consumers first", group=group, kafka_members=count)
