"""The fault kit on real processes, a real ZooKeeper and real partition logs.

(The ZooKeeper-client faults, expire_session and drop_connection, are
exercised by tests/zk/test_registry.py and test_coordinator.py.)"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time

import pytest
from kazoo.client import KazooClient

from raylog.config import TopicConfig
from raylog.errors import CorruptMessageError
from raylog.storage.log import PartitionLog
from raylog.storage.decoding import decode_messages
from raylog.storage.message import encode_message_set
from raylog.testing import faults


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


@pytest.fixture
def child():
    # The child says when it is up, so no test sees it mid-start (reading
    # its modules from disk, state "D").
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; print('up', flush=True); time.sleep(120)"],
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout.readline() == b"up\n"
        yield proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, 18)  # SIGCONT, in case a test left it stopped
            proc.kill()
        proc.wait(10)


def test_kill_process_kills_at_once(child):
    faults.kill_process(child.pid)
    assert child.wait(10) == -9
    with pytest.raises(faults.FaultInjectionError):
        faults.kill_process(child.pid)


def test_pause_process_stops_then_resumes(child):
    import threading

    states = []
    t = threading.Thread(target=faults.pause_process, args=(child.pid, 1.0))
    t.start()
    time.sleep(0.4)
    states.append(_state(child.pid))
    t.join(10)
    states.append(_state(child.pid))
    # Stopped, then no longer stopped: any state but "T"/"t" (traced) or a
    # dead one ("D", a disk wait, is a live process too on a busy machine).
    assert states[0] == "T", states
    assert states[1] not in ("T", "t", "Z", "X"), states


_BUSY_THREADS = """
import hashlib, threading, time
big = b"x" * (1 << 20)
def spin():
    while True:
        hashlib.sha256(big).digest()  # releases the GIL: the threads run at once
for _ in range(8):
    threading.Thread(target=spin, daemon=True).start()
