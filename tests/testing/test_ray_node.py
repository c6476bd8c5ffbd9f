"""The hosts kit's ``ray start`` launcher waits longer for a node's
registration than Ray's 30 s (raylog.testing.ray_node)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from raylog.testing import ray_node


def test_a_node_not_registered_yet_is_looked_up_again_until_it_is():
    calls = []

    def get_node(gcs_address, node_id):
        calls.append((gcs_address, node_id))
        if len(calls) < 3:
            raise RuntimeError("node not found")
        return {"node_id": node_id}

    lookup = ray_node._patient(get_node, wait_s=ray_node.RAY_WAIT_S + 30)
    assert lookup("10.0.0.1:6379", "n1") == {"node_id": "n1"}
    assert len(calls) == 3


def test_a_node_that_never_registers_is_reported_missing_after_the_wait():
    def get_node(gcs_address, node_id):
        raise RuntimeError("node not found")

    # no time beyond Ray's own wait: the first miss is reported, as Ray would
    lookup = ray_node._patient(get_node, wait_s=ray_node.RAY_WAIT_S)
    with pytest.raises(RuntimeError, match="node not found"):
        lookup("10.0.0.1:6379", "n1")


def test_the_launcher_is_rays_own_command_line():
    proc = subprocess.run([sys.executable, "-m", "raylog.testing.ray_node", "start", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "--node-ip-address" in proc.stdout, proc.stderr[-2000:]


def test_a_failed_start_names_the_newest_raylets_log(tmp_path):
    """A node started again in the same session writes raylet.<n>.out; the
    error of a failed start shows that one, not the first start's."""
    import os
    import time

    from raylog.testing.hosts import raylet_tail

    logs = tmp_path / "session_latest" / "logs"
    logs.mkdir(parents=True)
    (logs / "raylet.out").write_text("the first start\n")
    time.sleep(0.05)
    (logs / "raylet.2.out").write_text("Timed out waiting for file metrics_agent_port\n")
    os.utime(logs / "raylet.out", (time.time() - 60, time.time() - 60))
    tail = raylet_tail(str(tmp_path))
    assert "raylet.2.out" in tail and "Timed out waiting" in tail and "first start" not in tail
