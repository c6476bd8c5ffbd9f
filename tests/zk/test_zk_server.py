"""The embedded ZooKeeper server and connect_kazoo, against real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from raylog.errors import ZooKeeperUnavailableError
from raylog.errors import EmbeddedZooKeeperError
from raylog.testing.clusters import wait_until as _wait_until
from raylog.zk.launcher import find_jars, four_letter_word, free_port
from raylog.zk.server import EmbeddedZooKeeper
from raylog.zk.session import connect_kazoo


def process_gone(pid: int) -> bool:
    """True once ``pid`` no longer runs (absent, or a zombie awaiting its reaper)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def wait_until(predicate, timeout_s: float = 30.0) -> bool:
    return _wait_until(predicate, timeout_s, interval_s=0.05)


def close(client):
    client.stop()
    client.close()


# -------------------------------------------------------------- failures first


def test_missing_jars_raise_a_clear_error(tmp_path):
    (tmp_path / "zookeeper-3.6.3.jar").write_bytes(b"")
    with pytest.raises(EmbeddedZooKeeperError, match="zookeeper-jute") as info:
        find_jars(str(tmp_path))
    assert "reinstall pyspark" in str(info.value)

    server = EmbeddedZooKeeper(jars_dir=str(tmp_path))
    with pytest.raises(EmbeddedZooKeeperError, match="missing"):
        server.start()
    assert not server.running and server.pid is None


def test_missing_java_raises_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EmbeddedZooKeeperError, match="java was not found"):
        EmbeddedZooKeeper().start()


def test_a_port_in_use_fails_clearly_and_leaves_nothing_behind(zookeeper):
    server = EmbeddedZooKeeper(port=zookeeper.port, start_timeout_s=30)
    with pytest.raises(EmbeddedZooKeeperError, match="port is in use") as info:
        server.start()
    assert info.value.port_in_use
    assert "BindException" in str(info.value) or "Address already in use" in str(info.value)
    assert not server.running
    assert server.data_dir is None  # the temp dir it made is gone
    assert zookeeper.running  # and the server that owns the port is untouched


def test_connect_kazoo_to_nothing_raises_zookeeper_unavailable():
    port = free_port()  # nobody listens here
    with pytest.raises(ZooKeeperUnavailableError, match="could not connect to ZooKeeper") as info:
        connect_kazoo(f"127.0.0.1:{port}", timeout_s=1.0)
    assert info.value.retriable
    assert info.value.hosts == f"127.0.0.1:{port}"


def test_host_other_than_loopback_is_refused():
    from raylog.errors import ConfigError

    with pytest.raises(ConfigError, match="127.0.0.1 only"):
        EmbeddedZooKeeper(host="0.0.0.0")


# ------------------------------------------------------------------- lifecycle


def test_start_serves_clients_and_stop_leaves_no_process():
    server = EmbeddedZooKeeper()
    try:
        server.start()
        assert server.running
        pid, data_dir = server.pid, server.data_dir
        assert server.connect_string == f"127.0.0.1:{server.port}"
        assert four_letter_word(server.port, "ruok") == "imok"

        client = connect_kazoo(server.connect_string)
        try:
            client.create("/hello", b"world")
            assert client.get("/hello")[0] == b"world"
        finally:
            close(client)
        assert os.path.exists(os.path.join(data_dir, "zookeeper.out"))
    finally:
        server.stop()
    assert not server.running and server.pid is None
    assert process_gone(pid)
    assert not os.path.exists(data_dir)
    server.stop()  # idempotent


def test_context_manager_stops_the_server():
    with EmbeddedZooKeeper() as server:
        pid = server.pid
        assert server.running
    assert process_gone(pid)


def test_restart_keeps_port_and_data_and_clients_resume(tmp_path):
    server = EmbeddedZooKeeper(data_dir=str(tmp_path / "zk"))
    client = None
    try:
        server.start()
        port, old_pid = server.port, server.pid
        client = connect_kazoo(server.connect_string, timeout=20.0)
        session = client.client_id
        client.create("/kept", b"1")

        server.restart()

        assert server.port == port
        assert server.pid != old_pid and process_gone(old_pid)
        # the same client reconnects to the same session and sees the data
        assert wait_until(lambda: client.connected)
        assert client.retry(client.get, "/kept")[0] == b"1"
        assert client.client_id[0] == session[0]
    finally:
        if client is not None:
            close(client)
        server.stop()
    assert os.path.exists(tmp_path / "zk" / "zookeeper.out")  # a given data dir is kept


def test_start_after_kill_process_resumes_on_the_same_port(private_zookeeper, tmp_path):
    port, pid = private_zookeeper.port, private_zookeeper.pid
    client = connect_kazoo(private_zookeeper.connect_string)
    try:
        client.create("/kept", b"1")
    finally:
        close(client)

    private_zookeeper.kill_process()
    assert not private_zookeeper.running and process_gone(pid)
    assert os.path.exists(private_zookeeper.data_dir)

    private_zookeeper.start()
    assert private_zookeeper.port == port
    client = connect_kazoo(private_zookeeper.connect_string)
    try:
        assert client.get("/kept")[0] == b"1"
    finally:
        close(client)


def test_server_output_goes_to_its_log_file(private_zookeeper):
    log = open(private_zookeeper.log_path).read()
    assert "starting:" in log and "ZooKeeperServerMain" in log
    assert "binding to port" in log  # the server's own logger writes here too


