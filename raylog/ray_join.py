"""Joining a Ray cluster at an explicit address: presenting Ray's token,
and a reachability probe with a deadline (Ray's own join retries for
minutes against an address where nothing listens).

Used by :func:`raylog.connect` (``ray_address=...``). Ray is imported inside
the functions (heavy, lazy on purpose). Stateless; safe from any thread.
"""

from __future__ import annotations

import os
import socket
import time

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
    except ConnectionError:  # 'auto' and no Ray found on this machine
        raise RayUnavailableError(
            f"ray_address={ray_address!r} found no running Ray cluster (no RAY_ADDRESS, no 'ray start' on "
            f"this machine); start one ('ray start --head') or pass its HOST:PORT, or leave ray_address "
            f"out to start a local Ray",
            address=ray_address,
        ) from None
    if canonical is None:
        return None
    host, _, port = canonical.rpartition(":")
    return host.strip("[]"), int(port)


#: the client connection preface of HTTP/2 (RFC 7540 section 3.5) and an
#: empty SETTINGS frame: what a gRPC client sends first
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
#: the frame type of SETTINGS, the first frame every HTTP/2 server sends
_HTTP2_SETTINGS = 4


class NotGrpcError(OSError):
    """The address accepted a TCP connection but did not answer as a gRPC
    (HTTP/2) server, as Ray's GCS and Ray Client's server do."""


def _tls() -> bool:
    return os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true")


def probe_grpc(host: str, port: int, timeout_s: float) -> None:
    """Return when ``host:port`` accepts a TCP connection and answers the
    HTTP/2 preface with a SETTINGS frame (as every gRPC server does, Ray's
    GCS among them) within ``timeout_s``; else raise an ``OSError`` (a
    :class:`NotGrpcError` when something else answers or stays silent).
    With Ray's TLS on, only the TCP connection is checked."""
    deadline_s = max(0.05, timeout_s)
    with socket.create_connection((host, port), timeout=deadline_s) as sock:
        if _tls():
            return
        sock.settimeout(deadline_s)
        try:
            sock.sendall(_HTTP2_PREFACE)
            header = b""
            while len(header) < 9:  # a frame header: length u24, type u8, flags u8, stream u32
                chunk = sock.recv(9 - len(header))
                if not chunk:
                    raise NotGrpcError(f"{host}:{port} closed the connection without a gRPC answer")
                header += chunk
        except socket.timeout:
            raise NotGrpcError(f"{host}:{port} accepted a connection but sent no gRPC answer") from None
        if header[3] != _HTTP2_SETTINGS:
            raise NotGrpcError(f"{host}:{port} answered, but not as a gRPC server")


def check_ray_reachable(ray_address: str, timeout_s: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """Raise :class:`RayUnavailableError` unless the Ray head named by
    ``ray_address`` answers as a gRPC server (Ray's GCS) within ``timeout_s``
    in all: nothing listening, a silent listener and a listener that is no
    GCS fail within that deadline (Ray's own join retries for minutes, and
    logs each try). ``'auto'`` with no Ray found is a
    :class:`RayUnavailableError` too."""
    head = ray_head(ray_address)
    if head is None:
        return
    host, port = head
    deadline = time.monotonic() + timeout_s

    def probe() -> None:
        probe_grpc(host, port, min(2.0, deadline - time.monotonic()))

    policy = RetryPolicy(max_tries=20, delay_s=0.2, max_delay_s=1.0, deadline_s=timeout_s)
    try:
        policy.call(probe, retry_on=(OSError,))
    except OSError as err:
        cause = str(err) if isinstance(err, NotGrpcError) else (err.strerror or type(err).__name__)
        raise RayUnavailableError(
            f"could not reach the Ray cluster at {ray_address!r} ({host}:{port}: "
            f"{cause}) within {timeout_s:g}s; check that its head "
            f"runs ('ray status --address {host}:{port}') and that the address is the GCS "
            f"address 'ray start --head' printed",
            address=ray_address,
        ) from None
