"""The autoscaled benchmark's own logic (raylog.tools.bench, bench/autoscale.py,
raylog/tools/configs/bench-autoscale.yaml) and the argument handling of ``raylog bench``.

One end-to-end run (one short phase, one disk node, one partition) starts
the bench's own local autoscaling cluster and stops it; the full run takes
minutes and is run by hand (see docs/benchmarks.md).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import yaml

from raylog.tools import bench as benchmark
from raylog.actors.placement import DISK_RESOURCE, NODE_LABEL
from raylog.tools.bench import BenchSettings, NodeTracker, format_table, parse_phases, phase_report
from raylog.tools.bench.settings import disk_node_types
from raylog.errors import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RAYLOG = os.path.join(os.path.dirname(sys.executable), "raylog")
SCRIPT = os.path.join(REPO, "bench", "autoscale.py")


def _run(*cmd, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAYLOG_") and k != "RAY_ADDRESS"}
    return subprocess.run(list(cmd), capture_output=True, text=True, env=env, timeout=timeout)


# -- settings -------------------------------------------------------------------


def test_phases_parse_from_a_comma_list():
    assert parse_phases("1,2,3") == (1, 2, 3)
    assert parse_phases(" 2 , 1 ") == (2, 1)
    for bad in ("", "1,,2", "0", "1,-1", "two", "1.5"):
        with pytest.raises(ConfigError, match="comma-separated positive integers"):
            parse_phases(bad)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"phases": ()}, "phases must be one or more"),
        ({"phase_seconds": 1}, "at least 5"),
        ({"partitions": 0}, "partitions must be a positive"),
        ({"disk_nodes": 3}, "ask for at most 2 disk nodes"),
        ({"message_bytes": 0}, "message bytes"),
        ({"zookeeper": "127.0.0.1:2181"}, "pass both or neither"),
        ({"ray_address": "127.0.0.1:6379"}, "pass both or neither"),
    ],
)
def test_settings_out_of_range_fail_before_anything_starts(change, message):
    with pytest.raises(ConfigError, match=message):
        BenchSettings(**change).validate()


def test_an_existing_cluster_may_have_more_disk_nodes_than_the_bench_config():
    settings = BenchSettings(zookeeper="127.0.0.1:2181", ray_address="127.0.0.1:6379", disk_nodes=5).validate()
    assert settings.external


# -- node events ------------------------------------------------------------------


def _node(n: int, alive=True, cpus=0, disk=False, label=None) -> dict:
    resources = {"CPU": cpus} if cpus else {}
    if disk:
        resources[DISK_RESOURCE] = 1
    return {
        "NodeID": f"{n:056x}",
        "Alive": alive,
        "Resources": resources if alive else {},
        "Labels": {NODE_LABEL: label} if label else {},
    }


def test_node_tracker_reports_nodes_that_join_and_leave():
    tracker = NodeTracker()
    head, disk, compute = _node(0), _node(1, cpus=1, disk=True, label="bench-disk-a"), _node(3, cpus=2)
    assert [(e, i.kind) for e, i in tracker.update([head])] == [("node_added", "other")]
    assert tracker.update([head]) == []

    events = tracker.update([head, disk, compute])
    assert [(e, i.name, i.kind, i.cpus) for e, i in events] == [
        ("node_added", "bench-disk-a", "disk", 1.0),
        ("node_added", f"{3:08x}", "compute", 2.0),
    ]
    assert (tracker.count(), tracker.count("disk"), tracker.count("compute"), tracker.cpus) == (3, 1, 1, 3.0)

    # A dead node stays in ray.nodes() with Alive false and no resources: it
    # is reported as removed with what it had when it joined.
    events = tracker.update([head, disk, _node(3, alive=False)])
    assert [(e, i.kind, i.cpus) for e, i in events] == [("node_removed", "compute", 2.0)]
    assert tracker.count() == 2 and tracker.update([head, disk, _node(3, alive=False)]) == []


# -- reports ----------------------------------------------------------------------


def _phase(k, workers, produced, consumed, running=None, nodes=3, added=0):
    return phase_report(
        phase=k, workers=workers, seconds=20.0, produced=produced, consumed=consumed,
        producers_running=workers if running is None else running,
        consumers_running=workers if running is None else running,
        nodes_alive=nodes, nodes_added=added, nodes_removed=0, cpus=2.0 * nodes, message_bytes=100,
    )


def test_phase_report_gives_rates_over_the_phase():
    row = _phase(2, 2, produced=200_000, consumed=150_000, running=1, nodes=4, added=1)
    assert row["event"] == "phase" and row["phase"] == 2
    assert (row["producers"], row["consumers"], row["cpus_asked"]) == (2, 2, 4)
    assert (row["producers_running"], row["consumers_running"]) == (1, 1)
    assert (row["producer_msg_per_s"], row["consumer_msg_per_s"]) == (10_000, 7_500)
    assert (row["producer_mb_per_s"], row["consumer_mb_per_s"]) == (1.0, 0.75)
    assert (row["nodes_alive"], row["nodes_added"]) == (4, 1)
    json.dumps(row)  # a JSON line


def test_table_shows_each_phase_and_the_scale_down():
    rows = [
        {"event": "node_added", "t": 1.0},
        _phase(1, 1, 6_000_000, 5_990_000),
        _phase(2, 2, 4_000_000, 4_000_000, running=1, nodes=4, added=1),
        {"event": "scale_down", "complete": True, "seconds": 13.0, "removed": 1, "remaining": 0, "nodes_alive": 3},
    ]
    lines = format_table(rows).splitlines()
    assert lines[0].split("  ")[0] == "PHASE" and set(lines[1]) == {"-", " "}
    assert lines[2].split() == ["1", "1/1", "1/1", "3", "0", "300,000", "299,500"]
    assert lines[3].split() == ["2", "1/2", "1/2", "4", "+1", "200,000", "200,000"]
    assert lines[4] == "scale down: 1 added node removed 13 s after the load stopped; 3 nodes alive"
    assert len(lines) == 5


def test_table_says_when_added_nodes_stayed():
    rows = [_phase(1, 3, 1, 1, nodes=5, added=2),
            {"event": "scale_down", "complete": False, "seconds": 180.0, "removed": 1, "remaining": 1,
             "nodes_alive": 4}]
    assert format_table(rows).splitlines()[-1] == (
        "scale down: 1 of 2 added nodes removed within 180 s; 4 nodes alive"
    )


# -- the bench's cluster config -----------------------------------------------------


def _config() -> dict:
    with open(benchmark.CONFIG) as f:
        return yaml.safe_load(f)


def test_bench_config_follows_rays_schema():
    import jsonschema
    import ray.autoscaler
    from ray.autoscaler._private.util import validate_config

    with open(os.path.join(os.path.dirname(ray.autoscaler.__file__), "ray-schema.json")) as f:
        jsonschema.validate(_config(), json.load(f))
    validate_config(_config())


def test_bench_config_makes_load_add_nodes_and_lets_them_go_soon():
    config = _config()
    assert config["provider"]["type"] == "fake_multinode"
    head = config["available_node_types"][config["head_node_type"]]["resources"]
    assert head.get("CPU", 0) == 0 and DISK_RESOURCE not in head  # every worker needs a worker node
    workers = {n: t for n, t in config["available_node_types"].items() if n != config["head_node_type"]}
    disks = [t for t in workers.values() if t["resources"].get(DISK_RESOURCE)]
    computes = [t for t in workers.values() if not t["resources"].get(DISK_RESOURCE)]
    labels = [t["labels"][NODE_LABEL] for t in disks]
    assert len(disks) == 2 and len(set(labels)) == 2 and all(t["max_workers"] == 1 for t in disks)
    assert computes and all(t["min_workers"] == 0 and t["resources"]["CPU"] >= 1 for t in computes)
    assert sum(t["max_workers"] for t in workers.values()) == config["max_workers"] <= 4
    assert 0 < config["idle_timeout_minutes"] < 1
    assert disk_node_types(config) == 2


# -- the command line ------------------------------------------------------------


def _script_module():
    spec = importlib.util.spec_from_file_location("bench_autoscale", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_script_puts_connection_options_before_the_command():
    args = _script_module().raylog_args
    assert args([]) == ["bench"]
    assert args(["--phases", "1,2", "--zookeeper", "zk:2181", "--ray-address=head:6379", "--json-only"]) == [
        "--zookeeper", "zk:2181", "--ray-address=head:6379", "bench", "--phases", "1,2", "--json-only",
    ]
    assert args(["--cluster", "c", "--token", "t", "-h"]) == ["--cluster", "c", "--token", "t", "bench", "-h"]


def test_bench_help_from_both_entry_points():
    for cmd in ([RAYLOG, "bench", "--help"], [sys.executable, SCRIPT, "--help"]):
        proc = _run(*cmd)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith("Usage: raylog bench") and "--phases" in proc.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["bench", "--phases", "1,x"], "Invalid value for '--phases'"),
        (["bench", "--phases", "0"], "Invalid value for '--phases'"),
        (["bench", "--phase-seconds", "1"], "Invalid value for '--phase-seconds'"),
        (["--zookeeper", "127.0.0.1:2181", "bench"], "pass both or neither"),
        (["--ray-address", "127.0.0.1:6379", "bench"], "pass both or neither"),
        (["bench", "--disk-nodes", "3"], "error: the bench's local cluster has 2 disk node types"),
    ],
)
def test_bad_bench_arguments_exit_2_before_any_cluster_starts(args, message):
    proc = _run(RAYLOG, *args)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_bench_script_exits_like_the_command():
    proc = _run(sys.executable, SCRIPT, "--zookeeper", "127.0.0.1:2181", "--phase-seconds", "30")
    assert proc.returncode == 2 and "pass both or neither" in proc.stderr


# -- end to end ---------------------------------------------------------------------


@pytest.mark.timeout(900)
def test_bench_runs_end_to_end_on_its_own_cluster_and_stops_it(tmp_path):
    """``raylog bench`` with one short phase: its cluster starts, a disk node
    comes, the phase produces and consumes, the added node goes, and the
    cluster is stopped (by PID) at the end."""
    before = set(os.listdir("/tmp"))
    proc = _run(RAYLOG, "bench", "--phases", "1", "--phase-seconds", "5", "--partitions", "1",
                "--disk-nodes", "1", "--scale-down-timeout-s", "120", "--start-timeout-s", "300",
                timeout=800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-5000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    events = [row["event"] for row in rows]
    assert events[0] == "start" and events[-1] == "end", events
    assert rows[0]["cluster"] == "local"
    (topic,) = [row for row in rows if row["event"] == "topic"]
    assert topic["partitions"] == 1
    (phase,) = [row for row in rows if row["event"] == "phase"]
    assert (phase["producers"], phase["consumers"]) == (1, 1)  # what the phase asked for
    # how many got a CPU within the 5 s depends on the autoscaler and the
    # machine's load; the producer sits on the disk node that is up already
    assert phase["produced"] > 0, phase
    assert 0 <= phase["consumers_running"] <= 1 and phase["consumed"] >= 0
    assert "scale_down" in events
    assert "PHASE" in proc.stdout  # the table after the JSON lines
    # Its cluster is gone: no process names the state dir it made under /tmp.
    made = [name for name in set(os.listdir("/tmp")) - before if name.startswith("raylog-autoscale-")]
    assert not made, made  # removed after a run that did not fail
