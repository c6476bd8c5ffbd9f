"""``raylog audit`` through the installed script: a table per window and
exit code 1 when a window fell short.

Counts are made in this process (audited producers and consumers of the
module's ``raylog_client``, windows of 1 s at fixed timestamps, as in
test_audit.py); the script reads them back from the audit topic. It joins
the test session's local Ray as a second driver, as in test_cli.py (token
authentication: RAY_AUTH_MODE=token, which ``ray.init`` set in this
process's environment, reaches the subprocess).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

RAYLOG = os.path.join(os.path.dirname(sys.executable), "raylog")
COMMAND_TIMEOUT_S = 300
_OUR_VARS = ("RAYLOG_ZOOKEEPER", "RAYLOG_RAY_ADDRESS", "RAYLOG_CLUSTER", "RAYLOG_TOKEN", "RAYLOG_DATA_DIR", "RAY_ADDRESS")

# The audited producers and consumers of test_audit.py, the same windows.
from test_audit import _consume_all, _produce_windows  # noqa: E402

A_UTC = "1970-01-01 00:00:10"
B_UTC = "1970-01-01 00:00:20"


def raylog(*args) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in _OUR_VARS}
    proc = subprocess.run([RAYLOG, *args], input=b"", capture_output=True, env=env, timeout=COMMAND_TIMEOUT_S)
    proc.stdout = proc.stdout.decode(errors="replace")
    proc.stderr = proc.stderr.decode(errors="replace")
    return proc


def error_lines(proc) -> list[str]:
    assert "Traceback" not in proc.stderr, proc.stderr
    return [line for line in proc.stderr.splitlines() if line.startswith("error: ")]


@pytest.fixture(scope="module")
def cluster(zookeeper, ray_local, raylog_client):
    """The global options that point the script at the test cluster."""
    if not zookeeper.running:
        zookeeper.start()
    return [
        "--zookeeper", zookeeper.connect_string,
        "--ray-address", ray_local.get_runtime_context().gcs_address,
        "--cluster", raylog_client.settings.cluster,
    ]


def _rows(stdout: str) -> tuple[list[str], list[list[str]]]:
    """The table's columns and rows (the window start is two words)."""
    header, *lines = stdout.splitlines()
    columns = re.split(r"\s{2,}", header.strip())
    return columns, [re.split(r"\s{2,}", line.strip()) for line in lines]


def test_audit_without_loss_shows_every_window_ok_and_exits_0(cluster, raylog_client, make_topic):
    topic = make_topic(partitions=2)
    _produce_windows(raylog_client, topic, sets_a=5, sets_b=3)
    assert _consume_all(raylog_client, topic, "audited", 80) == 80

    proc = raylog(*cluster, "audit", "--topic", topic, "--group", "audited")
    assert proc.returncode == 0, proc.stderr
    assert error_lines(proc) == []
    columns, rows = _rows(proc.stdout)
    assert columns == ["WINDOW START (UTC)", "WIDTH", "PRODUCED", "CONSUMED:audited", "STATUS"]
    assert rows == [[A_UTC, "1s", "50", "50", "ok"], [B_UTC, "1s", "30", "30", "ok"]]


def test_audit_names_the_window_whose_data_was_removed_and_exits_1(cluster, raylog_client, make_topic):
    import ray

    # Sets of 10 x 122 bytes; 3 sets fill a segment. Window A: 10 sets, window B: 3.
    topic = make_topic(partitions=1, segment_bytes=4096, retention_bytes=8192, max_message_bytes=4096)
    _produce_windows(raylog_client, topic, sets_a=10, sets_b=3)
    actor = raylog_client.partition_actor(topic, 0)
    ray.get(actor.flush.remote())
    assert ray.get(actor.delete_old_segments.remote()), "retention removed nothing"  # the injected loss
    got = _consume_all(raylog_client, topic, "late-readers", 130)
    assert got < 130

    for args in (["--group", "late-readers"], []):  # the only group that read it, named or not
        proc = raylog(*cluster, "audit", "--topic", topic, *args)
        assert proc.returncode == 1, (args, proc.stdout, proc.stderr)
        columns, rows = _rows(proc.stdout)
        assert columns == ["WINDOW START (UTC)", "WIDTH", "PRODUCED", "CONSUMED:late-readers", "STATUS"]
        (a_start, _, a_produced, a_consumed, a_status), b = rows
        assert (a_start, a_produced, a_status) == (A_UTC, "100", "SHORT") and int(a_consumed) < 100
        assert b == [B_UTC, "1s", "30", "30", "ok"]
        [error] = error_lines(proc)
        assert error == (
            f"error: 1 of 2 windows of {topic} fell short: {A_UTC} (late-readers consumed {a_consumed} of 100)"
        )


def test_audit_of_a_group_that_read_nothing_flags_every_window(cluster, raylog_client, make_topic):
    topic = make_topic(partitions=1)
    _produce_windows(raylog_client, topic, sets_a=1, sets_b=1)
    proc = raylog(*cluster, "audit", "--topic", topic, "--group", "nobody")
    assert proc.returncode == 1, proc.stderr
    _, rows = _rows(proc.stdout)
    assert rows == [[A_UTC, "1s", "10", "0", "SHORT"], [B_UTC, "1s", "10", "0", "SHORT"]]
    [error] = error_lines(proc)
    assert f"2 of 2 windows of {topic} fell short" in error and "nobody consumed 0 of 10" in error


def test_audit_of_a_topic_without_counts_says_so_and_exits_0(cluster, make_topic):
    topic = make_topic(partitions=1)
    proc = raylog(*cluster, "audit", "--topic", topic)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and f"no audit counts for {topic}" in proc.stderr


def test_audit_of_an_unknown_topic_exits_1_with_one_line(cluster):
    proc = raylog(*cluster, "audit", "--topic", "no-such-topic")
    assert proc.returncode == 1, proc.stderr
    [error] = error_lines(proc)
    assert "no-such-topic" in error


def test_audit_usage():
    proc = raylog("audit", "--help")
    assert proc.returncode == 0 and proc.stdout.startswith("Usage: raylog audit")
    proc = raylog("audit")
    assert proc.returncode == 2 and "Missing option '--topic'" in proc.stderr
    proc = raylog("audit", "--topic", "t")
    assert proc.returncode == 2 and "needs an existing raylog cluster: pass --zookeeper HOST:PORT" in proc.stderr
