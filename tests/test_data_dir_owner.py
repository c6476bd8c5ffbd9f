"""One owner per kept ``data_dir``: while one process's
``raylog.connect(data_dir=D)`` runs, a second process's is refused at once
with :class:`raylog.DataDirInUseError` naming the owner (its pid and
command), starts no second ZooKeeper on D's data, and the first cluster's
messages stay intact; a lock left by a process killed with SIGKILL blocks
nothing. Real processes, real ZooKeeper and Ray."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest

from raylog.startup import EMBEDDED_ZOOKEEPER_DIR, DataDirLock
from raylog.errors import DataDirInUseError

pytestmark = pytest.mark.timeout(900)

OWNER = textwrap.dedent('''
    import json, sys, time
    import raylog
    data_dir = sys.argv[1]
    client = raylog.connect(data_dir=data_dir)
    if not client.list_topics():
        client.create_topic("clicks", partitions=1, flush_ms=10)
        producer = client.producer(acks="all")
        for i in range(20):
            producer.send("clicks", b"m-%d" % i)
        producer.close()  # raises unless every message was acknowledged
    print("READY", flush=True)
    sys.stdin.readline()  # hold the cluster until told to read back
    consumer = client.consumer("clicks", auto_offset_reset="earliest")
    end = client.end_offsets("clicks")[0]
    got, deadline = [], time.monotonic() + 120
    while (consumer.position("clicks", 0) or 0) < end:
        assert time.monotonic() < deadline, "could not read to the end"
        got += [m.value.decode() for m in consumer.poll(timeout_ms=200)]
    client.close()
    print("RESULT " + json.dumps(got), flush=True)
''')

SECOND = textwrap.dedent('''
    import json, sys
    import raylog
    try:
        raylog.connect(data_dir=sys.argv[1])
    except raylog.DataDirInUseError as err:
        print("REFUSED " + json.dumps({"message": str(err), "pid": err.pid, "command": err.command}))
        sys.exit(0)
    print("CONNECTED")
    sys.exit(3)
''')

HOLD_LOCK = textwrap.dedent('''
    import sys, time
    from raylog.startup import DataDirLock
    DataDirLock(sys.argv[1])
    print("LOCKED", flush=True)
    time.sleep(600)
''')


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("RAYLOG_") and k != "RAY_ADDRESS"}


def _start(script: str, data_dir: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", script, data_dir], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())


def _wait_line(proc: subprocess.Popen, word: str) -> str:
    for line in proc.stdout:
        if line.startswith(word):
            return line
    proc.wait(timeout=60)
    raise AssertionError(f"no {word} line (exit {proc.returncode}): {proc.stderr.read()[-5000:]}")


def _zookeepers_on(zk_dir: str) -> list[int]:
    """PIDs of the ZooKeeper servers running on ``zk_dir``'s data."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmdline = proc.info["cmdline"] or ()
        except psutil.Error:
            continue
        if any("QuorumPeerMain" in a or "ZooKeeperServerMain" in a for a in cmdline) \
                and any(zk_dir in a for a in cmdline):
            found.append(proc.pid)
    return found


def _finish(proc: subprocess.Popen) -> list[str]:
    out, err = proc.communicate("go\n", timeout=400)
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, out[-3000:] + err[-5000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_a_second_connect_on_a_data_dir_in_use_is_refused_naming_the_owner(tmp_path):
    data_dir = str(tmp_path / "data")
    zk_dir = os.path.join(data_dir, EMBEDDED_ZOOKEEPER_DIR)
    owner = _start(OWNER, data_dir)
    try:
        _wait_line(owner, "READY")
        servers = _zookeepers_on(zk_dir)

        second = subprocess.run([sys.executable, "-c", SECOND, data_dir], capture_output=True, text=True,
                                env=_env(), timeout=400)
        refused = [line for line in second.stdout.splitlines() if line.startswith("REFUSED ")]
        assert second.returncode == 0 and refused, second.stdout[-3000:] + second.stderr[-5000:]
        info = json.loads(refused[0][len("REFUSED "):])
        assert info["pid"] == owner.pid
        assert f"pid {owner.pid}" in info["message"] and data_dir in info["message"]
        assert "-c" in info["command"]  # what the owner runs: its command line
        assert _zookeepers_on(zk_dir) == servers  # no second ZooKeeper on the same data

        assert sorted(_finish(owner)) == sorted(f"m-{i}" for i in range(20))  # the first cluster intact
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait(timeout=60)

    # The owner closed its client: the directory is free again, and what it
    # kept is served to the next owner.
    again = _start(OWNER, data_dir)
    _wait_line(again, "READY")
    assert sorted(_finish(again)) == sorted(f"m-{i}" for i in range(20))


def test_a_lock_left_by_a_killed_process_blocks_nothing(tmp_path):
    data_dir = str(tmp_path / "data")
    holder = _start(HOLD_LOCK, data_dir)
    try:
        _wait_line(holder, "LOCKED")
        with pytest.raises(DataDirInUseError, match=f"pid {holder.pid} "):
            DataDirLock(data_dir)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
    assert os.path.exists(os.path.join(data_dir, ".raylog-owner.lock"))  # the file stays, unlocked
    lock = DataDirLock(data_dir)  # the dead owner's lock is gone with it
    with pytest.raises(DataDirInUseError, match=f"pid {os.getpid()} "):
        DataDirLock(data_dir)  # one owner, also within one process
    lock.release()
    DataDirLock(data_dir).release()
