"""Kafka's group administration on raylog's groups: ListGroups,
DescribeGroups, DeleteGroups and OffsetDelete (docs/design.md section 10),
what ``kafka-consumer-groups --list/--describe/--delete/--delete-offsets``
and the admin clients send.

Both kinds of group are served alike: raylog's own (members under
``consumers/<group>/ids``, coordinated through ZooKeeper) and the
Kafka-protocol groups of :mod:`raylog.kafka.coordinator`. Each group has
one coordinating listener (:meth:`~raylog.kafka.coordinator.Coordinator.entry_for`,
what FindCoordinator answers), and a listener answers for the groups it
coordinates only (another group is NOT_COORDINATOR; ListGroups lists its
own), so a client that asks every listener sees every group once.

**What a group shows** (protocol type ``consumer`` throughout):

* a Kafka-protocol group coordinated here: its state machine's state
  (``Empty``, ``PreparingRebalance``, ``CompletingRebalance``, ``Stable``),
  its members with client id, client host, subscription and assignment (the
  bytes its leader sent; as Kafka does, the protocol, subscriptions and
  assignments only while ``Stable``);
* a group with live raylog members: ``Stable`` (raylog's members rebalance
  cooperatively among themselves; no group-wide phase is visible), protocol
  ``raylog``, each member with client id ``raylog``, the host of its consumer
  id (``<host>-<pid>-<random>``), its subscription encoded as Kafka's
  ``ConsumerProtocolSubscription`` v0 and the partitions it owns right now
  (its owner nodes) as a ``ConsumerProtocolAssignment`` v0;
* a group with committed offsets and no member: ``Empty``;
* any other name: ``Dead`` without members (DescribeGroups), as Kafka
  answers a group it does not know.

**Deleting.** DeleteGroups deletes a group's offsets and nodes through
:func:`raylog.groups.admin.delete_group`: refused with NON_EMPTY_GROUP while
it has live members (nothing deleted), GROUP_ID_NOT_FOUND for a group with
neither members nor committed offsets. OffsetDelete deletes the named
partitions' committed offsets (:func:`raylog.groups.admin.delete_group_offsets`);
a partition of a topic a live member reads is refused with
GROUP_SUBSCRIBED_TO_TOPIC and keeps its offset, one of a topic or partition
that does not exist is UNKNOWN_TOPIC_OR_PARTITION.

**Bounds.** A request naming more than :data:`MAX_GROUPS` groups, more than
:data:`MAX_PARTITIONS` topics and partitions together or more than
:data:`MAX_STATES` states
closes the connection (:class:`~raylog.kafka.frames.BadFrame`), before any
ZooKeeper read. Like every API but ApiVersions and SASL's, these are served
only after authentication (:mod:`raylog.kafka.handlers`).

Thread-safety: the functions keep no state; the coordinator is thread-safe.
"""

from __future__ import annotations

import logging

from kafka.protocol.admin import DeleteGroupsResponse, DescribeGroupsResponse, ListGroupsResponse
from kafka.protocol.consumer import OffsetDeleteResponse
from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment, ConsumerProtocolSubscription

from raylog.errors import GroupActiveError, RaylogError, UnknownGroupError, UnknownTopicError
from raylog.groups import admin as groups
from raylog.groups import kafka_members
from raylog.kafka.consumer_protocol import CONSUMER
from raylog.kafka.frames import BadFrame
from raylog.zk.errors import zookeeper_errors

log = logging.getLogger(__name__)

# Kafka error codes
NONE = 0
UNKNOWN_TOPIC_OR_PARTITION = 3
COORDINATOR_NOT_AVAILABLE = 15
NOT_COORDINATOR = 16
INVALID_GROUP_ID = 24
NON_EMPTY_GROUP = 68
GROUP_ID_NOT_FOUND = 69
GROUP_SUBSCRIBED_TO_TOPIC = 86
UNKNOWN_SERVER_ERROR = -1

# Kafka's group states
EMPTY, STABLE, DEAD = "Empty", "Stable", "Dead"

#: the most groups one DescribeGroups or DeleteGroups may name
MAX_GROUPS = 1000
#: the most topics and partitions, together, one OffsetDelete may name
MAX_PARTITIONS = 10_000
#: the most states one ListGroups' filter may name
MAX_STATES = 16
#: the protocol (assignor) name a group of raylog consumers is described with
RAYLOG_PROTOCOL = "raylog"
#: the client id a raylog member is described with
RAYLOG_CLIENT_ID = "raylog"


def _failure(err: RaylogError) -> int:
    """The code of a group whose state could not be read: retriable
    (ZooKeeper away) as COORDINATOR_NOT_AVAILABLE, so the client retries."""
    return COORDINATOR_NOT_AVAILABLE if getattr(err, "retriable", False) else UNKNOWN_SERVER_ERROR


def _bound(what: str, count: int, limit: int) -> None:
    if count > limit:
        raise BadFrame(f"a request naming {count} {what} (at most {limit} are served in one request)")


