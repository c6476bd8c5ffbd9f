"""DescribeCluster, ListTransactions and DescribeTransactions through the
Kafka front door (raylog.kafka.handlers, raylog.kafka.transaction_admin),
with kafka-python's KafkaAdminClient and raw requests on real ZooKeeper,
Ray and sockets, each checked against raylog's own view: the listeners
registered, and the transaction records of a confluent-kafka producer
whose transaction is open, then committed."""

from __future__ import annotations

import uuid

import pytest
from kafka_raw import RawKafka

from raylog.zk.transactions import TransactionStore

confluent_kafka = pytest.importorskip("confluent_kafka")

from kafka.protocol.admin import (  # noqa: E402
    DescribeClusterRequest,
    DescribeClusterResponse,
    DescribeTransactionsRequest,
    DescribeTransactionsResponse,
    ListTransactionsRequest,
    ListTransactionsResponse,
)

pytestmark = pytest.mark.timeout(600)

WAIT_S = 60.0
TRANSACTIONAL_ID_NOT_FOUND, MISMATCHED_ENDPOINT_TYPE = 105, 114


@pytest.fixture(scope="module")
def coordinator(raylog_client, listeners):
    from raylog.actors.transaction_coordinator import stop_transaction_coordinator

    handle = raylog_client.transaction_coordinator()
    yield handle
    stop_transaction_coordinator(raylog_client.settings.cluster)


def _admin(config: dict):
    from kafka.admin import KafkaAdminClient

    return KafkaAdminClient(
        bootstrap_servers=config["bootstrap.servers"].split(","), security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-256", sasl_plain_username=config["sasl.username"],
        sasl_plain_password=config["sasl.password"])


def test_describe_cluster_names_the_listeners_as_brokers(raylog_client, kafka_config, listeners):
    admin = _admin(kafka_config)
    try:
        cluster = admin.describe_cluster()
    finally:
        admin.close()
    assert cluster["cluster_id"] == raylog_client.settings.cluster
    assert sorted((b["broker_id"], b["host"], b["port"]) for b in cluster["brokers"]) == sorted(
        (e["broker_id"], e["host"], e["port"]) for e in listeners)
    assert cluster["controller_id"] in {e["broker_id"] for e in listeners}
    assert "DESCRIBE" in cluster["authorized_operations"]
    with RawKafka(kafka_config) as raw:
        raw.authenticate()
        for version in (0, 1, 2):
            answer = raw.request(DescribeClusterRequest[version](include_cluster_authorized_operations=False),
                                 DescribeClusterResponse)
            assert answer.error_code == 0 and len(answer.brokers) == len(listeners)
            assert answer.authorized_operations is None  # bit 31 alone: not asked for
        controllers = raw.request(DescribeClusterRequest[1](include_cluster_authorized_operations=False,
                                                            endpoint_type=2), DescribeClusterResponse)
        assert controllers.error_code == MISMATCHED_ENDPOINT_TYPE and not controllers.brokers


def test_transactions_are_listed_and_described_as_their_records_hold_them(raylog_client, kafka_config,
                                                                           coordinator):
    topic = f"kta-{uuid.uuid4().hex[:10]}"
    raylog_client.create_topic(topic, partitions=2)
    tid = f"tx-{uuid.uuid4().hex[:8]}"
    producer = confluent_kafka.Producer({**kafka_config, "transactional.id": tid, "transaction.timeout.ms": 60_000})
    producer.init_transactions(WAIT_S)
    producer.begin_transaction()
    producer.produce(topic, value=b"a", partition=1)
    producer.flush(WAIT_S)  # the partition is added to the transaction before its batch goes
    store = TransactionStore(raylog_client._zk, raylog_client.settings.cluster)
    record = store.read(tid)[0]
    assert record.state == "Ongoing" and record.partitions == ((topic, 1),)

    admin = _admin(kafka_config)
    try:
        listed = admin.list_transactions()
        mine = [t for listings in listed.values() for t in listings if t.transactional_id == tid]
        assert len(mine) == 1, listed  # one listener lists each id
        assert (mine[0].producer_id, str(getattr(mine[0].state, "value", mine[0].state))) == (
            record.producer_id, "Ongoing")
        ongoing = [t.transactional_id for ls in admin.list_transactions(state_filters=["Ongoing"]).values()
                   for t in ls]
        assert tid in ongoing
        assert tid not in [t.transactional_id for ls in admin.list_transactions(
            state_filters=["CompleteCommit"]).values() for t in ls]
        assert tid in [t.transactional_id for ls in admin.list_transactions(
            producer_id_filters=[record.producer_id]).values() for t in ls]
        described = admin.describe_transactions([tid])[tid]
        assert (described.producer_id, described.producer_epoch) == (record.producer_id, record.producer_epoch)
        assert str(getattr(described.state, "value", described.state)) == "Ongoing"
        assert described.transaction_timeout_ms == 60_000
        assert described.transaction_start_time_ms == record.started_ms > 0
        assert {(tp.topic, tp.partition) for tp in described.topic_partitions} == {(topic, 1)}

        producer.commit_transaction(WAIT_S)
        record = store.read(tid)[0]
        assert record.state == "CompleteCommit"
        described = admin.describe_transactions([tid])[tid]
        assert str(getattr(described.state, "value", described.state)) == "CompleteCommit"
        assert not described.topic_partitions
    finally:
        admin.close()


