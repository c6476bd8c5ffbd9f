"""Fault injection for ZooKeeper clients, for tests of every suite.

::

    from raylog.groups.faults import drop_connection, expire_session

    drop_connection(zk)   # the socket breaks; the client reconnects, same session
    expire_session(zk)    # the session expires: LOST, ephemeral nodes gone,
                          # then the client connects again with a new session

Both act on a real server the way kazoo's own test harness does; nothing is
mocked. To take the whole server away, stop or restart the
:class:`~raylog.groups.zookeeper.EmbeddedZooKeeper` itself.
"""

from __future__ import annotations

import socket
import threading

from kazoo.client import KazooClient
from kazoo.protocol.states import KazooState


class FaultInjectionError(AssertionError):
    """The fault did not happen (or the client did not recover) in time."""


def _hosts(client: KazooClient) -> str:
    return ",".join(f"{host}:{port}" for host, port in client.hosts) + (client.chroot or "")


class _StateRecorder:
    """Records the states a client passes through, from now on."""

    def __init__(self, client: KazooClient, first: str, then: str):
        self.first_seen = threading.Event()
        self.then_seen = threading.Event()
        self._first, self._then = first, then
        self._client = client
        client.add_listener(self)

    def __call__(self, state):
        if state == self._first:
            self.first_seen.set()
        elif state == self._then and self.first_seen.is_set():
            self.then_seen.set()

    def remove(self):
        self._client.remove_listener(self)


def expire_session(client: KazooClient, timeout_s: float = 30.0, *, wait_reconnect: bool = True) -> None:
    """Force the server to expire ``client``'s session.

    A second client attaches to the same session (id and password) and
    closes it; the server then tells ``client`` its session expired, which
    kazoo reports as ``KazooState.LOST``. Ephemeral nodes of the session are
    gone at that point. With ``wait_reconnect`` (the default), waits until
    ``client`` has connected again with a new session.

    Raises :class:`FaultInjectionError` if LOST (or the reconnect) is not seen
    within ``timeout_s``.
    """
    if not client.connected:
        raise FaultInjectionError("expire_session needs a connected client")
    old_session = client.client_id[0]
    recorder = _StateRecorder(client, KazooState.LOST, KazooState.CONNECTED)
    try:
        attempts = 0
        per_attempt = max(1.0, timeout_s / 5)
        while not recorder.first_seen.is_set() and attempts < 5:
            attempts += 1
            intruder = KazooClient(hosts=_hosts(client), client_id=client.client_id, timeout=client._session_timeout / 1000.0)
            try:
                intruder.start(timeout=per_attempt)
                intruder.stop()
            except Exception:  # noqa: BLE001 - the next attempt may do it
                pass
            finally:
                intruder.close()
            recorder.first_seen.wait(per_attempt)
        if not recorder.first_seen.is_set():
            raise FaultInjectionError(
                f"session 0x{old_session:x} did not expire after {attempts} attempts"
            )
        if wait_reconnect:
            if not recorder.then_seen.wait(timeout_s):
                raise FaultInjectionError(
                    f"the client did not reconnect within {timeout_s:g}s after its session expired"
                )
            if client.client_id[0] == old_session:
                raise FaultInjectionError("the client reconnected with its old session")
    finally:
        recorder.remove()


def drop_connection(client: KazooClient, timeout_s: float = 30.0, *, wait_reconnect: bool = True) -> None:
    """Break ``client``'s TCP connection; the session survives.

    The socket is shut down under the client, which sees the connection drop
    (``KazooState.SUSPENDED``) and reconnects within the same session. With
    ``wait_reconnect`` (the default), waits until it is ``CONNECTED`` again.

    Raises :class:`FaultInjectionError` if that does not happen within ``timeout_s``.
    """
    if not client.connected:
        raise FaultInjectionError("drop_connection needs a connected client")
    session = client.client_id[0]
    recorder = _StateRecorder(client, KazooState.SUSPENDED, KazooState.CONNECTED)
    try:
        sock = client._connection._socket
        if sock is None:
            raise FaultInjectionError("the client has no open socket")
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already broken: the client notices all the same
        if not recorder.first_seen.wait(timeout_s):
            raise FaultInjectionError(f"the client did not notice the dropped connection within {timeout_s:g}s")
        if wait_reconnect:
            if not recorder.then_seen.wait(timeout_s):
                raise FaultInjectionError(f"the client did not reconnect within {timeout_s:g}s")
            if client.client_id[0] != session:
                raise FaultInjectionError("the client lost its session instead of resuming it")
    finally:
        recorder.remove()