def test_a_crashed_parent_leaves_no_server_behind(tmp_path):
    """The server dies with the process that started it, even on SIGKILL."""
    script = textwrap.dedent(
        """
        import os, signal, sys
        from raylog.zk.server import EmbeddedZooKeeper
        server = EmbeddedZooKeeper(data_dir=sys.argv[1]).start()
        print(server.pid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    parent = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "zk")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert parent.returncode == -9, parent.stderr
    pid = int(parent.stdout.split()[0])
    try:
        assert wait_until(lambda: process_gone(pid)), f"server {pid} outlived its parent"
    finally:
        if not process_gone(pid):
            os.kill(pid, 9)


# -------------------------------------------------------------------- fixtures


def test_fixtures_give_a_connected_client_and_fresh_cluster_names(zk, zookeeper, cluster_name):
    assert zk.connected
    assert zk.hosts[0] == ("127.0.0.1", zookeeper.port)
    assert cluster_name.startswith("test-")


_NAMES_SEEN: list[str] = []


@pytest.mark.parametrize("run", [1, 2])
def test_cluster_names_differ_between_tests(cluster_name, run):
    assert cluster_name not in _NAMES_SEEN
    _NAMES_SEEN.append(cluster_name)


@pytest.mark.parametrize("bind_failure, launches", [(True, 5), (False, 1)])
def test_only_a_lost_bind_is_tried_again_and_within_the_policys_tries(tmp_path, monkeypatch, bind_failure, launches):
    """The start's retry loop (a RetryPolicy): a server that lost its port
    to another process is started again on a new port, at most
    _BIND_FAILURE_TRIES times; a server that exited for any other reason is
    not started again."""
    from raylog.zk import server as server_module

    zk = EmbeddedZooKeeper(data_dir=str(tmp_path))
    ports = []

    def launch(java, classpath):
        ports.append(zk._port)

    def exited():
        raise server_module._ServerExited(1, bind_failure)

    monkeypatch.setattr(zk, "_launch", launch)
    monkeypatch.setattr(zk, "_wait_ready", exited)
    monkeypatch.setattr(zk, "_reap", lambda: None)
    monkeypatch.setattr(zk, "_log_tail", lambda: "")
    with pytest.raises(EmbeddedZooKeeperError, match="exited with code 1") as info:
        zk._start_process("java", "")
    assert len(ports) == launches == (server_module._BIND_FAILURE_TRIES if bind_failure else 1)
    assert info.value.port_in_use is bind_failure


# -------------------------------------------------------------- bounds

def test_a_server_bounds_connections_request_size_and_four_letter_words(tmp_path):
    from raylog.zk.launcher import MAX_CLIENT_CONNECTIONS, MAX_REQUEST_BYTES, ServerSettings, command, heap_for, write_config

    settings = ServerSettings(data_dir=str(tmp_path), port=2181)
    with open(write_config(settings)) as f:
        cfg = f.read().splitlines()
    assert f"maxClientCnxns={MAX_CLIENT_CONNECTIONS}" in cfg and MAX_CLIENT_CONNECTIONS > 0
    assert "4lw.commands.whitelist=ruok,srvr" in cfg
    line = command(settings, "java", "cp")
    assert f"-Djute.maxbuffer={MAX_REQUEST_BYTES}" in line and MAX_REQUEST_BYTES <= 1 << 20
    heap = int(next(arg for arg in line if arg.startswith("-Xmx"))[4:-1])
    # every connection's largest request fits at once, with room for the tree
    assert heap == heap_for(MAX_CLIENT_CONNECTIONS, MAX_REQUEST_BYTES)
    assert heap * (1 << 20) >= MAX_CLIENT_CONNECTIONS * MAX_REQUEST_BYTES + (128 << 20)
    assert "-XX:+ExitOnOutOfMemoryError" in line


def test_a_request_past_the_bound_is_refused_and_the_server_serves_on(private_zookeeper):
    from kazoo.exceptions import ConnectionLoss

    zk = connect_kazoo(private_zookeeper.connect_string)
    try:
        with pytest.raises(ConnectionLoss):
            zk.create_async("/big", b"x" * (2 << 20)).get(timeout=30)
        assert zk.exists("/big") is None
        zk.create("/small", b"x" * 1000)
        assert four_letter_word(private_zookeeper.port, "ruok") == "imok"
    finally:
        close(zk)


# -------------------------------------------------------------- the watchdog

def test_the_watchdog_restarts_a_server_that_died_unasked_and_leaves_one_stopped_on_purpose(tmp_path, caplog):
    import logging
    import signal

    with EmbeddedZooKeeper(data_dir=str(tmp_path / "zk"), watchdog=True) as server:
        port = server.port
        zk = connect_kazoo(server.connect_string)
        try:
            zk.create("/kept", b"1")
            with caplog.at_level(logging.WARNING, logger="raylog.zk.server"):
                pid = server.pid
                os.kill(pid, signal.SIGKILL)
                assert wait_until(lambda: server.running and server.pid != pid, 60)
            assert server.port == port
            assert zk.get("/kept")[0] == b"1"
            assert len([r for r in caplog.records if "restarting it" in r.getMessage()]) == 1
            server.kill_process()  # on purpose: it stays down
            assert not wait_until(lambda: server.running, 2.0)
        finally:
            close(zk)
    assert server.pid is None
