"""``raylog mirror start/status/stop`` and ``raylog groups translate`` through
the installed script (the target is the module's ``raylog_client``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

from raylog.testing.clusters import wait_until

RAYLOG = os.path.join(os.path.dirname(sys.executable), "raylog")
_OUR_VARS = ("RAYLOG_ZOOKEEPER", "RAYLOG_RAY_ADDRESS", "RAYLOG_CLUSTER", "RAYLOG_TOKEN", "RAYLOG_DATA_DIR", "RAY_ADDRESS")


def _raylog(target_options, *args):
    env = {k: v for k, v in os.environ.items() if k not in _OUR_VARS}
    proc = subprocess.run([RAYLOG, *target_options, *args], capture_output=True, text=True, env=env, timeout=300)
    return proc


def test_mirror_commands(zookeeper, ray_local, raylog_client, source, tmp_path):
    target = raylog_client
    options = ["--zookeeper", zookeeper.connect_string, "--ray-address",
               ray_local.get_runtime_context().gcs_address, "--cluster", target.settings.cluster]
    tag = uuid.uuid4().hex[:6]
    topic, name = f"cli-{tag}", f"cli-{tag}"
    source.create_topic(topic, partitions=2)
    producer = source.producer(acks="all")
    for i in range(20):
        producer.send(topic, f"v{i}".encode())
    producer.flush()
    producer.close()
    src = ["--source-zookeeper", zookeeper.connect_string, "--source-cluster", source.settings.cluster]

    refused = _raylog(options, "mirror", "start", *src, "--topics", f"none-{tag}", "--name", name)
    assert refused.returncode == 1, refused.stderr
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and f"none-{tag}" in errors[0] and "Traceback" not in refused.stderr, refused.stderr

    started = _raylog(options, "mirror", "start", *src, "--topics", topic, "--rename", "{source}.{topic}",
                      "--name", name)
    assert started.returncode == 0, started.stderr
    assert "2 partitions" in started.stdout
    try:
        def caught_up():
            proc = _raylog(options, "mirror", "status", name, "--json")
            assert proc.returncode == 0, proc.stderr
            rows = json.loads(proc.stdout)["partitions"]
            return len(rows) == 2 and all(r["lag_bytes"] == 0 for r in rows)
        assert wait_until(caught_up, timeout_s=120, interval_s=1.0)
        translated = _raylog(options, "groups", "translate", "--group", f"g-{tag}", "--mirror", name, "--json")
        assert translated.returncode == 0, translated.stderr
        assert json.loads(translated.stdout) == []  # the group committed nothing on the source
    finally:
        stopped = _raylog(options, "mirror", "stop", name)
    assert stopped.returncode == 0, stopped.stderr
    again = _raylog(options, "mirror", "stop", name)
    assert again.returncode == 1 and "no mirror named" in again.stderr, again.stderr
    assert target.end_offsets(f"{source.settings.cluster}.{topic}") == source.end_offsets(topic)


def test_the_readme_mirroring_example_runs_as_written(raylog_client, source, capsys):
    from tests.doc_blocks import block, printed_lines

    code = block("README.md", "Mirroring between clusters")
    for topic in ("clicks", "views"):
        source.create_topic(topic, partitions=2)
    code = code.replace('"10.0.0.5:2181"', repr(source.settings.zookeeper)).replace(
        '"live"', repr(source.settings.cluster))
    exec(compile(code, "README.md", "exec"), {"target": raylog_client})
    lines = printed_lines(capsys.readouterr().out)  # without Ray's forwarded "(raylet) WARNING: ..." lines
    assert sorted(line.split()[:2] for line in lines) == [["clicks", "0"], ["clicks", "1"], ["views", "0"],
                                                          ["views", "1"]]
    assert raylog_client.registry.topic_config(f"{source.settings.cluster}.views").partitions == 2
