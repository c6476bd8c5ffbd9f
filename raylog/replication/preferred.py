"""Preferred leaders (Kafka's preferred-replica election): the first of a
partition's ``replicas`` is its **preferred leader**. Placement spreads the
first replicas evenly over the disk nodes, so leading there spreads the
load; after failovers, drains and restarts the lead sits elsewhere, and a
balance hands it back (:mod:`raylog.replication.handoff`) wherever the
preferred replica runs and is in sync:

- on demand, :func:`balance_leaders` (``raylog topics balance-leaders``,
  :meth:`raylog.Client.balance_leaders`);
- by itself, a leader that is not the preferred one hands its lead there
  once the preferred replica has been in sync for a quiet period
  (:class:`PreferredWatch`, on the leader's timer).

:func:`preferred_moves` is the pure decision. The functions keep no state;
:class:`PreferredWatch` is used by one thread (the leader actor's timer).
"""

from __future__ import annotations

import logging
import time

from raylog.errors import RaylogError
from raylog.replication.admin import leader_counts, replicated_partitions, request_handoff
from raylog.replication.state import running_replicas

log = logging.getLogger(__name__)

#: how long the preferred replica must have been in sync before its leader hands the lead back by itself
PREFERRED_QUIET_S = 120.0


def preferred_moves(rows, running: dict) -> list[tuple[str, int, str]]:
    """``(topic, partition, preferred)`` for each partition of ``rows``
    (``(topic, partition, state)``) whose leader is not its preferred
    replica while that one is in sync and runs (``running``: (topic,
    partition) -> nodes whose replica actor runs)."""
    moves = []
    for topic, p, state in rows:
        preferred = state.replicas[0]
        if (state.leader != preferred and preferred in state.isr and preferred not in state.removing
                and preferred in running.get((topic, p), ())):
            moves.append((topic, p, preferred))
    return moves


def balance_leaders(zk, registry, cluster: str, token: bytes, topics=None, timeout_s: float = 10.0) -> dict:
    """Hand every lead that is not on its preferred replica back there (when
    that one runs and is in sync). Returns ``{"moved": [...], "failed":
    [...], "leaders_before": {node: n}, "leaders_after": {node: n}}``."""
    rows = replicated_partitions(zk, registry, topics)
    before = leader_counts(rows)
    running = {(t, p): set(running_replicas(zk, registry.paths, t, p)) for t, p, _ in rows}
    moved, failed = [], []
    for topic, p, target in preferred_moves(rows, running):
        try:
            result = request_handoff(zk, registry, cluster, topic, p, target, token, timeout_s)
            moved.append({"topic": topic, "partition": p, **result})
        except (RaylogError, ValueError) as err:
            failed.append({"topic": topic, "partition": p, "leader": target, "error": str(err)})
        except Exception as err:  # noqa: BLE001 - a Ray error of one partition: the others go on
            failed.append({"topic": topic, "partition": p, "leader": target, "error": repr(err)})
    after = leader_counts(replicated_partitions(zk, registry, topics), before)
    return {"moved": moved, "failed": failed, "leaders_before": before, "leaders_after": after}


class PreferredWatch:
    """On a leader that is not its partition's preferred replica: says when
    to hand the lead there (the preferred replica in sync, running, for
    ``quiet_s`` without a break)."""

    def __init__(self, quiet_s: float = PREFERRED_QUIET_S):
        self.quiet_s = quiet_s
        self._since: float | None = None

    def due(self, state, node: str, running, now: float | None = None) -> str | None:
        """The preferred replica when the lead should go there now, else None."""
        now = time.monotonic() if now is None else now
        preferred = state.replicas[0]
        if state.leader != node or preferred == node or preferred not in state.isr or preferred not in running \
                or preferred in state.removing:
            self._since = None
            return None
        if self._since is None:
            self._since = now
        if now - self._since >= self.quiet_s:
            self._since = None
            return preferred
        return None
