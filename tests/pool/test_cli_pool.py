"""``raylog pool status GROUP`` through the installed script, from another
driver of the same Ray cluster: it finds the pool by its group (the named
controller) and shows members, lag and a stopped partition's error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pool_helpers
from pool_helpers import Recorder, produce
from raylog.testing.clusters import wait_until

RAYLOG = os.path.join(os.path.dirname(sys.executable), "raylog")
_OUR_VARS = ("RAYLOG_ZOOKEEPER", "RAYLOG_RAY_ADDRESS", "RAYLOG_CLUSTER", "RAYLOG_TOKEN", "RAYLOG_DATA_DIR", "RAY_ADDRESS")


def _raylog(options, *args):
    env = {k: v for k, v in os.environ.items() if k not in _OUR_VARS}
    return subprocess.run([RAYLOG, *options, *args], capture_output=True, text=True, env=env, timeout=300)


def test_pool_status_finds_the_pool_by_its_group(zookeeper, ray_local, raylog_client, make_topic, tmp_path):
    pool_helpers.send_by_value()
    options = ["--zookeeper", zookeeper.connect_string, "--ray-address", ray_local.get_runtime_context().gcs_address,
               "--cluster", raylog_client.settings.cluster]
    topic, group = make_topic(2, flush_ms=20), f"pool-{uuid.uuid4().hex[:8]}"
    produce(raylog_client, topic, 40, 2)
    pool = raylog_client.consumer_pool(topic, group, Recorder(str(tmp_path / "handled"), always_fail=1),
                                       max_handler_failures=2, autoscale=False, resources={"num_cpus": 0},
                                       sample_interval_s=0.5, commit_interval_s=0.5, retry_delay_s=0.05)
    try:
        assert wait_until(lambda: pool.status()["partitions"][1]["stopped"], 120, 0.5), pool.status()
        proc = _raylog(options, "pool", "status", group, "--json")
        assert proc.returncode == 0, proc.stderr
        status = json.loads(proc.stdout)
        assert status["group"] == group and status["member_count"] == 1
        assert status["members"][0]["partitions"] == [f"{topic}-0", f"{topic}-1"]
        rows = {r["partition"]: r for r in status["partitions"]}
        assert rows[1]["stopped"] and "always fails on partition 1" in rows[1]["last_error"]["error"]
        text = _raylog(options, "pool", "status", group)
        assert text.returncode == 0, text.stderr
        assert f"pool {group}: 1 members" in text.stdout and "stopped" in text.stdout
        assert f"{topic}-1: stopped at offset 0 after 2 failures: RuntimeError" in text.stderr
    finally:
        pool.stop(drain=True)
    gone = _raylog(options, "pool", "status", group)
    assert gone.returncode == 1 and "Traceback" not in gone.stderr, gone.stderr
    errors = [line for line in gone.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and f"no consumer pool of group {group!r}" in errors[0], gone.stderr
