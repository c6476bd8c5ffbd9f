"""ZooKeeper sessions: a kazoo client that connects or fails clearly.

(How kazoo's errors become raylog's is :mod:`raylog.zk.errors`.)
"""

from __future__ import annotations

from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError

from raylog.errors import ZooKeeperUnavailableError


def connect_kazoo(hosts: str, timeout_s: float = 10.0, **kw):
    """Start a :class:`kazoo.client.KazooClient` on ``hosts`` and return it,
    connected. ``kw`` goes to ``KazooClient`` (e.g. ``timeout``, the session
    timeout in seconds).

    Raises :class:`raylog.ZooKeeperUnavailableError` if no connection is
    made within ``timeout_s``; the client is stopped and closed then.
    """
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
    return client
