"""The ``raylog`` command line, driven through the installed console script.

Every command runs in a subprocess against the shared ZooKeeper and the
test session's local Ray, under the cluster name of this module's
``raylog_client``, which deletes the module's topics at the end. A
subprocess joins the local Ray as a second driver through its GCS address;
the cluster uses token authentication (Ray's default for a local cluster:
the token is in ~/.ray/auth_token), and a driver given an explicit address
presents the token only with RAY_AUTH_MODE=token, which ``ray.init`` set in
this process's environment and the subprocesses inherit.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from raylog.zk.launcher import four_letter_word, free_port
from raylog.zk.session import connect_kazoo

RAYLOG = os.path.join(os.path.dirname(sys.executable), "raylog")
#: a bound on one command; generous, for a loaded machine
COMMAND_TIMEOUT_S = 300
_OUR_VARS = ("RAYLOG_ZOOKEEPER", "RAYLOG_RAY_ADDRESS", "RAYLOG_CLUSTER", "RAYLOG_TOKEN", "RAYLOG_DATA_DIR", "RAY_ADDRESS")


def _clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _OUR_VARS}
    env.update(extra)
    return env


def raylog(*args, input: bytes | str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the installed script; text output."""
    if isinstance(input, str):
        input = input.encode()
    proc = subprocess.run(
        [RAYLOG, *args],
        input=input if input is not None else b"",
        capture_output=True,
        env=env if env is not None else _clean_env(),
        timeout=COMMAND_TIMEOUT_S,
    )
    proc.stdout = proc.stdout.decode(errors="replace")
    proc.stderr = proc.stderr.decode(errors="replace")
    return proc


def assert_one_error_line(proc, code: int, *fragments: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]


@pytest.fixture(scope="module")
def cluster(zookeeper, ray_local, raylog_client):
    """The global options that point the script at the test cluster."""
    if not zookeeper.running:
        zookeeper.start()
    address = ray_local.get_runtime_context().gcs_address
    return [
        "--zookeeper", zookeeper.connect_string,
        "--ray-address", address,
        "--cluster", raylog_client.settings.cluster,
    ]


def _values(n: int) -> list[str]:
    return [f"v{i}" for i in range(n)]  # equal sizes for n <= 10


def _wait_flushed(client, topic: str, partition: int = 0) -> int:
    """The high watermark once everything appended is flushed (bounded wait)."""
    import ray

    actor = client.partition_actor(topic, partition)
    deadline = time.monotonic() + 120
    while True:
        stats = ray.get(actor.stats.remote())
        if stats["high_watermark"] == stats["log_end_offset"] or time.monotonic() > deadline:
            return stats["high_watermark"]
        time.sleep(0.05)


