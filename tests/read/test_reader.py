"""raylog.read: message boundaries for splits, read plans, range readers and
the Ray Data source (read_raylog), on real partition actors. No Spark here
(read_raylog -> to_spark is in tests/integrations/spark/test_read.py)."""

from __future__ import annotations

import bisect
import os
import random
import time

import pytest

from raylog.config import TopicConfig
from raylog.read import (
    ARROW_SCHEMA,
    DataLossError,
    placement_options,
    plan_read,
    read_range,
    read_ranges,
    read_raylog,
    split_counts,
)
from raylog.errors import (
    ConfigError,
    CorruptMessageError,
    InvalidOffsetError,
    OffsetOutOfRangeError,
    UnknownTopicError,
)
from raylog.storage.log import PartitionLog
from raylog.storage.decoding import decode_messages
from raylog.storage.message import encode_message_set
from tests.stored import stored_records

pytestmark = pytest.mark.timeout(300)


# ---------------------------------------------------------------------------
# PartitionLog.message_boundaries (no Ray)


@pytest.fixture
def small_log(tmp_path):
    """A log of several segments and messages of varied sizes; ``(log, boundaries)``
    with every message offset and the high watermark."""
    rng = random.Random(7)
    log = PartitionLog(tmp_path / "p", TopicConfig(segment_bytes=20_000, max_message_bytes=10_000))
    for _ in range(120):
        log.append(encode_message_set([os.urandom(rng.randrange(0, 2000)) for _ in range(rng.randrange(1, 5))]))
    log.flush()
    bounds, offset = [], 0
    while offset < log.high_watermark:
        piece = log.read(offset, 1 << 20)
        records, consumed = decode_messages(os.pread(piece.file.fileno(), piece.length, piece.position), offset)
        bounds += [r[0] for r in records]
        offset += consumed
    try:
        yield log, bounds + [log.high_watermark]
    finally:
        log.close()


def test_boundaries_refuse_a_start_off_a_boundary_and_ranges_outside_the_log(small_log):
    log, bounds = small_log
    with pytest.raises(InvalidOffsetError):
        log.message_boundaries(bounds[3] + 1, bounds[-1], [bounds[10]])
    with pytest.raises(OffsetOutOfRangeError):
        log.message_boundaries(0, log.high_watermark + 1, [5])


def test_boundaries_report_a_damaged_size_field(small_log, tmp_path):
    log, bounds = small_log
    segment = os.path.join(log.directory, "00000000000000000000.log")
    fd = os.open(segment, os.O_WRONLY)
    try:
        os.pwrite(fd, b"\xff\xff\xff\xff", bounds[2])
    finally:
        os.close(fd)
    with pytest.raises(CorruptMessageError, match=f"offset {bounds[2]}"):
        log.message_boundaries(0, bounds[-1], [bounds[2] + 1])


def test_boundaries_are_the_first_message_at_or_after_each_target(small_log):
    log, bounds = small_log
    assert len(log.segment_bases) > 3
    rng = random.Random(3)
    targets = [rng.randrange(0, bounds[-1] + 50) for _ in range(200)] + log.segment_bases
    got = log.message_boundaries(0, bounds[-1], targets)
    for target, found in zip(targets, got):
        assert found == (bounds[bisect.bisect_left(bounds, target)] if target <= bounds[-1] else bounds[-1])
    # within a sub-range: clamped to its ends
    start, end = bounds[20], bounds[-30]
    got = log.message_boundaries(start, end, targets)
    for target, found in zip(targets, got):
        want = start if target <= start else end if target >= end else bounds[bisect.bisect_left(bounds, target)]
        assert found == want


def test_split_counts_follow_sizes_and_reach_the_minimum():
    assert split_counts([100, 100], 4) == [2, 2]
    assert split_counts([900, 100], 10) == [9, 1]
    assert sum(split_counts([5, 1000, 3], 7)) >= 7
    assert split_counts([1, 1], 10) == [1, 1]  # a one-byte range cannot be split


# ---------------------------------------------------------------------------
# plans and range readers on real partition actors


