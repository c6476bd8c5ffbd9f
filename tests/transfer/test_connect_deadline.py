"""A connect has a deadline of its own, far below a request's: a SYN to a
host that is cut off is never answered, and it must not hold a send for a
whole request timeout. The producer then looks the endpoint up again in
ZooKeeper and retries within its delivery deadline.

A cut-off host is made without namespaces: a listening socket on 127.0.0.1
whose accept queue is full drops further SYNs (Linux, with
``net.ipv4.tcp_abort_on_overflow`` 0), so a connect to it hangs exactly as
one to a host whose link is down.
"""

from __future__ import annotations

import json
import socket
import threading

import pytest

from raylog.config import CONNECT_TIMEOUT_MS
from raylog.errors import BrokerUnavailableError
from raylog.transfer.connection import BrokerConnection

#: the request timeout of the clients under test: a connect that waited for it
#: would exhaust the delivery deadline
REQUEST_TIMEOUT_S = 30.0
#: the test's own bound on what must end after one short connect deadline
#: (generous: the machine is shared)
OUTER_BOUND_S = 25.0


class SilentHost:
    """A listener on 127.0.0.1 that answers no SYN: its accept queue is full."""

    def __init__(self):
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(0)
        self.address = self.listener.getsockname()
        self.fillers: list[socket.socket] = []
        for _ in range(4):  # never accepted: they fill the queue
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            s.connect_ex(self.address)
            self.fillers.append(s)

    def is_silent(self) -> bool:
        probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        probe.settimeout(1.0)
        try:
            probe.connect(self.address)
        except socket.timeout:
            return True
        except OSError:
            return False
        finally:
            probe.close()
        return False

    def close(self) -> None:
        for s in self.fillers:
            s.close()
        self.listener.close()


@pytest.fixture
def silent_host():
    host = SilentHost()
    try:
        if not host.is_silent():
            pytest.skip("this kernel answers a full accept queue (tcp_abort_on_overflow=1): no silent listener")
        yield host
    finally:
        host.close()


def _run_bounded(fn):
    """``fn()`` on a thread; its result or error, or a failure past OUTER_BOUND_S."""
    outcome = {}

    def run():
        try:
            outcome["result"] = fn()
        except BaseException as err:  # noqa: BLE001 - handed to the test
            outcome["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(OUTER_BOUND_S)
    assert not thread.is_alive(), f"still blocked after {OUTER_BOUND_S} s"
    return outcome


def test_a_connect_to_a_silent_host_fails_after_its_own_deadline_not_the_request_timeout(silent_host):
    host, port = silent_host.address
    conn = BrokerConnection(host, port, timeout_s=REQUEST_TIMEOUT_S)
    assert conn.connect_timeout_s == CONNECT_TIMEOUT_MS / 1000.0 < REQUEST_TIMEOUT_S
    outcome = _run_bounded(conn.connect)
    err = outcome.get("error")
    assert isinstance(err, BrokerUnavailableError), outcome
    assert err.retriable and err.refresh_metadata
    assert "timed out" in str(err) and "look it up again" in str(err)
    assert not conn.connected


def test_a_connect_deadline_is_never_longer_than_the_request_timeout():
    assert BrokerConnection("127.0.0.1", 1, timeout_s=0.5).connect_timeout_s == 0.5
    assert BrokerConnection("127.0.0.1", 1, timeout_s=9, connect_timeout_s=1.5).connect_timeout_s == 1.5


def test_a_producer_whose_endpoint_moved_off_a_silent_host_delivers_within_its_deadline(
    silent_host, raylog_client, make_topic
):
    """The producer's cached endpoint is a cut-off host (it looked it up
    before the cut; ZooKeeper now names the live actor): a plain producer,
    with no resend loop of its own, delivers every message."""
    topic = make_topic(partitions=1)
    registry, metadata = raylog_client.registry, raylog_client.metadata
    warmup = raylog_client.producer(acks="all", linger_ms=1)
    warmup.send(topic, b"before").result()
    warmup.close()
    zk = registry.zk  # a token holder's session: only such a one may write an endpoint
    path = registry.paths.endpoint(topic, 0)
    real, _ = zk.get(path)
    moved = dict(json.loads(real), host=silent_host.address[0], port=silent_host.address[1])
    zk.set(path, json.dumps(moved).encode())
    try:
        assert metadata.endpoint(topic, 0, refresh=True) == silent_host.address
    finally:
        zk.set(path, real)  # the endpoint moved (to the real actor) before the producer's first send

    producer = raylog_client.producer(acks="all", linger_ms=1, request_timeout_s=REQUEST_TIMEOUT_S)
    try:
        futures = [producer.send(topic, b"m%d" % i) for i in range(20)]
        outcome = _run_bounded(lambda: [f.result() for f in futures])
        assert "error" not in outcome, outcome.get("error")
        offsets = [offset for _, offset in outcome["result"]]
        assert offsets == sorted(offsets) and len(set(offsets)) == 20
    finally:
        producer.close()
    consumer = raylog_client.consumer([topic], auto_offset_reset="earliest")
    try:
        values = []
        for _ in range(60):
            values += [m.value for m in consumer.poll(timeout_ms=500)]
            if len(values) >= 21:
                break
        assert values == [b"before"] + [b"m%d" % i for i in range(20)]
    finally:
        consumer.close()
