"""The benchmark's own local autoscaling cluster, started through
:mod:`raylog.tools.local_cluster` with the bench's config and stopped by PID
(see :mod:`raylog.tools.bench`)."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import shutil
import sys
import tempfile

import raylog.tools.local_cluster as shared
from raylog.tools.bench.settings import AUTOSCALER_UPDATE_INTERVAL_S, BenchError, CONFIG
from raylog.zookeeper import free_port


def _local_cluster_module():
    """A private copy of :mod:`raylog.tools.local_cluster` pointed at the
    bench's config (the shared module keeps its own)."""

    spec = importlib.util.spec_from_file_location("raylog_bench_local_cluster", shared.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.CONFIG = str(CONFIG)  # this loaded copy is the bench's alone
    return module


@contextlib.contextmanager
def _stdout_to_stderr():
    """The helper's messages (and its children's) go to stderr: stdout is
    for the JSON lines and the table."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


@contextlib.contextmanager
def _environ(**values):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class LocalCluster:
    """A local autoscaling cluster started for one run and stopped by PID."""
    def __init__(self, timeout_s: float, cluster: str = "bench"):
        self.module = _local_cluster_module()
        self.state_dir = tempfile.mkdtemp(prefix="raylog-autoscale-", dir="/tmp")  # short: Ray's socket paths
        self.args = argparse.Namespace(
            state_dir=self.state_dir, port=free_port(), zookeeper_port=0, disk_nodes=0, timeout_s=timeout_s,
            cluster=cluster,  # the raylog cluster whose supervisor the helper starts
        )
        self.data_dir = os.path.join(self.state_dir, "data")
        self.zookeeper = self.ray_address = None
        self.failed = False

    def start(self) -> None:
        try:
            # What the helper prints (how to use and stop the cluster by
            # hand) is not for the bench's user.
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
                    _environ(AUTOSCALER_UPDATE_INTERVAL_S=str(AUTOSCALER_UPDATE_INTERVAL_S)):
                self.module.start(self.args)
        except SystemExit as err:  # the helper reports its failures so
            self.failed = True
            raise BenchError(f"the local autoscaling cluster did not start: {err}; logs in {self.state_dir}") from None
        state = self.module._load_state(self.state_dir)
        self.zookeeper, self.ray_address = state["zookeeper"], state["ray_address"]
        if self.module._token_mode():
            # The head runs with token authentication; a driver given an
            # explicit address presents the token only in token mode, which
            # Ray reads when it is imported.
            os.environ["RAY_AUTH_MODE"] = "token"

    @property
    def head_pid(self) -> int | None:
        state = self.module._load_state(self.state_dir)
        return None if state is None else state.get("ray_start_pid")

    def stop(self) -> None:
        """Stop what was started, by PID; keep the state dir (its logs, not
        the partition logs) after a failure."""
        if self.module._load_state(self.state_dir) is not None:
            with _stdout_to_stderr():
                self.module.stop(self.args)
        shutil.rmtree(self.data_dir, ignore_errors=True)
        if self.failed:
            print(f"the bench's cluster logs are kept in {self.state_dir}", file=sys.stderr)
        else:
            shutil.rmtree(self.state_dir, ignore_errors=True)
