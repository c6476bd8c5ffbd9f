"""Metadata names each partition's replicas and ISR from raylog's
replication state: a topic of replication factor 2 on two disk nodes of a
``ray.cluster_utils.Cluster`` (in a process of its own, see
replicated_metadata.py), read raw and through librdkafka."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("confluent_kafka")

pytestmark = pytest.mark.timeout(900)

SCRIPT = Path(__file__).resolve().parent / "replicated_metadata.py"


def test_metadata_lists_every_replica_and_the_isr_as_listener_broker_ids(zookeeper, tmp_path):
    if not zookeeper.running:
        zookeeper.start()
    proc = subprocess.run([sys.executable, str(SCRIPT), zookeeper.connect_string, str(tmp_path / "data")],
                          capture_output=True, text=True, timeout=840, env={**os.environ, "RAY_DEDUP_LOGS": "1"})
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
    found = json.loads(lines[-1])
    ids = sorted(e["broker_id"] for e in found["listeners"])
    assert len(ids) == 2
    for view in ("raw", "librdkafka"):
        partitions = found[view]
        assert [p["partition"] for p in partitions] == [0, 1], (view, found)
        for p in partitions:
            assert sorted(p["replicas"]) == ids and sorted(p["isr"]) == ids, (view, found)
            assert p["leader"] in ids, (view, found)
