"""A raylog cluster that restarts comes back serving every topic, and a topic
deleted while it was down is gone: on the real local cluster
(deploy/local_cluster.py, two disk nodes of Ray's fake multi-node provider,
stopped by PID), with ZooKeeper's data kept in the state dir.

The client steps run in fresh processes with ``RAY_AUTH_MODE`` unset: the
cluster uses Ray's token auth (``~/.ray/auth_token``), so they also show
that ``raylog.connect(ray_address=...)`` joins it without the variable.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOCAL_CLUSTER = os.path.join(REPO, "deploy", "local_cluster.py")
MESSAGES = 300

pytestmark = pytest.mark.skipif(
    not os.path.exists(os.path.expanduser("~/.ray/auth_token")), reason="needs Ray's token (~/.ray/auth_token)"
)


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RAYLOG_", "RAY_AUTH_MODE")) and k != "RAY_ADDRESS"}
    env.update(extra)
    return env


def _cluster(command: str, state_dir: str, *args, timeout=400) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, LOCAL_CLUSTER, command, "--state-dir", state_dir, *args],
                          capture_output=True, text=True, env=_env(), timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


# The client steps. argv: step, zookeeper, ray address, data dir, cluster, topic.
STEP = textwrap.dedent('''
    import json, sys, time
    import raylog
    from raylog.client import Client

    step, zookeeper, address, data_dir, cluster, topic = sys.argv[1:7]
    out = {}
    if step in ("create", "recreate"):
        client = raylog.connect(zookeeper=zookeeper, ray_address=address, data_dir=data_dir, cluster=cluster)
        client.create_topic(topic, partitions=4, flush_ms=20)
    else:  # no Ray: ZooKeeper and the data sockets only, as any consumer
        client = Client(zookeeper=zookeeper, cluster=cluster, data_dir=data_dir)
    if step == "delete":
        client.delete_topic(topic)
        out["tombstones"] = sorted(s["log_dir"] for s in client.registry.tombstones().values())
    if step in ("create", "produce-more"):
        producer = client.producer(acks=1, batch_size=20)
        values = [b"%s-%d" % (step.encode(), i) for i in range(int(sys.argv[7]))]
        for value in values:
            producer.send(topic, value)
        producer.close()  # flushes: raises unless every message was acknowledged
        out["acked"] = [v.decode() for v in values]
    if step in ("read", "recreate"):
        if step == "read":  # wait for endpoints newer than those before the restart
            old = json.loads(sys.argv[7])
            deadline = time.monotonic() + 120
            while True:
                epochs = {str(p): e["epoch"] for p, e in client.registry.endpoints(topic).items()}
                if all(epochs.get(p, -1) > e for p, e in old.items()):
                    break
                assert time.monotonic() < deadline, ("not served again", epochs, old)
                time.sleep(0.5)
        consumer = client.consumer(topic, auto_offset_reset="earliest")
        ends = client.end_offsets(topic)
        got = []
        deadline = time.monotonic() + 120
        while any((consumer.position(topic, p) or 0) < end for p, end in ends.items()):
            assert time.monotonic() < deadline, "could not read to the end"
            got += consumer.poll(timeout_ms=500)
        out["read"] = [[m.value.decode(), m.partition, m.offset] for m in got]
        out["ends"] = ends
    out["epochs"] = {str(p): e["epoch"] for p, e in client.registry.endpoints(topic).items()} \\
        if client.registry.topic_exists(topic) else {}
    out["log_dirs"] = {str(p): v["log_dir"] for p, v in client.registry.placements(topic).items()} \\
        if client.registry.topic_exists(topic) else {}
    client.close()
    print("RESULT " + json.dumps(out))
''')


def _step(step: str, state: dict, data_dir: str, cluster: str, topic: str, *extra) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", STEP, step, state["zookeeper"], state["ray_address"], data_dir, cluster, topic,
         *map(str, extra)],
        capture_output=True, text=True, env=_env(), timeout=400,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-5000:]
    return json.loads(lines[-1][len("RESULT "):])


def _state(state_dir: str) -> dict:
    with open(os.path.join(state_dir, "cluster.json")) as f:
        return json.load(f)


def _start(state_dir: str, port: int, cluster: str, exports: list | None = None) -> dict:
    proc = _cluster("start", state_dir, "--disk-nodes", "2", "--port", str(port), "--cluster", cluster)
    if exports is not None:
        exports.append(_exports(proc.stdout))
    return _state(state_dir)


def _stop(state_dir: str) -> None:
    if os.path.exists(os.path.join(state_dir, "cluster.json")):
        _cluster("stop", state_dir, timeout=120)


def _segment_files(log_dir: str) -> list[str]:
    try:
        return [n for n in os.listdir(log_dir) if n.endswith(".log")]
    except FileNotFoundError:
        return []


def test_local_cluster_restart_serves_every_topic_again_and_a_delete_while_down_is_honoured(tmp_path):
    from raylog.zk.launcher import free_port

    # Ray's socket paths under the state dir must stay short (107 bytes)
    state_dir, data_dir = tempfile.mkdtemp(prefix="rl-"), str(tmp_path / "data")
    cluster, topic = f"restart-{uuid.uuid4().hex[:8]}", "clicks"
    port = free_port()
    exports: list[dict] = []
    try:
        state = _start(state_dir, port, cluster, exports)
        # ``start`` prints only the export line on stdout, and raylog finds the cluster through it
        assert exports[0]["RAYLOG_ZOOKEEPER"] == state["zookeeper"]
        assert exports[0]["RAYLOG_RAY_ADDRESS"] == f"127.0.0.1:{port}" and exports[0]["RAYLOG_CLUSTER"] == cluster
        created = _step("create", state, data_dir, cluster, topic, MESSAGES)
        acked = created["acked"]
        assert len(acked) == MESSAGES and len(created["epochs"]) == 4
        assert len({os.path.dirname(d) for d in created["log_dirs"].values()}) == 1
        _joins_without_ray_auth_mode(state, cluster)

        # stop everything (Ray by PID, ZooKeeper by its pid file), start again
        _stop(state_dir)
        state = _start(state_dir, port, cluster, exports)
        assert exports[1] == exports[0]  # the same ZooKeeper port: the exported line is still right
        listed = subprocess.run([sys.executable, "-m", "raylog.tools.cli", "topics", "list", "--json"],
                                capture_output=True, text=True, env=_env(**exports[1]), timeout=120)
        assert listed.returncode == 0 and json.loads(listed.stdout) == [topic], listed.stderr[-4000:]

        # No client call brings it back: a client outside Ray only reads.
        read = _step("read", state, data_dir, cluster, topic, json.dumps(created["epochs"]))
        assert sorted(v for v, _, _ in read["read"]) == sorted(acked)  # every acknowledged message, once
        more = _step("produce-more", state, data_dir, cluster, topic, 50)
        assert len(more["acked"]) == 50  # producing continues
        assert all(more["epochs"][p] > created["epochs"][p] for p in created["epochs"])

        # delete while the cluster is down: only ZooKeeper runs
        _stop(state_dir)
        zk_dir = os.path.join(state_dir, "zookeeper")
        raylog_cli = [sys.executable, "-m", "raylog.tools.cli"]
        out = subprocess.run([*raylog_cli, "zookeeper", "start", "--port", "0", "--data-dir", zk_dir],
                             capture_output=True, text=True, env=_env(), timeout=180)
        assert out.returncode == 0, out.stderr
        try:
            zookeeper = out.stdout.split("running at ")[1].split()[0]
            deleted = _step("delete", {**state, "zookeeper": zookeeper}, data_dir, cluster, topic)
        finally:
            subprocess.run([*raylog_cli, "zookeeper", "stop", "--data-dir", zk_dir], env=_env(), timeout=60)
        assert sorted(deleted["tombstones"]) == sorted(created["log_dirs"].values())
        assert all(_segment_files(d) for d in created["log_dirs"].values())  # still on disk, for now

        # start: the supervisor removes the logs; the same name starts empty
        state = _start(state_dir, port, cluster)
        deadline = time.monotonic() + 120
        while any(_segment_files(d) for d in created["log_dirs"].values()):
            assert time.monotonic() < deadline, "the deleted logs were not removed"
            time.sleep(0.5)
        again = _step("recreate", state, data_dir, cluster, topic)
        assert again["read"] == [] and set(again["ends"].values()) == {0}
    finally:
        _stop(state_dir)
        shutil.rmtree(state_dir, ignore_errors=True)


def _joins_without_ray_auth_mode(state: dict, cluster: str) -> None:
    """The local cluster's head runs with Ray's token auth; a process with
    RAY_AUTH_MODE unset joins it with raylog.connect(ray_address=...) (and
    the CLI through it) at once, with no warnings' worth of retries."""
    script = textwrap.dedent(f"""
        import os, ray, raylog
        assert "RAY_AUTH_MODE" not in os.environ
        client = raylog.connect(zookeeper={state['zookeeper']!r}, ray_address={state['ray_address']!r},
                                cluster={cluster!r})
        print("NODES", len(ray.nodes()))
        client.close()
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.returncode == 0 and "NODES" in proc.stdout, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr and "InvalidAuthToken" not in proc.stderr, proc.stderr[-4000:]

    cli = subprocess.run(
        [sys.executable, "-m", "raylog.tools.cli", "--zookeeper", state["zookeeper"], "--ray-address",
         state["ray_address"], "--cluster", cluster, "supervisor", "start"],
        capture_output=True, text=True, env=_env(), timeout=120,
    )
    assert cli.returncode == 0 and f"supervisor of cluster {cluster} runs" in cli.stdout, cli.stderr[-4000:]


def _exports(stdout: str) -> dict:
    """The variables of the one ``export`` line ``start`` prints on stdout."""
    (line,) = stdout.splitlines()
    assert line.startswith("export "), stdout
    return dict(item.split("=", 1) for item in line.split()[1:])
