"""ListGroups, DescribeGroups, DeleteGroups and OffsetDelete
(raylog.kafka.group_admin) with kafka-python's KafkaAdminClient and
confluent-kafka's AdminClient against the listeners of a real embedded
cluster (real ZooKeeper, Ray and sockets), on both kinds of group: a group
of raylog consumers and a Kafka-protocol group of confluent-kafka
consumers. Each answer is checked against raylog's own view
(``list_groups``, ``describe_group``, the committed offsets); a group with
a live member is refused and keeps everything."""

from __future__ import annotations

import socket
import time
import uuid

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")

from confluent_kafka import ConsumerGroupState, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402

from raylog.groups.offsets import OffsetStore  # noqa: E402

WAIT_S = 60.0


def _topic(raylog_client, partitions: int) -> str:
    name = f"kga-{uuid.uuid4().hex[:12]}"
    raylog_client.create_topic(name, partitions=partitions)
    return name


def _produce(raylog_client, topic: str, partitions: int, count: int = 20) -> None:
    with raylog_client.producer() as producer:
        for i in range(count):
            producer.send(topic, f"m{i}".encode(), partition=i % partitions)
        producer.flush(WAIT_S)


def _committed(raylog_client, group: str) -> dict:
    return OffsetStore(raylog_client._zk, raylog_client.settings.cluster).committed_all(group)


def _kafka_python_admin(config: dict):
    from kafka.admin import KafkaAdminClient

    return KafkaAdminClient(
        bootstrap_servers=config["bootstrap.servers"].split(","), security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-256", sasl_plain_username=config["sasl.username"],
        sasl_plain_password=config["sasl.password"])


def _wait(predicate, what: str):
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"no {what} within {WAIT_S} s"
        time.sleep(0.2)


def _raylog_group(raylog_client, topic: str, partitions: int, group: str):
    """A live raylog consumer of ``group`` that read ``topic`` and committed."""
    consumer = raylog_client.consumer([topic], group=group, enable_auto_commit=False,
                                      auto_offset_reset="earliest")
    got = []
    deadline = time.monotonic() + WAIT_S
    while len(got) < 20 or len(consumer.assignment()) < partitions:
        assert time.monotonic() < deadline, "the raylog consumer read nothing"
        got += consumer.poll(timeout_ms=200)
    consumer.commit()
    return consumer


def _confluent_group(config: dict, topic: str, partitions: int, group: str):
    """A live confluent-kafka consumer of ``group`` that read ``topic`` and committed."""
    consumer = confluent_kafka.Consumer({
        **config, "group.id": group, "enable.auto.commit": False, "auto.offset.reset": "earliest",
        "session.timeout.ms": 6000, "heartbeat.interval.ms": 300, "fetch.wait.max.ms": 100,
        "client.id": "group-admin-test"})
    consumer.subscribe([topic])
    got = 0
    deadline = time.monotonic() + WAIT_S
    while got < 20 or len(consumer.assignment()) < partitions:
        assert time.monotonic() < deadline, "the Kafka consumer read nothing"
        msg = consumer.poll(0.2)
        if msg is not None and msg.error() is None:
            got += 1
    consumer.commit(asynchronous=False)
    return consumer


def _owners(raylog_client, group: str) -> dict:
    """``{member: {(topic, partition), ...}}`` as raylog's describe_group shows them."""
    out: dict = {}
    for row in raylog_client.describe_group(group):
        if row["topic"] is not None and row["owner"] is not None:
            out.setdefault(row["owner"], set()).add((row["topic"], row["partition"]))
    return out