def produce(client, topic, values, keys=None, compression=None):
    import ray

    producer = client.producer(acks=1, batch_size=40, compression=compression)
    for i, value in enumerate(values):
        producer.send(topic, value, None if keys is None else keys[i])
    producer.flush()
    producer.close()
    ray.get([client.partition_actor(topic, p).flush.remote() for p in range(client.metadata.partitions(topic))])


def log_messages(client, topic):
    return sorted((p, o, k, v, ts) for p in range(client.metadata.partitions(topic))
                  for o, ts, k, v in stored_records(client, topic, p))


def batch_rows(batches):
    rows = []
    for batch in batches:
        assert batch.schema == ARROW_SCHEMA
        d = batch.to_pydict()
        rows += [
            (p, o, k, v, round(t.timestamp() * 1000))
            for p, o, k, v, t in zip(d["partition"], d["offset"], d["key"], d["value"], d["timestamp"])
        ]
    return sorted(rows)


@pytest.fixture(scope="module")
def events(raylog_client):
    topic = "events-data"
    raylog_client.create_topic(topic, partitions=2)
    values = [b"event-%04d" % i + b"." * (i % 300) for i in range(1500)]
    produce(raylog_client, topic, values, keys=[b"k%d" % (i % 5) if i % 2 else None for i in range(1500)])
    return topic


def test_plan_read_of_an_unknown_topic_fails(raylog_client):
    with pytest.raises(UnknownTopicError):
        plan_read("nope", client=raylog_client)


def test_without_a_client_reads_use_the_client_of_this_process_or_RAYLOG_ZOOKEEPER(
    raylog_client, events, monkeypatch
):
    import raylog.client
    import raylog.metadata.clients

    expected = plan_read(events, client=raylog_client)
    # the client this process made (raylog_client is the only one open)
    assert plan_read(events).end_offsets == expected.end_offsets
    monkeypatch.setattr(raylog.metadata.clients, "OPEN_CLIENTS", [])
    monkeypatch.delenv("RAYLOG_ZOOKEEPER", raising=False)
    with pytest.raises(ConfigError, match=r"raylog.connect\(\).*RAYLOG_ZOOKEEPER"):
        plan_read(events)
    settings = raylog_client.settings
    monkeypatch.setenv("RAYLOG_ZOOKEEPER", settings.zookeeper)
    monkeypatch.setenv("RAYLOG_CLUSTER", settings.cluster)
    plan = plan_read(events)
    assert plan.end_offsets == expected.end_offsets
    assert plan.settings.zookeeper == settings.zookeeper and plan.settings.cluster == settings.cluster
    # a closed client is no longer the default
    monkeypatch.delenv("RAYLOG_ZOOKEEPER")
    monkeypatch.setattr(raylog.metadata.clients, "OPEN_CLIENTS", [raylog_client])
    assert raylog.client.current_client() is raylog_client


def test_range_readers_return_the_log(raylog_client, events):
    plan = plan_read(events, client=raylog_client)
    assert len(plan.ranges) == 2
    assert batch_rows(read_ranges(plan.ranges, plan.settings)) == log_messages(raylog_client, events)


def test_splits_from_the_partition_actors_tile_the_ranges(raylog_client, events):
    whole = plan_read(events, client=raylog_client)
    plan = plan_read(events, client=raylog_client, min_partitions=9)
    assert len(plan.ranges) >= 9
    offsets = {(m[0], m[1]) for m in log_messages(raylog_client, events)}
    for rng in plan.ranges:
        assert (rng.partition, rng.start) in offsets
        assert (rng.partition, rng.end) in offsets or rng.end == whole.end_offsets[rng.partition]
    assert sum(r.size for r in plan.ranges) == whole.total_bytes
    assert batch_rows(read_ranges(plan.ranges, plan.settings)) == log_messages(raylog_client, events)


