"""Run as a script by test_kafka_leader_move.py (a Ray cluster of its own
needs a process of its own): a ``ray.cluster_utils.Cluster`` with two disk
nodes, each with its Kafka listener; topics of replication factor 2. For
each way of moving a lead -- ``handoff`` (:meth:`Client.hand_off`, on
purpose) and ``failover`` (the leader's partition actor SIGKILLed by its
handle) -- an idempotent batch is stored through the leader's listener (A),
the lead moves to the other node, and the same batch is sent again through
the other listener (B), then the next sequence and a gap; and
(``confluent``) confluent-kafka's idempotent producer sends through listener
B while the lead moves both ways. Prints one JSON line of what each
listener answered and what raylog's consumer read back; the test judges it.

    python leader_move_idempotence.py <zookeeper connect string> <data dir>
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

WAIT_S = 120.0
#: Kafka error codes a producer retries after refreshing its metadata (a lead moving)
RETRIED = {6, 7, 15, 19, 20, 56}


def _batch(producer_id: int, epoch: int, base_sequence: int, values) -> bytes:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                        producer_id=producer_id, producer_epoch=epoch,
                                        base_sequence=base_sequence, batch_size=1 << 20)
    for i, value in enumerate(values):
        builder.append(i, timestamp=1_000 + i, key=None, value=value.encode(), headers=[])
    return bytes(builder.build())


def _produce_once(config: dict, topic: str, records: bytes):
    from kafka.protocol.producer import ProduceRequest, ProduceResponse
    from kafka_raw import RawKafka

    Topic = ProduceRequest.TopicProduceData
    request = ProduceRequest[8](transactional_id=None, acks=-1, timeout_ms=30_000, topic_data=[
        Topic(name=topic, partition_data=[Topic.PartitionProduceData(index=0, records=records)])])
    with RawKafka(config) as raw:
        raw.authenticate()
        part = raw.request(request, ProduceResponse).responses[0].partition_responses[0]
    return part.error_code, part.base_offset


def _produce(config: dict, topic: str, records: bytes, retried: list):
    """``(error code, base offset)`` of an acks=-1 Produce of ``records``
    to partition 0 through the listener of ``config``; an answer that asks
    a producer to retry (the lead moving) is retried on a new connection,
    as a Kafka producer does, and noted in ``retried``."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            code, base = _produce_once(config, topic, records)
        except OSError as err:  # the listener's connection to a lost leader broke
            code, base = f"connection: {err}", -1
        if code not in RETRIED and not isinstance(code, str) or time.monotonic() > deadline:
            return code, base
        retried.append(code)
        time.sleep(0.5)


def _init_producer_id(config: dict) -> int:
    from kafka.protocol.producer import InitProducerIdRequest, InitProducerIdResponse
    from kafka_raw import RawKafka

    with RawKafka(config) as raw:
        raw.authenticate()
        return raw.request(InitProducerIdRequest[1](transactional_id=None, transaction_timeout_ms=60_000),
                           InitProducerIdResponse).producer_id


def _read(client, topic: str, count: int) -> list:
    consumer = client.consumer([topic], group=f"g-{uuid.uuid4().hex[:8]}", auto_offset_reset="earliest")
    got = []
    deadline = time.monotonic() + WAIT_S
    try:
        while len(got) < count and time.monotonic() < deadline:
            got.extend(consumer.poll(timeout_ms=1000))
        got.extend(consumer.poll(timeout_ms=1000))  # nothing more arrives
    finally:
        consumer.close()
    return [[m.offset, m.value.decode()] for m in got]


def _in_sync(client, topic: str) -> tuple:
    """The partition's replication state once both replicas are in sync
    and its leader serves."""
    from raylog.testing.clusters import wait_until

    def whole():
        state = client.replication_state(topic, 0)
        return (state is not None and len(state.isr) == 2 and state.leader is not None
                and client.registry.endpoint(topic, 0) is not None)

    assert wait_until(whole, WAIT_S), client.replication_state(topic, 0)
    return client.replication_state(topic, 0)


