"""The compaction workload in CI (``--workload compact``): a compacted topic,
writes and deletes per key with acks="all", the cleaner crashed in the
middle of its swap, before its swap and with a full disk, partition actors
killed and paused, ZooKeeper stopped; the final read from the log start
must hold docs/design.md section 6's compaction guarantee (no latest
acknowledged value lost, no deleted key back, offsets strictly increasing
and never changed, no removed record back), with the cleaner having run
many passes meanwhile.

Each run has a process of its own, as in test_run.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from raylog.testing.nemesis import COMPACTION_KINDS, DISK_FULL_CLEANING

# the kinds not made by the end get up to the run's fault grace (240 s) more
pytestmark = pytest.mark.timeout(900)

#: the fewest cleaner passes a run must have seen (they come every few hundred ms per partition)
MIN_PASSES = 20


def _run(tmp_path, *args, timeout=840) -> tuple[dict, str]:
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "raylog.testing.runner", "--workload", "compact", "--out", str(out), "--no-png",
         *args],
        capture_output=True, text=True, timeout=timeout, env={**os.environ, "RAY_DEDUP_LOGS": "1"},
    )
    report_path = out / "report.json"
    assert report_path.exists(), proc.stdout[-3000:] + proc.stderr[-5000:]
    report = json.loads(report_path.read_text())
    summary = proc.stdout[-3000:]
    assert (proc.returncode == 0) == report["valid"], summary
    return report, summary


def _assert_guarantee_held(report: dict, summary: str) -> None:
    assert report["run"]["final_scan"]["complete"], summary
    for name in ("lost-latest", "resurrected", "offset-anomaly", "record-back", "unexpected-record"):
        assert report["counts"][name] == 0, (name, report["examples"].get(name), summary)
    assert report["valid"], summary
    ops = report["operations"]
    # the run did work: writes and deletes acknowledged, keys read back
    assert ops["sends_by_outcome"]["ok"] > 1000 and ops["deletes_acknowledged"] > 100, summary
    assert report["keys"]["acknowledged"] > 20 and ops["final_reads"] > 0, summary


def test_compaction_run_every_cleaner_fault_keeps_the_guarantee(tmp_path):
    # 40 s: the six kinds' first round (one every ~4 s) is over by about 30 s, and the rest
    # of the run repeats kinds; the cleaner makes ~100 passes, well above MIN_PASSES
    report, summary = _run(tmp_path, "--duration", "40", "--seed", "3", "--nodes", "1", "--partitions", "3",
                           "--producers", "2", "--rate", "100", "--gap", "4")
    kinds = set(COMPACTION_KINDS) if os.geteuid() == 0 else set(COMPACTION_KINDS) - {DISK_FULL_CLEANING}
    assert kinds <= set(report["faults"]), summary  # each cleaner fault made at least once
    assert {"kill-partition", "pause-partition", "zookeeper-outage"} <= set(report["faults"]), summary
    _assert_guarantee_held(report, summary)
    cleaner = report["run"]["cleaner"]
    assert cleaner["passes"] >= MIN_PASSES, summary
    assert cleaner["partitions_cleaned_by_their_actor"] == [0, 1, 2], summary
    # with delete_retention_ms long over at the final read, deleted keys were cleaned away
    assert report["keys"]["delete_gone"] > 0, summary


def test_compaction_run_replicated_keeps_the_guarantee(tmp_path):
    """Replication factor 3 on three disk nodes, every replica cleaning its
    own log: leaders killed, reassigned, restarted in turn, and killed and
    crashed while they clean."""
    kinds = [k for k in COMPACTION_KINDS if os.geteuid() == 0 or k != DISK_FULL_CLEANING]
    faults = ",".join(["kill-partition", "zookeeper-outage", "kill-leader", "reassign", "rolling-restart", *kinds])
    report, summary = _run(tmp_path, "--duration", "75", "--seed", "5", "--nodes", "3", "--replication-factor", "3",
                           "--min-insync", "2", "--partitions", "2", "--producers", "2", "--rate", "100",
                           "--gap", "4", "--faults", faults)
    assert set(kinds) <= set(report["faults"]), summary  # each cleaner fault made at least once
    _assert_guarantee_held(report, summary)
    assert report["run"]["cleaner"]["passes"] > 0, summary
