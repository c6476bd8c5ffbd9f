"""ZooKeeper sessions: a kazoo client that connects or fails clearly.

(How kazoo's errors become raylog's is :mod:`raylog.zk.errors`.)
"""

from __future__ import annotations

import logging
import socket
import threading
import time

from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry

from raylog.errors import ConfigError, ZooKeeperUnavailableError
from raylog.zk.acl import secure_session
from raylog.zk.errors import zookeeper_errors

#: the longest pause between two connection attempts while ZooKeeper is away
#: (kazoo's own default grows to an hour: a client came back long after the
#: server did once an outage had lasted a while)
CONNECTION_RETRY_MAX_DELAY_S = 2.0
#: a command retried by ``client.retry``: tries and the time it may take in all
COMMAND_RETRY_TRIES = 10
COMMAND_RETRY_DEADLINE_S = 30.0


def connection_retry() -> KazooRetry:
    """How a client reconnects: for as long as it runs (``stop`` ends it),
    from 0.1 s, doubling, at most :data:`CONNECTION_RETRY_MAX_DELAY_S` apart."""
    return KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_jitter=0.4, max_delay=CONNECTION_RETRY_MAX_DELAY_S)


def command_retry() -> KazooRetry:
    """How ``client.retry`` retries a command on a lost connection: at most
    :data:`COMMAND_RETRY_TRIES` tries within :data:`COMMAND_RETRY_DEADLINE_S`."""
    return KazooRetry(max_tries=COMMAND_RETRY_TRIES, delay=0.1, backoff=2, max_jitter=0.4,
                      max_delay=CONNECTION_RETRY_MAX_DELAY_S, deadline=COMMAND_RETRY_DEADLINE_S)


#: kazoo's warnings about a connection it is about to retry (and a session
#: it renews after an expiry): expected while ZooKeeper is away, and
#: repeated by every session of every actor at each retry. raylog reports an outage once, from the client that the user holds
#: (:class:`raylog.Client`).
EXPECTED_CONNECTION_WARNINGS = (
    "Connection dropped", "Connection time-out", "Transition to CONNECTING", "Session has expired",
)