def _move(client, topic: str, how: str, leader: str, other: str) -> dict:
    """Move the lead of ``topic``-0 from ``leader`` to ``other``; the new state."""
    from raylog.testing.clusters import wait_until
    from raylog.testing.faults import kill_actor

    before = client.replication_state(topic, 0)
    if how == "handoff":
        client.hand_off(topic, 0, other, timeout_s=30)
    else:
        kill_actor(client.leader_actor(topic, 0))
    assert wait_until(lambda: client.replication_state(topic, 0).leader == other
                      and client.replication_state(topic, 0).leader_epoch > before.leader_epoch, WAIT_S)
    state = client.replication_state(topic, 0)
    return {"leader": state.leader, "epoch_before": before.leader_epoch, "epoch_after": state.leader_epoch}


def _resend_case(client, configs: dict, how: str) -> dict:
    topic = f"move-{how}-{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, partitions=1, replication_factor=2, min_insync_replicas=1)
    state = _in_sync(client, topic)
    leader = state.leader
    other = next(n for n in state.replicas if n != leader)
    a, b = configs[leader], configs[other]
    retried: list = []
    pid = _init_producer_id(a)
    first = _batch(pid, 0, 0, [f"{how}-a0", f"{how}-a1", f"{how}-a2"])
    stored = _produce(a, topic, first, retried)
    moved = _move(client, topic, how, leader, other)
    again = _produce(b, topic, first, retried)
    following = _produce(b, topic, _batch(pid, 0, 3, [f"{how}-b0", f"{how}-b1"]), retried)
    gap = _produce(b, topic, _batch(pid, 0, 9, [f"{how}-gap"]), retried)
    again_following = _produce(b, topic, _batch(pid, 0, 3, [f"{how}-b0", f"{how}-b1"]), retried)
    return {"topic": topic, "leader": leader, "other": other, "moved": moved, "stored": stored,
            "again": again, "following": following, "gap": gap, "again_following": again_following,
            "retried": [str(c) for c in retried], "read": _read(client, topic, 5)}


def _confluent_case(client, configs: dict, count: int = 600) -> dict:
    """confluent-kafka's idempotent producer bootstrapped at listener B
    sends ``count`` messages while the lead moves by a handoff and back by
    a failover."""
    import confluent_kafka

    topic = f"move-confluent-{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, partitions=1, replication_factor=2, min_insync_replicas=1)
    state = _in_sync(client, topic)
    leader = state.leader
    other = next(n for n in state.replicas if n != leader)
    producer = confluent_kafka.Producer({**configs[other], "enable.idempotence": True, "acks": "all",
                                         "linger.ms": 5, "batch.num.messages": 20,
                                         "message.timeout.ms": 180_000})
    reports = []
    moves = []
    third = count // 3

    def send(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            producer.produce(topic, f"c{i}".encode(), partition=0,
                             on_delivery=lambda err, msg: reports.append((None if err is None else str(err),
                                                                          msg.offset())))
            if i % 10 == 0:
                producer.poll(0)
                time.sleep(0.005)

    send(0, third)
    mover = threading.Thread(target=lambda: moves.append(_move(client, topic, "handoff", leader, other)))
    mover.start()
    send(third, 2 * third)
    mover.join()
    _in_sync(client, topic)
    mover = threading.Thread(target=lambda: moves.append(_move(client, topic, "failover", other, leader)))
    mover.start()
    send(2 * third, count)
    mover.join()
    left = producer.flush(WAIT_S)
    return {"topic": topic, "count": count, "left": left, "moves": moves,
            "errors": [err for err, _ in reports if err is not None][:5], "reported": len(reports),
            "offsets": [offset for err, offset in reports if err is None],
            "read": _read(client, topic, count)}


def main(zookeeper: str, data_dir: str) -> None:
    import ray
    from ray.cluster_utils import Cluster

    from raylog.client import Client
    from raylog.testing.clusters import start_disk_nodes

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    client = None
    try:
        start_disk_nodes(cluster, ("disk-a", "disk-b"))
        client = Client(zookeeper=zookeeper, cluster=f"km-{uuid.uuid4().hex[:12]}", data_dir=data_dir,
                        data_host="127.0.0.1")
        entries = client.start_kafka_listeners()
        config = client.kafka_config()
        configs = {e["node"]: {**config, "bootstrap.servers": f"{e['host']}:{e['port']}"} for e in entries}
        found = {"listeners": entries}
        for how in ("handoff", "failover"):
            found[how] = _resend_case(client, configs, how)
        found["confluent"] = _confluent_case(client, configs)
        print(json.dumps(found))
    finally:
        if client is not None:
            client.close()
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
