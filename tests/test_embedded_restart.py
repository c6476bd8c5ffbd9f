"""The embedded default with a kept ``data_dir`` outlives its processes:
topics created by one ``raylog.connect(data_dir=...)`` are served again by
the next one with no client call, every acknowledged message there; a topic
deleted while no cluster runs (ZooKeeper only) is gone when the next one
starts, and re-created it starts empty. Each step is a process of its own
(the embedded default owns its Ray and ZooKeeper)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(900)

STEP = textwrap.dedent('''
    import json, os, sys, time
    import raylog
    import raylog.auth
    from raylog.client import Client
    from raylog.startup import EMBEDDED_ZOOKEEPER_DIR
    from raylog.zk.server import EmbeddedZooKeeper

    step, data_dir = sys.argv[1], sys.argv[2]
    out = {}
    if step == "delete":  # no Ray: only the kept ZooKeeper runs
        zk = EmbeddedZooKeeper(data_dir=os.path.join(data_dir, EMBEDDED_ZOOKEEPER_DIR)).start()
        try:
            # the cluster's token, as a process outside Ray derives it (Ray's auth token of this
            # machine): ZooKeeper refuses a delete from a session without it
            token = raylog.auth.cluster_token("default")
            assert token is not None, "no Ray auth token on this machine to derive the cluster's token from"
            client = Client(zookeeper=zk.connect_string, data_dir=data_dir, token=token)
            client.delete_topic("clicks")
            out["tombstones"] = len(client.registry.tombstones())
            client.close()
        finally:
            zk.stop()
        print("RESULT " + json.dumps(out)); sys.exit(0)
    client = raylog.connect(data_dir=data_dir)
    if step == "create":
        client.create_topic("clicks", partitions=2, flush_ms=10)
    deadline = time.monotonic() + 120
    old = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    while True:  # served by partition actors of this process's cluster
        if step == "recreate" and not client.registry.tombstones():
            break
        if step != "recreate":
            epochs = {str(p): e["epoch"] for p, e in client.registry.endpoints("clicks").items()}
            if len(epochs) == 2 and all(epochs[p] > e for p, e in old.items()):
                break
        assert time.monotonic() < deadline, "not served again / not removed"
        time.sleep(0.2)
    if step == "recreate":
        client.create_topic("clicks", partitions=2)
    producer = client.producer(acks="all")  # flushed: readable below the end offsets read next
    for i in range(100):
        producer.send("clicks", b"%s-%d" % (step.encode(), i))
    producer.close()  # raises unless every message was acknowledged
    consumer = client.consumer("clicks", auto_offset_reset="earliest")
    ends = client.end_offsets("clicks")
    got = []
    while any((consumer.position("clicks", p) or 0) < end for p, end in ends.items()):
        assert time.monotonic() < deadline + 120, "could not read to the end"
        got += [m.value.decode() for m in consumer.poll(timeout_ms=200)]
    out["read"] = got
    out["epochs"] = {str(p): e["epoch"] for p, e in client.registry.endpoints("clicks").items()}
    out["log_dirs"] = [v["log_dir"] for v in client.registry.placements("clicks").values()]
    client.close()
    print("RESULT " + json.dumps(out))
''')


def _step(*args) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAYLOG_") and k != "RAY_ADDRESS"}
    proc = subprocess.run([sys.executable, "-c", STEP, *args], capture_output=True, text=True, env=env, timeout=400)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_embedded_default_with_a_kept_data_dir_comes_back_and_honours_a_delete(tmp_path):
    data_dir = str(tmp_path / "data")
    first = _step("create", data_dir)
    assert sorted(first["read"]) == sorted(f"create-{i}" for i in range(100))

    second = _step("again", data_dir, json.dumps(first["epochs"]))
    assert sorted(second["read"]) == sorted([f"create-{i}" for i in range(100)] + [f"again-{i}" for i in range(100)])

    assert _step("delete", data_dir)["tombstones"] == 2
    assert all(os.path.exists(d) for d in first["log_dirs"])

    third = _step("recreate", data_dir)
    assert sorted(third["read"]) == sorted(f"recreate-{i}" for i in range(100))  # nothing of the old topic
