"""The first flexible version of each API the listener serves (compact
strings and arrays, tagged fields), on real ZooKeeper, Ray and sockets:
raw requests of Produce 9, Fetch 12, Metadata 9, ListOffsets 6,
FindCoordinator 3, JoinGroup 6, SyncGroup 4, Heartbeat 4, OffsetCommit 8,
OffsetFetch 6 and LeaveGroup 4, each answered and decoded by kafka-python's
own codec; what they store and commit checked against raylog's view."""

from __future__ import annotations

import uuid

import pytest
from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse, MetadataRequest, MetadataResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka_raw import RawKafka

from raylog.groups.offsets import OffsetStore
from raylog.storage.record_batch import encode_batch

WAIT_S = 60.0


def _topic(raylog_client) -> str:
    name = f"kflex-{uuid.uuid4().hex[:10]}"
    raylog_client.create_topic(name, partitions=1)
    return name


def test_produce_9_and_fetch_12_store_and_read_back_a_batch(raylog_client, kafka_config):
    topic = _topic(raylog_client)
    batch = encode_batch([b"flexible", None], [b"k", None], [[("h", b"v")], None])
    Topic = ProduceRequest.TopicProduceData
    with RawKafka(kafka_config) as raw:
        raw.authenticate()
        produced = raw.request(ProduceRequest[9](transactional_id=None, acks=-1, timeout_ms=30_000, topic_data=[
            Topic(name=topic, partition_data=[Topic.PartitionProduceData(index=0, records=batch)])]),
            ProduceResponse)
        (answer,) = produced.responses[0].partition_responses
        assert answer.error_code == 0 and answer.base_offset == 0
        FTopic = FetchRequest.FetchTopic
        fetched = raw.request(FetchRequest[12](
            replica_id=-1, max_wait_ms=1000, min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0,
            session_epoch=-1, topics=[FTopic(topic=topic, partitions=[FTopic.FetchPartition(
                partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1, log_start_offset=-1,
                partition_max_bytes=1 << 20)])], forgotten_topics_data=[], rack_id=""), FetchResponse)
    (partition,) = fetched.responses[0].partitions
    assert partition.error_code == 0 and partition.high_watermark > 0
    from raylog.storage.record_batch import decode_batch

    got = decode_batch(bytes(partition.records)).records
    assert [(r.key, r.value, r.headers) for r in got] == [(b"k", b"flexible", [("h", b"v")]), (None, None, [])]
    # raylog's own consumer sees what the flexible Produce stored
    with raylog_client.consumer(topic, auto_offset_reset="earliest") as consumer:
        seen = []
        for _ in range(100):
            seen.extend(consumer.poll(timeout_ms=200))
            if len(seen) >= 2:
                break
    assert [(m.key, m.value) for m in seen] == [(b"k", b"flexible"), (None, None)]


def test_metadata_9_list_offsets_6_and_find_coordinator_3(raylog_client, kafka_config, listeners):
    topic = _topic(raylog_client)
    with RawKafka(kafka_config) as raw:
        raw.authenticate()
        meta = raw.request(MetadataRequest[9](topics=[MetadataRequest.MetadataRequestTopic(name=topic)],
                                              allow_auto_topic_creation=False,
                                              include_cluster_authorized_operations=False,
                                              include_topic_authorized_operations=False), MetadataResponse)
        (found,) = meta.topics
        assert found.error_code == 0 and [p.partition_index for p in found.partitions] == [0]
        assert {(b.host, b.port) for b in meta.brokers} == {(e["host"], e["port"]) for e in listeners}
        LTopic = ListOffsetsRequest.ListOffsetsTopic
        offsets = raw.request(ListOffsetsRequest[6](replica_id=-1, isolation_level=0, topics=[LTopic(
            name=topic, partitions=[LTopic.ListOffsetsPartition(partition_index=0, current_leader_epoch=-1,
                                                                timestamp=-1)])]), ListOffsetsResponse)
        (latest,) = offsets.topics[0].partitions
        assert latest.error_code == 0 and latest.offset == raylog_client.offsets(topic, 0)[1]
        coordinator = raw.request(FindCoordinatorRequest[3](key=f"g-{uuid.uuid4().hex[:6]}", key_type=0),
                                  FindCoordinatorResponse)
        assert coordinator.error_code == 0 and coordinator.port in {e["port"] for e in listeners}


def test_a_group_joins_syncs_beats_commits_fetches_and_leaves_in_flexible_versions(raylog_client, kafka_config):
    topic, group = _topic(raylog_client), f"gflex-{uuid.uuid4().hex[:8]}"
    with RawKafka(kafka_config) as raw:
        raw.authenticate()
        Protocol = JoinGroupRequest.JoinGroupRequestProtocol
        join = JoinGroupRequest[6](group_id=group, session_timeout_ms=30_000, rebalance_timeout_ms=5_000,
                                   member_id="", group_instance_id=None, protocol_type="consumer",
                                   protocols=[Protocol(name="range", metadata=b"md")])
        joined = raw.request(join, JoinGroupResponse)
        if joined.error_code == 79:  # MEMBER_ID_REQUIRED (KIP-394): join again with the id given
            join = JoinGroupRequest[6](group_id=group, session_timeout_ms=30_000, rebalance_timeout_ms=5_000,
                                       member_id=joined.member_id, group_instance_id=None,
                                       protocol_type="consumer", protocols=[Protocol(name="range", metadata=b"md")])
            joined = raw.request(join, JoinGroupResponse)
        assert joined.error_code == 0 and joined.leader == joined.member_id
        me, generation = joined.member_id, joined.generation_id
        Assignment = SyncGroupRequest.SyncGroupRequestAssignment
        synced = raw.request(SyncGroupRequest[4](group_id=group, generation_id=generation, member_id=me,
                                                 group_instance_id=None,
                                                 assignments=[Assignment(member_id=me, assignment=b"all")]),
                             SyncGroupResponse)
        assert synced.error_code == 0 and bytes(synced.assignment) == b"all"
        beat = raw.request(HeartbeatRequest[4](group_id=group, generation_id=generation, member_id=me,
                                               group_instance_id=None), HeartbeatResponse)
        assert beat.error_code == 0
        CTopic = OffsetCommitRequest.OffsetCommitRequestTopic
        committed = raw.request(OffsetCommitRequest[8](
            group_id=group, generation_id_or_member_epoch=generation, member_id=me, group_instance_id=None,
            topics=[CTopic(name=topic, partitions=[CTopic.OffsetCommitRequestPartition(
                partition_index=0, committed_offset=0, committed_leader_epoch=-1, committed_metadata="")])]),
            OffsetCommitResponse)
        assert committed.topics[0].partitions[0].error_code == 0
        FTopic = OffsetFetchRequest.OffsetFetchRequestTopic
        fetched = raw.request(OffsetFetchRequest[6](group_id=group, topics=[FTopic(name=topic,
                                                                                   partition_indexes=[0])]),
                              OffsetFetchResponse)
        assert fetched.error_code == 0
        (partition,) = fetched.topics[0].partitions
        assert (partition.error_code, partition.committed_offset) == (0, 0)
        Member = LeaveGroupRequest.MemberIdentity
        left = raw.request(LeaveGroupRequest[4](group_id=group, members=[Member(member_id=me,
                                                                                group_instance_id=None)]),
                           LeaveGroupResponse)
        assert left.error_code == 0 and [m.error_code for m in left.members] == [0]
    assert OffsetStore(raylog_client._zk, raylog_client.settings.cluster).committed(group, topic, 0) == 0
