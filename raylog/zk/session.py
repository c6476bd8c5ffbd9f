"""ZooKeeper sessions: a kazoo client that connects or fails clearly.

(How kazoo's errors become raylog's is :mod:`raylog.zk.errors`.)
"""

from __future__ import annotations

from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry

from raylog.errors import ZooKeeperUnavailableError
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


def connect_kazoo(hosts: str, timeout_s: float = 10.0, *, token: bytes | None = None,
                  cluster: str | None = None, **kw):
    """Start a :class:`kazoo.client.KazooClient` on ``hosts`` and return it,
    connected. ``kw`` goes to ``KazooClient`` (e.g. ``timeout``, the session
    timeout in seconds); unless it says otherwise, the client reconnects
    by :func:`connection_retry` and retries commands by :func:`command_retry`.
    With ``cluster`` and its ``token`` the session authenticates as a holder
    of the token and creates nodes with the cluster's ACL
    (:func:`raylog.zk.acl.secure_session`); without a token it can read, and
    ZooKeeper refuses its writes to the cluster's nodes.

    Raises :class:`raylog.ZooKeeperUnavailableError` if no connection is
    made within ``timeout_s``; the client is stopped and closed then.
    """
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
