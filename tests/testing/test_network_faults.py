"""The network faults of raylog.testing.faults on the hosts kit: each blocks
what it should, and only that, and heal restores it."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from raylog.testing import faults

pytestmark = [pytest.mark.hosts, pytest.mark.timeout(900)]

PORT = 7431

_SERVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(64)
while True:
    c, _ = s.accept()
    try:
        c.settimeout(5)
        data = c.recv(100)
        c.sendall(b"echo:" + data)
    except OSError:
        pass
    finally:
        c.close()
"""

_UDP_RECEIVE = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.settimeout(float(sys.argv[2]))
print("ready", flush=True)
try:
    print(s.recv(100).decode(), flush=True)
except OSError:
    print("nothing", flush=True)
"""

_UDP_SEND = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(10):
    s.sendto(b"datagram", (sys.argv[1], int(sys.argv[2]))); time.sleep(0.1)
"""


@pytest.fixture(scope="module")
def listeners(hosts):
    """A TCP echo server on port PORT of every host."""
    procs = [h.popen([sys.executable, "-c", _SERVER, str(PORT)], stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL) for h in hosts.hosts]
    deadline = time.monotonic() + 60
    while not all(hosts.can_connect(None, h, PORT, 2) for h in hosts.hosts):
        assert time.monotonic() < deadline, "the echo servers did not start"
        time.sleep(0.2)
    yield hosts
    for p in procs:
        p.kill()
        p.wait(10)


@pytest.fixture
def net(listeners):
    yield listeners
    faults.heal(listeners)


def reach(hosts, source, target, timeout_s=2.0) -> bool:
    return hosts.can_connect(source, target, PORT, timeout_s)


def udp_arrives(source, target) -> bool:
    receiver = target.popen([sys.executable, "-c", _UDP_RECEIVE, str(PORT + 1), "3"], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert receiver.stdout.readline().strip() == "ready"
        source.run([sys.executable, "-c", _UDP_SEND, target.address, str(PORT + 1)])
        return receiver.stdout.readline().strip() == "datagram"
    finally:
        receiver.kill()
        receiver.wait(10)


def test_everything_reaches_everything_when_healthy(net):
    h = net.hosts
    for source in [None] + h:
        for target in h:
            if source is not target:
                assert reach(net, source, target), (source, target)


def test_a_cut_host_is_silent_and_comes_back(net):
    h1, h2, h3, h4 = net.hosts
    faults.cut_host(h2)
    started = time.monotonic()
    assert not reach(net, None, h2, 2.0)
    assert time.monotonic() - started >= 1.5  # a timeout, not a refusal
    assert not reach(net, h3, h2) and not reach(net, h2, h3)
    assert reach(net, None, h3) and reach(net, h3, h4)
    assert h2.pids(), "its processes live on"
    faults.restore_host(h2)
    assert reach(net, None, h2, 10) and reach(net, h3, h2, 10) and reach(net, h2, h3, 10)


def test_a_partition_splits_two_sides_and_heals(net):
    h1, h2, h3, h4 = net.hosts
    faults.partition([h1, h2], [h3, h4])
    for a in (h1, h2):
        for b in (h3, h4):
            assert not reach(net, a, b) and not reach(net, b, a), (a, b)
    assert reach(net, h1, h2) and reach(net, h3, h4)
    for h in net.hosts:
        assert reach(net, None, h)  # the client machine is on neither side
    faults.heal(net)
    assert reach(net, h2, h3) and reach(net, h4, h1)


def test_a_one_way_partition_blocks_one_direction(net):
    h1, h2, h3, h4 = net.hosts
    assert udp_arrives(h2, h3) and udp_arrives(h3, h2)
    faults.one_way_partition([h2], [h3])
    assert not udp_arrives(h2, h3)
    assert udp_arrives(h3, h2)
    assert udp_arrives(h2, h4) and udp_arrives(h4, h3)
    faults.heal(net)
    assert udp_arrives(h2, h3)


def test_a_host_cut_from_zookeeper_still_serves_clients(net):
    from raylog.testing.hosts import RAY_PORT, ZOOKEEPER_PORT

    h1, h2, h3, h4 = net.hosts
    assert net.can_connect(h2, h1, ZOOKEEPER_PORT)
    faults.cut_from_zookeeper(h2, net)
    assert not net.can_connect(h2, h1, ZOOKEEPER_PORT, 2.0)
    assert net.can_connect(h3, h1, ZOOKEEPER_PORT) and net.can_connect(None, h1, ZOOKEEPER_PORT)
    assert net.can_connect(h2, h1, RAY_PORT)  # the Ray head on the same host is still reached
    assert reach(net, None, h2) and reach(net, h3, h2) and reach(net, h2, h4)
    with pytest.raises(Exception, match="head host"):
        faults.cut_from_zookeeper(h1, net)
    faults.heal(net)
    assert net.can_connect(h2, h1, ZOOKEEPER_PORT, 10)


def _echo(hosts, target, timeout_s: float) -> bool:
    import socket

    try:
        with socket.create_connection((target.address, PORT), timeout=timeout_s) as s:
            s.settimeout(timeout_s)
            s.sendall(b"x")
            return s.recv(10) == b"echo:x"
    except OSError:
        return False


def test_a_paused_host_answers_nothing_until_resumed(net):
    h4 = net.host("h4")
    assert _echo(net, h4, 5)
    pids = faults.stop_host(h4)
    try:
        assert pids
        assert not _echo(net, h4, 2)  # the kernel may accept, the process answers nothing
    finally:
        faults.resume_host(pids)
    assert _echo(net, h4, 10)


def test_a_killed_host_loses_its_processes_keeps_its_disk_and_restarts(net):
    import ray

    from raylog.actors.placement import NODE_LABEL

    h4 = net.host("h4")
    h4.run(["sh", "-c", f"echo kept > {net.data_dir}/kill-probe"])
    before = h4.process_pids()
    killed = faults.kill_host(h4)
    assert set(before) <= set(killed)
    deadline = time.monotonic() + 30
    while h4.process_pids() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert h4.process_pids() == []
    assert not _echo(net, h4, 2)
    assert h4.run(["cat", f"{net.data_dir}/kill-probe"]).stdout.strip() == "kept"
    net.restart_ray(h4)

    def alive():
        return any(n["Alive"] and n["Labels"].get(NODE_LABEL) == h4.label for n in ray.nodes())

    deadline = time.monotonic() + 120
    while not alive():
        assert time.monotonic() < deadline, "h4's Ray node did not come back"
        time.sleep(0.5)
    h4.run(["rm", "-f", f"{net.data_dir}/kill-probe"])
