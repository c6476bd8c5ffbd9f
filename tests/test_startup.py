"""Connecting fails fast: a wrong ZooKeeper or Ray address gives one typed,
one-line error within a deadline, through the API and through the
installed ``raylog`` script. Failure cases only; the happy paths run in
every other suite.

Each attempt runs in a subprocess: this process may already hold a Ray
(``connect`` then skips ``ray.init``), and a hang must not hang the run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from raylog.zk.launcher import free_port

RAYLOG = os.path.join(os.path.dirname(sys.executable), "raylog")
#: the loose bound of the issue: a wrong address must fail well within it
FAIL_WITHIN_S = 30.0
#: the subprocess is killed after this (a hang is then a clear failure)
KILL_AFTER_S = 120.0
_OUR_VARS = ("RAYLOG_ZOOKEEPER", "RAYLOG_RAY_ADDRESS", "RAYLOG_CLUSTER", "RAYLOG_TOKEN", "RAY_ADDRESS", "RAYLOG_LOG_LEVEL")


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in _OUR_VARS}


def _run(cmd: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=KILL_AFTER_S)
    except subprocess.TimeoutExpired as hung:
        pytest.fail(f"{cmd[-3:]} still ran after {KILL_AFTER_S:g} s: {hung.stderr!r}")
    return proc, time.monotonic() - start


def _api(call: str) -> tuple[subprocess.CompletedProcess, float]:
    script = textwrap.dedent(
        f"""
        import raylog
        try:
            {call}
        except raylog.RaylogError as err:
            print(type(err).__name__, err.retriable, sep="\\n")
            print(err)
            raise SystemExit(3)
        raise SystemExit("connected?!")
        """
    )
    return _run([sys.executable, "-c", script])


def _one_line_error(proc, elapsed: float, error: str, *fragments: str) -> str:
    assert proc.returncode == 3, (proc.returncode, proc.stdout, proc.stderr)
    name, retriable, *message = proc.stdout.splitlines()
    assert name == error and retriable == "True"
    assert len(message) == 1, proc.stdout  # one line
    for fragment in fragments:
        assert fragment in message[0]
    assert proc.stderr == "", proc.stderr  # no retry chatter from kazoo or Ray
    assert elapsed < FAIL_WITHIN_S, f"took {elapsed:.1f} s"
    return message[0]


def test_a_wrong_zookeeper_address_fails_fast_through_the_api():
    address = f"127.0.0.1:{free_port()}"
    proc, elapsed = _api(f"raylog.connect(zookeeper={address!r}, ray_address='127.0.0.1:1')")
    _one_line_error(proc, elapsed, "ZooKeeperUnavailableError", address, "check that it runs")


def test_a_wrong_ray_address_fails_fast_through_the_api(zookeeper):
    address = f"127.0.0.1:{free_port()}"
    proc, elapsed = _api(f"raylog.connect(zookeeper={zookeeper.connect_string!r}, ray_address={address!r})")
    _one_line_error(proc, elapsed, "RayUnavailableError", repr(address), "ray status")


def test_a_bad_ray_address_is_a_config_error(zookeeper):
    proc, _ = _api(f"raylog.connect(zookeeper={zookeeper.connect_string!r}, ray_address='no port here')")
    assert proc.returncode == 3 and proc.stdout.splitlines()[0] == "ConfigError", proc.stdout + proc.stderr


def _cli_error(proc, elapsed: float, *fragments: str) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for fragment in fragments:
        assert fragment in lines[0]
    assert elapsed < FAIL_WITHIN_S, f"took {elapsed:.1f} s"
    return lines[0]


def test_a_wrong_zookeeper_address_fails_fast_through_the_cli():
    address = f"127.0.0.1:{free_port()}"
    proc, elapsed = _run([RAYLOG, "--zookeeper", address, "topics", "list"])
    _cli_error(proc, elapsed, "ZooKeeper", address)


def test_a_wrong_ray_address_fails_fast_through_the_cli_and_creates_nothing(zookeeper, zk):
    from raylog.zk.registry import Registry

    address = f"127.0.0.1:{free_port()}"
    cluster = f"deadline-{uuid.uuid4().hex[:8]}"
    proc, elapsed = _run(
        [RAYLOG, "--zookeeper", zookeeper.connect_string, "--ray-address", address, "--cluster", cluster,
         "topics", "create", "never", "--partitions", "2"]
    )
    _cli_error(proc, elapsed, "Ray", address)
    assert Registry(zk, cluster).list_topics() == []


#: a refused port (nothing listens) fails at once: well under the 10 s
#: deadline that a slow or silent ZooKeeper gets (a loose bound: the machine is shared)
REFUSED_WITHIN_S = 5.0
_TIMED = '''
import sys, time
import raylog
start = time.monotonic()
try:
    {call}
except raylog.ZooKeeperUnavailableError as err:
    print("ELAPSED", time.monotonic() - start)
    print(err)
    raise SystemExit(3)
raise SystemExit("connected?!")
'''


def test_a_refused_zookeeper_port_fails_at_once_naming_the_address():
    address = f"127.0.0.1:{free_port()}"  # nothing listens: connections are refused
    for call in (f"raylog.connect(zookeeper={address!r})",
                 f"raylog.Client(zookeeper={address!r})"):
        proc, _ = _run([sys.executable, "-c", _TIMED.format(call=call)])
        assert proc.returncode == 3, (call, proc.stdout, proc.stderr)
        elapsed_line, message = proc.stdout.splitlines()[:2]
        assert float(elapsed_line.split()[1]) < REFUSED_WITHIN_S, (call, elapsed_line)
        assert address in message and "refused" in message, message


def test_a_silent_zookeeper_keeps_its_full_deadline():
    """A port that accepts and never answers is not taken for a refused one:
    the connection gets its whole deadline (here 3 s) before the error."""
    import socket

    from raylog.errors import ZooKeeperUnavailableError
    from raylog.zk.session import connect_kazoo

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # the kernel completes the handshake; nothing ever answers
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        start = time.monotonic()
        with pytest.raises(ZooKeeperUnavailableError, match="within 3s"):
            connect_kazoo(address, timeout_s=3.0, refused_fails_fast=True)
        assert time.monotonic() - start >= 2.5


UNCLEAN_FIRST = textwrap.dedent('''
    import os, sys
    import raylog
    client = raylog.connect(data_dir=sys.argv[1])
    client.create_topic("kept", partitions=3, flush_ms=10)
    producer = client.producer(acks="all")
    for i in range(60):
        producer.send("kept", b"k-%d" % i, partition=i % 3)
    producer.close()
    print("READY", flush=True)
    sys.stdin.readline()  # killed here, by the test: no close
''')

UNCLEAN_SECOND = textwrap.dedent('''
    import json, sys, time
    import raylog
    client = raylog.connect(data_dir=sys.argv[1])
    # the first calls right after connect returns: every partition serves
    ends = client.end_offsets("kept")
    consumer = client.consumer("kept", auto_offset_reset="earliest")
    got, deadline = [], time.monotonic() + 120
    while any((consumer.position("kept", p) or 0) < end for p, end in ends.items()):
        assert time.monotonic() < deadline, "could not read to the end"
        got += [m.value.decode() for m in consumer.poll(timeout_ms=200)]
    consumer.close()
    client.close()
    print("RESULT " + json.dumps(sorted(got)), flush=True)
''')


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc`` and every process below it (its Ray, its ZooKeeper), by PID."""
    import psutil

    try:
        below = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        below = []
    proc.kill()
    proc.wait(timeout=60)
    for child in below:
        try:
            child.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(below, timeout=30)


def test_connect_on_a_kept_data_dir_after_an_unclean_stop_returns_when_every_partition_serves(tmp_path):
    data_dir = str(tmp_path / "data")
    first = subprocess.Popen([sys.executable, "-c", UNCLEAN_FIRST, data_dir], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        line = first.stdout.readline()
        assert line.startswith("READY"), line + first.stderr.read()[-3000:] if first.poll() is not None else line
    finally:
        _kill_tree(first)  # an unclean stop: the partitions' endpoints stay behind in ZooKeeper
    proc, _ = _run([sys.executable, "-c", UNCLEAN_SECOND, data_dir])
    assert proc.returncode == 0, proc.stderr[-5000:]
    result = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert result and json.loads(result[0][len("RESULT "):]) == sorted(f"k-{i}" for i in range(60)), proc.stdout
