"""The thread side of a group member (:class:`~raylog.groups.member.GroupMember`):
event intake on kazoo's threads (record, wake, return) and the member's own
thread, which runs the state machine of :mod:`raylog.groups.states`, every
ZooKeeper step and the ``on_assigned``/``on_revoked`` callbacks, one at a
time, in order.

Thread-safety: the ``_on_*`` intake methods run on kazoo's threads and only
touch the event queue under the member's condition; everything else runs on
the member's thread.
"""

from __future__ import annotations

import logging
import time
from typing import Mapping

from kazoo.protocol.states import KazooState

from raylog.errors import ClosedError, RaylogError, ZooKeeperUnavailableError
from raylog.groups.assignment import Assignment, TopicPartition, moves, partition_count, range_assignment
from raylog.groups.states import Action, Event, MemberState, transition

log = logging.getLogger(__name__)


class MemberThread:
    """Mixin of :class:`~raylog.groups.member.GroupMember`: its event intake
    and its thread (the attributes it uses are set by ``GroupMember.__init__``)."""

    # ------------------------------------------------------------ event intake
    # On kazoo's threads: record, wake the member's thread, return.

    def _post(self, event: Event) -> None:
        with self._cond:
            if event not in self._events:
                self._events.append(event)
            self._cond.notify_all()

    def _on_connection_change(self, state: str) -> bool:
        with self._cond:
            if self._state is MemberState.CLOSED:
                return True  # remove the listener
            self._conn = state
            if state == KazooState.LOST:
                self._lost_pending = True
        self._post({KazooState.SUSPENDED: Event.DISCONNECTED, KazooState.LOST: Event.SESSION_LOST}.get(
            state, Event.CONNECTED))
        return False

    def _on_members(self, children: list[str]):
        self._zk_ops.count_reads()
        with self._cond:
            if self._state is MemberState.CLOSED:
                return False  # stop watching
            changed = frozenset(children) != self._last_members
        if changed:
            self._post(Event.CHANGED)
        return None

    def _topic_watcher(self, topic: str):
        def on_topic(data, stat):
            self._zk_ops.count_reads()
            with self._cond:
                if self._state is MemberState.CLOSED:
                    return False
                try:
                    count = partition_count(data)
                except (ValueError, RaylogError):
                    count = -1  # unreadable: let the rebalance read it and report
                changed = count != self._last_counts.get(topic)
            if changed:
                self._post(Event.CHANGED)
            return None

        return on_topic

    def _on_owner_node(self, event) -> None:
        """An owner node this member waits for changed or went."""
        with self._cond:
            self._wake = True
            self._cond.notify_all()

    # ------------------------------------------------------------ the member's thread

    def _run(self) -> None:
        # One timer at most: (due, state it belongs to, ("event", Event) or ("actions", [...]))
        timer = None
        settle_started: float | None = None
        backoff = self._retry.start()
        while True:
            with self._cond:
                while True:
                    if self._events:
                        kind, payload = "event", self._events.pop(0)
                        break
                    if timer is not None:
                        due, owner_state, (kind, payload) = timer
                        if owner_state is not self._state:
                            timer = None  # stale: the state moved on
                            continue
                        now = time.monotonic()
                        if now >= due or (self._wake and kind == "actions"):
                            timer, self._wake = None, False
                            break
                        self._cond.wait(due - now)
                    else:
                        self._cond.wait()
                state = self._state
            if kind == "actions":
                actions = list(payload)
            else:
                step = transition(state, payload)
                with self._cond:
                    self._state = step.state
                    self._cond.notify_all()
                if step.state is not MemberState.SETTLING:
                    settle_started = None
                if step.state is not state or step.actions:
                    log.debug("consumer %s: %s --%s--> %s %s", self._id, state, payload, step.state,
                              [str(a) for a in step.actions])
                actions = list(step.actions)
            # Perform the actions; a pause defers the rest to the timer.
            pause = 0.0
            while actions:
                action = actions.pop(0)
                now = time.monotonic()
                if action is Action.BACKOFF:
                    pause = backoff.next_delay() or self._retry.max_delay_s
                elif action is Action.WAIT_SETTLE:
                    if settle_started is None:
                        settle_started = now
                    due = max(now + pause, min(now + self._settle_s, settle_started + self._max_settle_s))
                    timer = (due, MemberState.SETTLING, ("event", Event.SETTLED))
                    with self._cond:
                        self._wake = False
                elif pause > 0:
                    with self._cond:
                        timer = (now + pause, self._state, ("actions", [action, *actions]))
                    break
                else:
                    result = self._perform(action)
                    if result in (Event.REBALANCED, Event.JOINED):
                        backoff.reset()  # a success resets the back-off
                    if action is Action.LEAVE:
                        self._finish_leave()
                        return
                    if result is not None:
                        with self._cond:
                            self._events.insert(0, result)  # the step's outcome comes first

    def _perform(self, action: Action) -> Event | None:
        try:
            if action is Action.REGISTER:
                return Event.JOINED if self._zk_ops.register(self.topics) else Event.FAILED_STEP
            if action is Action.REBALANCE:
                return self._rebalance()
            if action is Action.HIDE:
                return None
            if action is Action.FORGET_OWNED:
                with self._ownership, self._cond:
                    self._owned.clear()
                    self._lost_pending = False
                    self._last_members = None
                self._zk_ops.forget()
                return None
            if action is Action.REVOKE_ALL:
                self._revoke(self._handed_now())
                return None
            if action is Action.LEAVE:
                self._leave()
                return Event.LEFT
            raise AssertionError(f"unknown action {action}")
        except (ZooKeeperUnavailableError, ClosedError) as err:
            log.info("consumer %s of group %r: %s interrupted (%s); retrying", self._id, self.group, action, err)
            return Event.FAILED_STEP
        except Exception:  # noqa: BLE001 - a bug must not leave partitions unread: retry the step
            log.exception("consumer %s of group %r: %s failed; retrying", self._id, self.group, action)
            return Event.FAILED_STEP

    def _handed_now(self) -> Assignment:
        with self._cond:
            return self._handed

    def _callback(self, name: str, fn, partitions: Assignment) -> Exception | None:
        if fn is None or not partitions:
            return None
        try:
            fn(partitions)
        except Exception as err:  # noqa: BLE001 - logged; the caller decides
            log.exception("consumer %s of group %r: %s(%s) raised", self._id, self.group, name, sorted(partitions))
            return err
        return None

    def _revoke(self, partitions: Assignment) -> None:
        """on_revoked (the partitions are still owned: commits land), then drop them."""
        if not partitions:
            return
        self._callback("on_revoked", self._on_revoked, partitions)
        with self._cond:
            self._handed = self._handed - partitions
            self._cond.notify_all()

    def _release(self, versions: Mapping[TopicPartition, int], session: int | None) -> None:
        if not versions:
            return
        with self._ownership:
            for tp in versions:
                self._owned.pop(tp, None)
            self._zk_ops.release(versions, session)

    def _rebalance(self) -> Event:
        """One cooperative step (see the module docstring)."""
        try:
            return self._rebalance_step()
        finally:
            with self._cond:
                self._rebalances += 1
                self._cond.notify_all()

    def _rebalance_step(self) -> Event:
        members = self._zk_ops.members()
        if self._id not in members:
            # Our ids node is gone (deleted from outside, or a session change raced us).
            if not self._zk_ops.register(self.topics):
                return Event.FAILED_STEP
            members = sorted({*members, self._id})
        subscriptions = self._zk_ops.subscriptions(members)
        subscriptions[self._id] = list(self.topics)
        counts = self._zk_ops.partition_counts(self.topics)
        with self._cond:
            self._last_members = frozenset(members)
            self._last_counts = dict(counts)
        target = range_assignment(counts, subscriptions)[self._id]

        # Revoke what moves away (the application commits it while it still owns it) ...
        mv = moves(self._handed_now(), target)
        self._revoke(mv.revoke)
        # ... then reconcile with ZooKeeper, read *after* the callback (the
        # session may have expired while it ran): what this session holds.
        held = self._zk_ops.held(self.topics)
        self._revoke(frozenset(tp for tp in self._handed_now() if tp not in held))  # node gone
        self._release({tp: v for tp, v in held.items() if tp not in target}, held.session)
        with self._ownership:
            self._owned = {tp: v for tp, v in held.items() if tp in target}
            missing = target - set(self._owned)
        busy: dict = {}
        session = held.session
        if missing:
            claimed, busy = self._zk_ops.claim(missing, self._on_owner_node)
            with self._ownership:
                for tp in claimed:
                    self._owned[tp] = 0
            if any(holder is None for holder in busy.values()):
                self._on_owner_node(None)  # released just now: try again at once
        new = frozenset(self.owned & target) - self._handed_now()
        if new:
            with self._cond:
                self._handed = self._handed | new
            err = self._callback("on_assigned", self._on_assigned, new)
            if err is not None:
                # The consumer did not take them: give them back rather than hold them unread.
                self._revoke(new)
                with self._ownership:
                    versions = {tp: self._owned[tp] for tp in new if tp in self._owned}
                self._release(versions, session)
                return Event.FAILED_STEP
        with self._cond:
            if new or mv.revoke:
                self._generation += 1
            self._cond.notify_all()
        if busy:
            self._note_blocked(busy)
            return Event.INCOMPLETE
        self._blocked_since = None
        log.info("consumer %s of group %r: %d members, owns %s", self._id, self.group, len(members),
                 ", ".join(f"{t}/{p}" for t, p in sorted(target)) or "nothing")
        return Event.REBALANCED

    _blocked_since: float | None = None
    _warned = False

    def _note_blocked(self, busy: dict) -> None:
        now = time.monotonic()
        if self._blocked_since is None:
            self._blocked_since, self._warned = now, False
        if not self._warned and now - self._blocked_since > self._warn_after_s:
            self._warned = True
            log.warning("consumer %s of group %r: %s still held by another member after %.0fs; "
                        "retrying until it lets go", self._id, self.group,
                        ", ".join(f"{t}/{p} ({h})" for (t, p), h in sorted(busy.items())), now - self._blocked_since)

    def _leave(self) -> None:
        self._revoke(self._handed_now())
        try:
            if self.zk.state == KazooState.CONNECTED:
                held = self._zk_ops.held(self.topics)
                self._release(held, held.session)
                self._zk_ops.unregister()
        except RaylogError as err:
            log.warning("consumer %s of group %r left while ZooKeeper is unreachable (%s); its nodes "
                        "vanish when its session ends", self._id, self.group, err)

    def _finish_leave(self) -> None:
        """After LEAVE (whether its steps reached ZooKeeper or not: the nodes
        left behind vanish with the session), the table's (CLOSING, LEFT)
        step ends the member."""
        with self._ownership, self._cond:
            self._owned.clear()
            self._state = transition(self._state, Event.LEFT).state  # CLOSING -> CLOSED
            self._cond.notify_all()
        self.zk.remove_listener(self._on_connection_change)
        log.info("consumer %s left group %r", self._id, self.group)
