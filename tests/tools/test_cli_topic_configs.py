"""``raylog topics create`` with the compaction settings, ``raylog topics
alter`` on a live topic, and ``raylog topics describe`` showing a compacted
topic's cleaner (issue 46 point 5), through the installed console script
against the shared ZooKeeper and the session's Ray (see test_cli.py)."""

from __future__ import annotations

import json
import os
import time

import pytest

from raylog.testing.clusters import wait_until

from test_cli import assert_one_error_line, raylog  # noqa: E402 - the runner of test_cli.py

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def cluster(zookeeper, ray_local, raylog_client):
    if not zookeeper.running:
        zookeeper.start()
    return ["--zookeeper", zookeeper.connect_string, "--ray-address", ray_local.get_runtime_context().gcs_address,
            "--cluster", raylog_client.settings.cluster]


def _name() -> str:
    return f"clc-{os.getpid()}-{time.monotonic_ns()}"


def test_create_takes_the_compaction_settings(cluster, raylog_client):
    name = _name()
    proc = raylog(*cluster, "topics", "create", name, "--cleanup-policy", "compact", "--delete-retention-ms", "5000",
                  "--min-compaction-lag-ms", "10", "--max-compaction-lag-ms", "3600000",
                  "--min-cleanable-dirty-ratio", "0.2", "--data-dir", raylog_client.data_dir)
    assert proc.returncode == 0, proc.stderr
    config = raylog_client.describe_topic(name)["config"]
    assert (config.cleanup_policy, config.delete_retention_ms, config.min_compaction_lag_ms,
            config.max_compaction_lag_ms, config.min_cleanable_dirty_ratio) == ("compact", 5000, 10, 3_600_000, 0.2)


def test_a_bad_compaction_setting_exits_2_before_anything_is_made(cluster):
    proc = raylog(*cluster, "topics", "create", _name(), "--cleanup-policy", "compact",
                  "--min-cleanable-dirty-ratio", "1.5")
    assert_one_error_line(proc, 2, "min_cleanable_dirty_ratio must be a number in (0, 1]")


def test_alter_refuses_bad_values_fixed_and_unknown_settings_and_changes_nothing(cluster, raylog_client, make_topic):
    name = make_topic(partitions=1, retention_ms=120_000)
    before = raylog_client.describe_topic(name)["config"]
    for args, fragments in (
        (["--set", "min_cleanable_dirty_ratio=2"], ["min_cleanable_dirty_ratio must be a number in (0, 1]"]),
        (["--set", "retention_ms=soon"], ["retention_ms=soon: an integer is expected"]),
        (["--set", "partitions=4"], ["partitions cannot change on a live topic"]),
        (["--set", "cleanup_policy=compact", "--set", "replication_factor=3"],
         ["replication_factor cannot change on a live topic"]),
        (["--set", "retention_days=3"], ["unknown topic setting retention_days"]),
    ):
        assert_one_error_line(raylog(*cluster, "topics", "alter", name, *args), 2, *fragments)
    assert raylog_client.describe_topic(name)["config"] == before
    proc = raylog(*cluster, "topics", "alter", name)
    assert proc.returncode == 2 and "--set SETTING=VALUE" in proc.stderr


def test_alter_to_compact_and_describe_shows_the_cleaner(cluster, raylog_client, make_topic):
    name = make_topic(partitions=2, segment_bytes=8 * 1024, max_message_bytes=4 * 1024, retention_check_ms=200,
                      flush_ms=10, retention_ms=120_000)
    producer = raylog_client.producer(acks=1)
    try:
        for r in range(30):
            for k in range(20):
                producer.send(name, b"v-%d" % r + b"." * 200, key=b"k-%d" % k, partition=k % 2)
        producer.flush()
    finally:
        producer.close()

    proc = raylog(*cluster, "topics", "alter", name, "--set", "cleanup-policy=compact",
                  "--set", "min_cleanable_dirty_ratio=0.01", "--reset", "retention_ms")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (f"Altered topic {name}: cleanup_policy=compact, min_cleanable_dirty_ratio=0.01, "
                                   f"retention_ms=604800000.")
    config = raylog_client.describe_topic(name)["config"]
    assert (config.cleanup_policy, config.min_cleanable_dirty_ratio, config.retention_ms) == (
        "compact", 0.01, 604_800_000)

    def described():
        proc = raylog(*cluster, "topics", "describe", name, "--json")
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    assert wait_until(lambda: all((p["cleaner"] or {}).get("passes", 0) > 0 for p in described()["partitions"]),
                      120, interval_s=1)
    for p in described()["partitions"]:
        cleaner = p["cleaner"]
        assert cleaner["running"] and cleaner["bytes_removed"] > 0 and cleaner["last_run_ms"] > 0
        assert 0.0 <= cleaner["dirty_ratio"] <= 1.0

    proc = raylog(*cluster, "topics", "describe", name)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "cleanup_policy: compact" in lines[0]
    at = next(i for i, line in enumerate(lines) if line.split()[:2] == ["PARTITION", "DIRTY_RATIO"])
    assert lines[at].split() == ["PARTITION", "DIRTY_RATIO", "LAST_RUN", "PASSES", "BYTES_REMOVED",
                                 "RECORDS_REMOVED", "CLEANER"]
    rows = [line.split() for line in lines[at + 1:at + 3]]
    assert [row[0] for row in rows] == ["0", "1"]
    for row in rows:
        partition, ratio, last_run, passes, removed, records, state = row
        assert 0.0 <= float(ratio) <= 1.0 and last_run.endswith("Z") and int(passes) > 0 and int(removed) > 0
        assert state == "running"

    # back to delete: the cleaner stops and the table is gone
    proc = raylog(*cluster, "topics", "alter", name, "--set", "cleanup_policy=delete")
    assert proc.returncode == 0, proc.stderr
    proc = raylog(*cluster, "topics", "describe", name)
    assert "cleanup_policy: delete" in proc.stdout and "DIRTY_RATIO" not in proc.stdout
