"""What the tests on the hosts kit (:mod:`raylog.testing.hosts`) look at and
undo on one host: the files on its private disk, seen from the host itself
(no other host and not the client machine can see them), and a host made
whole again after a fault.

::

    from raylog.testing import faults
    from raylog.testing.host_checks import exists_on, heal_host, log_bytes_on

    faults.kill_host(host)            # or faults.cut_host(host)
    ...
    heal_host(cluster, host)          # links up, rules gone, its Ray node running
    assert not exists_on(host, log_dir)

The functions keep no state; each call runs one short command on the host.
"""

from __future__ import annotations

import time

from raylog.testing.clusters import wait_until

#: how long a killed host's node may take to be counted dead by Ray (its health checks)
NODE_DEATH_WAIT_S = 120.0
#: a cut at least this long may make Ray count the node dead just after the
#: heal (a health check sent during the cut fails after it: the last one Ray allows)
SILENCE_AT_RISK_S = 20.0
#: how long a healed host is watched for Ray giving its node up: longer than
#: one health check's timeout and period
HEAL_SETTLE_S = 20.0

#: reads a directory's ``*.log`` segments in name (= offset) order, printed as hex
_LOG_BYTES = (
    "import glob, os, sys\n"
    "parts = [open(p, 'rb').read() for p in sorted(glob.glob(os.path.join(sys.argv[1], '*.log')))]\n"
    "sys.stdout.write(b''.join(parts).hex())\n"
)


def exists_on(host, path: str) -> bool:
    """Whether ``path`` exists on ``host``'s disk."""
    return host.run(["test", "-e", path], check=False).returncode == 0


def log_bytes_on(host, directory: str) -> bytes:
    """The bytes of the partition log ``directory`` on ``host``'s disk, its
    segments in offset order (as :func:`raylog.testing.clusters.log_bytes`
    reads a local one); ``b""`` when it has none."""
    return bytes.fromhex(host.python(_LOG_BYTES, directory).strip())


def paths_on(host, pattern: str) -> list[str]:
    """The paths on ``host``'s disk that match the glob ``pattern``, sorted."""
    code = "import glob, sys\nprint('\\n'.join(sorted(glob.glob(sys.argv[1]))))\n"
    return host.python(code, pattern).split()


def ray_node_alive(host) -> bool:
    """Whether the Ray cluster counts ``host``'s node alive (the caller has joined Ray)."""
    import ray  # heavy (Ray): imported when used

    return any(n["Alive"] and n["NodeManagerAddress"] == host.address for n in ray.nodes())


def heal_host(cluster, host) -> None:
    """Heal every network fault of ``cluster``; when ``host``'s processes were
    killed, or Ray gave its node up meanwhile (a long cut), start its Ray
    node again, so that the next test finds every host.

    A cut that lasted :data:`SILENCE_AT_RISK_S` or more may have Ray count
    the node dead just after the heal (a health check sent during the cut
    fails after it, the last one Ray allows): then ``host`` is watched for
    :data:`HEAL_SETTLE_S` and started again if Ray gives its node up."""
    from raylog.testing import faults

    silent_since = getattr(host, "silent_since", None)
    silent_s = 0.0 if silent_since is None else time.monotonic() - silent_since
    faults.heal(cluster)
    if host.ray is not None and silent_s >= SILENCE_AT_RISK_S:
        wait_until(lambda: not ray_node_alive(host), timeout_s=HEAL_SETTLE_S)
    if host.ray is None:
        # killed (faults.kill_host forgets its node): started again once Ray
        # counts the old node dead, never two nodes of one address alive
        wait_until(lambda: not ray_node_alive(host), timeout_s=NODE_DEATH_WAIT_S)
        cluster.restart_ray(host)
    elif not ray_node_alive(host):  # the cluster marked it dead; a cut-off raylet ends itself once back
        cluster.restart_ray(host)
