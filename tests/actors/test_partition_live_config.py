"""A live topic's config changed with ``client.alter_topic`` (issue 46
point 1, issue 49) on real Ray and ZooKeeper: the running partition actor
takes it without a restart (its cleaner starts and stops with
``cleanup_policy``), a restarted actor takes the stored config, and a bad
change is refused with the config and the data as they were."""

from __future__ import annotations

import time

import pytest

from raylog.errors import ConfigError, ConfigNotLiveError, DeliveryError, MissingKeyError
from raylog.testing.clusters import wait_until

pytestmark = pytest.mark.timeout(300)

KEYS = 20
ROUNDS = 30


def _produce(client, topic, rounds, start=0):
    """``rounds`` values of each of KEYS keys; returns the latest value of each key."""
    producer = client.producer(acks=1)
    try:
        for r in range(start, start + rounds):
            for k in range(KEYS):
                producer.send(topic, b"v-%d-%d" % (k, r) + b"." * 200, key=b"k-%d" % k, partition=0)
        producer.flush()
    finally:
        producer.close()
    return {b"k-%d" % k: b"v-%d-%d" % (k, start + rounds - 1) + b"." * 200 for k in range(KEYS)}


def _read_all(client, topic):
    consumer = client.consumer(topic, auto_offset_reset="earliest")
    got = []
    try:
        end = client.end_offsets(topic)[0]
        deadline = time.monotonic() + 60
        while not got or got[-1].next_offset < end:
            got += consumer.poll(timeout_ms=300)
            assert time.monotonic() < deadline, "the consumer did not reach the log end"
    finally:
        consumer.close()
    return got


def _latest(records):
    table = {}
    for m in records:
        table[m.key] = m.value
    return table


def _stats(client, topic):
    import ray

    return ray.get(client.partition_actor(topic, 0).stats.remote(), timeout=30)


def _small_delete_topic(make_topic):
    # small segments (many roll), the cleaner's back-off short (retention_check_ms)
    return make_topic(partitions=1, segment_bytes=8 * 1024, max_message_bytes=4 * 1024, retention_check_ms=200,
                      flush_ms=10)


def test_a_delete_topic_altered_to_compact_is_cleaned_without_a_restart(raylog_client, make_topic):
    topic = _small_delete_topic(make_topic)
    latest = _produce(raylog_client, topic, ROUNDS)
    pid = _stats(raylog_client, topic)["pid"]
    written = len(_read_all(raylog_client, topic))
    assert written == KEYS * ROUNDS
    assert _stats(raylog_client, topic)["cleaner"] is None  # not compacted: no cleaner

    config = raylog_client.alter_topic(topic, cleanup_policy="compact", min_cleanable_dirty_ratio=0.01)
    assert config.compacted and raylog_client.describe_topic(topic)["config"] == config

    # the cleaner starts in the running actor and keeps the latest record of each key
    assert wait_until(lambda: (_stats(raylog_client, topic)["cleaner"] or {}).get("passes", 0) > 0, 60), \
        "the altered topic was not cleaned"
    records = _read_all(raylog_client, topic)
    assert _latest(records) == latest
    assert len(records) < written
    offsets = [m.offset for m in records]
    assert offsets == sorted(set(offsets))
    stats = _stats(raylog_client, topic)
    assert stats["pid"] == pid  # the same process: no restart
    assert stats["cleaner"]["bytes_removed"] > 0 and stats["cleaner"]["last_run_ms"] is not None
    assert 0.0 <= stats["cleaner"]["dirty_ratio"] <= 1.0

    # a compacted topic refuses records without a key from now on
    producer = raylog_client.producer(acks=1)
    try:
        with pytest.raises(MissingKeyError):
            producer.send(topic, b"no key", partition=0).result(timeout_s=30)
    finally:
        with pytest.raises(DeliveryError, match="MissingKeyError"):  # and told again at close
            producer.close()
    assert _latest(_read_all(raylog_client, topic)) == latest


def test_compact_altered_to_delete_stops_cleaning(raylog_client, make_topic):
    topic = make_topic(partitions=1, segment_bytes=8 * 1024, max_message_bytes=4 * 1024, retention_check_ms=200,
                       flush_ms=10, cleanup_policy="compact", min_cleanable_dirty_ratio=0.01)
    _produce(raylog_client, topic, ROUNDS)
    assert wait_until(lambda: (_stats(raylog_client, topic)["cleaner"] or {}).get("passes", 0) > 0, 60)
    raylog_client.alter_topic(topic, cleanup_policy="delete")
    assert wait_until(lambda: _stats(raylog_client, topic)["cleaner"] is None, 30)
    before = len(_read_all(raylog_client, topic))

    _produce(raylog_client, topic, ROUNDS, start=ROUNDS)  # as many duplicates again, over closed segments
    time.sleep(3)  # fifteen of the cleaner's back-offs: it would have cleaned by now
    after = _read_all(raylog_client, topic)
    assert len(after) == before + KEYS * ROUNDS  # nothing was cleaned
    assert _stats(raylog_client, topic)["cleaner"] is None


def test_a_bad_change_is_refused_and_the_config_and_data_stay(raylog_client, make_topic):
    topic = _small_delete_topic(make_topic)
    latest = _produce(raylog_client, topic, 3)
    before = raylog_client.describe_topic(topic)["config"]
    with pytest.raises(ConfigError, match="min_cleanable_dirty_ratio"):
        raylog_client.alter_topic(topic, cleanup_policy="compact", min_cleanable_dirty_ratio=1.5)
    with pytest.raises(ConfigNotLiveError, match="partitions cannot change on a live topic"):
        raylog_client.alter_topic(topic, partitions=2)
    with pytest.raises(ConfigError, match="unknown topic setting retention_days"):
        raylog_client.alter_topic(topic, retention_days=3)
    assert raylog_client.describe_topic(topic)["config"] == before
    assert _stats(raylog_client, topic)["cleaner"] is None  # still a delete topic
    records = _read_all(raylog_client, topic)
    assert len(records) == KEYS * 3 and _latest(records) == latest


def test_a_restarted_partition_takes_the_stored_config(raylog_client, make_topic):
    """Ray restarts an actor with its first arguments (the config at
    creation); it reads the stored config before it serves."""
    import ray

    topic = _small_delete_topic(make_topic)
    raylog_client.alter_topic(topic, cleanup_policy="compact", retention_ms=123_456)
    pid = _stats(raylog_client, topic)["pid"]
    ray.kill(raylog_client.partition_actor(topic, 0), no_restart=False)

    def restarted():
        try:
            return _stats(raylog_client, topic)["pid"] != pid
        except Exception:  # noqa: BLE001 - restarting
            return False

    assert wait_until(restarted, 120)
    stats = _stats(raylog_client, topic)
    assert stats["cleaner"] is not None and stats["cleaner"]["running"]
