"""Compaction on a replicated partition (docs/design.md §3, §6, §7) with
real Ray and ZooKeeper: a compacted topic over three replicas on disk nodes
of a ``ray.cluster_utils.Cluster`` (in a process of its own, see
compacted_replicas.py). Each replica cleans on its own and serves the
latest record of each key at the offset it was written at; a new replica
catches up from the cleaned leader and ends the same; a leader killed while
it cleans (writes going on) loses no acknowledged latest value."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(1200)

SCRIPT = Path(__file__).resolve().parent / "compacted_replicas.py"


@pytest.fixture(scope="module")
def phases(zookeeper, tmp_path_factory):
    if not zookeeper.running:
        zookeeper.start()
    data = tmp_path_factory.mktemp("compacted-replicas") / "data"
    proc = subprocess.run([sys.executable, str(SCRIPT), zookeeper.connect_string, str(data)],
                          capture_output=True, text=True, timeout=1100, env={**os.environ, "RAY_DEDUP_LOGS": "1"})
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and len(rows) == 3, proc.stdout[-3000:] + proc.stderr[-6000:]
    return {row["phase"]: row for row in rows}


def _serves_the_model(row, exact: bool = True):
    """Every replica serves, for each key, its latest acknowledged record at
    its offset (``exact``; else at least that: a later record that was sent,
    stored with its ack lost to the leader change), and every record it
    serves sits at the offset it was acknowledged at."""
    model, sent = row["model"], {tuple(pair) for pair in row["sent"]}
    assert len(row["replicas"]) == 3
    for node, replica in row["replicas"].items():
        assert replica["misplaced"] == [], (node, replica["misplaced"])
        if exact:
            assert replica["latest"] == model, node
            continue
        assert set(replica["latest"]) == set(model), node
        for key, (offset, value) in model.items():
            got_offset, got_value = replica["latest"][key]
            assert got_offset >= offset, (node, key, got_offset, offset)
            assert got_value == value if got_offset == offset else (key, got_value) in sent, (node, key)


def test_each_replica_cleans_on_its_own_and_keeps_the_latest_value_of_each_key_at_its_offset(phases):
    row = phases["cleaned"]
    assert all(row["dirs_cleaned"].values()), row["dirs_cleaned"]
    _serves_the_model(row)
    sent = sum(1 for _ in row["sent"])
    assert all(r["records"] < sent for r in row["replicas"].values())  # each cleaned away old records


def test_a_new_replica_catches_up_from_the_cleaned_leader_with_the_same_records(phases):
    row = phases["new_follower"]
    assert row["leader_cleaned_before"]
    assert row["spare"] in row["replicas"]
    _serves_the_model(row)


def test_a_leader_change_while_the_leader_cleans_loses_no_acknowledged_latest_value(phases):
    row = phases["leader_change"]
    assert row["epochs"][1] > row["epochs"][0] and row["new_leader"] != row["old_leader"]
    _serves_the_model(row, exact=False)
    # every replica agrees on each key's latest record
    tables = [r["latest"] for r in row["replicas"].values()]
    assert all(t == tables[0] for t in tables)