def test_small_batches_and_compressed_sets(raylog_client, make_topic):
    topic = make_topic(partitions=1)
    produce(raylog_client, topic, [b"z-%d" % i for i in range(300)], compression="zstd")
    plan = plan_read(topic, client=raylog_client)
    rows = batch_rows(read_range(plan.ranges[0], plan.settings, batch_bytes=1))
    assert sorted(r[3] for r in rows) == sorted(b"z-%d" % i for i in range(300))
    offsets = [r[1] for r in rows]
    assert len(set(offsets)) == 300 and offsets == sorted(offsets)  # an offset of its own per message
    # a range that starts and ends inside wrappers: the messages from its start, before its end
    rng = plan.ranges[0]._replace(start=offsets[150], end=offsets[250])
    inner = batch_rows(read_range(rng, plan.settings))
    assert [r[1] for r in inner] == offsets[150:250]


def test_a_reader_finds_a_partition_actor_that_restarted(raylog_client, make_topic):
    import ray

    topic = make_topic(partitions=1)
    produce(raylog_client, topic, [b"v%d" % i for i in range(100)])
    plan = plan_read(topic, client=raylog_client)
    actor = raylog_client.partition_actor(topic, 0)
    old_pid = ray.get(actor.pid.remote())
    ray.kill(actor, no_restart=False)
    deadline = time.monotonic() + 120
    while True:  # until Ray restarted it (a new process, a new port)
        try:
            if ray.get(actor.pid.remote(), timeout=10) != old_pid:
                break
        except ray.exceptions.RayError:
            pass
        assert time.monotonic() < deadline, "the partition actor restarted within 120 s"
        time.sleep(0.2)
    assert raylog_client.metadata.endpoint(topic, 0, refresh=True, wait_s=30)[1] != plan.ranges[0].port
    rows = batch_rows(read_range(plan.ranges[0], plan.settings))
    assert sorted(r[3] for r in rows) == sorted(b"v%d" % i for i in range(100))


def test_retention_before_the_plan_is_data_loss(raylog_client, make_topic):
    import ray

    topic = make_topic(partitions=1, segment_bytes=4096, max_message_bytes=2048, retention_bytes=4096)
    produce(raylog_client, topic, [b"r%04d" % i + b"-" * 100 for i in range(150)])
    plan = plan_read(topic, client=raylog_client)
    assert ray.get(raylog_client.partition_actor(topic, 0).delete_old_segments.remote())
    log_start = raylog_client.offsets(topic, 0)[0]
    with pytest.raises(DataLossError) as caught:
        plan_read(topic, {0: 0}, client=raylog_client)
    assert (caught.value.lost_start, caught.value.lost_end) == (0, log_start)
    # the old plan's reader meets the deletion: an error, or skipped and reported
    with pytest.raises(DataLossError):
        list(read_range(plan.ranges[0], plan.settings))
    lost = []
    rows = batch_rows(read_range(plan.ranges[0], plan.settings, fail_on_data_loss=False, lost=lost))
    assert rows == log_messages(raylog_client, topic)
    assert [(g.start, g.end) for g in lost] == [(0, log_start)]


# ---------------------------------------------------------------------------
# Ray Data


def test_read_raylog_is_the_same_messages(raylog_client, events):
    ds = read_raylog(events, client=raylog_client, min_partitions=4)
    assert ds.schema().names == ARROW_SCHEMA.names
    rows = sorted(
        (r["partition"], r["offset"], r["key"], r["value"], round(r["timestamp"].timestamp() * 1000))
        for r in ds.iter_rows()
    )
    assert rows == log_messages(raylog_client, events)


def test_read_raylog_tasks_prefer_the_partitions_node(raylog_client, events):
    import ray

    plan = plan_read(events, client=raylog_client)
    node_ids = {r.node_id for r in plan.ranges}
    assert node_ids <= {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    options = placement_options(plan.ranges[0].node_id)
    assert options["label_selector"] == {"ray.io/node-id": plan.ranges[0].node_id}

    @ray.remote(num_cpus=0, **options)
    def where():
        return ray.get_runtime_context().get_node_id()

    assert ray.get(where.remote()) == plan.ranges[0].node_id
    assert read_raylog(events, plan=plan, num_cpus=0.5).count() == 1500


def test_read_raylog_of_nothing_is_an_empty_dataset(raylog_client, events):
    ds = read_raylog(events, "latest", client=raylog_client)
    assert ds.count() == 0