# -- usage -------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        [],
        ["topics"],
        ["topics", "create"],
        ["topics", "alter"],
        ["topics", "add-partitions"],
        ["topics", "delete-records"],
        ["topics", "list"],
        ["topics", "describe"],
        ["topics", "delete"],
        ["topics", "repair"],
        ["topics", "reassign"],
        ["topics", "balance-leaders"],
        ["nodes"],
        ["nodes", "drain"],
        ["nodes", "restart"],
        ["supervisor"],
        ["supervisor", "start"],
        ["produce"],
        ["consume"],
        ["groups"],
        ["groups", "list"],
        ["groups", "describe"],
        ["groups", "translate"],
        ["mirror"],
        ["mirror", "start"],
        ["mirror", "status"],
        ["mirror", "stop"],
        ["pool"],
        ["pool", "status"],
        ["zookeeper"],
        ["zookeeper", "start"],
        ["zookeeper", "stop"],
        ["audit"],
        ["audit", "compare"],
        ["bench"],
    ],
    ids=lambda c: "-".join(c) or "raylog",
)
def test_every_command_has_help(command):
    proc = raylog(*command, "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"Usage: raylog {' '.join(command)}".rstrip())


def test_bad_usage_exits_2():
    for args in (
        ["no-such-command"],
        ["topics", "create", "t", "--partitions", "many"],
        ["consume", "t", "--max-messages", "0"],
        ["produce", "t", "--acks", "2"],
        ["--no-such-option", "topics", "list"],
        ["topics", "reassign", "t"],
        ["topics", "reassign", "t", "--replicas", "a,b", "--replace", "a=c"],
        ["topics", "reassign", "t", "--replicas", "a,b"],
        ["topics", "reassign", "t", "--replace", "a"],
        ["nodes", "restart"],
        ["nodes", "drain"],
    ):
        proc = raylog(*args)
        # one line: what is wrong and where the help is; nothing on stdout
        assert_one_error_line(proc, 2, "(see 'raylog")
        assert len(proc.stderr.splitlines()) == 1 and not proc.stdout, (args, proc.stderr)
        assert "Usage:" not in proc.stderr


def test_a_bad_topic_setting_exits_2_with_one_error_line():
    proc = raylog("topics", "create", "t", "--partitions", "0")
    assert_one_error_line(proc, 2, "partitions must be a positive integer")


def test_replication_settings_reach_the_topic_config():
    proc = raylog("topics", "create", "t", "--replication-factor", "2", "--min-insync-replicas", "3")
    assert_one_error_line(proc, 2, "min_insync_replicas (3) must not exceed replication_factor (2)")


def test_cluster_commands_without_an_address_say_what_to_pass():
    for args in (
        ["consume", "t"],
        ["produce", "t"],
        ["topics", "describe", "t"],
        ["topics", "delete", "t"],
        ["groups", "list"],
        ["groups", "describe", "g"],
        ["nodes", "drain", "h2"],
        ["nodes", "restart", "--rolling"],
        ["topics", "balance-leaders"],
        ["pool", "status", "g"],
    ):
        proc = raylog(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "needs an existing raylog cluster: pass --zookeeper HOST:PORT" in proc.stderr
    proc = raylog("--ray-address", "127.0.0.1:6379", "topics", "list")
    assert proc.returncode == 2
    assert "--ray-address needs --zookeeper HOST:PORT too" in proc.stderr


# -- topics ------------------------------------------------------------------


def test_topics_create_list_describe_delete(cluster, raylog_client):
    name = f"cli-{os.getpid()}-{time.monotonic_ns()}"
    proc = raylog(*cluster, "topics", "create", name, "--partitions", "2", "--flush-ms", "10",
                  "--retention-ms", "3600000", "--data-dir", raylog_client.data_dir)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"Created topic {name} with 2 partitions."

    proc = raylog(*cluster, "topics", "list")
    assert proc.returncode == 0, proc.stderr
    assert name in proc.stdout.splitlines()
    proc = raylog(*cluster, "topics", "list", "--json")
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    assert name in json.loads(proc.stdout)

    proc = raylog(*cluster, "topics", "describe", name, "--json")
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    info = json.loads(proc.stdout)
    assert info["topic"] == name and info["config"]["partitions"] == 2 and info["config"]["flush_ms"] == 10
    assert [(p["partition"], p["node"], p["served"], p["log_start_offset"], p["high_watermark"])
            for p in info["partitions"]] == [(0, "local", True, 0, 0), (1, "local", True, 0, 0)]

    proc = raylog(*cluster, "topics", "describe", name)
    assert proc.returncode == 0, proc.stderr
    header, columns, *rows = proc.stdout.splitlines()
    assert f"Topic: {name}" in header and "partitions: 2" in header
    assert "flush_ms: 10" in header and "retention_ms: 3600000" in header
    assert columns.split() == ["PARTITION", "NODE", "STATE", "ENDPOINT", "LOG", "START", "HIGH", "WATERMARK"]
    assert [row.split()[0] for row in rows] == ["0", "1"]
    for row in rows:
        partition, node, state, endpoint, start, high_watermark = row.split()
        assert node == "local" and state == "serving" and re.fullmatch(r"[\d.]+:\d+", endpoint)
        assert (start, high_watermark) == ("0", "0")

    proc = raylog(*cluster, "topics", "delete", name)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"Deleted topic {name}."
    assert name not in raylog(*cluster, "topics", "list").stdout.splitlines()
    assert_one_error_line(raylog(*cluster, "topics", "describe", name), 1, name)


def test_joining_ray_without_its_token_says_what_to_set(cluster, raylog_client):
    if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
        pytest.skip("the test Ray runs without token authentication")
    # Without RAY_AUTH_MODE the CLI presents the token by itself (see
    # tests/deploy/test_restart.py); a process told not to present it is refused.
    env = _clean_env(RAY_AUTH_MODE="disabled")
    proc = raylog(*cluster, "topics", "create", "never", "--data-dir", raylog_client.data_dir, env=env)
    assert_one_error_line(proc, 1, "requires token authentication; export RAY_AUTH_MODE=token")
    assert "never" not in raylog_client.list_topics()


def test_creating_an_existing_topic_exits_1(cluster, make_topic, raylog_client):
    topic = make_topic()
    proc = raylog(*cluster, "topics", "create", topic, "--data-dir", raylog_client.data_dir)
    assert_one_error_line(proc, 1, "already exists")


def test_unknown_topics_exit_1_with_one_line(cluster):
    for args in (["topics", "describe", "no-such-topic"], ["produce", "no-such-topic"],
                 ["consume", "no-such-topic", "--timeout-ms", "100"]):
        assert_one_error_line(raylog(*cluster, *args), 1, "no-such-topic")
    assert_one_error_line(raylog(*cluster, "topics", "delete", "no-such-topic"), 1, "no-such-topic")
    assert_one_error_line(raylog(*cluster, "topics", "reassign", "no-such-topic", "-p", "0", "--replicas", "a"), 1,
                          "no-such-topic")


def test_reassigning_a_topic_that_is_not_replicated_is_refused(cluster, make_topic):
    topic = make_topic()
    proc = raylog(*cluster, "topics", "reassign", topic, "--partition", "0", "--replicas", "disk-a")
    assert_one_error_line(proc, 2, "is not replicated")  # InvalidReassignmentError: a bad setting
    proc = raylog(*cluster, "topics", "reassign", topic, "--replace", "disk-a=disk-b")
    assert_one_error_line(proc, 1, f"no partition of {topic} has a replica on disk-a")


def test_environment_variables_select_the_cluster(zookeeper, raylog_client, make_topic):
    topic = make_topic()
    env = _clean_env(RAYLOG_ZOOKEEPER=zookeeper.connect_string, RAYLOG_CLUSTER=raylog_client.settings.cluster)
    proc = raylog("topics", "list", env=env)
    assert proc.returncode == 0, proc.stderr
    assert topic in proc.stdout.splitlines()


def test_topics_on_the_embedded_default_live_for_one_command():
    # No address: a local Ray and a ZooKeeper of the command's own. Ray's
    # temp dir of its own (short: it holds socket paths) keeps the command
    # from finding any other local Ray of the machine.
    temp = tempfile.mkdtemp(prefix="rl-", dir="/tmp")
    try:
        proc = raylog("topics", "create", "demo", "--partitions", "2", env=_clean_env(RAY_TMPDIR=temp))
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "Created topic demo with 2 partitions."
    assert "embedded cluster" in proc.stderr and "gone when the command ends" in proc.stderr


# -- produce and consume -----------------------------------------------------


def test_produce_and_consume_keys_values_and_offsets(cluster, make_topic):
    topic = make_topic(partitions=1)
    lines = [f"user-{i}\t{v}" for i, v in enumerate(_values(5))]
    proc = raylog(*cluster, "produce", topic, "--key-separator", "\t", input="\n".join(lines) + "\n")
    assert proc.returncode == 0, proc.stderr
    assert f"produced 5 messages to {topic}" in proc.stderr

    proc = raylog(*cluster, "consume", topic, "--from-beginning", "--max-messages", "5")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == _values(5)
    assert "consumed 5 messages" in proc.stderr

    proc = raylog(*cluster, "consume", topic, "--from-beginning", "--max-messages", "5",
                  "--print-key", "--print-offset", "--key-separator", "=")
    assert proc.returncode == 0, proc.stderr
    rows = [line.split("\t") for line in proc.stdout.splitlines()]
    assert [r[0] for r in rows] == ["Partition:0"] * 5
    offsets = [int(r[1].removeprefix("Offset:")) for r in rows]
    assert offsets[0] == 0 and offsets == sorted(offsets) and len(set(offsets)) == 5
    assert [r[2] for r in rows] == [f"user-{i}={v}" for i, v in enumerate(_values(5))]


def test_produce_compressed_without_acks_and_consume_unkeyed(cluster, make_topic):
    topic = make_topic(partitions=2)
    values = [f"line {i}" for i in range(50)]
    proc = raylog(*cluster, "produce", topic, "--compression", "zstd", "--acks", "0",
                  input="\r\n".join(values) + "\r\n")
    assert proc.returncode == 0, proc.stderr
    assert "produced 50 messages" in proc.stderr

    proc = raylog(*cluster, "consume", topic, "--from-beginning", "--max-messages", "50", "--print-key")
    assert proc.returncode == 0, proc.stderr
    got = [line.split("\t", 1) for line in proc.stdout.splitlines()]
    assert {key for key, _ in got} == {"null"}
    assert sorted(value for _, value in got) == sorted(values)  # \r\n line ends stripped


def test_produce_with_acks_all_is_readable_at_once(cluster, make_topic):
    topic = make_topic(partitions=1, flush_ms=600_000, flush_messages=10**9)  # only acks=all flushes
    proc = raylog(*cluster, "produce", topic, "--acks", "all", input="a\nb\nc\n")
    assert proc.returncode == 0, proc.stderr
    proc = raylog(*cluster, "consume", topic, "--from-beginning", "--max-messages", "3", "--timeout-ms", "20000")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["a", "b", "c"]


def test_produce_stops_at_a_line_without_the_key_separator(cluster, make_topic):
    topic = make_topic(partitions=1)
    proc = raylog(*cluster, "produce", topic, "--key-separator", ":", input="k:v\nno separator\nk:w\n")
    assert_one_error_line(proc, 1, "line 2 has no key separator ':'")
    assert f"produced 1 message to {topic}" in proc.stderr  # what came before was sent


def test_consume_exits_after_the_idle_timeout(cluster, make_topic):
    topic = make_topic(partitions=1)
    proc = raylog(*cluster, "consume", topic, "--timeout-ms", "500")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and "consumed 0 messages" in proc.stderr


# -- consumer groups ---------------------------------------------------------


def _produce_ten(raylog_client, topic: str) -> tuple[int, int]:
    """Ten values of one size into ``topic``'s partition 0 as format-1
    messages (one set each, through the data channel: every message at a byte
    position of its own, which the offsets below count), flushed:
    ``(log end, size of one message)``."""
    from raylog.storage.message import encode_message_set
    from raylog.transfer.connection import BrokerConnection

    host, port = raylog_client.metadata.endpoint(topic, 0, refresh=True, wait_s=10.0)
    with BrokerConnection(host, port, token=raylog_client.settings.token, timeout_s=10) as conn:
        for value in _values(10):
            conn.produce(topic, 0, encode_message_set([value.encode()]))
    end = _wait_flushed(raylog_client, topic)
    return end, end // 10


def test_consume_in_a_group_commits_and_groups_show_the_lag(cluster, make_topic, raylog_client):
    topic = make_topic(partitions=1)
    end, size = _produce_ten(raylog_client, topic)
    group = f"g-{topic}"

    proc = raylog(*cluster, "consume", topic, "--group", group, "--from-beginning", "--max-messages", "4")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == _values(4)

    proc = raylog(*cluster, "groups", "list")
    assert proc.returncode == 0, proc.stderr
    assert group in proc.stdout.splitlines()
    proc = raylog(*cluster, "groups", "list", "--json")
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    assert group in json.loads(proc.stdout)

    proc = raylog(*cluster, "groups", "describe", group, "--json")
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    (row,) = json.loads(proc.stdout)
    assert (row["topic"], row["partition"], row["owner"], row["committed"], row["end_offset"],
            row["lag_bytes"], row["lag_messages"]) == (topic, 0, None, 4 * size, end, end - 4 * size, 6)

    proc = raylog(*cluster, "groups", "describe", group)
    assert proc.returncode == 0, proc.stderr
    columns, row = proc.stdout.splitlines()
    assert columns.split() == ["TOPIC", "PARTITION", "OWNER", "COMMITTED", "END", "OFFSET", "LAG", "(BYTES)",
                               "LAG", "(MESSAGES)"]
    assert row.split() == [topic, "0", "-", str(4 * size), str(end), str(end - 4 * size), "6"]

    # The group goes on from its commit.
    proc = raylog(*cluster, "consume", topic, "--group", group, "--max-messages", "6")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == _values(10)[4:]
    row = raylog(*cluster, "groups", "describe", group).stdout.splitlines()[1]
    assert row.split()[3:] == [str(end), str(end), "0", "0"]


def test_groups_reset_offsets_dry_run_execute_and_delete(cluster, make_topic, raylog_client):
    topic = make_topic(partitions=1)
    end, size = _produce_ten(raylog_client, topic)
    group = f"g-reset-{topic}"
    proc = raylog(*cluster, "consume", topic, "--group", group, "--from-beginning", "--max-messages", "10")
    assert proc.returncode == 0, proc.stderr

    # a dry run shows the plan and writes nothing
    proc = raylog(*cluster, "groups", "reset-offsets", group, "--topic", topic, "--to-offset", str(3 * size))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1].split() == [topic, "0", str(end), str(3 * size)]
    assert "dry run" in proc.stderr
    assert raylog_client.describe_group(group)[0]["committed"] == end
    # not a message boundary, or two targets: one clear error line
    assert_one_error_line(raylog(*cluster, "groups", "reset-offsets", group, "--topic", topic, "--to-offset",
                                 str(3 * size + 1), "--execute"), 1, "not the start of a message")
    proc = raylog(*cluster, "groups", "reset-offsets", group, "--topic", topic, "--to-earliest", "--to-offset", "0")
    assert proc.returncode == 2 and "exactly one" in proc.stderr and "Traceback" not in proc.stderr
    proc = raylog(*cluster, "groups", "reset-offsets", group, "--topic", topic, "--to-offset", str(3 * size),
                  "--execute")
    assert proc.returncode == 0, proc.stderr
    proc = raylog(*cluster, "consume", topic, "--group", group, "--max-messages", "7")
    assert proc.stdout.splitlines() == _values(10)[3:]
    proc = raylog(*cluster, "groups", "reset-offsets", group, "--topic", topic, "--to-datetime",
                  "2000-01-01T00:00:00Z", "--execute")
    assert proc.returncode == 0, proc.stderr
    assert raylog_client.describe_group(group)[0]["committed"] == 0  # every message is newer

    # the committed offset of partition 0 deleted; asked again, none is left to delete
    proc = raylog(*cluster, "groups", "delete-offsets", group, "--topic", topic, "-p", "0")
    assert proc.returncode == 0, proc.stderr
    assert [line.split() for line in proc.stdout.splitlines()] == [["TOPIC", "PARTITION"], [topic, "0"]]
    assert group not in raylog_client.list_groups()  # its only offset: nothing is left of the group
    proc = raylog(*cluster, "groups", "delete-offsets", group, "--topic", topic)
    assert proc.returncode == 1 and group in proc.stderr  # no offsets and no members: no such group

    raylog_client.reset_offsets(group, topic, "earliest", dry_run=False)
    proc = raylog(*cluster, "groups", "delete", group)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"Deleted consumer group {group}." and not proc.stderr  # a result: stdout
    assert group not in raylog(*cluster, "groups", "list").stdout.splitlines()
    assert_one_error_line(raylog(*cluster, "groups", "delete", group), 1, group)


def test_describing_an_unknown_group_exits_1(cluster):
    assert_one_error_line(raylog(*cluster, "groups", "describe", "no-such-group"), 1, "no-such-group")


# -- a local ZooKeeper -------------------------------------------------------


def _kill_if_left(pid_file: str) -> None:
    try:
        with open(pid_file) as f:
            pid = int(f.read())
    except (OSError, ValueError):
        return
    try:
        os.kill(pid, signal.SIGKILL)  # the server's java process dies with it
    except ProcessLookupError:
        pass


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_zookeeper_start_outlives_the_command_and_stop_ends_it(tmp_path):
    data_dir = str(tmp_path / "zk")
    pid_file = os.path.join(data_dir, "raylog-zookeeper.pid")
    port = free_port()
    try:
        proc = raylog("zookeeper", "start", "--port", str(port), "--data-dir", data_dir)
        assert proc.returncode == 0, proc.stderr
        match = re.fullmatch(rf"ZooKeeper running at 127\.0\.0\.1:{port} \(pid (\d+), data dir .*\)\n", proc.stdout)
        assert match, proc.stdout
        pid = int(match.group(1))
        with open(pid_file) as f:
            assert int(f.read()) == pid
        assert f"raylog zookeeper stop --data-dir {data_dir}" in proc.stderr

        zk = connect_kazoo(f"127.0.0.1:{port}")  # serving, after the command ended
        try:
            zk.ensure_path("/raylog/probe")
        finally:
            zk.stop()
            zk.close()

        again = raylog("zookeeper", "start", "--port", str(free_port()), "--data-dir", data_dir)
        assert_one_error_line(again, 1, f"already runs from {data_dir} (pid {pid})")

        proc = raylog("zookeeper", "stop", "--data-dir", data_dir)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == f"Stopped ZooKeeper (pid {pid})."
        assert _gone(pid) and not os.path.exists(pid_file)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the java process ends with its parent
            try:
                four_letter_word(port, "ruok", timeout_s=1.0)
            except OSError:
                break
            time.sleep(0.2)
        with pytest.raises(OSError):
            four_letter_word(port, "ruok", timeout_s=1.0)

        assert_one_error_line(raylog("zookeeper", "stop", "--data-dir", data_dir), 1, "no ZooKeeper started by raylog")
    finally:
        _kill_if_left(pid_file)


def test_zookeeper_start_on_a_busy_port_fails_clearly(tmp_path, zookeeper):
    data_dir = str(tmp_path / "zk")
    try:
        proc = raylog("zookeeper", "start", "--port", str(zookeeper.port), "--data-dir", data_dir)
        assert_one_error_line(proc, 1, "ZooKeeper did not start", "port is in use")
    finally:
        _kill_if_left(os.path.join(data_dir, "raylog-zookeeper.pid"))


# -- the token ---------------------------------------------------------------


def test_token_prints_the_cluster_token_that_a_process_outside_ray_can_use(cluster, make_topic, raylog_client):
    name = raylog_client.settings.cluster
    proc = raylog("--cluster", name, "token")
    assert proc.returncode == 0, proc.stderr
    token = proc.stdout.strip()
    assert proc.stdout == token + "\n" and len(token) >= 32  # the token alone on stdout
    (warning,) = proc.stderr.splitlines()
    assert warning.startswith("warning: ") and "secret" in warning and token not in proc.stderr

    # A process outside Ray, which cannot derive the token, works with it ...
    topic = make_topic(partitions=1)
    outside = _clean_env(RAY_AUTH_MODE="disabled")
    proc = raylog(*cluster, "produce", topic, input="a\nb\n", env={**outside, "RAYLOG_TOKEN": token})
    assert proc.returncode == 0, proc.stderr
    proc = raylog(*cluster, "consume", topic, "--from-beginning", "--max-messages", "2",
                  env={**outside, "RAYLOG_TOKEN": token})
    assert proc.returncode == 0 and proc.stdout.splitlines() == ["a", "b"], proc.stderr
    # ... and is refused with another one, nothing stored
    proc = raylog(*cluster, "produce", topic, input="c\n", env={**outside, "RAYLOG_TOKEN": "0" * len(token)})
    assert_one_error_line(proc, 1, "token")
    proc = raylog(*cluster, "consume", topic, "--from-beginning", "--max-messages", "3", "--timeout-ms", "3000",
                  env={**outside, "RAYLOG_TOKEN": token})
    assert proc.stdout.splitlines() == ["a", "b"], proc.stderr


def test_token_without_a_ray_token_or_a_ray_cluster_says_what_to_do():
    proc = raylog("--ray-address", f"127.0.0.1:{free_port()}", "token", env=_clean_env(RAY_AUTH_MODE="disabled"))
    assert_one_error_line(proc, 1, "Ray cluster")
    assert not proc.stdout
