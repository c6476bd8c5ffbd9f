"""Fixtures of the partition actor tests."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest


@pytest.fixture
def run_cluster_script(zookeeper, cluster_name, tmp_path):
    """``run(script) -> dict``: run ``script`` in a child process (argv:
    ZooKeeper, cluster name, data directory), which builds its own
    multi-node Ray cluster with ``ray.cluster_utils.Cluster`` and prints
    ``RESULT <json>``; returns that JSON. The child gets a Ray temp dir of
    its own (short: Ray's socket paths must fit in 107 bytes), so it never
    touches this session's Ray or another cluster on the machine."""

    def run(script: str) -> dict:
        ray_tmp = tempfile.mkdtemp(prefix="rl-", dir="/tmp")
        try:
            proc = subprocess.run(
                [sys.executable, "-c", script, zookeeper.connect_string, cluster_name, str(tmp_path / "data")],
                capture_output=True, text=True, timeout=600, env={**os.environ, "RAY_TMPDIR": ray_tmp},
            )
        finally:
            shutil.rmtree(ray_tmp, ignore_errors=True)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
        return json.loads(lines[-1][len("RESULT "):])

    return run
