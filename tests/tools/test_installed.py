"""The tools work from an installed package, outside a checkout.

The package is installed (not editable: a real build, with its package data)
into a temporary folder, and the ``raylog`` command runs from another
directory with that folder first on the path: ``raylog bench --help``
resolves the bench's cluster config inside the installed package, and
``raylog zookeeper start`` / ``stop`` run a ZooKeeper and end it, each through
the console script the install wrote (``raylog = raylog.tools.cli:main``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import pytest

from raylog.zk.launcher import four_letter_word, free_port

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    target = tmp_path_factory.mktemp("site")
    # a copy of the sources: a build leaves build/ behind, not in the checkout
    source = tmp_path_factory.mktemp("src") / "raylog"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__",
                                                                 "*.so", "jars", ".pytest_cache"))
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
         "--target", str(target), str(source)],
        capture_output=True, text=True, timeout=540,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return str(target)


def _raylog(installed: str, cwd, *args, timeout_s: float = 180) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAYLOG_") and k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = installed  # before the checkout's editable install
    script = os.path.join(installed, "bin", "raylog")  # the console script the install wrote
    return subprocess.run([script, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)


def test_the_installed_package_is_the_one_that_runs_and_carries_its_configs(installed, tmp_path):
    env = {**os.environ, "PYTHONPATH": installed}
    code = ("import raylog, raylog.tools.bench as b, raylog.tools.local_cluster as c, os; "
            "print(raylog.__file__); print(b.CONFIG); print(c.CONFIG); "
            "print(os.path.exists(b.CONFIG) and os.path.exists(c.CONFIG))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    module, bench_config, cluster_config, exists = proc.stdout.split("\n")[:4]
    for path in (module, bench_config, cluster_config):
        assert path.startswith(installed), path  # not the checkout
    assert exists == "True"


def test_raylog_bench_help_runs_outside_the_checkout(installed, tmp_path):
    proc = _raylog(installed, tmp_path, "bench", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "--phases" in proc.stdout and "--disk-nodes" in proc.stdout


def test_raylog_zookeeper_start_and_stop_outside_the_checkout(installed, tmp_path):
    data_dir = str(tmp_path / "zk")
    pid_file = os.path.join(data_dir, "raylog-zookeeper.pid")
    port = free_port()
    try:
        proc = _raylog(installed, tmp_path, "zookeeper", "start", "--port", str(port), "--data-dir", data_dir)
        assert proc.returncode == 0, proc.stderr
        assert f"ZooKeeper running at 127.0.0.1:{port}" in proc.stdout
        assert four_letter_word(port, "ruok") == "imok"
        proc = _raylog(installed, tmp_path, "zookeeper", "stop", "--data-dir", data_dir)
        assert proc.returncode == 0, proc.stderr
        assert not os.path.exists(pid_file)
    finally:
        try:  # a failed test leaves no server behind
            with open(pid_file) as f:
                os.kill(int(f.read()), signal.SIGKILL)
        except (OSError, ValueError):
            pass
