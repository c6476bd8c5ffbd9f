"""``raylog consume --skip-corrupt``: the installed script in a subprocess
(shared ZooKeeper, the session's Ray, a real partition actor) stops at a
damaged message with the error and the way out, or skips it with a warning
and prints every other message."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from raylog.testing.faults import flip_byte, message_size

RAYLOG = os.path.join(os.path.dirname(sys.executable), "raylog")
_OUR_VARS = ("RAYLOG_ZOOKEEPER", "RAYLOG_RAY_ADDRESS", "RAYLOG_CLUSTER", "RAYLOG_TOKEN", "RAYLOG_DATA_DIR", "RAY_ADDRESS")


@pytest.fixture(scope="module")
def cluster(zookeeper, raylog_client):
    if not zookeeper.running:
        zookeeper.start()
    return ["--zookeeper", zookeeper.connect_string, "--cluster", raylog_client.settings.cluster]


def _consume(cluster, topic, *extra) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in _OUR_VARS}
    return subprocess.run([RAYLOG, *cluster, "consume", topic, "--from-beginning", "--timeout-ms", "3000", *extra],
                          capture_output=True, env=env, timeout=300)


def test_consume_stops_at_a_corrupt_message_or_skips_it(cluster, raylog_client, make_topic):
    import ray

    topic = make_topic(partitions=1)
    producer = raylog_client.producer(acks=1, batch_size=1)  # a record batch each, all of one size
    for i in range(8):
        producer.send(topic, b"line-%d" % i)
    producer.close()
    ray.get(raylog_client.partition_actor(topic, 0).flush.remote())
    log_dir = raylog_client.registry.placement(topic, 0)["log_dir"]
    size = message_size(log_dir, 0)
    flip_byte(log_dir, 3 * size)

    stopped = _consume(cluster, topic)
    assert stopped.returncode != 0
    assert stopped.stdout.decode().split() == ["line-0", "line-1", "line-2"]
    err = stopped.stderr.decode()
    assert f"offset {3 * size}" in err and f"next readable batch is at {4 * size}" in err
    assert "--skip-corrupt" in err

    skipped = _consume(cluster, topic, "--skip-corrupt")
    assert skipped.returncode == 0, skipped.stderr.decode()[-3000:]
    assert skipped.stdout.decode().split() == [f"line-{i}" for i in range(8) if i != 3]
    err = skipped.stderr.decode()
    assert f"skipped {size} corrupt bytes of {topic}-0, offsets [{3 * size}, {4 * size})" in err
    assert "consumed 7 messages (skipped 1 corrupt range)" in err
