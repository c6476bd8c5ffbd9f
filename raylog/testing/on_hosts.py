"""What the tests on the hosts kit (:mod:`raylog.testing.hosts`) share:
bounded waits, a host's fault undone so that the next test finds every host
whole, a partition's replication state, a topic read back, and a log read
on the disk of the host that holds it.

The functions keep no state; every wait has an explicit bound (the machine
is shared: generous).
"""

from __future__ import annotations

import time

#: the bound of every wait, unless told
WAIT_S = 180.0


def wait(check, what: str, timeout_s: float = WAIT_S):
    """``check()``'s first true answer, asked every 0.2 s; an
    ``AssertionError`` naming ``what`` if none came within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.2)


def node_alive(host) -> bool:
    """Whether Ray counts ``host``'s node among the alive ones."""
    import ray  # heavy: imported when used

    return any(n["Alive"] and n["NodeManagerAddress"] == host.address for n in ray.nodes())


def heal(hosts, host) -> None:
    """Heal every network fault; when Ray gave ``host``'s node up meanwhile
    (a long cut), start it again, so that the next test finds every host."""
    from raylog.testing import faults

    faults.heal(hosts)
    if not node_alive(host):  # the cluster marked it dead during the cut; its raylet ends itself once back
        hosts.restart_ray(host)


def bring_back(hosts, host) -> None:
    """``host``, whose processes were killed (:func:`raylog.testing.faults.kill_host`),
    runs its Ray node again on the same disk, and Ray counts it alive."""
    hosts.restart_ray(host)
    wait(lambda: node_alive(host), f"{host.name}'s Ray node is alive again")


def partition_state(client, topic: str, partition: int = 0):
    """The partition's replication state as ZooKeeper holds it (leader, epoch, replicas, ISR)."""
    from raylog.replication.state import read_state

    return read_state(client._zk, client.registry.paths, topic, partition)[0]


def read_values(client, topic: str, count: int, timeout_s: float = WAIT_S) -> list[bytes]:
    """The values of ``topic`` from its start: polled until ``count`` came
    (or ``timeout_s``), then once more, so that a surplus shows."""
    consumer = client.consumer([topic], auto_offset_reset="earliest")
    try:
        values: list[bytes] = []
        deadline = time.monotonic() + timeout_s
        while len(values) < count and time.monotonic() < deadline:
            values += [m.value for m in consumer.poll(timeout_ms=500)]
        values += [m.value for m in consumer.poll(timeout_ms=1000)]
        return values
    finally:
        consumer.close()


def log_digest(host, log_dir: str) -> tuple[int, str] | None:
    """``(size, sha256)`` of the segments of the log at ``log_dir`` on
    ``host``'s own disk, in offset order (as :func:`raylog.testing.clusters.log_bytes`
    joins them); ``None`` where that host has no segment there."""
    script = 'set -- "$1"/*.log; [ -e "$1" ] || exit 3; cat "$@" | wc -c; cat "$@" | sha256sum'
    proc = host.run(["sh", "-c", script, "sh", log_dir], check=False)
    if proc.returncode == 3:
        return None
    size, digest = proc.stdout.split()[:2]
    return int(size), digest


def segment_bases(host, log_dir: str) -> list[int]:
    """The base offsets of the segments of the log at ``log_dir`` on ``host``'s disk."""
    names = host.run(["sh", "-c", 'ls "$1"', "sh", log_dir], check=False).stdout.split()
    return sorted(int(n[:-4]) for n in names if n.endswith(".log"))
