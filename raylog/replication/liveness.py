"""How a follower learns, fast and safely, that its leader's process is gone.

ZooKeeper removes a process's ephemeral nodes (the leader's ``endpoint`` and
``replicas/<leader>``) only when its session expires, a session timeout
after the process died, unless the process closed its session itself (a
clean shutdown does). A leader killed (SIGKILL, a crash, an out-of-memory
kill) leaves both behind for that long, and while ``replicas/<leader>`` is
there no follower may take over (:func:`~raylog.replication.state.take_over`).

The fast signal is the data socket: a connect to the port the leader
registered that is **refused** means no process listens there any more (the
leader's data server listens for as long as the actor lives, on the port it
registered). Nothing else counts: a reset or closed connection can be the
leader ending one connection; a connect that times out is a host cut off
(or a loaded one), whose process may still live and serve; those wait for
the session to expire.

On a refusal :func:`clear_dead_leader` removes the dead session's two nodes
in one ZooKeeper transaction that also checks the partition node's version
(the fence every endpoint registration bumps, :mod:`raylog.zk.endpoints`),
so that it never removes what a restarted leader registered after the
refused node was read. The follower then takes over at once by the usual
compare-and-set with ``leader_epoch + 1`` and the ISR rules; if the old
leader comes back (Ray restarts it), it finds it is no longer the leader and
becomes a follower (:mod:`raylog.replication.leader`, ``on_deposed``).

Thread-safety: the functions keep no state (kazoo clients are thread-safe).
"""

from __future__ import annotations

import json
import logging
import socket

from kazoo.exceptions import NoNodeError

from raylog.replication.state import replica_path

log = logging.getLogger(__name__)

#: how long the probe waits for its connect (a refusal comes at once; anything
#: slower is not a refusal)
PROBE_TIMEOUT_S = 0.5


def refuses_connections(host: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """True when a connect to ``host:port`` is refused (nothing listens);
    False when it succeeds, times out or fails otherwise (a host cut off
    may still run the process)."""
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    return False


def clear_dead_leader(zk, paths, topic: str, partition: int, leader: str) -> bool:
    """Remove the ephemeral nodes of ``leader``'s replica actor (its
    ``replicas/<leader>`` node and the partition's endpoint, when that
    belongs to the same session) if its registered data port refuses
    connections. True when they are gone (removed now, or already), False
    when the leader may still live or the nodes changed meanwhile (a
    restarted leader registered again)."""
    fence_path = paths.partition(topic, partition)
    replica = replica_path(paths, topic, partition, leader)
    endpoint_path = paths.endpoint(topic, partition)
    try:
        _, fence = zk.get(fence_path)
        data, stat = zk.get(replica)
    except NoNodeError:
        return True
    try:
        info = json.loads(data)
        host, port = info["host"], int(info["port"])
    except (ValueError, KeyError, TypeError):
        return False
    if not refuses_connections(host, port):
        return False
    tx = zk.transaction()
    tx.check(fence_path, fence.version)
    tx.delete(replica, stat.version)
    endpoint = zk.exists(endpoint_path)
    if endpoint is not None and endpoint.ephemeralOwner == stat.ephemeralOwner:
        tx.delete(endpoint_path, endpoint.version)
    if any(isinstance(result, Exception) for result in tx.commit()):
        return False  # registered again (or removed) meanwhile: look again
    log.warning("%s-%d: leader %s refuses connections at %s:%d (its process is gone); removed the nodes its "
                "session left", topic, partition, leader, host, port)
    return True
