"""A follower removes a leader's lingering ZooKeeper nodes only when the
leader's data port refuses connections (its process is gone): never while
something listens there, never when the connect merely gets no answer (a
host cut off may still run the leader), never a node a newer registration
made. Real ZooKeeper, real sockets on 127.0.0.1."""

from __future__ import annotations

import json
import socket

import pytest

from raylog.replication.liveness import clear_dead_leader, refuses_connections
from raylog.replication.state import create_state, register_replica, replica_path
from raylog.zk.paths import Paths


@pytest.fixture
def partition(zk, make_zk, cluster_name):
    """``(paths, leader_zk, register)``: a replicated partition ``t``/0 and a
    second session, the leader's, whose ``register(port)`` makes its
    replica node and the endpoint (ephemeral, as the leader's actor does)."""
    paths = Paths(cluster_name)
    zk.create(paths.partition("t", 0), b"{}", makepath=True)
    create_state(zk, paths, "t", 0, ["disk-a", "disk-b"])
    leader_zk = make_zk()

    def register(port: int) -> None:
        endpoint = {"host": "127.0.0.1", "port": port, "actor": "a"}
        register_replica(leader_zk, paths, "t", 0, "disk-a", endpoint)
        leader_zk.create(paths.endpoint("t", 0), json.dumps(dict(endpoint, epoch=1)).encode(), ephemeral=True)

    return paths, leader_zk, register


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_a_refused_port_clears_the_dead_leaders_nodes(zk, partition):
    paths, _, register = partition
    register(_closed_port())
    assert clear_dead_leader(zk, paths, "t", 0, "disk-a")
    assert zk.exists(replica_path(paths, "t", 0, "disk-a")) is None
    assert zk.exists(paths.endpoint("t", 0)) is None
    assert zk.exists(paths.partition("t", 0)) is not None  # the persistent nodes stay
    assert clear_dead_leader(zk, paths, "t", 0, "disk-a")  # already gone: nothing to do


def test_a_listening_port_keeps_the_leaders_nodes(zk, partition):
    paths, _, register = partition
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        register(listener.getsockname()[1])
        assert not refuses_connections("127.0.0.1", listener.getsockname()[1])
        assert not clear_dead_leader(zk, paths, "t", 0, "disk-a")
    assert zk.exists(replica_path(paths, "t", 0, "disk-a")) is not None
    assert zk.exists(paths.endpoint("t", 0)) is not None


def test_a_connect_that_gets_no_answer_keeps_the_leaders_nodes(zk, partition):
    """A full accept queue drops SYNs, as a host cut off does."""
    paths, _, register = partition
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    address = listener.getsockname()
    fillers = []
    try:
        for _ in range(4):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(address)
            fillers.append(s)
        probe = socket.socket()
        probe.settimeout(1.0)
        try:
            probe.connect(address)
            pytest.skip("this kernel answers a full accept queue: no silent listener")
        except socket.timeout:
            pass
        finally:
            probe.close()
        register(address[1])
        assert not clear_dead_leader(zk, paths, "t", 0, "disk-a")
        assert zk.exists(replica_path(paths, "t", 0, "disk-a")) is not None
    finally:
        for s in fillers:
            s.close()
        listener.close()


def test_an_endpoint_of_another_session_is_left_alone(zk, make_zk, partition):
    """The endpoint was registered by a newer actor (another session): only
    the dead session's replica node goes."""
    paths, leader_zk, _ = partition
    register_replica(leader_zk, paths, "t", 0, "disk-a", {"host": "127.0.0.1", "port": _closed_port(), "actor": "a"})
    newer = make_zk()
    newer.create(paths.endpoint("t", 0), b'{"host": "127.0.0.1", "port": 1, "epoch": 2}', ephemeral=True)
    assert clear_dead_leader(zk, paths, "t", 0, "disk-a")
    assert zk.exists(replica_path(paths, "t", 0, "disk-a")) is None
    assert zk.exists(paths.endpoint("t", 0)) is not None
