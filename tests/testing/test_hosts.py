"""The hosts kit (raylog.testing.hosts): hosts with their own addresses,
disks and Ray nodes; raylog on them from the wheel; a replicated topic
across them; nothing left behind, even by a run that was killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from raylog.testing import hosts as kit

pytestmark = [pytest.mark.hosts, pytest.mark.timeout(900)]


def test_each_host_has_its_own_address_and_ray_node(hosts):
    import ray

    from raylog.actors.placement import DISK_RESOURCE, NODE_LABEL

    addresses = [h.address for h in hosts.hosts]
    assert len(set(addresses)) == len(addresses)
    for h in hosts.hosts:
        assert h.address.startswith(f"{kit.SUBNET}.{hosts.slot}.")
        # the address is the host's own: its interface holds it, the machine's does not
        assert h.address in h.run(["ip", "-o", "addr", "show", "dev", "eth0"]).stdout
    root = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True).stdout
    assert not any(f" {a}/" in root for a in addresses)
    nodes = {n["Labels"].get(NODE_LABEL): n for n in ray.nodes() if n["Alive"]}
    for h in hosts.hosts:
        assert nodes[h.label]["NodeManagerAddress"] == h.address
        assert (nodes[h.label]["Resources"].get(DISK_RESOURCE, 0) > 0) == h.disk
    assert nodes[kit.CLIENT_LABEL]["NodeManagerAddress"] == hosts.client_address
    assert [h.name for h in hosts.disk_hosts] == ["h2", "h3", "h4"]


def test_each_host_has_a_private_disk(hosts):
    name = f"probe-{uuid.uuid4().hex[:8]}"
    h2, h3 = hosts.host("h2"), hosts.host("h3")
    path = os.path.join(hosts.data_dir, name)
    h2.run(["sh", "-c", f"echo written-on-h2 > {path}"])
    try:
        assert h2.run(["cat", path]).stdout.strip() == "written-on-h2"
        assert h3.run(["test", "-e", path], check=False).returncode == 1
        assert not os.path.exists(path)  # nor on the machine itself
        mounts = h2.run(["cat", "/proc/self/mountinfo"]).stdout
        assert any(f" {hosts.data_dir} " in line and "tmpfs" in line for line in mounts.splitlines())
    finally:
        h2.run(["rm", "-f", path], check=False)


def test_raylog_on_the_hosts_is_the_wheel_in_their_venv(hosts):
    import ray

    from raylog.actors.placement import NODE_LABEL

    client = hosts.client(cluster=f"wheel-{uuid.uuid4().hex[:8]}")
    client.create_topic("w", partitions=1)
    actor = client.partition_actor("w", 0)
    host = hosts.host_of(ray.get(actor.stats.remote(), timeout=60)["host"])
    venv = os.path.realpath(hosts.venv) + "/"

    def where(_actor=None):
        import raylog
        import raylog.storage.log

        return raylog.__file__, raylog.storage.log.__file__

    # inside the partition actor itself
    found = ray.get(actor.__ray_call__.remote(where), timeout=60)
    assert all(f.startswith(venv) and "/site-packages/raylog/" in f for f in found), found
    # and any task on its host
    found = ray.get(ray.remote(where).options(label_selector={NODE_LABEL: host.label}).remote(), timeout=120)
    assert all(f.startswith(venv) for f in found), found
    client.delete_topic("w")


def test_a_replicated_topic_across_two_disk_hosts(hosts):
    client = hosts.client(cluster=f"rf2-{uuid.uuid4().hex[:8]}")
    client.create_topic("rf2", partitions=1, replication_factor=2, min_insync_replicas=2)
    producer = client.producer(acks="all")
    futures = [producer.send("rf2", f"m{i}".encode()) for i in range(200)]
    producer.flush()
    acked = [f.result(60) for f in futures]
    assert len(acked) == 200
    producer.close()
    consumer = client.consumer(["rf2"], group="g", auto_offset_reset="earliest")
    got = []
    deadline = time.monotonic() + 120
    while len(got) < 200 and time.monotonic() < deadline:
        got += consumer.poll(timeout_ms=1000)
    consumer.close()
    assert [m.value for m in got] == [f"m{i}".encode() for i in range(200)]
    assert [m.offset for m in got] == [a.offset for a in acked]
    # the two replicas are on two disk hosts, each log on that host's own disk only
    log_dirs = [h.run(["sh", "-c", f"ls -d {hosts.data_dir}/{client.settings.cluster}/rf2-* 2>/dev/null"],
                      check=False).stdout.split() for h in hosts.disk_hosts]
    assert sum(1 for d in log_dirs if d) == 2, log_dirs
    client.delete_topic("rf2")


def test_the_kit_needs_root_and_says_so(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "needs root" in kit.unavailable()
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(kit.shutil, "which", lambda tool: None if tool == "nft" else "/usr/sbin/" + tool)
    assert "nft" in kit.unavailable()


# -- nothing left behind ------------------------------------------------------------


def _leftovers(slot: int, pids) -> list[str]:
    found = []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found += [line.split()[0] for line in netns.splitlines() if line.startswith(f"{kit.PREFIX}{slot}-")]
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    found += [line.split(":")[1].strip() for line in links.splitlines()
              if line.split(":")[1].strip().startswith(f"{kit.PREFIX}{slot}")]
    found += [f"pid {p}" for p in pids if kit._alive(p)]
    found += [f"pid {p} ({kit._pids_with(f'/tmp/{kit.PREFIX}{slot}/')})" for p in kit._pids_with(f"/tmp/{kit.PREFIX}{slot}/")]
    if os.path.exists(f"/tmp/{kit.PREFIX}{slot}"):
        found.append(f"/tmp/{kit.PREFIX}{slot}")
    return found


def _every_pid(cluster) -> list[int]:
    pids = [p for h in cluster.hosts for p in h.pids()]
    return pids + kit._pids_with(cluster.tmp + "/")


_CRASHING_RUN = """
import json, sys, time
from raylog.testing.hosts import HostsCluster
cluster = HostsCluster(hosts=2).start()
pids = [p for h in cluster.hosts for p in h.pids()]
print(json.dumps({"slot": cluster.slot, "pids": pids}), flush=True)
time.sleep(3600)
"""


@pytest.mark.skipif(kit.unavailable() is not None, reason=str(kit.unavailable()))
def test_stop_and_a_killed_run_leave_nothing_behind(tmp_path):
    # a clean stop
    cluster = kit.HostsCluster(hosts=2)
    with cluster:
        slot = cluster.slot
        pids = _every_pid(cluster)
        assert len(pids) > 5 and _leftovers(slot, []) != []
    assert _leftovers(slot, pids) == []
    # a run killed with SIGKILL (no clean-up at all): the next one's sweep removes it
    errors = open(tmp_path / "crashing-run.err", "w+")
    proc = subprocess.Popen([sys.executable, "-c", _CRASHING_RUN], stdout=subprocess.PIPE, stderr=errors,
                            text=True, start_new_session=True)
    try:
        line = proc.stdout.readline()
        if not line:
            errors.seek(0)
            raise AssertionError("the crashing run did not start its cluster: " + errors.read()[-4000:])
        info = json.loads(line)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        assert _leftovers(info["slot"], info["pids"]) != []  # left behind
        removed = kit.sweep()
        assert any(f"{kit.PREFIX}{info['slot']}-" in r for r in removed), removed
        deadline = time.monotonic() + 30
        while _leftovers(info["slot"], info["pids"]) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _leftovers(info["slot"], info["pids"]) == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        errors.close()
