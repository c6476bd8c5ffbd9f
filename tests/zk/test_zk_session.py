"""connect_kazoo's clients against a real ZooKeeper that goes away and comes back."""

from __future__ import annotations

import time

from kazoo.protocol.states import KazooState

from raylog.zk.session import CONNECTION_RETRY_MAX_DELAY_S, connect_kazoo

#: the client's session timeout (ZooKeeper's smallest with its default tick)
SESSION_TIMEOUT_S = 4.0
#: how long ZooKeeper stays down: ten session timeouts (kazoo's own back-off
#: would have grown to pauses of tens of seconds by then)
OUTAGE_S = 10 * SESSION_TIMEOUT_S
#: a generous bound on the reconnection once the server is back: a few
#: pauses of the bounded back-off
RECONNECT_WAIT_S = 4 * CONNECTION_RETRY_MAX_DELAY_S


def wait_for(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_a_client_reconnects_soon_after_an_outage_longer_than_its_session(private_zookeeper):
    client = connect_kazoo(private_zookeeper.connect_string, timeout=SESSION_TIMEOUT_S)
    try:
        client.create("/before", b"x")
        private_zookeeper.kill_process()  # same port and data dir for the restart
        assert wait_for(lambda: client.state != KazooState.CONNECTED, 30.0)
        time.sleep(OUTAGE_S)  # the outage (not a measurement)
        private_zookeeper.start()
        assert wait_for(lambda: client.state == KazooState.CONNECTED, RECONNECT_WAIT_S), (
            f"no connection {RECONNECT_WAIT_S:g} s after ZooKeeper was back (state {client.state})")
        assert client.exists("/before") is not None
    finally:
        client.stop()
        client.close()
