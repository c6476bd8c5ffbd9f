"""Finding and stopping a cluster-wide named actor (the supervisor, the
transaction coordinator): one detached actor per cluster, named in the
``raylog`` namespace."""

from __future__ import annotations

from raylog.config import NAMESPACE


def find_named(name: str):
    """The running actor called ``name`` in raylog's namespace, or None."""
    import ray  # heavy (Ray): imported when used

    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return None


def stop_named(name: str, timeout_s: float = 10.0) -> bool:
    """Ask the actor called ``name`` to stop (its ``stop()``), then kill it
    without a restart; True if one ran."""
    import ray  # heavy (Ray): imported when used

    actor = find_named(name)
    if actor is None:
        return False
    try:
        ray.get(actor.stop.remote(), timeout=timeout_s)
    except Exception:  # noqa: BLE001 - it is killed just below anyway
        pass
    ray.kill(actor, no_restart=True)
    return True
