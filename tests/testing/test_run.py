"""The fault run in CI: the whole workload under every fault kind, a fixed
seed, a multi-node Ray cluster; fails on any forbidden anomaly.

The run has a process of its own (a process holds one Ray driver, and this
test session may already have its local Ray); it starts and stops its own
ZooKeeper and Ray cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from raylog.testing.nemesis import FAULT_KINDS

# the kinds not made by the end get up to the run's fault grace (240 s) more
pytestmark = pytest.mark.timeout(700)

SEED = 7
DURATION_S = 30


def test_fault_run_every_kind_no_forbidden_anomaly(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "raylog.testing.runner", "--duration", str(DURATION_S), "--seed", str(SEED),
         "--out", str(out), "--gap", "3", "--drain", "30", "--partitions", "4", "--no-png"],
        capture_output=True, text=True, timeout=640, env={**os.environ, "RAY_DEDUP_LOGS": "1"},
    )
    report_path = out / "report.json"
    assert report_path.exists(), proc.stdout[-3000:] + proc.stderr[-5000:]
    report = json.loads(report_path.read_text())
    summary = proc.stdout[-3000:]
    assert set(report["faults"]) == set(FAULT_KINDS), summary  # every kind at least once
    assert report["run"]["drained"]["complete"], summary
    for name in ("lost-write", "duplicate", "inconsistent-offsets", "nonmonotonic-poll", "poll-skip", "garbage-read"):
        assert report["counts"][name] == 0, (name, report["anomalies"].get(name), summary)
    assert report["unseen_by_acks"].get("all", 0) == 0, (report["anomalies"].get("unseen"), summary)
    assert report["valid"] and proc.returncode == 0, summary
    # the run did work: most sends acknowledged and read
    ops = report["operations"]
    assert ops["sends_by_outcome"].get("ok", 0) > 1000 and ops["distinct_values_read"] > 1000, summary