def _host_of(consumer_id: str) -> str:
    """The host of a raylog consumer id ``<host>-<pid>-<random>``, as Kafka shows hosts."""
    parts = consumer_id.rsplit("-", 2)
    return "/" + parts[0] if len(parts) == 3 else ""


def _subscription(topics) -> bytes:
    return ConsumerProtocolSubscription(version=0, topics=sorted(topics), user_data=None).encode()


def _assignment(partitions) -> bytes:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        by_topic.setdefault(topic, []).append(partition)
    TopicPartition = ConsumerProtocolAssignment.TopicPartition
    return ConsumerProtocolAssignment(
        version=0, assigned_partitions=[TopicPartition(topic=t, partitions=ps) for t, ps in by_topic.items()],
        user_data=None).encode()


def view(backend, group: str) -> dict:
    """What the listener shows of ``group`` (see the module docstring):
    ``{"state", "protocol_type", "protocol", "members", "committed"}``,
    each member ``{"member_id", "client_id", "client_host", "metadata",
    "assignment", "topics"}``. Raises :class:`raylog.RaylogError` when
    ZooKeeper does not answer."""
    zk, cluster = backend.zk, backend.settings.cluster
    here = backend.coordinator.snapshot(group)
    committed = groups.has_offsets(zk, cluster, group)
    if here is not None:
        return {**here, "committed": committed}
    members = []
    raylog_members = groups.live_members(zk, cluster, group)
    if raylog_members:
        owned: dict[str, list] = {}
        for tp, owner in groups.owners(zk, cluster, group).items():
            owned.setdefault(owner, []).append(tp)
        for member, topics in sorted(raylog_members.items()):
            members.append({"member_id": member, "client_id": RAYLOG_CLIENT_ID, "client_host": _host_of(member),
                            "metadata": _subscription(topics), "assignment": _assignment(owned.get(member, ())),
                            "topics": sorted(set(topics) | {t for t, _ in owned.get(member, ())})})
        protocol = RAYLOG_PROTOCOL
    else:  # Kafka members another listener published (it coordinated the group until the listeners changed)
        with zookeeper_errors(zk, f"read the Kafka members of group {group!r}"):
            published = kafka_members.details(zk, backend.paths, group)
        for member, d in sorted(published.items()):
            members.append({"member_id": member, "client_id": d["client_id"] or "", "client_host": "",
                            "metadata": _subscription(d["topics"]), "assignment": _assignment(d["assigned"]),
                            "topics": sorted(set(d["topics"]) | {t for t, _ in d["assigned"]})})
        protocol = ""
    if members:
        return {"state": STABLE, "protocol_type": CONSUMER, "protocol": protocol, "members": members,
                "committed": committed}
    return {"state": EMPTY if committed else DEAD, "protocol_type": CONSUMER if committed else "",
            "protocol": "", "members": [], "committed": committed}


def _state(backend, group: str) -> str:
    """The state :func:`view` shows, from fewer reads (what ListGroups needs)."""
    here = backend.coordinator.snapshot(group)
    if here is not None:
        return here["state"]
    zk, cluster = backend.zk, backend.settings.cluster
    if groups.live_members(zk, cluster, group):
        return STABLE
    with zookeeper_errors(zk, f"read the Kafka members of group {group!r}"):
        if kafka_members.live(zk, backend.paths, group):
            return STABLE
    return EMPTY if groups.has_offsets(zk, cluster, group) else DEAD


def list_groups(backend, body, version: int):
    """The groups this listener coordinates (with members or committed
    offsets), filtered by state from version 4 (Kafka's names, any case)."""
    states = list(getattr(body, "states_filter", None) or []) if version >= 4 else []
    _bound("states", len(states), MAX_STATES)
    wanted = {s.lower() for s in states}
    coordinator = backend.coordinator
    Listed = ListGroupsResponse.ListedGroup
    try:
        names = set(groups.list_groups(backend.zk, backend.settings.cluster)) | set(coordinator.group_ids())
        listed = []
        for group in sorted(names):
            if not coordinator.coordinates(group):
                continue
            state = _state(backend, group)
            if state == DEAD or (wanted and state.lower() not in wanted):
                continue
            listed.append(Listed(group_id=group, protocol_type=CONSUMER, group_state=state, group_type="classic"))
    except RaylogError as err:
        log.warning("ListGroups: reading the groups failed: %s", err)
        return ListGroupsResponse[version](throttle_time_ms=0, error_code=_failure(err), groups=[])
    return ListGroupsResponse[version](throttle_time_ms=0, error_code=NONE, groups=listed)


