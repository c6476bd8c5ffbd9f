"""The cluster core end to end: real Ray, real ZooKeeper, partition actors,
sockets. Failure cases first."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import raylog
from raylog.errors import (
    AuthenticationError,
    ConfigError,
    OffsetOutOfRangeError,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
)
from raylog.storage.record_batch import iter_batches
from raylog.transfer.connection import BrokerConnection


def _consume(consumer, count: int, timeout_s: float = 60.0) -> list:
    got: list = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count:
        assert time.monotonic() < deadline, f"only {len(got)} of {count} messages arrived"
        got.extend(consumer.poll(timeout_ms=500))
    return got


def _flush_log(client, topic: str, partition: int = 0) -> int:
    """Flush the partition now (acks=1 replies come before the flush that
    makes data visible) and return its high watermark."""
    import ray

    return ray.get(client.partition_actor(topic, partition).flush.remote())


# -- errors ------------------------------------------------------------------


def test_unknown_topic_is_a_typed_error(raylog_client):
    with pytest.raises(UnknownTopicError):
        raylog_client.consumer("no-such-topic")
    producer = raylog_client.producer()
    with pytest.raises(UnknownTopicError):
        producer.send("no-such-topic", b"x")
    with pytest.raises(UnknownTopicError):
        raylog_client.describe_topic("no-such-topic")
    with pytest.raises(UnknownTopicError):
        raylog_client.delete_topic("no-such-topic")


def test_creating_a_topic_twice_fails_and_keeps_the_first(raylog_client, make_topic):
    topic = make_topic(partitions=1)
    producer = raylog_client.producer(acks=1)
    producer.send(topic, b"kept")
    producer.flush()
    with pytest.raises(TopicExistsError):
        raylog_client.create_topic(topic, partitions=3)
    assert raylog_client.describe_topic(topic)["config"].partitions == 1
    consumer = raylog_client.consumer(topic, auto_offset_reset="earliest")
    assert [m.value for m in _consume(consumer, 1)] == [b"kept"]
    consumer.close()


def test_bad_settings_are_config_errors(raylog_client):
    with pytest.raises(ConfigError):
        raylog_client.create_topic("bad-partitions", partitions=0)
    with pytest.raises(ConfigError):
        raylog_client.producer(acks=2)
    with pytest.raises(ConfigError):
        raylog_client.producer(compression="snappy")
    assert "bad-partitions" not in raylog_client.list_topics()


def test_offset_errors_reach_the_consumer_and_data_stays(raylog_client, make_topic):
    topic = make_topic(partitions=1)
    producer = raylog_client.producer(acks=1)
    for i in range(10):
        producer.send(topic, b"m%d" % i)
    producer.flush()
    # no position to start from and resets refused: say so at once
    with pytest.raises(OffsetOutOfRangeError):
        raylog_client.consumer(topic, auto_offset_reset="error")

    _flush_log(raylog_client, topic)
    consumer = raylog_client.consumer(topic, auto_offset_reset="earliest")
    start, end = raylog_client.offsets(topic, 0)
    # an explicit seek outside the log is refused at once, whatever auto_offset_reset says
    with pytest.raises(OffsetOutOfRangeError) as info:
        consumer.seek(topic, 0, end + 1000)
    assert (info.value.earliest, info.value.latest, info.value.offset) == (start, end, end + 1000)
    assert [m.value for m in _consume(consumer, 10)] == [b"m%d" % i for i in range(10)]  # position unchanged

    # inside the last record batch's bytes, past its records' offsets: a gap, as on a compacted topic
    # (docs/design.md §2): the consumer goes on with the next record
    consumer = raylog_client.consumer(topic, auto_offset_reset="earliest")
    consumer.seek(topic, 0, end - 1)
    producer.send(topic, b"after")
    producer.flush()
    _flush_log(raylog_client, topic)
    assert [m.value for m in _consume(consumer, 1)] == [b"after"]

    consumer = raylog_client.consumer(topic, auto_offset_reset="earliest")
    assert [m.value for m in _consume(consumer, 11)] == [b"m%d" % i for i in range(10)] + [b"after"]


def test_unknown_partition(raylog_client, make_topic):
    topic = make_topic(partitions=2)
    producer = raylog_client.producer()
    with pytest.raises(UnknownPartitionError):
        producer.send(topic, b"x", partition=5)
    producer.flush(timeout_s=30)


def test_wrong_token_is_refused(zookeeper, ray_local, tmp_path, cluster_name):
    secured = raylog.Client(
        zookeeper=zookeeper.connect_string,
        cluster=cluster_name,
        data_dir=str(tmp_path),
        data_host="127.0.0.1",
    )
    intruder = raylog.Client(zookeeper=zookeeper.connect_string, cluster=cluster_name, token=b"wrong")
    try:
        secured.create_topic("secured", partitions=1)
        producer = secured.producer(acks=1)
        producer.send("secured", b"private")
        producer.flush()
        with pytest.raises(AuthenticationError):
            intruder.offsets("secured", 0)
        with pytest.raises(AuthenticationError):
            intruder.consumer("secured", auto_offset_reset="earliest")
        consumer = secured.consumer("secured", auto_offset_reset="earliest")
        assert [m.value for m in _consume(consumer, 1)] == [b"private"]
    finally:
        intruder.close()
        secured.delete_topic("secured")
        secured.close()


# -- round trips ---------------------------------------------------------------


def test_keyed_round_trip_keeps_order_per_partition(raylog_client, make_topic):
    topic = make_topic(partitions=4)
    producer = raylog_client.producer(batch_size=20, linger_ms=2, acks=1)
    sent = []
    for i in range(2000):
        key = b"user-%d" % (i % 37)
        value = b"%s:%d" % (key, i)
        producer.send(topic, value, key=key)
        sent.append((key, value))
    producer.flush()

    consumer = raylog_client.consumer(topic, auto_offset_reset="earliest")
    got = _consume(consumer, len(sent))
    consumer.close()
    assert sorted(m.value for m in got) == sorted(v for _, v in sent)

    partitions_of_key: dict[bytes, set] = {}
    for m in got:
        partitions_of_key.setdefault(m.key, set()).add(m.partition)
    assert all(len(ps) == 1 for ps in partitions_of_key.values())
    assert len({p for ps in partitions_of_key.values() for p in ps}) > 1

    # order within a key (hence within its partition) is the send order
    for key in partitions_of_key:
        mine = [int(m.value.split(b":")[1]) for m in got if m.key == key]
        assert mine == sorted(mine)
    # offsets increase within a partition
    for p in range(4):
        offsets = [m.offset for m in got if m.partition == p]
        assert offsets == sorted(offsets)


def test_offsets_are_byte_offsets(raylog_client, make_topic):
    topic = make_topic(partitions=1)
    producer = raylog_client.producer(batch_size=7, acks=1)
    values = [b"v" * n for n in range(1, 30)]
    for v in values:
        producer.send(topic, v, key=b"k")
    producer.flush()
    consumer = raylog_client.consumer(topic, auto_offset_reset="earliest")
    got = _consume(consumer, len(values))
    end = raylog_client.offsets(topic, 0)[1]
    # the log's record batches, read from the partition's data socket: each at its byte position
    host, port = raylog_client.metadata.endpoint(topic, 0, refresh=True)
    with BrokerConnection(host, port, token=raylog_client.settings.token) as conn:
        data = bytes(conn.fetch(topic, 0, 0, 1 << 20).data)
    batches = list(iter_batches(data))
    assert sum(h.size for _p, h in batches) == end and all(p == h.base_offset for p, h in batches)
    # record i of the batch at byte position p has offset p + i (docs/design.md §2)
    assert [m.offset for m in got] == [p + i for p, h in batches for i in range(h.count)]
    assert [m.value for m in got] == values
    for a, b in zip(got, got[1:]):
        assert a.next_offset == b.offset
    assert consumer.position(topic, 0) == end
    consumer.close()


def test_seek_back_replays(raylog_client, make_topic):
    topic = make_topic(partitions=1)
    producer = raylog_client.producer(acks=1)
    for i in range(100):
        producer.send(topic, b"%d" % i)
    producer.flush()
    consumer = raylog_client.consumer(topic, auto_offset_reset="earliest")
    first = _consume(consumer, 100)
    consumer.seek(topic, 0, first[40].offset)
    again = _consume(consumer, 60)
    assert [m.value for m in again] == [m.value for m in first[40:]]
    assert [m.offset for m in again] == [m.offset for m in first[40:]]
    consumer.close()


def test_compressed_batches_round_trip(raylog_client, make_topic):
    topic = make_topic(partitions=2)
    for codec in ("gzip", "zstd", "lz4"):
        producer = raylog_client.producer(batch_size=50, compression=codec, acks=1)
        for i in range(500):
            producer.send(topic, b"%s-%d" % (codec.encode(), i) * 5, key=b"k%d" % (i % 5))
        producer.close()
    consumer = raylog_client.consumer(topic, auto_offset_reset="earliest")
    got = _consume(consumer, 1500)
    assert sorted(m.value for m in got) == sorted(
        b"%s-%d" % (c.encode(), i) * 5 for c in ("gzip", "zstd", "lz4") for i in range(500)
    )
    consumer.close()


def test_two_producer_processes_map_keys_identically(raylog_client, make_topic, tmp_path):
    topic = make_topic(partitions=5)
    script = textwrap.dedent(
        """
        import sys
        from raylog.metadata import ConnectionSettings, Metadata
        from raylog.producer import Producer
        metadata = Metadata.connect(ConnectionSettings(zookeeper=sys.argv[1], cluster=sys.argv[2]))
        producer = Producer(metadata, acks=1)
        for i in range(200):
            producer.send(sys.argv[3], sys.argv[4].encode() + b"-%d" % i, key=b"key-%d" % i)
        producer.close()
        metadata.close()
        """
    )
    settings = raylog_client.settings
    for name, seed in (("a", "1"), ("b", "2")):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        subprocess.run(
            [sys.executable, "-c", script, settings.zookeeper, settings.cluster, topic, name],
            check=True,
            env=env,
            timeout=120,
        )
    consumer = raylog_client.consumer(topic, auto_offset_reset="earliest")
    got = _consume(consumer, 400)
    consumer.close()
    partition_of = {}
    for m in got:
        assert partition_of.setdefault(m.key, m.partition) == m.partition
    assert len(partition_of) == 200


def test_producer_actor_from_ray_tasks(raylog_client, make_topic):
    import ray

    topic = make_topic(partitions=3)
    handle = raylog_client.producer_actor(batch_size=10)

    @ray.remote(num_cpus=0)
    def produce(task):
        return ray.get(handle.send_batch.remote(topic, [b"%d-%d" % (task, i) for i in range(100)]))

    assert sum(ray.get([produce.remote(t) for t in range(4)])) == 400
    stats = ray.get(handle.flush.remote())
    assert stats["sent_messages"] == 400
    ray.get(handle.close.remote())
    consumer = raylog_client.consumer(topic, auto_offset_reset="earliest")
    got = _consume(consumer, 400)
    consumer.close()
    assert len({m.value for m in got}) == 400


def test_describe_and_delete_topic(raylog_client, make_topic):
    topic = make_topic(partitions=2)
    info = raylog_client.describe_topic(topic)
    assert [p["partition"] for p in info["partitions"]] == [0, 1]
    assert all(p["endpoint"] and p["node"] == "local" for p in info["partitions"])
    assert topic in raylog_client.list_topics()
    log_dirs = [p["log_dir"] for p in info["partitions"]]
    raylog_client.delete_topic(topic)
    assert topic not in raylog_client.list_topics()
    assert not any(os.path.exists(d) for d in log_dirs)


# -- long polling ----------------------------------------------------------------


def test_long_poll_returns_when_data_is_flushed(raylog_client, make_topic):
    topic = make_topic(partitions=1)
    consumer = raylog_client.consumer(topic, auto_offset_reset="latest", fetch_max_wait_ms=10_000)
    result = {}

    def poll():
        t0 = time.monotonic()
        result["messages"] = consumer.poll(timeout_ms=15_000)
        result["waited"] = time.monotonic() - t0

    thread = threading.Thread(target=poll)
    thread.start()
    time.sleep(1.0)
    producer = raylog_client.producer(acks=1)
    producer.send(topic, b"wake up")
    producer.flush()
    thread.join(timeout=20)
    consumer.close()
    assert [m.value for m in result["messages"]] == [b"wake up"]
    # it came back on the data, long before the 10 s long poll ran out
    assert result["waited"] < 9.0


def test_idle_long_poll_costs_the_actor_almost_no_cpu(raylog_client, make_topic):
    import psutil
    import ray

    topic = make_topic(partitions=1)
    pid = ray.get(raylog_client.partition_actor(topic, 0).pid.remote())
    consumer = raylog_client.consumer(topic, auto_offset_reset="latest", fetch_max_wait_ms=10_000)
    time.sleep(0.5)
    process = psutil.Process(pid)
    before = process.cpu_times()
    assert consumer.poll(timeout_ms=4_000) == []
    after = process.cpu_times()
    consumer.close()
    used = (after.user + after.system) - (before.user + before.system)
    assert used < 1.0, f"an idle long poll cost the partition actor {used:.2f} s of CPU in 4 s"
