"""kazoo's failures as raylog errors, in one place.

:func:`zookeeper_errors` wraps ZooKeeper calls: a lost connection or a
timeout becomes :class:`raylog.ZooKeeperUnavailableError`, an expired session
:class:`raylog.SessionExpiredError`, a stopped client
:class:`raylog.ClosedError`. Node-level errors (``NoNodeError``,
``NodeExistsError`` ...) pass through: they carry meaning the caller handles.
:func:`ensure_connected` fails fast instead of letting kazoo queue a request
while it reconnects.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionDropped,
    ConnectionLoss,
    NoAuthError,
    OperationTimeoutError,
    ZookeeperStoppedError,
)
from kazoo.exceptions import SessionExpiredError as KazooSessionExpiredError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KazooState

from raylog.errors import AuthenticationError, ClosedError, ClusterPathTakenError, SessionExpiredError, ZooKeeperUnavailableError


def zk_hosts(zk) -> str:
    try:
        return ",".join(f"{host}:{port}" for host, port in zk.hosts) + (zk.chroot or "")
    except (TypeError, ValueError, AttributeError):
        return "?"


@contextlib.contextmanager
def zookeeper_errors(zk, action: str) -> Iterator[None]:
    """Translate kazoo's connection failures raised inside the block.

    * the session expired → :class:`SessionExpiredError`
    * the connection is lost, a request timed out → :class:`ZooKeeperUnavailableError`
    * the client was stopped or closed → :class:`ClosedError`
    * ZooKeeper refused the call by the node's ACL (a session without the
      cluster's token writing, :mod:`raylog.zk.acl`) → :class:`AuthenticationError`

    Node-level errors (``NoNodeError``, ``NodeExistsError`` ...) pass through
    unchanged: they carry meaning the caller handles.
    """
    where = zk_hosts(zk)
    try:
        yield
    except (ConnectionClosedError, ZookeeperStoppedError) as err:
        raise ClosedError(
            f"cannot {action}: the ZooKeeper client for {where} was stopped; "
            f"start it again (zk.start()) or build a new client and Registry",
            hosts=where,
        ) from err
    except NoAuthError as err:
        taken = getattr(zk, "_raylog_taken", None)
        if taken is not None:  # a squatted cluster root (raylog.zk.acl.secure_session)
            raise ClusterPathTakenError(f"cannot {action}: {taken}", hosts=where) from err
        raise AuthenticationError(
            f"cannot {action}: ZooKeeper at {where} refused it, as raylog's nodes may be changed only "
            f"with the cluster's token; pass it (raylog.connect(token=...), raylog --token) or run "
            f"inside the cluster's Ray cluster",
            hosts=where,
        ) from err
    except KazooSessionExpiredError as err:
        raise SessionExpiredError(
            f"cannot {action}: the ZooKeeper session expired (ephemeral nodes of the "
            f"session, such as partition endpoints, are gone); the client opens a new "
            f"session by itself, so retry the call and register ephemeral nodes again",
            hosts=where,
        ) from err
    except (ConnectionLoss, ConnectionDropped, OperationTimeoutError, KazooTimeoutError) as err:
        raise ZooKeeperUnavailableError(
            f"cannot {action}: ZooKeeper at {where} did not answer ({type(err).__name__}); "
            f"check that it runs and is reachable; the call succeeds again once it is back",
            hosts=where,
        ) from err


def ensure_connected(zk, what: str) -> None:
    """Raise :class:`ZooKeeperUnavailableError` unless ``zk`` is connected now.

    kazoo queues requests made while it reconnects; callers that must not
    block (a commit, an admin call) check first and fail with a clear error.
    """
    if zk.state != KazooState.CONNECTED:
        raise ZooKeeperUnavailableError(
            f"cannot {what}: the ZooKeeper connection is {zk.state.lower()}; "
            f"the call succeeds again once ZooKeeper is reachable (check that it runs)",
            zk_state=str(zk.state),
        )
