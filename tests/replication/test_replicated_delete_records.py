"""client.delete_records on a replicated partition (two replicas on disk
nodes of a ``ray.cluster_utils.Cluster``, in a process of its own, see
delete_records_replicas.py) with real Ray and ZooKeeper: the leader moves
the log start, the follower takes it from its fetches and keeps it on its
disk, and after the leader's process is killed the follower leads with it:
its offsets start there and a consumer from earliest reads only what lies
at or after it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(1200)

SCRIPT = Path(__file__).resolve().parent / "delete_records_replicas.py"


@pytest.fixture(scope="module")
def phases(zookeeper, tmp_path_factory):
    if not zookeeper.running:
        zookeeper.start()
    data = tmp_path_factory.mktemp("delete-records-replicas") / "data"
    proc = subprocess.run([sys.executable, str(SCRIPT), zookeeper.connect_string, str(data)],
                          capture_output=True, text=True, timeout=1100, env={**os.environ, "RAY_DEDUP_LOGS": "1"})
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and len(rows) == 2, proc.stdout[-3000:] + proc.stderr[-6000:]
    return {row["phase"]: row for row in rows}


def test_the_leader_moves_the_start_and_the_follower_keeps_it_on_its_disk(phases):
    row = phases["deleted"]
    assert row["answer"] == row["asked"] == row["offsets"][0]
    assert len(row["recorded"]) == 2 and set(row["recorded"].values()) == {row["asked"]}


def test_the_follower_leads_with_the_start(phases):
    start = phases["deleted"]["asked"]
    row = phases["follower_leads"]
    assert row["new_leader"] != row["old_leader"]
    assert row["offsets"][0] == start
    assert [value for _offset, value in row["read"]] == ["v-%03d" % i for i in range(60, 100)]
    assert row["read"][0][0] == start
