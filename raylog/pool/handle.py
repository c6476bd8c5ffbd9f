"""Starting a pool and the handle that speaks to it.

:func:`start_pool` (what :meth:`raylog.Client.consumer_pool` calls) checks
every argument first (:func:`raylog.pool.spec.make_spec`: unknown topics,
bounds, the handler, resources, unknown options), refuses a second pool of
the same group (:class:`raylog.PoolExistsError`), then starts the
controller (:mod:`raylog.pool.controller`), which starts the members.

A :class:`PoolHandle` finds the controller by name (cluster and group, see
:mod:`raylog.pool.spec`), so a handle made in another driver of the same
Ray cluster works the same (``PoolHandle(cluster, group).status()`` is
what ``raylog pool status GROUP`` does).
"""

from __future__ import annotations

from raylog.errors import PoolExistsError, PoolNotFoundError
from raylog.pool import spec as specs
from raylog.pool.controller import PoolController

#: how long the start waits for the controller (its members may take longer: see ``ready``)
START_TIMEOUT_S = 120.0
#: a bound on one ``status`` or ``scale`` call, beyond the drain a scale step may wait for
CALL_TIMEOUT_S = 60.0


class PoolHandle:
    """A running pool: ``status()``, ``scale(n)``, ``stop(drain=True)``."""

    def __init__(self, cluster: str, group: str, controller=None):
        self.cluster = cluster
        self.group = group
        self._stopped = False
        # The handle of the driver that started the pool: a controller that is
        # not detached lives as long as this first handle does.
        self._controller = controller

    def _actor(self):
        import ray  # heavy, lazy on purpose

        if self._controller is not None and not self._stopped:
            return self._controller
        try:
            return ray.get_actor(specs.controller_name(self.cluster, self.group), namespace=specs.NAMESPACE)
        except ValueError:
            raise PoolNotFoundError(f"no consumer pool of group {self.group!r} runs in cluster {self.cluster!r}; "
                                    f"start one with client.consumer_pool(...)", group=self.group) from None

    def status(self) -> dict:
        """The pool now::

            {"group", "cluster", "topics", "member_count", "min_members", "max_members",
             "running_count",    # members that answered (not waiting for a node, starting or restarting)
             "autoscale", "target_lag_s",
             "lag_s",            # the largest lag in seconds of the partitions not stopped
             "processed_per_s",  # messages the handlers returned from per second, all members
             "members": [{"index", "consumer_id", "state", "partitions": ["topic-p", ...],
                          "handled", "processed_per_s", "last_error", "replaced"}],
             "partitions": [{"topic", "partition", "member", "committed", "end",
                             "lag_bytes", "lag_messages", "lag_s",   # None where not known
                             "handled", "stopped", "fetching", "dead_lettered",
                             "errors", "last_error", "error"}],
             "events": [{"at", "from", "to", "why"}]}   # scaling steps (kept as the count changes,
                                                         # before the leaving members drain) and replacements

        ``lag_messages`` is exact at 0 and an estimate above it; ``lag_s``
        is the age of the oldest message not committed
        (:mod:`raylog.pool.lag`). A partition's ``last_error`` is the
        handler's last failure on it (``{"offset", "failures", "error",
        "traceback", "at"}``); ``stopped`` is true once it failed
        ``max_handler_failures`` times in a row: the partition is not
        consumed past ``offset`` until the pool is started again, and it is
        no longer fetched (``fetching`` false; None where no member owns it)."""
        import ray

        return ray.get(self._actor().status.remote(), timeout=CALL_TIMEOUT_S)

    def scale(self, n: int) -> int:
        """Go to ``n`` members now (added members join the group; removed
        ones are drained first). :class:`raylog.ConfigError` outside
        ``[min_members, max_members]``. The autoscaler cools down after it."""
        import ray

        return ray.get(self._actor().scale.remote(n), timeout=CALL_TIMEOUT_S + 2 * START_TIMEOUT_S)

    def members(self) -> dict:
        """``{index: actor handle}`` of the member actors now (for tests and tools)."""
        import ray

        return ray.get(self._actor().members.remote(), timeout=CALL_TIMEOUT_S)

    def stop(self, drain: bool = True) -> None:
        """Stop the pool. ``drain``: every member finishes its current
        batch, commits what its handler returned from and leaves the group;
        otherwise the members are killed at once (what they handled since
        their last commit is handled again by the next pool). Afterwards no
        actor of the pool is left."""
        import ray

        actor = self._actor()
        try:
            ray.get(actor.stop.remote(drain), timeout=2 * START_TIMEOUT_S)
        finally:
            ray.kill(actor, no_restart=True)
            self._stopped = True
            self._controller = None

    def close(self) -> None:
        """Stop with a drain unless stopped (what the client's close does)."""
        if self._stopped:
            return
        try:
            self.stop(drain=True)
        except PoolNotFoundError:
            self._stopped = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return f"PoolHandle(cluster={self.cluster!r}, group={self.group!r})"


def _client_kwargs(client) -> dict:
    return {"zookeeper": client.settings.zookeeper, "cluster": client.settings.cluster,
            "token": client.settings.token, "data_dir": client.data_dir, "data_host": client.data_host}


def start_pool(client, topics, group, handler, options: dict) -> PoolHandle:
    """Check everything, then start the pool's controller (see the module docstring)."""
    import ray

    spec = specs.make_spec(topics, group, handler, client.metadata.partitions, dict(options))
    cluster = client.settings.cluster
    handle = PoolHandle(cluster, spec.group)
    try:
        handle._actor()
    except PoolNotFoundError:
        pass
    else:
        raise PoolExistsError(f"a consumer pool of group {spec.group!r} already runs in cluster {cluster!r}; "
                              f"stop it first or scale it (PoolHandle.scale)", group=spec.group)
    controller = ray.remote(PoolController).options(
        name=specs.controller_name(cluster, spec.group), namespace=specs.NAMESPACE, max_restarts=-1,
        max_task_retries=0, num_cpus=0, max_concurrency=8, lifetime="detached" if spec.detached else None,
    ).remote(spec, type(client), _client_kwargs(client))
    ray.get(controller.ready.remote(), timeout=START_TIMEOUT_S)
    return PoolHandle(cluster, spec.group, controller)