def describe_groups(backend, body, version: int):
    """Each named group as :func:`view` shows it."""
    names = list(body.groups or [])
    _bound("groups", len(names), MAX_GROUPS)
    Described = DescribeGroupsResponse.DescribedGroup
    Member = Described.DescribedGroupMember
    out = []
    for group in names:
        error, shown = NONE, None
        if not group:
            error = INVALID_GROUP_ID
        else:
            try:
                if not backend.coordinator.coordinates(group):
                    error = NOT_COORDINATOR
                else:
                    shown = view(backend, group)
            except RaylogError as err:
                error = _failure(err)
        if shown is None:
            out.append(Described(error_code=error, error_message=None, group_id=group or "", group_state=DEAD,
                                 protocol_type="", protocol_data="", members=[], authorized_operations=None))
            continue
        members = [Member(member_id=m["member_id"], group_instance_id=m.get("instance_id"), client_id=m["client_id"],
                          client_host=m["client_host"], member_metadata=bytes(m["metadata"]),
                          member_assignment=bytes(m["assignment"]))
                   for m in shown["members"]]
        out.append(Described(error_code=NONE, error_message=None, group_id=group, group_state=shown["state"],
                             protocol_type=shown["protocol_type"], protocol_data=shown["protocol"], members=members,
                             authorized_operations=None))
    return DescribeGroupsResponse[version](throttle_time_ms=0, groups=out)


def _delete_one(backend, group: str) -> int:
    if not group:
        return INVALID_GROUP_ID
    try:
        if not backend.coordinator.coordinates(group):
            return NOT_COORDINATOR
        shown = view(backend, group)
        if shown["members"]:
            return NON_EMPTY_GROUP
        if not shown["committed"]:
            return GROUP_ID_NOT_FOUND
        groups.delete_group(backend.zk, backend.settings.cluster, group)
        return NONE
    except GroupActiveError:
        return NON_EMPTY_GROUP
    except UnknownGroupError:
        return GROUP_ID_NOT_FOUND
    except RaylogError as err:
        log.warning("DeleteGroups: group %r: %s", group, err)
        return _failure(err)


def delete_groups(backend, body, version: int):
    """Delete each named group (see the module docstring)."""
    names = list(body.groups_names or [])
    _bound("groups", len(names), MAX_GROUPS)
    Result = DeleteGroupsResponse.DeletableGroupResult
    results = [Result(group_id=group or "", error_code=_delete_one(backend, group)) for group in names]
    return DeleteGroupsResponse[version](throttle_time_ms=0, results=results)


def offset_delete(backend, body, version: int):
    """Delete the group's committed offsets of the named partitions (see
    the module docstring)."""
    topics = list(body.topics or [])
    _bound("partitions", sum(len(t.partitions or []) for t in topics) + len(topics), MAX_PARTITIONS)
    Topic = OffsetDeleteResponse.OffsetDeleteResponseTopic
    Partition = Topic.OffsetDeleteResponsePartition
    group = body.group_id

    def answer(error: int, codes: dict | None = None):
        out = [Topic(name=t.name, partitions=[
            Partition(partition_index=p.partition_index, error_code=(codes or {}).get((t.name, p.partition_index),
                                                                                       NONE))
            for p in t.partitions or []]) for t in topics] if error == NONE else []
        return OffsetDeleteResponse[version](error_code=error, throttle_time_ms=0, topics=out)

    if not group:
        return answer(INVALID_GROUP_ID)
    try:
        if not backend.coordinator.coordinates(group):
            return answer(NOT_COORDINATOR)
        shown = view(backend, group)
        if not shown["members"] and not shown["committed"]:
            return answer(GROUP_ID_NOT_FOUND)
        consumed = {t for m in shown["members"] for t in m["topics"]}
        consumed |= set(groups.consumed_topics(backend.zk, backend.settings.cluster, group))
        registry = backend.metadata.registry
        codes, deletable = {}, set()
        counts: dict[str, int | None] = {}
        for t in topics:
            if t.name not in counts:
                try:
                    counts[t.name] = registry.topic_config(t.name).partitions
                except UnknownTopicError:
                    counts[t.name] = None
            for p in t.partitions or []:
                tp = (t.name, p.partition_index)
                if counts[t.name] is None or not 0 <= p.partition_index < counts[t.name]:
                    codes[tp] = UNKNOWN_TOPIC_OR_PARTITION
                elif t.name in consumed:
                    codes[tp] = GROUP_SUBSCRIBED_TO_TOPIC
                else:
                    deletable.add(tp)
        if deletable:
            try:
                groups.delete_group_offsets(backend.zk, backend.settings.cluster, group, deletable)
            except GroupActiveError as err:  # a member came meanwhile: nothing was deleted
                busy = set(err.details.get("topics") or ())
                codes.update({tp: GROUP_SUBSCRIBED_TO_TOPIC if tp[0] in busy else UNKNOWN_SERVER_ERROR
                              for tp in deletable})
            except UnknownGroupError:
                return answer(GROUP_ID_NOT_FOUND)
    except RaylogError as err:
        log.warning("OffsetDelete: group %r: %s", group, err)
        return answer(_failure(err))
    return answer(NONE, codes)
