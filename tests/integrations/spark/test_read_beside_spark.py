"""read_raylog next to a RayDP session that holds every CPU of a 2-CPU Ray
(executor_cores=2): it runs, where it used to wait for good for a CPU. In a
process of its own, as the Ray here must have exactly 2 CPUs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(600)

SCRIPT = textwrap.dedent('''
    import ray, raylog, raylog_spark
    from raylog.actors.placement import DISK_RESOURCE, NODE_LABEL
    from raylog.read import read_raylog

    ray.init(address="local", num_cpus=2, resources={DISK_RESOURCE: 1}, labels={NODE_LABEL: "local"},
             include_dashboard=False, logging_level="WARNING", object_store_memory=256 * 1024 * 1024)
    client = raylog.connect()
    client.create_topic("clicks", partitions=2, flush_ms=10)
    producer = client.producer(acks=1)
    for i in range(200):
        producer.send("clicks", b"v%d" % i)
    producer.close()
    for p in range(2):
        ray.get(client.partition_actor("clicks", p).flush.remote())
    spark = raylog_spark.init_spark(app_name="beside", num_executors=1, executor_cores=2, executor_memory="512M")
    try:
        print("FREE", ray.available_resources().get("CPU", 0), flush=True)
        ds = read_raylog("clicks", client=client)
        print("COUNT", ds.to_spark(spark).count(), flush=True)
    finally:
        raylog_spark.stop_spark()
        client.close()
        ray.shutdown()
''')


def test_read_raylog_runs_beside_a_spark_session_that_holds_every_cpu():
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAYLOG_") and k != "RAY_ADDRESS"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=500)
    out = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "FREE 0" in out or "FREE 0.0" in out, out  # Spark holds both CPUs
    assert "COUNT 200" in out, out
    # raylog's warning says what waits; Ray Data's "will hang" would contradict it
    assert "read_raylog: no CPU of the Ray cluster is free" in proc.stderr, proc.stderr[-4000:]
    assert "will hang" not in proc.stderr, proc.stderr[-4000:]