@pytest.mark.parametrize("kind", ["raylog", "kafka"])
def test_kafka_python_admin_lists_describes_and_deletes_a_group(raylog_client, kafka_config, kind):
    from kafka.errors import GroupSubscribedToTopicError, NoError

    topic = _topic(raylog_client, 2)
    _produce(raylog_client, topic, 2)
    group = f"kga-{kind}-{uuid.uuid4().hex[:8]}"
    if kind == "raylog":
        consumer = _raylog_group(raylog_client, topic, 2, group)
    else:
        consumer = _confluent_group(kafka_config, topic, 2, group)
    admin = _kafka_python_admin(kafka_config)
    try:
        committed = _committed(raylog_client, group)
        assert set(committed) == {(topic, 0), (topic, 1)}

        # listed as raylog lists it, Stable while the member lives
        listed = {g["group_id"]: g for g in admin.list_groups()}
        assert group in listed and group in raylog_client.list_groups()
        assert (listed[group]["protocol_type"], listed[group]["group_state"]) == ("consumer", "Stable")
        assert group in {g["group_id"] for g in admin.list_groups(states_filter=["Stable"])}
        assert group not in {g["group_id"] for g in admin.list_groups(states_filter=["Empty"])}

        # described: the member raylog shows, with the partitions raylog says it owns
        owners = _owners(raylog_client, group)
        described = admin.describe_groups([group])[group]
        assert described["error"] is None and described["group_state"] == "Stable"
        assert described["protocol_type"] == "consumer"
        members = {m["member_id"]: m for m in described["members"]}
        assert set(members) == set(owners) and len(members) == 1
        (member_id, member), = members.items()
        assigned = {(t["topic"], p) for t in member["member_assignment"]["assigned_partitions"]
                    for p in t["partitions"]}
        assert assigned == owners[member_id] == {(topic, 0), (topic, 1)}
        assert member["member_metadata"]["topics"] == [topic]
        if kind == "raylog":
            assert member["client_id"] == "raylog" and member["client_host"] == f"/{socket.gethostname()}"
        else:
            assert member["client_id"] == "group-admin-test" and member["client_host"] == "/127.0.0.1"

        # a live member: the group and its offsets of the topic it reads stay
        assert admin.delete_groups([group]) == {group: "NonEmptyGroupError"}
        assert admin.delete_group_offsets(group, [_tp(topic, 0)]) == {_tp(topic, 0): GroupSubscribedToTopicError}
        assert _committed(raylog_client, group) == committed
        assert group in raylog_client.list_groups()

        consumer.close()
        consumer = None
        _wait(lambda: not _owners(raylog_client, group), "member gone")
        described = admin.describe_groups([group])[group]
        assert (described["group_state"], described["members"]) == ("Empty", [])
        assert group in {g["group_id"] for g in admin.list_groups(states_filter=["empty"])}

        # no member: one partition's offset deleted, the other kept
        assert admin.delete_group_offsets(group, [_tp(topic, 0)]) == {_tp(topic, 0): NoError}
        assert _committed(raylog_client, group) == {(topic, 1): committed[(topic, 1)]}
        assert admin.delete_groups([group]) == {group: "OK"}
        assert group not in raylog_client.list_groups() and _committed(raylog_client, group) == {}
        assert group not in {g["group_id"] for g in admin.list_groups()}
        assert admin.delete_groups([group]) == {group: "GroupIdNotFoundError"}
        assert admin.describe_groups([group])[group]["group_state"] == "Dead"
    finally:
        admin.close()
        if consumer is not None:
            consumer.close()


def _tp(topic: str, partition: int):
    from kafka.structs import TopicPartition as KafkaTopicPartition

    return KafkaTopicPartition(topic, partition)


@pytest.mark.parametrize("kind", ["raylog", "kafka"])
def test_confluent_admin_lists_describes_and_deletes_a_group(raylog_client, kafka_config, kind):
    topic = _topic(raylog_client, 2)
    _produce(raylog_client, topic, 2)
    group = f"kgc-{kind}-{uuid.uuid4().hex[:8]}"
    if kind == "raylog":
        consumer = _raylog_group(raylog_client, topic, 2, group)
    else:
        consumer = _confluent_group(kafka_config, topic, 2, group)
    admin = AdminClient(kafka_config)
    try:
        committed = _committed(raylog_client, group)
        listed = {g.group_id: g for g in admin.list_consumer_groups(request_timeout=WAIT_S).result(WAIT_S).valid}
        assert group in listed and listed[group].state == ConsumerGroupState.STABLE
        assert not listed[group].is_simple_consumer_group
        stable = admin.list_consumer_groups(states={ConsumerGroupState.STABLE}, request_timeout=WAIT_S)
        assert group in {g.group_id for g in stable.result(WAIT_S).valid}

        owners = _owners(raylog_client, group)
        described = admin.describe_consumer_groups([group], request_timeout=WAIT_S)[group].result(WAIT_S)
        assert described.state == ConsumerGroupState.STABLE
        assert {m.member_id: {(tp.topic, tp.partition) for tp in m.assignment.topic_partitions}
                for m in described.members} == owners

        deleted = admin.delete_consumer_groups([group], request_timeout=WAIT_S)[group]
        with pytest.raises(confluent_kafka.KafkaException) as refused:
            deleted.result(WAIT_S)
        assert refused.value.args[0].code() == confluent_kafka.KafkaError.NON_EMPTY_GROUP
        assert _committed(raylog_client, group) == committed and group in raylog_client.list_groups()

        consumer.close()
        consumer = None
        _wait(lambda: not _owners(raylog_client, group), "member gone")
        described = admin.describe_consumer_groups([group], request_timeout=WAIT_S)[group].result(WAIT_S)
        assert described.state == ConsumerGroupState.EMPTY and described.members == []
        assert admin.delete_consumer_groups([group], request_timeout=WAIT_S)[group].result(WAIT_S) is None
        assert group not in raylog_client.list_groups() and _committed(raylog_client, group) == {}
        again = admin.delete_consumer_groups([group], request_timeout=WAIT_S)[group]
        with pytest.raises(confluent_kafka.KafkaException) as unknown:
            again.result(WAIT_S)
        assert unknown.value.args[0].code() == confluent_kafka.KafkaError.GROUP_ID_NOT_FOUND
    finally:
        if consumer is not None:
            consumer.close()