class _DropExpectedConnectionWarnings(logging.Filter):
    """Drops kazoo's retry warnings (:data:`EXPECTED_CONNECTION_WARNINGS`)
    unless raylog logs below WARNING (``RAYLOG_LOG_LEVEL=INFO``, ``verbose``);
    every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        if logging.getLogger("raylog").getEffectiveLevel() < logging.WARNING:
            return True
        return not str(record.msg).startswith(EXPECTED_CONNECTION_WARNINGS)


#: the logger of every kazoo client raylog makes (a child of ``kazoo``, so
#: that the levels set on kazoo's loggers still apply)
SESSION_LOGGER = logging.getLogger("kazoo.client.raylog")
SESSION_LOGGER.addFilter(_DropExpectedConnectionWarnings())


def check_hosts(hosts) -> str:
    """Return ``hosts`` if it is a ZooKeeper connect string
    (``host:port[,host:port...][/chroot]``, ports in 1..65535, the port
    2181 when left out), else raise :class:`ConfigError` naming the part
    that is wrong."""
    if not isinstance(hosts, str) or not hosts.strip():
        raise ConfigError(f"zookeeper must be 'host:port', got {hosts!r}")
    servers = hosts.split("/", 1)[0]
    for server in servers.split(","):
        server = server.strip()
        host, sep, port = server.rpartition(":")
        if not sep:
            host, port = server, "2181"
        if not host.strip("[]"):
            raise ConfigError(f"zookeeper address {hosts!r}: {server!r} has no host; use 'host:port'")
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ConfigError(
                f"zookeeper address {hosts!r}: port {port!r} of {server!r} is not a port number (1..65535)"
            )
    return hosts


#: how long a probe of a ZooKeeper address waits for its TCP connection
#: before the address counts as slow (then kazoo's own deadline applies)
REFUSED_PROBE_S = 1.0


def _servers(hosts: str) -> list[tuple[str, int]]:
    """The ``(host, port)`` pairs of a checked connect string."""
    found = []
    for server in hosts.split("/", 1)[0].split(","):
        server = server.strip()
        host, sep, port = server.rpartition(":")
        if not sep:
            host, port = server, "2181"
        found.append((host.strip("[]"), int(port)))
    return found


def _all_refuse(hosts: str, probe_s: float = REFUSED_PROBE_S) -> bool:
    """Whether every server of ``hosts`` refuses a TCP connection outright
    (nothing listens on the port: the kernel answers with a reset at once).
    A server that accepts, stays silent past ``probe_s`` or cannot be
    resolved is not counted as refusing."""
    for host, port in _servers(hosts):
        try:
            with socket.create_connection((host, port), timeout=probe_s):
                return False
        except ConnectionRefusedError:
            continue
        except OSError:
            return False
    return True


def connect_kazoo(hosts: str, timeout_s: float = 10.0, *, token: bytes | None = None,
                  cluster: str | None = None, refused_fails_fast: bool = False, **kw):
    """Start a :class:`kazoo.client.KazooClient` on ``hosts`` and return it,
    connected. ``kw`` goes to ``KazooClient`` (e.g. ``timeout``, the session
    timeout in seconds); unless it says otherwise, the client reconnects
    by :func:`connection_retry` and retries commands by :func:`command_retry`.
    With ``cluster`` and its ``token`` the session authenticates as a holder
    of the token and creates nodes with the cluster's ACL
    (:func:`raylog.zk.acl.secure_session`); without a token it can read, and
    ZooKeeper refuses its writes to the cluster's nodes.

    Raises :class:`raylog.ConfigError` for a malformed ``hosts`` (before
    any connection), :class:`raylog.ZooKeeperUnavailableError` if no
    connection is made within ``timeout_s``; the client is stopped and
    closed then. kazoo's retry warnings are left out of the log (see
    :data:`EXPECTED_CONNECTION_WARNINGS`).

    ``refused_fails_fast`` (a user's first connection: ``raylog.connect``, a
    :class:`raylog.Client`): when every server refuses the connection at
    once, nothing listens there, and :class:`ZooKeeperUnavailableError` is
    raised at once instead of after ``timeout_s`` (a server that is slow or
    silent still gets ``timeout_s``). Off for the cluster's own processes,
    which wait out a ZooKeeper that is being restarted.
    """
    check_hosts(hosts)
    if refused_fails_fast and _all_refuse(hosts):
        raise ZooKeeperUnavailableError(
            f"could not connect to ZooKeeper at {hosts}: the connection was refused, nothing listens on "
            f"that port; check that it runs and listens there, or use raylog.connect() without "
            f"zookeeper= to start an embedded one",
            hosts=hosts,
        )
    kw.setdefault("logger", SESSION_LOGGER)
    kw.setdefault("connection_retry", connection_retry())
    kw.setdefault("command_retry", command_retry())
    client = KazooClient(hosts=hosts, **kw)
    try:
        client.start(timeout=timeout_s)
    except KazooTimeoutError:
        client.stop()
        client.close()
        raise ZooKeeperUnavailableError(
            f"could not connect to ZooKeeper at {hosts} within {timeout_s:g}s; "
            f"check that it runs and listens there (e.g. 'echo ruok | nc "
            f"{hosts.split(',')[0].split('/')[0].replace(':', ' ')}'), or use "
            f"raylog.connect() without zookeeper= to start an embedded one",
            hosts=hosts,
        ) from None
    except Exception:
        client.stop()
        client.close()
        raise
    if cluster is not None and token is not None:
        try:
            with zookeeper_errors(client, f"authenticate to ZooKeeper for cluster {cluster!r}"):
                secure_session(client, token, cluster, timeout_s=timeout_s)
        except BaseException:
            client.stop()
            client.close()
            raise
    return client


class OutageReporter:
    """A kazoo state listener that logs one warning when the session's
    connection to ZooKeeper is lost and one when it is back (with how long
    it was away), however many retries happen in between; a session that
    expired meanwhile is said in the second line. Add it with
    ``client.add_listener(reporter)``; ``close()`` silences it (a stopping
    client's own disconnect is no outage).

    Thread-safety: called on kazoo's event thread; its state is kept under
    a lock."""

    def __init__(self, hosts: str, logger: logging.Logger):
        self.hosts, self.log = hosts, logger
        self._lock = threading.Lock()
        self._since: float | None = None  # when the outage began (monotonic)
        self._expired = False
        self._closed = False

    def __call__(self, state) -> None:
        from kazoo.protocol.states import KazooState  # here: a listener is called with its values

        with self._lock:
            if self._closed:
                return
            if state == KazooState.LOST and self._since is None:
                # The session expired while the connection stood (told on
                # reconnecting, say): kazoo starts a new one; no outage.
                self.log.debug("the ZooKeeper session at %s expired; a new one starts", self.hosts)
            elif state in (KazooState.SUSPENDED, KazooState.LOST):
                self._expired = self._expired or state == KazooState.LOST
                if self._since is None:
                    self._since = time.monotonic()
                    self.log.warning(
                        "ZooKeeper at %s is unreachable; raylog keeps reconnecting, and calls that need "
                        "ZooKeeper raise ZooKeeperUnavailableError until it is back", self.hosts)
            elif state == KazooState.CONNECTED and self._since is not None:
                away = time.monotonic() - self._since
                expired = "; the session had expired and was renewed" if self._expired else ""
                self._since, self._expired = None, False
                self.log.warning("ZooKeeper at %s is reachable again after %.0f s%s", self.hosts, away, expired)

    def close(self) -> None:
        with self._lock:
            self._closed = True
