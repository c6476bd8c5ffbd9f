"""The pool's controller: the Ray actor that owns the members, replaces
the dead ones, samples the group's lag and applies the scaling decision.

It is named ``pool:<cluster>:<group>`` in the Ray namespace
:data:`raylog.pool.spec.NAMESPACE` (:func:`raylog.pool.spec.controller_name`),
so any driver of the Ray cluster finds the pool by its group (the CLI's
``raylog pool status GROUP`` does). It is a threaded actor: ``status``
is answered while a scale step drains members.

Every ``sample_interval_s`` its loop:

1. asks every member for its stats; a member whose actor died for good
   (killed, its node gone, its restarts used up) is killed for certain and
   replaced by a new member actor under the same index (Ray restarts a
   member whose process died on its own: ``max_restarts=-1``);
2. samples the group's lag per partition (:mod:`raylog.pool.lag`);
3. with ``autoscale``, feeds the largest lag in seconds of the partitions
   not stopped to the :class:`~raylog.pool.scaling.Autoscaler` and applies
   its answer: members are added (each joins the group: one cooperative
   rebalance) or the newest ones drained and removed.

Removing a member drains it (:meth:`raylog.pool.member.PoolMember.stop`:
its batch finishes, the handled positions are committed, it leaves the
group) and then kills its actor.

Thread-safety: the members table is read and changed under ``_lock``;
scale steps (the loop's and ``scale``'s) are serialized by ``_scaling``.
"""

from __future__ import annotations

import collections
import logging
import threading
import time

from raylog.errors import ConfigError
from raylog.pool.lag import group_lag
from raylog.pool.member import PoolMember
from raylog.pool.scaling import Autoscaler, ScalingPolicy
from raylog.read import offset_store

log = logging.getLogger(__name__)

#: how long a stats call of a member may take before it counts as not answering
STATS_TIMEOUT_S = 5.0
#: how long ``ready`` waits for the first members to answer
READY_TIMEOUT_S = 60.0
#: scaling steps and replacements kept for ``status``
EVENTS_KEPT = 50


