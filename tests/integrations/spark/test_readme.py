"""The Spark example of docs/howto/spark.md runs as written: in a fresh Python process
(its own ``raylog.connect()``, Ray, ZooKeeper and Spark through RayDP), in a
scratch folder; then its outputs are checked here."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.doc_blocks import block

pytestmark = pytest.mark.timeout(900)

def spark_example() -> str:
    return block("docs/howto/spark.md", "Spark and Ray Data")


def test_the_readme_spark_example_runs_as_written(tmp_path):
    import pyarrow.parquet as pq

    code = spark_example()
    assert 'spark.read.format("raylog")' in code and "readStream" in code
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAYLOG_", "RAY_ADDRESS"))}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=840
    )
    assert done.returncode == 0, done.stderr[-5000:]
    # quiet by default: no start-up chatter of Ray's core in Spark's JVMs,
    # no log4j complaint, no stack trace
    for chatter in ("gcs_client.cc", "Reconfiguration failed", "Traceback"):
        assert chatter not in done.stderr, done.stderr[-5000:]
    # nor warnings of the driver JVM (Ray's Java runtime logs them on stdout),
    # nor a ZooKeeper session of the reads outliving the session
    for chatter in (" WARN ", "EndOfStreamException", "will hang"):
        assert chatter not in done.stdout + done.stderr, (done.stdout + done.stderr)[-5000:]
    streamed = pq.read_table(tmp_path / "out" / "clicks").to_pylist()
    assert len(streamed) == 1000
    assert len({(r["partition"], r["offset"]) for r in streamed}) == 1000
    assert pq.read_table(tmp_path / "out" / "hourly").num_rows == 1000
    assert "|partition|count|" in done.stdout
