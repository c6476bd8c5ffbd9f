"""The deploy configs: Ray's own cluster-config schema, the raylog parts of
each config, the cluster ZooKeeper script, and the local cluster's stop by PID."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import jsonschema
import pytest
import yaml

from raylog.actors.placement import DISK_RESOURCE, NODE_LABEL

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOY = os.path.join(REPO, "deploy")
CONFIGS = ["cluster-aws.yaml", "local-autoscaling.yaml"]


def _load(name: str) -> dict:
    with open(os.path.join(DEPLOY, name)) as f:
        return yaml.safe_load(f)


def _ray_schema() -> dict:
    import ray.autoscaler

    with open(os.path.join(os.path.dirname(ray.autoscaler.__file__), "ray-schema.json")) as f:
        return json.load(f)


def _workers(config: dict) -> dict:
    return {name: t for name, t in config["available_node_types"].items() if name != config["head_node_type"]}


# -- Ray's schema -------------------------------------------------------------


@pytest.mark.parametrize("name", CONFIGS)
def test_config_follows_rays_cluster_schema(name):
    config = _load(name)
    jsonschema.validate(config, _ray_schema())
    # What `ray up` does with it: merge the provider's defaults, then Ray's
    # checks on top of the schema (node types, head type, worker bounds).
    # Ray 2.60 ships no defaults file for fake_multinode (why `ray up` fails
    # with it), so that config is complete on its own.
    from ray.autoscaler._private.util import prepare_config, validate_config

    if config["provider"]["type"] != "fake_multinode":
        config = prepare_config(config)
    validate_config(config)


def test_the_schema_check_catches_a_broken_config():
    config = _load("local-autoscaling.yaml")
    config["available_node_types"]["raylog.disk.a"]["resources"]["raylog_disk"] = "one"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(config, _ray_schema())


# -- raylog's parts -------------------------------------------------------------


@pytest.mark.parametrize("name", CONFIGS)
def test_the_head_runs_no_partitions(name):
    config = _load(name)
    head = config["available_node_types"][config["head_node_type"]]
    assert DISK_RESOURCE not in head["resources"]
    assert not any(DISK_RESOURCE in cmd for cmd in config.get("head_start_ray_commands", []))


def test_aws_disk_nodes_offer_disk_under_a_label_of_their_own():
    config = _load("cluster-aws.yaml")
    disks = {n: t for n, t in _workers(config).items() if t["resources"].get(DISK_RESOURCE, 0) > 0}
    assert disks, "no worker node type offers raylog_disk"
    for node_type in disks.values():
        # never scaled down under their logs
        assert node_type["min_workers"] == node_type["max_workers"] >= 1
        assert NODE_LABEL not in node_type.get("labels", {})  # a type's label would be shared
    start = " ".join(config["worker_start_ray_commands"])
    assert re.search(rf'--labels="?{NODE_LABEL}=\$\(hostname', start), start
    assert "RAY_AUTH_MODE=token" in start and "$RAY_HEAD_IP:6379" in start
    elastic = [t for t in _workers(config).values() if DISK_RESOURCE not in t["resources"]]
    assert all(t["min_workers"] == 0 and t["max_workers"] > 0 for t in elastic)


def test_aws_head_starts_the_cluster_zookeeper_on_its_private_address():
    config = _load("cluster-aws.yaml")
    commands = config["head_start_ray_commands"]
    zookeeper = [c for c in commands if "cluster_zookeeper.py start" in c]
    assert len(zookeeper) == 1 and "--host $(hostname -I" in zookeeper[0]
    assert commands.index(zookeeper[0]) < next(i for i, c in enumerate(commands) if "ray start --head" in c)
    assert any("RAYLOG_ZOOKEEPER=$(hostname -I" in c for c in config["head_setup_commands"])


def test_aws_setup_installs_raylog_with_the_pinned_constraints():
    config = _load("cluster-aws.yaml")
    mounts = config["file_mounts"]
    checkout = next(remote for remote, local in mounts.items() if local == ".")
    installs = [c for c in config["setup_commands"] if "pip install" in c and "constraints.txt" in c]
    assert installs, config["setup_commands"]
    assert re.search(r"-c \S*raylog/constraints\.txt \S*raylog-dist/raylog-\*\.whl", installs[0])
    assert checkout.endswith("/raylog") and os.path.exists(os.path.join(REPO, "constraints.txt"))
    assert any("openjdk" in c for c in config["setup_commands"])  # ZooKeeper and Spark need java
    assert "~/.ray/auth_token" in mounts.values()


def test_aws_nodes_install_a_built_wheel_not_an_editable_checkout():
    """Every node builds a wheel of the mounted checkout and installs it
    (as users install raylog): no editable install anywhere, the wheel
    built before it is installed, and this build put in place of an earlier
    one of the same version."""
    config = _load("cluster-aws.yaml")
    commands = [c for key in ("setup_commands", "head_setup_commands", "worker_setup_commands")
                for c in config.get(key) or []]
    assert not any(re.search(r"pip install\b.*(\s-e\s|--editable)", c) for c in commands), commands
    setup = config["setup_commands"]
    checkout = next(remote for remote, local in config["file_mounts"].items() if local == ".")
    build = [i for i, c in enumerate(setup) if re.search(r"pip wheel .*--no-deps -w ~/raylog-dist ~/raylog$", c)]
    install = [i for i, c in enumerate(setup) if "pip install" in c and "raylog-dist/raylog-*.whl" in c]
    assert len(build) == 1 and len(install) == 2 and build[0] < min(install), setup
    assert "--force-reinstall" in setup[max(install)] and "--no-deps" in setup[max(install)]
    assert checkout.replace("/home/ubuntu", "~") == "~/raylog"  # what the build reads


def test_local_config_autoscales_disk_nodes_with_distinct_labels():
    config = _load("local-autoscaling.yaml")
    assert config["provider"]["type"] == "fake_multinode"
    workers = _workers(config)
    assert workers
    for node_type in workers.values():
        assert node_type["resources"][DISK_RESOURCE] >= 1 and node_type["resources"]["CPU"] >= 1
        assert node_type["min_workers"] == 0 and node_type["max_workers"] == 1
    labels = [t["labels"][NODE_LABEL] for t in workers.values()]
    assert len(set(labels)) == len(labels)
    assert 2 <= config["max_workers"] <= 3
    assert sum(t["max_workers"] for t in workers.values()) == config["max_workers"]
    host, port = config["provider"]["gcs_address"].rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0


# -- the cluster ZooKeeper script ---------------------------------------------


def _script(*args, timeout=180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, os.path.join(DEPLOY, "cluster_zookeeper.py"), *args],
        capture_output=True, text=True, timeout=timeout,
    )


def test_cluster_zookeeper_starts_once_and_stops_by_pid(tmp_path):
    from raylog.zk.launcher import free_port
    from raylog.zk.session import connect_kazoo

    data_dir = str(tmp_path / "zk")
    port = free_port()
    try:
        proc = _script("start", "--host", "127.0.0.1", "--port", str(port), "--data-dir", data_dir)
        assert proc.returncode == 0, proc.stderr
        pid = int(re.search(r"\(pid (\d+)", proc.stdout).group(1))
        zk = connect_kazoo(f"127.0.0.1:{port}")
        try:
            zk.ensure_path("/raylog")
        finally:
            zk.stop()
            zk.close()

        again = _script("start", "--host", "127.0.0.1", "--port", str(port), "--data-dir", data_dir)
        assert again.returncode == 0 and f"already running from {data_dir} (pid {pid})" in again.stdout
        assert _script("status", "--data-dir", data_dir).returncode == 0

        proc = _script("stop", "--data-dir", data_dir)
        assert proc.returncode == 0 and f"stopped ZooKeeper (pid {pid})" in proc.stdout
        assert _script("status", "--data-dir", data_dir).returncode == 3
    finally:
        _kill_pid_file(os.path.join(data_dir, "zookeeper.pid"))


def _kill_pid_file(path: str) -> None:
    try:
        with open(path) as f:
            os.kill(int(f.read()), signal.SIGKILL)
    except (OSError, ValueError):
        pass


# -- the local cluster helper --------------------------------------------------


def _local_cluster():
    import raylog.tools.local_cluster

    return raylog.tools.local_cluster


def test_local_cluster_stop_ends_the_recorded_process_tree_by_pid(tmp_path):
    """A stand-in for `ray start --block`: a process with children and
    grandchildren, and one stray that names the cluster's temp dir."""
    import psutil

    local_cluster = _local_cluster()
    temp_dir = str(tmp_path / "ray")
    tree = subprocess.Popen(["sh", "-c", "sleep 300 & (sleep 300 & wait) & wait"], start_new_session=True)
    stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", temp_dir], start_new_session=True)
    bystander = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while len(psutil.Process(tree.pid).children(recursive=True)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        members = [tree.pid, *(p.pid for p in psutil.Process(tree.pid).children(recursive=True)), stray.pid]
        state = {"ray_start_pid": tree.pid, "ray_temp_dir": temp_dir}
        with open(tmp_path / "cluster.json", "w") as f:
            json.dump(state, f)
        assert {p.pid for p in local_cluster.cluster_processes(state)} == set(members)

        local_cluster.main(["stop", "--state-dir", str(tmp_path)])

        tree.wait(timeout=30)
        stray.wait(timeout=30)
        assert not any(local_cluster._alive(pid) for pid in members)
        assert bystander.poll() is None  # not ours: untouched
        assert not os.path.exists(tmp_path / "cluster.json")
    finally:
        for proc in (tree, stray, bystander):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_local_cluster_stop_gives_workers_their_grace_and_kills_ray_processes_that_linger(tmp_path, monkeypatch):
    """A stop signals every process at once: a Ray worker (``ray::...``,
    where a partition actor closes its log on SIGTERM) gets its time; a
    process of Ray's own that ignores SIGTERM (a raylet whose GCS is gone
    lingers about 30 s) is killed after the short grace, not waited for."""
    import psutil

    local_cluster = _local_cluster()
    monkeypatch.setattr(local_cluster, "SYSTEM_GRACE_S", 0.5)
    temp_dir = str(tmp_path / "ray")
    closed = tmp_path / "closed"
    worker = subprocess.Popen(["bash", "-c", f"exec -a 'ray::PartitionActor' bash -c "
                               f"'trap \"sleep 1; touch {closed}; exit 0\" TERM; while :; do sleep 0.1; done' {temp_dir}"],
                              start_new_session=True)
    lingering = subprocess.Popen(["bash", "-c", f"trap '' TERM; while :; do sleep 0.1; done", temp_dir],
                                 start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (
                psutil.Process(worker.pid).cmdline()[:1] == ["ray::PartitionActor"]):
            time.sleep(0.05)
        state = {"ray_start_pid": None, "ray_temp_dir": temp_dir}
        with open(tmp_path / "cluster.json", "w") as f:
            json.dump(state, f)
        assert {p.pid for p in local_cluster.cluster_processes(state)} == {worker.pid, lingering.pid}
        assert [local_cluster._is_worker(psutil.Process(pid)) for pid in (worker.pid, lingering.pid)] == [True, False]

        local_cluster.main(["stop", "--state-dir", str(tmp_path)])

        assert worker.wait(timeout=30) == 0 and closed.exists()  # it closed on SIGTERM, in its time
        assert lingering.wait(timeout=30) == -signal.SIGKILL  # killed, not waited for
    finally:
        for proc in (worker, lingering):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_aws_head_starts_the_supervisor_after_ray():
    """Every start of the cluster serves its topics again: the head's start
    commands start raylog's supervisor once Ray and ZooKeeper run."""
    commands = _load("cluster-aws.yaml")["head_start_ray_commands"]
    head = next(i for i, c in enumerate(commands) if "ray start --head" in c)
    supervisor = [i for i, c in enumerate(commands) if "supervisor start" in c]
    assert len(supervisor) == 1 and supervisor[0] > head
    assert "--zookeeper $(hostname -I" in commands[supervisor[0]] and "--ray-address auto" in commands[supervisor[0]]



def test_local_cluster_start_refuses_port_0_at_once(tmp_path, capsys):
    """The head's port goes into the nodes' config and the export line
    before the head starts: 0 is refused before anything starts (it used to
    wait out the whole start timeout for a head "on 127.0.0.1:0")."""
    local_cluster = _local_cluster()
    with pytest.raises(SystemExit) as stopped:
        local_cluster.main(["start", "--state-dir", str(tmp_path), "--port", "0"])
    assert stopped.value.code == 2
    assert "cannot be 0" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []  # nothing started, nothing written