def test_offset_delete_answers_per_partition_on_the_wire(raylog_client, kafka_config, listeners):
    """OffsetDelete over a raw connection: an unknown topic or partition, a
    topic a live member reads, a partition deleted; an unknown group."""
    from kafka.protocol.consumer import OffsetDeleteRequest, OffsetDeleteResponse
    from kafka_raw import RawKafka

    from raylog.kafka import group_admin as ga

    read, other = _topic(raylog_client, 1), _topic(raylog_client, 2)
    _produce(raylog_client, read, 1)
    group = f"kgw-{uuid.uuid4().hex[:8]}"
    store = OffsetStore(raylog_client._zk, raylog_client.settings.cluster)
    store.commit(group, other, 0, 0)
    store.commit(group, other, 1, 0)
    Topic = OffsetDeleteRequest.OffsetDeleteRequestTopic
    Partition = Topic.OffsetDeleteRequestPartition

    def delete(raw, group_id, wanted):
        response = raw.request(OffsetDeleteRequest[0](group_id=group_id, topics=[
            Topic(name=t, partitions=[Partition(partition_index=p) for p in ps]) for t, ps in wanted.items()]),
            OffsetDeleteResponse)
        return response.error_code, {(t.name, p.partition_index): p.error_code
                                     for t in response.topics for p in t.partitions}

    consumer = _raylog_group(raylog_client, read, 1, group)
    try:
        with RawKafka(kafka_config) as raw:
            raw.authenticate()
            assert delete(raw, group, {read: [0], other: [1, 7], "no-such-topic": [0]}) == (ga.NONE, {
                (read, 0): ga.GROUP_SUBSCRIBED_TO_TOPIC, (other, 1): ga.NONE,
                (other, 7): ga.UNKNOWN_TOPIC_OR_PARTITION, ("no-such-topic", 0): ga.UNKNOWN_TOPIC_OR_PARTITION})
            assert set(_committed(raylog_client, group)) == {(read, 0), (other, 0)}
            assert delete(raw, f"none-{uuid.uuid4().hex[:8]}", {other: [0]}) == (ga.GROUP_ID_NOT_FOUND, {})
            assert delete(raw, "", {other: [0]}) == (ga.INVALID_GROUP_ID, {})
            assert set(_committed(raylog_client, group)) == {(read, 0), (other, 0)}
    finally:
        consumer.close()


def test_requests_naming_too_many_groups_or_partitions_close_the_connection(raylog_client, kafka_config,
                                                                           listeners):
    from kafka.protocol.admin import DeleteGroupsRequest, DeleteGroupsResponse, DescribeGroupsRequest
    from kafka.protocol.admin import DescribeGroupsResponse
    from kafka.protocol.consumer import OffsetDeleteRequest, OffsetDeleteResponse
    from kafka_raw import RawKafka

    from raylog.kafka.group_admin import MAX_GROUPS, MAX_PARTITIONS

    store = OffsetStore(raylog_client._zk, raylog_client.settings.cluster)
    group = f"kgb-{uuid.uuid4().hex[:8]}"
    topic = _topic(raylog_client, 1)
    store.commit(group, topic, 0, 0)
    Topic = OffsetDeleteRequest.OffsetDeleteRequestTopic
    too_many = [
        (DescribeGroupsRequest[5](groups=[group] * (MAX_GROUPS + 1), include_authorized_operations=False),
         DescribeGroupsResponse),
        (DeleteGroupsRequest[2](groups_names=[group] * (MAX_GROUPS + 1)), DeleteGroupsResponse),
        (OffsetDeleteRequest[0](group_id=group, topics=[Topic(name=topic, partitions=[
            Topic.OffsetDeleteRequestPartition(partition_index=0)] * MAX_PARTITIONS)]), OffsetDeleteResponse),
    ]
    for request, response in too_many:
        with RawKafka(kafka_config) as raw:
            raw.authenticate()
            request.with_header(correlation_id=1, client_id="raw")
            raw.sock.sendall(bytes(request.encode(header=True, framed=True)))
            assert raw.read_frame() is None, f"{type(request).__name__} of too many names was answered"
    assert store.committed(group, topic, 0) == 0  # nothing deleted
    with RawKafka(kafka_config) as raw:  # at the bound: served
        raw.authenticate()
        answer = raw.request(DescribeGroupsRequest[5](groups=[group] * MAX_GROUPS, include_authorized_operations=False),
                             DescribeGroupsResponse)
        assert len(answer.groups) == MAX_GROUPS and answer.groups[0].group_state == "Empty"
