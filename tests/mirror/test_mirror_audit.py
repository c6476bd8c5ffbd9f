"""The audit across tiers (raylog.mirror.audit, ``raylog audit compare``): a
mirrored topic counted per window in the source and in the target agrees;
a message missing from the target, or one extra in it, is named by window."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
import uuid

from raylog.audit import compare_tiers
from raylog.mirror.audit import compare_topic
from raylog.mirror.controller import partition_status
from raylog.mirror.spec import MirrorSpec
from raylog.testing.clusters import wait_until

RAYLOG = os.path.join(os.path.dirname(sys.executable), "raylog")
_OUR_VARS = ("RAYLOG_ZOOKEEPER", "RAYLOG_RAY_ADDRESS", "RAYLOG_CLUSTER", "RAYLOG_TOKEN", "RAYLOG_DATA_DIR", "RAY_ADDRESS")
WINDOW_MS = 10_000


def _send(client, topic, stamps, tag):
    producer = client.producer(acks="all", linger_ms=2)
    try:
        for i, ts in enumerate(stamps):
            producer.send(topic, f"{tag}{i}".encode(), key=b"k%d" % (i % 5), timestamp_ms=ts)
        producer.flush()
    finally:
        producer.close()


def test_compare_tiers_flags_missing_and_extra_windows_in_its_bounds():
    rows = compare_tiers({0: 5, 10: 3, 20: 4, 30: 1}, {0: 5, 10: 2, 20: 6}, 10, since_ms=10, until_ms=30)
    assert [(r["window_start"], r["source"], r["target"], r["status"]) for r in rows] == [
        (10, 3, 2, "missing"), (20, 4, 6, "extra")]
    assert [r["status"] for r in compare_tiers({0: 1}, {0: 1}, 10)] == ["ok"]


def _scrape(ray) -> str:
    node = ray._private.worker.global_worker.node
    with urllib.request.urlopen(f"http://{node.node_ip_address}:{node.metrics_export_port}/metrics", timeout=10) as r:
        return r.read().decode()


def test_a_mirrored_topic_agrees_per_window_and_a_difference_is_named(zookeeper, ray_local, raylog_client, source):
    target, tag = raylog_client, uuid.uuid4().hex[:6]
    topic = f"audited-{tag}"
    source.create_topic(topic, partitions=2)
    now = int(time.time() * 1000)
    base = now - now % WINDOW_MS - 5 * WINDOW_MS  # five closed windows
    stamps = [base + (i % 5) * WINDOW_MS + i for i in range(250)]
    _send(source, topic, stamps, "s")
    handle = target.mirror(source_zookeeper=source.settings.zookeeper, source_cluster=source.settings.cluster,
                           topics=topic, rename="{source}.{topic}", name=f"audit-{tag}", scan_interval_s=2.0)
    copy = f"{source.settings.cluster}.{topic}"
    try:
        wait_until(lambda: target.registry.topic_exists(copy)
                   and len(handle.status()["partitions"]) == 2
                   and all(r["lag_messages"] == 0 for r in handle.status()["partitions"])
                   and sum(target.end_offsets(copy).values()) > 0, timeout_s=120)
        # the controller records each partition's lag as Ray metrics
        wanted = f'mirror="audit-{tag}"'
        wait_until(lambda: len([line for line in _scrape(ray_local).splitlines()
                                if line.startswith("ray_raylog_mirror_lag_messages{") and wanted in line
                                and line.endswith(" 0.0")]) == 2, timeout_s=90)
    finally:
        handle.stop()

    rows = compare_topic(source, target, topic, copy, window_ms=WINDOW_MS)
    assert [(r["window_start"], r["source"], r["target"], r["status"]) for r in rows] == [
        (base + k * WINDOW_MS, 50, 50, "ok") for k in range(5)]

    # the mirror is stopped: 3 messages reach only the source, 2 only the target
    _send(source, topic, [base + WINDOW_MS + 1] * 3, "late")
    _send(target, copy, [base + 3 * WINDOW_MS + 2] * 2, "dup")
    spec = MirrorSpec(name=f"audit-{tag}", source_zookeeper=source.settings.zookeeper,
                      source_cluster=source.settings.cluster, topics=topic, rename="{source}.{topic}")
    lags = [partition_status(spec, source, target, topic, p) for p in range(2)]
    assert sum(r["lag_messages"] for r in lags) == 3 and all(r["lag_bytes"] >= 0 for r in lags)
    rows = {r["window_start"]: r for r in compare_topic(source, target, topic, copy, window_ms=WINDOW_MS)}
    assert (rows[base + WINDOW_MS]["status"], rows[base + WINDOW_MS]["target"]) == ("missing", 50)
    assert (rows[base + 3 * WINDOW_MS]["status"], rows[base + 3 * WINDOW_MS]["target"]) == ("extra", 52)
    assert sum(r["status"] == "ok" for r in rows.values()) == 3

    env = {k: v for k, v in os.environ.items() if k not in _OUR_VARS}
    proc = subprocess.run(
        [RAYLOG, "--zookeeper", zookeeper.connect_string, "--cluster", target.settings.cluster, "audit", "compare",
         "--source-zookeeper", zookeeper.connect_string, "--source-cluster", source.settings.cluster,
         "--topic", topic, "--target-topic", copy, "--window-ms", str(WINDOW_MS)],
        capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["WINDOW", "START", "(UTC)", "WIDTH", "SOURCE", "TARGET", "STATUS"]
    assert [line.split()[-1] for line in lines[1:]] == ["ok", "missing", "ok", "extra", "ok"]
    assert "error: 2 of 5 windows of " in proc.stderr and "missing: source 53, target 50" in proc.stderr
