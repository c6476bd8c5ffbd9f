"""The fault run in CI with replication: a topic of replication factor 3 on
three disk nodes of a ``ray.cluster_utils.Cluster``, every fault kind and
``kill-leader`` (the current leader replica's process SIGKILLed), ``reassign`` and ``rolling-restart``, a fixed
seed; what acks="all" producers were told must hold: no lost write, no
unseen write, no duplicate, no two values at one position. (acks=1 sets that
a leader change truncated before a follower fetched them are reported, not
forbidden: see the checker's ``lossy_acks``.)

The run has a process of its own, as in test_run.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from raylog.testing.nemesis import FAULT_KINDS, REPLICATED_KINDS

# the kinds not made by the end get up to the run's fault grace (240 s) more
pytestmark = pytest.mark.timeout(900)

SEED = 11
DURATION_S = 45


def test_replicated_fault_run_acks_all_loses_nothing(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "raylog.testing.runner", "--duration", str(DURATION_S), "--seed", str(SEED),
         "--out", str(out), "--gap", "3", "--drain", "40", "--partitions", "3", "--nodes", "3",
         "--replication-factor", "3", "--min-insync", "2", "--consumers", "2", "--rate", "100", "--no-png"],
        capture_output=True, text=True, timeout=840, env={**os.environ, "RAY_DEDUP_LOGS": "1"},
    )
    report_path = out / "report.json"
    assert report_path.exists(), proc.stdout[-3000:] + proc.stderr[-5000:]
    report = json.loads(report_path.read_text())
    summary = proc.stdout[-3000:]
    assert report["run"]["replication_factor"] == 3, summary
    assert set(report["faults"]) == set(FAULT_KINDS) | set(REPLICATED_KINDS), summary  # every kind at least once
    assert report["run"]["drained"]["complete"], summary
    # acks=1 sets a leader change truncated are reported (lost_by_acks["1"]), not forbidden
    assert report["lost_by_acks"].get("all", 0) == 0, (report["anomalies"].get("lost-write"), summary)
    assert report["unseen_by_acks"].get("all", 0) == 0, (report["anomalies"].get("unseen"), summary)
    for name in ("duplicate", "inconsistent-offsets", "nonmonotonic-poll", "poll-skip", "garbage-read"):
        assert report["counts"][name] == 0, (name, report["anomalies"].get(name), summary)
    assert report["valid"] and proc.returncode == 0, summary
    ops = report["operations"]
    assert ops["sends_by_outcome"].get("ok", 0) > 1000 and ops["distinct_values_read"] > 1000, summary
