"""Kafka's FindCoordinator, OffsetCommit and OffsetFetch on raylog's group
offsets (docs/design.md section 10): a Kafka group's committed offsets are
stored where raylog's groups keep theirs
(``consumers/<group>/offsets/<topic>/<p>``, :class:`raylog.groups.offsets.OffsetStore`),
so ``raylog groups describe`` shows them and a raylog consumer of the same
group resumes there, and the other way round.

A commit with a member id and generation (a member of a Kafka-protocol
group, ``subscribe`` + ``commit``) is checked against the group's state
in the listener's :class:`raylog.kafka.coordinator.Coordinator`
(UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, REBALANCE_IN_PROGRESS as Kafka
answers them); one without (generation -1: ``assign`` + ``commit``) is
accepted while the group has no Kafka-protocol members. A commit to a group
that has raylog members right now is refused (UNKNOWN_MEMBER_ID): the
Kafka client is not one of them. FindCoordinator answers the listener that
coordinates the group (:meth:`raylog.kafka.coordinator.Coordinator.entry_for`).
Kafka's per-offset metadata string is not kept (answered empty).

Thread-safety: the functions keep no state.
"""

from __future__ import annotations

from kafka.protocol.consumer import OffsetCommitResponse, OffsetFetchResponse
from kafka.protocol.metadata import FindCoordinatorResponse
from kazoo.exceptions import NoNodeError

from raylog.errors import RaylogError

NONE = 0
UNKNOWN_TOPIC_OR_PARTITION = 3
COORDINATOR_NOT_AVAILABLE = 15
UNKNOWN_MEMBER_ID = 25
INVALID_REQUEST = 42
UNKNOWN_SERVER_ERROR = -1


def find_coordinator(body, version: int, entry: dict):
    """The listener ``entry`` coordinates the group (key type 0)."""
    if getattr(body, "key_type", 0) != 0:
        return FindCoordinatorResponse[version](
            throttle_time_ms=0, error_code=COORDINATOR_NOT_AVAILABLE,
            error_message="raylog has no transaction coordinator", node_id=-1, host="", port=-1)
    return FindCoordinatorResponse[version](throttle_time_ms=0, error_code=NONE, error_message=None,
                                            node_id=entry["broker_id"], host=entry["host"], port=entry["port"])


def _raylog_members(zk, paths, group: str) -> list[str]:
    try:
        return zk.get_children(paths.ids(group))
    except NoNodeError:
        return []


def offset_commit(body, version: int, store, registry, coordinator=None):
    """Store each offset (a raylog offset: the next one to read), if the
    group's ``coordinator`` allows the commit."""
    Topic = OffsetCommitResponse.OffsetCommitResponseTopic
    Partition = Topic.OffsetCommitResponsePartition
    members = _raylog_members(store.zk, store.paths, body.group_id)
    group_error = NONE
    if not members and coordinator is not None:
        generation = getattr(body, "generation_id_or_member_epoch", getattr(body, "generation_id", -1))
        group_error = coordinator.check_commit(body.group_id, getattr(body, "member_id", None) or "", generation,
                                               getattr(body, "group_instance_id", None) or None)
    topics = []
    for topic in body.topics:
        partitions = []
        count = None
        if not members:
            try:
                count = registry.topic_config(topic.name).partitions
            except RaylogError:
                count = None
        for p in topic.partitions:
            if members:
                code = UNKNOWN_MEMBER_ID  # a group of raylog consumers right now
            elif group_error != NONE:
                code = group_error
            elif count is None or not 0 <= p.partition_index < count:
                code = UNKNOWN_TOPIC_OR_PARTITION
            elif p.committed_offset < 0:
                code = INVALID_REQUEST
            else:
                try:
                    store.commit(body.group_id, topic.name, p.partition_index, p.committed_offset)
                    code = NONE
                except RaylogError:
                    code = UNKNOWN_SERVER_ERROR
            partitions.append(Partition(partition_index=p.partition_index, error_code=code))
        topics.append(Topic(name=topic.name, partitions=partitions))
    return OffsetCommitResponse[version](throttle_time_ms=0, topics=topics)


def offset_fetch(body, version: int, store):
    """The committed offsets (-1 where none)."""
    Topic = OffsetFetchResponse.OffsetFetchResponseTopic
    Partition = Topic.OffsetFetchResponsePartition
    if body.topics is None:
        wanted: dict[str, list[int]] = {}
        for (topic, partition) in sorted(store.committed_all(body.group_id)):
            wanted.setdefault(topic, []).append(partition)
    else:
        wanted = {t.name: list(t.partition_indexes) for t in body.topics}
    topics = []
    for name, indexes in wanted.items():
        partitions = []
        for index in indexes:
            try:
                offset, code = store.committed(body.group_id, name, index), NONE
            except RaylogError:
                offset, code = None, UNKNOWN_SERVER_ERROR
            partitions.append(Partition(partition_index=index, committed_offset=-1 if offset is None else offset,
                                        committed_leader_epoch=-1, metadata="", error_code=code))
        topics.append(Topic(name=name, partitions=partitions))
    return OffsetFetchResponse[version](throttle_time_ms=0, topics=topics, error_code=NONE)