def test_raw_answers_filters_and_unknown_ids(raylog_client, kafka_config, coordinator):
    with RawKafka(kafka_config) as raw:
        raw.authenticate()
        answer = raw.request(DescribeTransactionsRequest[0](transactional_ids=[f"none-{uuid.uuid4().hex[:6]}"]),
                             DescribeTransactionsResponse)
        assert [t.error_code for t in answer.transaction_states] == [TRANSACTIONAL_ID_NOT_FOUND]
        listed = raw.request(ListTransactionsRequest[1](state_filters=["Ongoing", "Bogus"], producer_id_filters=[],
                                                        duration_filter=10 ** 12), ListTransactionsResponse)
        # nothing has been open for 30 years; an unknown state is named back
        assert listed.error_code == 0 and listed.unknown_state_filters == ["Bogus"]
        assert listed.transaction_states == []


def test_a_request_naming_too_many_ids_closes_the_connection(raylog_client, kafka_config, coordinator):
    from raylog.kafka.transaction_admin import MAX_IDS

    with RawKafka(kafka_config) as raw:
        raw.authenticate()
        request = DescribeTransactionsRequest[0](transactional_ids=[f"t{i}" for i in range(MAX_IDS + 1)])
        request.with_header(correlation_id=1, client_id="raw")
        raw.sock.sendall(bytes(request.encode(header=True, framed=True)))
        assert raw.read_frame() is None


def test_describe_producers_shows_the_partitions_producer_state(raylog_client, kafka_config, listeners,
                                                                coordinator):
    """An idempotent producer on partition 0 and a transactional one with a
    transaction open on partition 1: kafka-python's describe_producers shows
    each with its id, epoch, last sequence and the open transaction's first
    offset, as the partitions' own state holds them."""
    import kafka.errors
    from kafka import TopicPartition

    from tests.stored import stored_records

    topic = f"ktp-{uuid.uuid4().hex[:10]}"
    raylog_client.create_topic(topic, partitions=2)
    idempotent = confluent_kafka.Producer({**kafka_config, "enable.idempotence": True})
    for i in range(5):
        idempotent.produce(topic, value=f"i{i}".encode(), partition=0)
    assert idempotent.flush(WAIT_S) == 0
    tid = f"tx-{uuid.uuid4().hex[:8]}"
    transactional = confluent_kafka.Producer({**kafka_config, "transactional.id": tid,
                                              "transaction.timeout.ms": 60_000})
    transactional.init_transactions(WAIT_S)
    transactional.begin_transaction()
    for i in range(3):
        transactional.produce(topic, value=f"t{i}".encode(), partition=1)
    assert transactional.flush(WAIT_S) == 0
    record = TransactionStore(raylog_client._zk, raylog_client.settings.cluster).read(tid)[0]

    admin = _admin(kafka_config)
    try:
        states = admin.describe_producers([TopicPartition(topic, 0), TopicPartition(topic, 1)])
        (on_0,) = states[TopicPartition(topic, 0)].active_producers
        (on_1,) = states[TopicPartition(topic, 1)].active_producers
        assert on_0.last_sequence == 4 and on_0.current_transaction_start_offset == -1
        assert (on_1.producer_id, on_1.producer_epoch) == (record.producer_id, record.producer_epoch)
        assert on_1.last_sequence == 2
        first_offset = stored_records(raylog_client, topic, 1)[0][0]
        assert on_1.current_transaction_start_offset == first_offset
        # raylog's own view: the partition actors' state
        import ray

        for p, shown in ((0, on_0), (1, on_1)):
            endpoint = raylog_client.registry.endpoint(topic, p)
            own = ray.get(ray.get_actor(endpoint["actor"], namespace="raylog").active_producers.remote())
            assert [(f["producer_id"], f["epoch"], f["last_sequence"], f["transaction_start"]) for f in own] == [
                (shown.producer_id, shown.producer_epoch, shown.last_sequence,
                 shown.current_transaction_start_offset)]
        transactional.commit_transaction(WAIT_S)
        (after,) = admin.describe_producers([TopicPartition(topic, 1)])[TopicPartition(topic, 1)].active_producers
        assert after.current_transaction_start_offset == -1
        with pytest.raises(kafka.errors.KafkaError):
            admin.describe_producers([TopicPartition(topic, 7)], broker_id=listeners[0]["broker_id"])
    finally:
        admin.close()