class PoolController:
    """The controller actor (see the module docstring)."""

    def __init__(self, spec, client_cls, client_kwargs: dict):
        import ray  # heavy, lazy on purpose

        self.spec = spec
        self._client_cls = client_cls
        self._client_kwargs = client_kwargs
        self.client = client_cls(**client_kwargs)
        self._store = offset_store(self.client.metadata)
        self._member_actor = ray.remote(PoolMember)
        self._lock = threading.RLock()
        self._scaling = threading.Lock()
        self._members: dict[int, object] = {}  # index -> actor handle
        self._replaced = collections.Counter()  # index -> replacements
        self._events: collections.deque = collections.deque(maxlen=EVENTS_KEPT)
        self._autoscaler = Autoscaler(ScalingPolicy.of(spec))
        self._last_lag: list[dict] = []
        self._last_stats: dict[int, dict] = {}
        self._stop = threading.Event()
        with self._scaling:
            self._apply(spec.first_members, "start")
        self._autoscaler.stepped(time.monotonic())
        self._thread = threading.Thread(target=self._loop, name=f"pool-controller-{spec.group}", daemon=True)
        self._thread.start()

    # -- the members ---------------------------------------------------------------

    def _new_member(self, index: int):
        options = dict(max_restarts=-1, max_task_retries=0, **self.spec.actor_options())
        return self._member_actor.options(**options).remote(self.spec, self._client_cls, self._client_kwargs, index)

    def _apply(self, count: int, why: str) -> None:
        """Go to ``count`` members (``_scaling`` held)."""
        with self._lock:
            before = len(self._members)
            while len(self._members) < count:
                index = 0
                while index in self._members:
                    index += 1
                self._members[index] = self._new_member(index)
            leaving = sorted(self._members)[count:]
            handles = [self._members.pop(i) for i in leaving]
            if count != before:  # with the change, so that a status showing the new count shows its step
                self._events.append({"at": time.time(), "from": before, "to": count, "why": why})
                log.info("pool %s: %d -> %d members (%s)", self.spec.group, before, count, why)
        if handles:
            self._drain(handles)

    def _drain(self, handles: list) -> None:
        import ray

        refs = [h.stop.remote() for h in handles]
        try:
            ray.wait(refs, num_returns=len(refs), timeout=self.spec.drain_timeout_s + 10.0)
        except Exception:  # noqa: BLE001 - killed below either way
            pass
        for h in handles:
            ray.kill(h, no_restart=True)

    def _member_stats(self) -> dict[int, dict]:
        """``{index: stats}`` of the members that answered; a member that
        died for good is replaced (its stats then say so)."""
        import ray
        from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

        with self._lock:
            members = dict(self._members)
        refs = {i: h.stats.remote() for i, h in members.items()}
        if refs:
            ray.wait(list(refs.values()), num_returns=len(refs), timeout=STATS_TIMEOUT_S)
        out = {}
        for i, ref in refs.items():
            try:
                out[i] = ray.get(ref, timeout=0)
            except GetTimeoutError:
                out[i] = {"index": i, "alive": None, "state": "not answering (starting, or busy)"}
            except ActorUnavailableError:
                out[i] = {"index": i, "alive": None, "state": "restarting"}
            except RayActorError as err:
                out[i] = {"index": i, "alive": False, "state": "replaced", "last_error": str(err).splitlines()[0]}
                self._replace(i, members[i])
        return out

    def _replace(self, index: int, handle) -> None:
        import ray

        with self._lock:
            if self._members.get(index) is not handle:
                return  # removed or replaced meanwhile
            try:
                ray.kill(handle, no_restart=True)
            except Exception:  # noqa: BLE001 - gone already
                pass
            self._members[index] = self._new_member(index)
            self._replaced[index] += 1
        self._events.append({"at": time.time(), "from": len(self._members), "to": len(self._members),
                             "why": f"member {index} died: replaced"})
        log.warning("pool %s: member %d died; replaced", self.spec.group, index)

    # -- the loop ------------------------------------------------------------------

    def _partitions(self) -> list[tuple[str, int]]:
        metadata = self.client.metadata
        return [(t, p) for t in self.spec.topics for p in range(metadata.partitions(t))]

    def _loop(self) -> None:
        while not self._stop.wait(self.spec.sample_interval_s):
            try:
                stats = self._member_stats()
                lag = group_lag(self.client.metadata, self._store, self.spec.group, self._partitions(),
                                reset=self.spec.auto_offset_reset)
                self._last_stats, self._last_lag = stats, lag
                if self.spec.autoscale and not self._stop.is_set():
                    self._autoscale(stats, lag)
            except Exception as err:  # noqa: BLE001 - logged; the next round tries again
                log.warning("pool %s: controller round failed: %s", self.spec.group, err)

    def _autoscale(self, stats: dict, lag: list[dict]) -> None:
        stopped = {key for s in stats.values() for key, part in (s.get("partitions") or {}).items()
                   if part["stopped"]}
        consumed = [r for r in lag if f"{r['topic']}-{r['partition']}" not in stopped]
        known = [r["lag_s"] for r in consumed if r["lag_s"] is not None]
        lag_s = max(known) if known else None
        backlog = sum(r["lag_messages"] or 0 for r in consumed)
        rates = [s["processed_per_s"] for s in stats.values() if s.get("processed_per_s")]
        rate_per_member = sum(rates) / len(rates) if rates else None
        with self._scaling:
            with self._lock:
                members = len(self._members)
            now = time.monotonic()
            target = self._autoscaler.observe(now, lag_s, members, backlog=backlog, rate_per_member=rate_per_member)
            if target is None or self._stop.is_set():
                return
            self._apply(target, f"lag {lag_s:.1f} s" if lag_s is not None else "bounds")
            self._autoscaler.stepped(time.monotonic())

    # -- asked by the handle -------------------------------------------------------------

    def ready(self) -> int:
        """How many of the members answer (waiting up to ``READY_TIMEOUT_S`` for all)."""
        import ray

        with self._lock:
            refs = [h.ping.remote() for h in self._members.values()]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=READY_TIMEOUT_S)
        return len(ready)

    def members(self) -> dict:
        """``{index: actor handle}`` of the members now."""
        with self._lock:
            return dict(self._members)

    def scale(self, count: int) -> int:
        """Go to ``count`` members now (within ``[min_members, max_members]``)."""
        spec = self.spec
        if isinstance(count, bool) or not isinstance(count, int) or not spec.min_members <= count <= spec.max_members:
            raise ConfigError(f"pool {spec.group!r} scales within min_members={spec.min_members} and "
                              f"max_members={spec.max_members}; got {count!r}")
        with self._scaling:
            self._apply(count, "scale()")
            self._autoscaler.stepped(time.monotonic())
        return count

    def status(self) -> dict:
        """See :meth:`raylog.pool.handle.PoolHandle.status`."""
        stats = self._member_stats()
        lag = group_lag(self.client.metadata, self._store, self.spec.group, self._partitions(),
                        reset=self.spec.auto_offset_reset)
        owners, partition_stats = {}, {}
        for i, s in stats.items():
            for key, part in (s.get("partitions") or {}).items():
                owners[key] = i
                partition_stats[key] = part
        rows = []
        for r in lag:
            key = f"{r['topic']}-{r['partition']}"
            part = partition_stats.get(key) or {}
            rows.append({**r, "member": owners.get(key), "handled": part.get("handled"),
                         "stopped": bool(part.get("stopped")), "fetching": part.get("fetching"),
                         "dead_lettered": part.get("dead_lettered", 0),
                         "errors": part.get("errors", 0),
                         "last_error": part.get("last_error")})
        members = []
        for i, s in sorted(stats.items()):
            parts = sorted(s.get("partitions") or {})
            members.append({"index": i, "consumer_id": s.get("consumer_id"),
                            "state": s.get("state") or ("running" if s.get("alive") else "stopped"),
                            "partitions": parts, "handled": s.get("handled", 0),
                            "processed_per_s": s.get("processed_per_s", 0.0), "last_error": s.get("last_error", ""),
                            "replaced": self._replaced.get(i, 0)})
        known = [r["lag_s"] for r in rows if r["lag_s"] is not None and not r["stopped"]]
        return {"group": self.spec.group, "cluster": self.client.settings.cluster, "topics": list(self.spec.topics),
                "members": members, "member_count": len(members),
                "running_count": sum(1 for s in stats.values() if s.get("alive")),
                "min_members": self.spec.min_members,
                "max_members": self.spec.max_members, "autoscale": self.spec.autoscale,
                "target_lag_s": self.spec.target_lag_s, "lag_s": max(known) if known else None,
                "processed_per_s": sum(m["processed_per_s"] or 0.0 for m in members),
                "partitions": rows, "events": list(self._events)}

    def stop(self, drain: bool = True) -> None:
        """Stop the loop, then every member: drained (finish, commit, leave) or killed at once."""
        import ray

        self._stop.set()
        self._thread.join(timeout=self.spec.sample_interval_s + 30.0)
        with self._scaling:
            with self._lock:
                handles = list(self._members.values())
                self._members.clear()
            if drain:
                self._drain(handles)
            else:
                for h in handles:
                    ray.kill(h, no_restart=True)
        try:
            self.client.close()
        except Exception as err:  # noqa: BLE001 - the controller goes either way
            log.debug("pool %s: closing the controller's client: %s", self.spec.group, err)
