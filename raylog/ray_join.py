"""Joining a Ray cluster at an explicit address: presenting Ray's token,
and a reachability probe with a deadline (Ray's own join retries for
minutes against an address where nothing listens).

Used by :func:`raylog.connect` (``ray_address=...``). Ray is imported inside
the functions (heavy, lazy on purpose). Stateless; safe from any thread.
"""

from __future__ import annotations

import os
import socket

from raylog.errors import ConfigError, RayUnavailableError
from raylog.retry import RetryPolicy

#: how long ``connect(ray_address=...)`` waits for the Ray head's GCS port
#: to accept a TCP connection before it gives up (Ray itself would retry
#: for minutes)
RAY_CONNECT_TIMEOUT_S = 5.0


def present_ray_token() -> None:
    """Make this driver present Ray's token to a cluster at an explicit
    address, as ``ray start`` turned token auth on for it, when a token is
    at hand and ``RAY_AUTH_MODE`` does not say otherwise.

    Setting the variable is not enough once ``ray`` is imported: Ray reads
    its config (the auth mode among it) at import, so it is read again here,
    and the token loader's cache is dropped."""
    if "RAY_AUTH_MODE" in os.environ:
        return  # the user's choice
    if not (
        os.environ.get("RAY_AUTH_TOKEN")
        or os.environ.get("RAY_AUTH_TOKEN_PATH")
        or os.path.exists(os.path.expanduser("~/.ray/auth_token"))
    ):
        return
    os.environ["RAY_AUTH_MODE"] = "token"
    from ray._raylet import AuthenticationTokenLoader, Config  # heavy (Ray): imported when used

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def ray_head(ray_address: str) -> tuple[str, int] | None:
    """``(host, port)`` of the GCS that ``ray.init(address=ray_address)``
    would join (``"auto"`` read from ``RAY_ADDRESS`` or this node's last
    ``ray start``), or None when there is no address to probe (``"auto"``
    with nothing found: Ray then fails at once by itself)."""
    from ray._private.services import canonicalize_bootstrap_address  # heavy (Ray): imported when used

    address = ray_address.strip()
    if address.startswith("ray://"):  # Ray Client: probe its server port
        address = address[len("ray://") :]
        host, sep, port = address.rpartition(":")
        if not sep or not port.isdigit():
            raise ConfigError(f"ray_address {ray_address!r} is not ray://HOST:PORT")
        return host, int(port)
    try:
        canonical = canonicalize_bootstrap_address(address)
    except ValueError:
        raise ConfigError(
            f"ray_address {ray_address!r} is not HOST:PORT, 'auto' or 'local'"
        ) from None
    if canonical is None:
        return None
    host, _, port = canonical.rpartition(":")
    return host.strip("[]"), int(port)


def check_ray_reachable(ray_address: str, timeout_s: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """Raise :class:`RayUnavailableError` unless the Ray head named by
    ``ray_address`` accepts a TCP connection within ``timeout_s`` (Ray's own
    join retries for minutes against an address where nothing listens)."""
    head = ray_head(ray_address)
    if head is None:
        return
    host, port = head

    def probe() -> None:
        with socket.create_connection((host, port), timeout=min(2.0, timeout_s)):
            pass

    policy = RetryPolicy(max_tries=20, delay_s=0.2, max_delay_s=1.0, deadline_s=timeout_s)
    try:
        policy.call(probe, retry_on=(OSError,))
    except OSError as err:
        raise RayUnavailableError(
            f"could not reach the Ray cluster at {ray_address!r} ({host}:{port}: "
            f"{err.strerror or type(err).__name__}) within {timeout_s:g}s; check that its head "
            f"runs ('ray status --address {host}:{port}') and that the address is the GCS "
            f"address 'ray start --head' printed",
            address=ray_address,
        ) from None
