"""Ray's token for the test clusters, made once before any of them starts.

Ray 2.60 turns token authentication on for a new local ``ray.init()`` and
writes a new token to ``~/.ray/auth_token`` when there is none; ``ray start``
(the hosts kit's nodes, the local cluster) turns it on only when a token is
already at hand. On a fresh machine the first ``ray.init()`` of a test run
therefore made the token halfway through: clusters started before it ran
without token authentication, processes started after it presented the new
token, and raylog's cluster token (derived from Ray's) was no longer the one
those clusters were made with. :func:`ensure_ray_token` makes the token the
way ``ray.init()`` would, before anything starts, so every cluster of a run
sees the same one.
"""

from __future__ import annotations

import os
import secrets
import tempfile

#: where Ray keeps its token when neither RAY_AUTH_TOKEN nor RAY_AUTH_TOKEN_PATH says otherwise
DEFAULT_PATH = os.path.join("~", ".ray", "auth_token")


def ensure_ray_token() -> str | None:
    """Make ``~/.ray/auth_token`` when token mode is not decided otherwise
    (``RAY_AUTH_MODE``, ``RAY_AUTH_TOKEN`` or ``RAY_AUTH_TOKEN_PATH`` set) and
    the file is missing. Safe when several processes call it at once: the
    first file made is the one every caller keeps. Returns the path made or
    found, or None when the environment decides."""
    if any(os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")):
        return None
    path = os.path.expanduser(DEFAULT_PATH)
    if os.path.exists(path):
        return path
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".auth_token-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))  # 64 hex digits, as Ray's own tokens
        try:
            os.link(tmp, path)  # fails when another process made it first: theirs is kept
        except FileExistsError:
            pass
    finally:
        os.unlink(tmp)
    return path