print("up", flush=True)
time.sleep(120)
"""


def test_stop_process_returns_once_every_thread_is_stopped():
    """SIGSTOP stops a process's threads one after another; a test that
    freezes a partition actor must not go on while one still serves."""
    proc = subprocess.Popen([sys.executable, "-c", _BUSY_THREADS], stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"up\n"
        for _ in range(20):
            faults.stop_process(proc.pid)
            stopped, threads = faults._stopped_threads(proc.pid)
            assert threads == 9 and stopped == threads, (stopped, threads)
            faults.resume_process(proc.pid)
            time.sleep(0.01)
    finally:
        faults.resume_process(proc.pid)
        proc.kill()
        proc.wait(10)
    with pytest.raises(faults.FaultInjectionError):
        faults.stop_process(proc.pid)


def _log_with(tmp_path, sets):
    log = PartitionLog(tmp_path / "p", TopicConfig())
    offsets = [log.append(s) for s in sets]
    log.flush()
    return log, offsets


@pytest.mark.parametrize("codec", [None, "zstd"])
def test_flip_byte_is_detected_by_crc_and_keeps_boundaries(tmp_path, codec):
    sets = [encode_message_set([b"value-%d-%d" % (i, j) for j in range(3)], compression=codec) for i in range(5)]
    log, offsets = _log_with(tmp_path, sets)
    victim = offsets[2]
    size = faults.message_size(log.directory, victim)
    flipped = faults.flip_byte(log.directory, victim, random.Random(1))
    assert flipped["offset"] == victim and victim + 22 <= flipped["position"] < victim + size
    end = log.high_watermark
    with open(flipped["segment"], "rb") as f:
        data = f.read()
    # everything before the damage reads back, the damaged message fails its CRC
    records, consumed = decode_messages(data[:victim], 0)
    assert consumed == victim
    with pytest.raises(CorruptMessageError) as err:
        decode_messages(data[victim:end], victim)
    assert err.value.offset == victim
    # and the message after it is intact, where its size field says
    after, _ = decode_messages(data[victim + size : end], victim + size)
    assert after[0][0] == victim + size and (codec is None or victim + size == offsets[3])
    log.close()


def test_flip_byte_outside_the_log_is_refused(tmp_path):
    log, _ = _log_with(tmp_path, [encode_message_set([b"x"])])
    with pytest.raises(faults.FaultInjectionError):
        faults.flip_byte(log.directory, 10_000)
    log.close()


def test_zookeeper_outage_keeps_data_and_sessions(private_zookeeper):
    zk = KazooClient(hosts=private_zookeeper.connect_string, timeout=10)
    zk.start(timeout=15)
    try:
        zk.create("/before", b"1")
        session = zk.client_id[0]
        faults.zookeeper_outage(private_zookeeper, 1.0)
        assert private_zookeeper.running
        deadline = time.monotonic() + 30
        while not zk.connected and time.monotonic() < deadline:
            time.sleep(0.1)
        assert zk.get("/before")[0] == b"1"
        assert zk.client_id[0] == session
    finally:
        zk.stop()
        zk.close()


def test_old_module_still_reexports_the_zookeeper_faults():
    from raylog.testing import faults as old

    assert old.expire_session is faults.expire_session and old.drop_connection is faults.drop_connection


def test_crash_at_makes_a_cleaning_process_crash_at_that_step(tmp_path):
    """crash_at arms the storage layer's fault point with 'kill': a process
    with the switch on SIGKILLs itself when its cleaner gets there (here,
    the cleaned segment written, the swap not begun). (What recovery makes
    of each step is tests/storage/test_cleaner.py's.)"""
    from raylog.storage import faults as storage_faults

    assert faults.FAULT_INJECTION_ENV == storage_faults.ENV
    log_dir = str(tmp_path / "p")
    code = (
        "import sys\n"
        "from raylog.config import TopicConfig\n"
        "from raylog.storage.log import PartitionLog\n"
        "from raylog.storage.record_batch import encode_batch\n"
        "config = TopicConfig(cleanup_policy='compact', segment_bytes=512, max_message_bytes=512,"
        " flush_messages=1, min_compaction_lag_ms=0)\n"
        "log = PartitionLog(sys.argv[1], config)\n"
        "for i in range(60):\n"
        "    log.append(encode_batch([b'v%d' % i], keys=[b'k%d' % (i % 5)], timestamp_ms=1000))\n"
        "log.flush()\n"
        "print(log.high_watermark, flush=True)\n"
        "log.clean(now_ms=10**13, force=True)\n"
        "print('not crashed', flush=True)\n"
    )
    os.makedirs(log_dir)
    trigger = faults.crash_at(log_dir, "clean-written")
    proc = subprocess.run([sys.executable, "-c", code, log_dir], capture_output=True, text=True, timeout=120,
                          env={**os.environ, faults.FAULT_INJECTION_ENV: "1"})
    assert proc.returncode == -9, proc.stdout + proc.stderr  # SIGKILL, at the step
    assert "not crashed" not in proc.stdout and not os.path.exists(trigger)
    assert any(n.endswith(".cleaned") for n in os.listdir(log_dir))  # written, never swapped


def test_fill_disk_takes_the_room_of_a_real_tmpfs_and_free_disk_gives_it_back(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], check=True)
    try:
        (disk / "data").write_bytes(b"x" * 100_000)
        taken = faults.fill_disk(str(disk), leave_bytes=8192)
        assert 3 << 20 < taken < 4 << 20
        with pytest.raises(OSError) as err:  # nothing more than the room left fits
            (disk / "more").write_bytes(b"y" * 64 * 1024)
        assert err.value.errno == 28
        assert (disk / "data").read_bytes() == b"x" * 100_000
        faults.free_disk(str(disk))
        (disk / "more").write_bytes(b"y" * 1024 * 1024)
    finally:
        subprocess.run(["umount", str(disk)], check=True)
