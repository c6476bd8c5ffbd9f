"""Moving a partition's lead on purpose (drain, rolling restart,
reassignment, preferred-leader balance): a **handoff**, not a failover
(docs/design.md section 7).

On the leader, :func:`hand_off` runs these steps:

1. **stop accepting**: new appends are refused with the retriable
   :class:`~raylog.errors.NotOwnerError` (a producer looks the endpoint up
   again and retries, as after any leader change) and the appends under
   way end;
2. **catch up**: the log is flushed and the chosen replica (an ISR member)
   fetches up to the leader's log end, at most ``timeout_s``; if it does
   not, the leader accepts again and :class:`~raylog.errors.HandoffError`
   (retriable) is raised, with nothing changed;
3. **switch**: a compare-and-set of the ``state`` node names the target the
   leader with ``leader_epoch + 1``, its epoch beginning at the log end
   (:func:`handoff_state`). The ISR stays as it was: every member holds
   what it held, and the old leader, which holds everything, follows the new
   epoch at once.

The partition actor then takes the steps around it
(:meth:`raylog.replication.replica.ReplicaRole.hand_off`): the old leader
removes its endpoint and becomes a follower in its own process; the target's
follower, woken by the endpoint's change, finds the ``state`` node naming it
and leads (no session has to expire); it registers the endpoint, which
redirects producers and readers. The time between steps 1 and that
registration is the partition's leaderless time.

:func:`choose_target` picks the replica to hand to (pure).

The functions keep no state; :func:`hand_off` runs on a thread of the
leader's actor while its data server goes on serving.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from raylog.errors import HandoffError
from raylog.replication.state import PartitionState, compare_and_set, read_state

log = logging.getLogger(__name__)

#: how often the switch's compare-and-set is redone after losing to another writer (the ISR review)
CAS_TRIES = 20


def handoff_state(state: PartitionState, target: str, log_end: int) -> PartitionState:
    """The ``state`` after handing ``state.leader``'s lead to ``target`` at
    ``log_end``: the next leader epoch, beginning there. Raises
    :class:`HandoffError` when ``target`` is the leader or not in sync."""
    if target == state.leader:
        raise HandoffError(f"{target} leads already; name another in-sync replica")
    if target not in state.isr:
        raise HandoffError(f"{target} is not in sync (ISR {', '.join(state.isr)}); hand the lead to an in-sync "
                           f"replica or wait until it catches up")
    epoch = state.leader_epoch + 1
    return dataclasses.replace(state, leader=target, leader_epoch=epoch, epochs=state.epochs + ((epoch, log_end),))


def choose_target(state: PartitionState, running, leads: dict | None = None, avoid=()) -> str | None:
    """The replica to hand ``state.leader``'s lead to: an ISR member that
    runs (``running``: nodes), is not the leader nor in ``avoid``; of those
    the one that leads fewest partitions (``leads``: node -> count), the
    earlier in ``replicas`` (the preferred first) on a tie. None when there
    is none."""
    leads = leads or {}
    order = {n: i for i, n in enumerate(state.replicas)}
    candidates = [n for n in state.isr if n != state.leader and n not in avoid and n in running]
    if not candidates:
        return None
    return min(candidates, key=lambda n: (leads.get(n, 0), order.get(n, len(order))))


def hand_off(leader, target: str, timeout_s: float) -> dict:
    """Steps 1-3 of the module docstring on ``leader``
    (:class:`~raylog.replication.leader.Leader`). Returns ``{"leader",
    "leader_epoch", "log_end", "refused_at"}`` (``refused_at``: the wall
    time new appends began to be refused). Raises :class:`HandoffError`
    (the leader accepts again) when it cannot complete within ``timeout_s``."""
    name = f"{leader.topic}-{leader.partition}"
    handoff_state(leader.state, target, 0)  # checked before anything is refused
    deadline = time.monotonic() + timeout_s
    refused_at = time.time()
    done = False
    try:
        if not leader.stop_accepting(target, deadline):
            raise HandoffError(f"{name}: the appends under way did not end within {timeout_s:g} s; retry")
        leader.log.flush()
        log_end = leader.log.log_end_offset
        if not leader.wait_reached(target, log_end, deadline):
            raise HandoffError(f"{name}: {target} did not reach the log end {log_end} within {timeout_s:g} s; "
                               f"the leader accepts again; retry or name another in-sync replica")
        for _ in range(CAS_TRIES):
            state, version = read_state(leader.zk, leader.paths, leader.topic, leader.partition)
            if state.leader != leader.node:
                raise HandoffError(f"{name}: {state.leader} leads now (epoch {state.leader_epoch}), not "
                                   f"{leader.node}; nothing to hand off")
            new = handoff_state(state, target, log_end)
            if compare_and_set(leader.zk, leader.paths, leader.topic, leader.partition, new, version) is not None:
                done = True
                leader.deposed = True  # our own handoff: no on_deposed, the role makes it a follower
                log.info("%s: lead handed from %s to %s at %d (epoch %d)", name, leader.node, target, log_end,
                         new.leader_epoch)
                return {"leader": target, "leader_epoch": new.leader_epoch, "log_end": log_end,
                        "refused_at": refused_at}
        raise HandoffError(f"{name}: the state node kept changing under {CAS_TRIES} writes; retry")
    finally:
        if not done:
            leader.resume_accepting()
