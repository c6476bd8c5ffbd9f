"""The cluster token: every data port of a raylog cluster requires it.

Closed by default, with no set-up step: the token is derived, never chosen
and handed around by whoever starts an actor.

* **Ray token authentication on** (Ray 2.60 turns it on when a token exists
  in ``~/.ray/auth_token``; every process of the Ray cluster has that token):
  the token is ``hex(HMAC-SHA256(Ray's auth token, "raylog:" + cluster))``.
  A process outside Ray that holds the Ray token (a CLI on a cluster node, a
  Spark executor) derives the same value: the Ray token is read the way Ray
  reads it (``RAY_AUTH_TOKEN``, the file ``RAY_AUTH_TOKEN_PATH``, else
  ``~/.ray/auth_token``) unless ``RAY_AUTH_MODE=disabled``. Why: a Ray
  cluster with token authentication already trusts exactly the holders of
  that token (they can run any code on it), so they and only they can serve
  or read raylog data; one HMAC per cluster name keeps clusters that share a
  Ray cluster apart.
* **Ray token authentication off**: a random 256-bit secret, made when the
  cluster is first used (atomic create-if-absent) and kept in the Ray
  cluster's own key-value store (the GCS, namespace ``raylog``, key
  ``token/<cluster>``). Why: only processes that joined the Ray cluster
  (drivers, workers, actors) can read it, which is again the set of
  processes that can already run code on the cluster.

At rest: Ray's token file is its owner's only; raylog makes it so where it
first reads it (group and other bits taken off, with a warning once).
raylog itself writes no token to disk (a token passed on the command line
is read from a file the user keeps: ``--source-token-file``).

A process that cannot derive the token (outside Ray, without the Ray token)
passes it explicitly: ``raylog.connect(token=...)`` (or ``raylog --token``).
The partition actor derives it itself and never takes one from its caller:
an actor started with a token that differs from the cluster's refuses to
start (:class:`AuthenticationError`), and its ``shutdown`` requires it; so
does :meth:`raylog.Client.repair` and every call that serves,
restarts or stops a partition.

Where the token goes: never into ZooKeeper, never over a socket.
ZooKeeper sessions of token holders authenticate with a password derived
from it (:mod:`raylog.zk.acl`: only they may write raylog's nodes), and a
data connection is opened by a challenge–response in which the server
proves it holds the token before the client proves it
(:mod:`raylog.transfer.handshake`).

Thread-safety: the functions may be called from any thread.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import stat
import threading

from raylog.errors import AuthenticationError

log = logging.getLogger(__name__)

KV_NAMESPACE = "raylog"
#: how the derived token starts its HMAC message
CONTEXT = b"raylog:"


_tightened: set[str] = set()
_tightened_lock = threading.Lock()


def _owner_only(path: str) -> None:
    """Make Ray's token file ``0600`` if group or others may read it (and this
    process owns it), with a warning once per path and process. The same
    rule as the data at rest (:mod:`raylog.storage.owner_only`, which this
    base module may not import)."""
    try:
        st = os.stat(path)
    except OSError:
        return
    if not st.st_mode & (stat.S_IRWXG | stat.S_IRWXO) or st.st_uid != os.geteuid():
        return
    old = stat.S_IMODE(st.st_mode)
    with _tightened_lock:
        first = path not in _tightened
        _tightened.add(path)
    try:
        os.chmod(path, old & ~(stat.S_IRWXG | stat.S_IRWXO))
    except OSError as err:
        if first:
            log.warning("Ray's token file %s is readable by others (%04o) and could not be made its owner's "
                        "only: %s", path, old, err)
        return
    if first:
        log.warning("Ray's token file %s (raylog's cluster token derives from it) was readable by others; "
                    "made it its owner's only: %04o -> %04o", path, old, old & ~(stat.S_IRWXG | stat.S_IRWXO))


def ray_token_path() -> str:
    """The file Ray reads its auth token from (``RAY_AUTH_TOKEN_PATH``, else
    ``~/.ray/auth_token``)."""
    return os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")


def _ray_token_outside_ray() -> bytes | None:
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        return None
    raw = os.environ.get("RAY_AUTH_TOKEN")
    if raw:
        return raw.strip().encode()
    path = ray_token_path()
    _owner_only(path)
    try:
        with open(path, "rb") as f:
            raw = f.read().strip()
    except OSError:
        return None
    return raw or None


def _ray_token() -> tuple[bool, bytes | None]:
    """``(inside Ray, Ray's auth token or None)``."""
    try:
        import ray  # heavy (Ray): imported when used
    except ImportError:
        return False, _ray_token_outside_ray()
    if not ray.is_initialized():
        return False, _ray_token_outside_ray()
    from ray._private.authentication.authentication_utils import is_token_auth_enabled  # heavy (Ray): imported when used

    if not is_token_auth_enabled():
        return True, None
    from ray._raylet import AuthenticationTokenLoader  # heavy (Ray): imported when used

    loader = AuthenticationTokenLoader.instance()
    if not loader.has_token():
        return True, None
    if not os.environ.get("RAY_AUTH_TOKEN"):
        _owner_only(ray_token_path())
    raw = loader.get_raw_token()
    return True, raw.encode() if isinstance(raw, str) else bytes(raw)


def ray_token() -> bytes | None:
    """Ray's auth token as this process can read it (inside Ray or outside,
    as :func:`cluster_token` does), or None."""
    return _ray_token()[1]


def derive(ray_token: bytes, cluster: str) -> bytes:
    """The cluster token from Ray's auth token."""
    return hmac.new(ray_token, CONTEXT + cluster.encode("utf-8"), hashlib.sha256).hexdigest().encode()


def _kv_secret(cluster: str) -> bytes:
    from ray.experimental import internal_kv  # heavy (Ray): imported when used

    key = f"token/{cluster}".encode()
    internal_kv._internal_kv_put(key, secrets.token_hex(32).encode(), overwrite=False, namespace=KV_NAMESPACE)
    value = internal_kv._internal_kv_get(key, namespace=KV_NAMESPACE)
    if not value:
        raise AuthenticationError(f"the token of cluster {cluster!r} could not be read from Ray's key-value store")
    return bytes(value)


def cluster_token(cluster: str) -> bytes | None:
    """The data token of ``cluster`` as this process can derive it, or
    ``None`` (outside Ray, without Ray's token: pass it explicitly)."""
    inside, ray_token = _ray_token()
    if ray_token is not None:
        return derive(ray_token, cluster)
    if inside:
        return _kv_secret(cluster)
    return None


def check(cluster: str, token: bytes | None, what: str) -> None:
    """Raise :class:`AuthenticationError` unless ``token`` is the cluster's
    (compared in constant time); ``what`` names the refused call."""
    expected = cluster_token(cluster)
    if expected is None:
        raise AuthenticationError(
            f"{what} needs the token of cluster {cluster!r}, which this process cannot derive "
            f"(it is not part of the Ray cluster and has no Ray auth token)"
        )
    if token is None or not hmac.compare_digest(bytes(token), expected):
        raise AuthenticationError(
            f"{what} refused: {'no token' if token is None else 'a wrong token'} for cluster {cluster!r}; "
            f"pass the cluster's token (raylog.connect(token=...)) or run inside its Ray cluster"
        )
