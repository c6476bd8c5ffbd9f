"""The transactional workload in CI (``--workload txn``): transactional
writers (some transactions aborted on purpose, some committing an input
group's offsets), a read_committed and a read_uncommitted reader the whole
run, a final read after the faults healed; a writer's producer dropped in
the middle of a transaction, the transaction coordinator killed, partition
actors killed and paused, ZooKeeper stopped. docs/design.md section 6's
transactions guarantee must hold: none of Jepsen's Kafka anomalies (see
raylog.testing.txn_checker), with transactions committed, aborted and read.

The run has a process of its own, as in test_run.py (RF 1, a local Ray).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from raylog.testing.nemesis import TXN_KINDS
from raylog.testing.txn_checker import ANOMALIES

# the kinds not made by the end get up to the run's fault grace (240 s) more
pytestmark = pytest.mark.timeout(600)

SEED = 11
DURATION_S = 45


def test_txn_run_every_transaction_fault_keeps_the_guarantee(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "raylog.testing.runner", "--workload", "txn", "--duration", str(DURATION_S),
         "--seed", str(SEED), "--out", str(out), "--nodes", "1", "--partitions", "3", "--producers", "2",
         "--rate", "50", "--gap", "4", "--drain", "30", "--no-png"],
        capture_output=True, text=True, timeout=560, env={**os.environ, "RAY_DEDUP_LOGS": "1"},
    )
    report_path = out / "report.json"
    assert report_path.exists(), proc.stdout[-3000:] + proc.stderr[-5000:]
    report = json.loads(report_path.read_text())
    summary = proc.stdout[-3000:]
    assert (proc.returncode == 0) == report["valid"], summary
    # every transaction fault at least once, and the partition and ZooKeeper faults
    assert set(TXN_KINDS) <= set(report["faults"]), summary
    assert {"kill-partition", "pause-partition", "zookeeper-outage"} <= set(report["faults"]), summary
    assert report["run"]["final_read"]["complete"], summary
    for name in ANOMALIES:
        assert report["counts"][name] == 0, (name, report["examples"].get(name), summary)
    assert report["valid"], summary
    # the run did work: transactions committed (some with offsets), aborted on
    # purpose and dropped mid-way; committed values read by both readers
    ops = report["operations"]
    outcomes = ops["transactions_by_outcome"]
    assert outcomes["committed"] >= 10 and outcomes["aborted"] >= 1 and outcomes["not-committed"] >= 1, summary
    assert ops["with_offsets"] >= 1 and ops["offsets_reads"] >= 1, summary
    # the dropped producer, a zombie once its successor started, had its commit refused
    assert ops["zombie_commits_refused"] >= 1, summary
    assert ops["committed_values"] >= 20 and ops["final_reads"] == ops["committed_values"], summary
    reads = ops["reads_by_reader"]
    assert reads.get("reader-read-committed", 0) > 0 and reads.get("reader-read-uncommitted", 0) > 0, summary
