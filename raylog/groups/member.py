"""One consumer's membership in a consumer group.

There is no group leader: every member watches the same ZooKeeper nodes,
computes the same assignment from a fresh read with the assignor every
member supports (:mod:`raylog.groups.assignors`; ``range`` by default) and
claims its own share (:mod:`raylog.groups.ownership`). What the member
does next is decided by the pure transition function of
:mod:`raylog.groups.states`; this module feeds it events and performs its
actions.

Usage (what :class:`raylog.Consumer` does)::

    def revoked(partitions):             # stop reading them; commit what was processed
        member.commit({tp: positions[tp] for tp in partitions})

    def assigned(partitions):            # start reading them from the committed offsets
        ...

    member = GroupMember(zk, "default", "analytics", ["clicks"],
                         on_assigned=assigned, on_revoked=revoked)
    member.start(timeout_s=30)           # joined and holding its first assignment
    while running:
        for topic, p in member.assignment:       # empty while not sure of ownership
            ...
    member.close()

Rebalances are **cooperative**: after a change (a member joins or leaves, a
subscribed topic gains partitions) and a settle period without further
change, each member revokes only the partitions that move away from it
(``on_revoked`` — the consumer commits them — then the owner nodes are
deleted) and claims only the ones that move to it, waiting on a watch of
each node its previous owner still holds. Partitions that stay are never
unowned and keep flowing. A claim blocked by a slow peer is retried with
jittered back-off for as long as the member lives, never abandoned; the
partitions already claimed are handed out meanwhile (``on_assigned`` may
be called several times in one rebalance, each with the newly owned ones).

Each rebalance costs the member one listing of the members, one read per
member it has not seen before, one read per topic the group subscribes to, and the
reconciliation of its owner nodes (one listing per topic plus one read per
owner node): O(members + partitions) reads (:attr:`GroupMember.zk_reads`).
An assignor that reads the owners (``sticky``) costs that listing once more,
and its step is repeated (with back-off) until the member sees the group
hold exactly the assignment it computed.

A member never shares its ZooKeeper session with another member: two
members on one client could both "own" a partition (the session, not the
member, owns an ephemeral node). :meth:`GroupMember.start` refuses a client
another live member uses.

Threads: kazoo's listener and watch callbacks only queue events. The
member's own thread runs the state machine, every ZooKeeper step and the
``on_assigned``/``on_revoked`` callbacks, one at a time, in order.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
import weakref
from typing import Callable, Mapping, Sequence

from kazoo.client import KazooClient
from kazoo.protocol.states import KazooState
from kazoo.recipe.watchers import ChildrenWatch, DataWatch

from raylog.errors import (
    ClosedError,
    ConfigError,
    PartitionNotAssignedError,
    RaylogError,
    SessionExpiredError,
    ZooKeeperUnavailableError,
)
from raylog.groups import assignors as assignors_
from raylog.groups import kafka_members
from raylog.groups.assignment import Assignment, TopicPartition, moves, partition_count
from raylog.groups.assignors import UNKNOWN_JOINED, Assignor, MemberInfo
from raylog.groups.offsets import REQUEST_TIMEOUT_S, OffsetStore
from raylog.groups.ownership import Ownership
from raylog.groups.states import Action, Event, MemberState, hands_out, transition
from raylog.retry import RetryPolicy
from raylog.zk.errors import zookeeper_errors

log = logging.getLogger(__name__)

#: the default settle period: a rebalance starts once membership has been
#: quiet this long (so 32 members joining at once cost a few rebalances, not 32)
SETTLE_S = 0.3
#: a settle period never stretches beyond this, however busy the group
MAX_SETTLE_S = 5.0


def default_retry() -> RetryPolicy:
    """Jittered back-off between tries of a step ZooKeeper interrupted or a
    claim a previous owner still blocks: 0.05 s doubling to 2 s, ±50 %.
    There is no deadline: the member retries as long as it lives (a claim
    also proceeds at once when the blocking node goes, through a watch);
    after ``warn_after_s`` of blocked claims it logs a warning once."""
    return RetryPolicy.forever(delay_s=0.05, max_delay_s=2.0, jitter=0.5)


def default_consumer_id() -> str:
    """``<host>-<pid>-<random>``: unique per member, readable in admin output."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _check_name(kind: str, name: str) -> str:
    if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
        raise ConfigError(f"a {kind} must be a non-empty string without '/', got {name!r}")
    return name


#: ZooKeeper clients in use by a live member (one session, one member)
_SESSIONS: "weakref.WeakKeyDictionary[KazooClient, GroupMember]" = weakref.WeakKeyDictionary()
_SESSIONS_LOCK = threading.Lock()


class GroupMember:
    """One consumer's membership in a consumer group (see the module docstring).

    ``on_assigned(partitions)`` and ``on_revoked(partitions)`` receive
    frozensets of ``(topic, partition)``; they run on the member's thread,
    one at a time. Every partition passed to ``on_assigned`` is later passed
    to exactly one ``on_revoked`` before it is assigned again. Inside
    ``on_revoked`` the partitions are still owned, so :meth:`commit` of them
    succeeds (unless the session was lost: then it raises). An exception
    from ``on_revoked`` is logged and the release goes on; one from
    ``on_assigned`` revokes those partitions again, releases them and
    retries the rebalance after a pause.

    ``assignors`` names the assignors the member supports, most preferred
    first (a name, ``"sticky,range"``, or a list of names and assignor
    objects; default ``range``; :func:`raylog.groups.assignors.resolve`
    raises :class:`raylog.errors.AssignorError`, a ``ConfigError``, for an
    unknown name). They are
    written into the member's ``ids/`` node; the group applies the first, in
    its oldest member's order, that every member supports, else ``range``.

    ``settle_s`` is the quiet period before a rebalance; ``retry`` the
    back-off between retried steps; ``warn_after_s`` how long claims may be
    blocked before a warning is logged.

    The member uses ``zk`` but does not own it; it must be the only member
    on that client.

    Thread-safety: all public methods and properties may be called from any
    thread; callbacks are serialized on the member's own thread.
    """

    def __init__(
        self,
        zk: KazooClient,
        cluster: str,
        group: str,
        topics: Sequence[str],
        *,
        consumer_id: str | None = None,
        on_assigned: Callable[[Assignment], None] | None = None,
        on_revoked: Callable[[Assignment], None] | None = None,
        retry: RetryPolicy | None = None,
        settle_s: float = SETTLE_S,
        max_settle_s: float = MAX_SETTLE_S,
        warn_after_s: float | None = None,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        assignors: "str | Sequence[str | Assignor] | None" = None,
    ):
        if isinstance(topics, str):
            raise ConfigError(f"topics is a list of topic names, got the string {topics!r}")
        topics = tuple(sorted({_check_name("topic name", t) for t in topics}))
        if not topics:
            raise ConfigError("a group member subscribes to at least one topic")
        if settle_s < 0 or max_settle_s < settle_s:
            raise ConfigError(f"need 0 <= settle_s <= max_settle_s, got {settle_s}, {max_settle_s}")
        self.zk = zk
        self.cluster = cluster
        self.group = _check_name("group name", group)
        self.topics: tuple[str, ...] = topics
        #: the assignors this member supports, most preferred first (:mod:`raylog.groups.assignors`)
        self.assignors: tuple[Assignor, ...] = assignors_.resolve(assignors)
        self._assignor_names = tuple(a.name for a in self.assignors)
        self._id = _check_name("consumer id", consumer_id) if consumer_id is not None else default_consumer_id()
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked
        self._retry = retry or default_retry()
        self._settle_s = settle_s
        self._max_settle_s = max_settle_s
        session_s = getattr(zk, "_session_timeout", 10_000) / 1000.0
        self._warn_after_s = warn_after_s if warn_after_s is not None else max(15.0, 1.5 * session_s + 5.0)
        self._zk_ops = Ownership(zk, cluster, self.group, self._id, request_timeout_s=request_timeout_s)
        self._offsets = OffsetStore(zk, cluster, request_timeout_s=request_timeout_s)

        # Guarded by _cond.
        self._cond = threading.Condition()
        self._state = MemberState.CREATED
        self._events: list[Event] = []          # queued; at most one of each kind
        self._wake = False                      # an owner node we wait for changed
        self._conn = KazooState.CONNECTED       # the listener's view, updated at once
        self._lost_pending = False              # a LOST the member's thread has not handled
        self._handed: Assignment = frozenset()  # given to on_assigned, not yet revoked
        self._generation = 0
        self._rebalances = 0
        self._last_members: frozenset[str] | None = None
        self._last_counts: dict[str, int] = {}
        self._assignor: str | None = None       # the name applied by the last rebalance step
        self._thread: threading.Thread | None = None
        self._watches: list = []
        self._watched_topics: set[str] = set(topics)  # on the member's thread (and start)

        # Owner nodes held (created by the current session, holding our id).
        # Guarded by _ownership: commit holds it across its check and write,
        # the release holds it while deleting, so a commit that returns landed
        # while the member held the node.
        self._ownership = threading.RLock()
        self._owned: dict[TopicPartition, int] = {}

    # ------------------------------------------------------------ properties

    @property
    def consumer_id(self) -> str:
        return self._id

    @property
    def state(self) -> MemberState:
        with self._cond:
            return self._state

    @property
    def generation(self) -> int:
        """The number of rebalance steps that changed what this member holds."""
        with self._cond:
            return self._generation

    @property
    def rebalances(self) -> int:
        """The number of rebalance steps run (each after a settle period)."""
        with self._cond:
            return self._rebalances

    @property
    def assignor(self) -> str | None:
        """The name of the assignor the group applied in this member's last
        rebalance step (None before the first)."""
        with self._cond:
            return self._assignor

    @property
    def zk_reads(self) -> int:
        """ZooKeeper reads made by this member so far (watches included)."""
        return self._zk_ops.reads

    @property
    def assignment(self) -> Assignment:
        """The partitions this member owns and may hand out now.

        Empty whenever it is not sure: before the first claims, while
        disconnected, after a session loss until it rejoined. During a
        cooperative rebalance the partitions that do not move stay here.
        """
        with self._cond:
            # kazoo sets its state before it calls any listener: read it here
            # too, so no listener (ours included) ever sees a stale assignment.
            if (hands_out(self._state) and self._conn == KazooState.CONNECTED and not self._lost_pending
                    and self.zk.state == KazooState.CONNECTED):
                return self._handed
            return frozenset()

    @property
    def owned(self) -> Assignment:
        """The partitions whose owner node this member holds (as far as it knows)."""
        with self._ownership:
            return frozenset(self._owned)

    def __repr__(self) -> str:
        return (f"GroupMember({self._id!r}, group={self.group!r}, topics={list(self.topics)}, "
                f"state={self._state}, generation={self._generation})")

    # ------------------------------------------------------------- lifecycle

    def start(self, timeout_s: float = 30.0) -> Assignment:
        """Join the group; wait up to ``timeout_s`` for the first rebalance
        and return what it holds then (possibly empty: more members than
        partitions, or claims still blocked by a slow peer, which go on).

        Raises :class:`raylog.ZooKeeperUnavailableError` if ZooKeeper is not
        reachable now, :class:`raylog.ConfigError` if another live member
        uses the same ZooKeeper client, :class:`raylog.errors.MixedGroupError`
        if the group has live Kafka-protocol members
        (:mod:`raylog.groups.kafka_members`).
        """
        with _SESSIONS_LOCK:
            other = _SESSIONS.get(self.zk)
            if other is not None and other is not self and other.state is not MemberState.CLOSED:
                raise ConfigError(
                    f"consumer {other.consumer_id} already uses this ZooKeeper client; two members on "
                    f"one session could both own a partition. Give each member its own client"
                )
            with self._cond:
                if self._state is not MemberState.CREATED:
                    raise ConfigError(f"{self!r} was already started; create a new GroupMember")
            _SESSIONS[self.zk] = self
        try:
            with zookeeper_errors(self.zk, f"join group {self.group!r}"):
                if self.zk.state != KazooState.CONNECTED:
                    raise ZooKeeperUnavailableError(
                        f"cannot join group {self.group!r}: the ZooKeeper connection is "
                        f"{self.zk.state.lower()}; start the member once ZooKeeper is reachable")
                kafka_members.check_no_kafka_members(self.zk, self._zk_ops.paths, self.group)
                self.zk.ensure_path(self._zk_ops.paths.ids(self.group))
                self.zk.add_listener(self._on_connection_change)
                # Arm the watches before the first read, so no change falls between.
                self._watches = [ChildrenWatch(self.zk, self._zk_ops.paths.ids(self.group), self._on_members)]
                self._watches += [DataWatch(self.zk, self._zk_ops.paths.topic(t), self._topic_watcher(t))
                                  for t in self.topics]
        except BaseException:
            with self._cond:
                self._state = transition(self._state, Event.CLOSE).state  # CREATED -> CLOSED
            self.zk.remove_listener(self._on_connection_change)
            raise
        self._post(Event.START)
        self._thread = threading.Thread(target=self._run, name=f"raylog-group-{self.group}-{self._id}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._rebalances == 0 and self._state is not MemberState.CLOSED:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
        return self.assignment

    def close(self, timeout_s: float = 30.0) -> None:
        """Leave the group: ``on_revoked`` for what is handed out, then the
        owner nodes this session holds and the ids node are deleted, so the
        other members rebalance at once. Idempotent. Called from a callback,
        it returns at once and the member leaves after the callback."""
        with self._cond:
            if self._state is MemberState.CREATED:
                self._state = transition(self._state, Event.CLOSE).state  # CREATED -> CLOSED
                return
        self._post(Event.CLOSE)
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            return
        thread.join(timeout_s)
        if thread.is_alive():
            log.warning("consumer %s of group %r did not finish leaving within %gs; its nodes vanish "
                        "when its ZooKeeper session ends", self._id, self.group, timeout_s)

    def __enter__(self) -> "GroupMember":
        if self.state is MemberState.CREATED:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------- consumer API

    def check(self) -> None:
        """Raise :class:`raylog.ClosedError` if the member left the group."""
        with self._cond:
            if self._state in (MemberState.CLOSING, MemberState.CLOSED):
                raise ClosedError(f"consumer {self._id} left group {self.group!r}; create a new member")

    def wait_for_assignment(self, timeout_s: float) -> Assignment:
        """Wait until the member is STABLE (holding its whole share) and return it;
        an empty frozenset after ``timeout_s``. Raises ClosedError once closed."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                if self._state in (MemberState.CLOSING, MemberState.CLOSED):
                    raise ClosedError(f"consumer {self._id} left group {self.group!r}")
                if (self._state is MemberState.STABLE and not self._events
                        and self._conn == KazooState.CONNECTED and not self._lost_pending):
                    return self._handed
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return frozenset()
                self._cond.wait(remaining)

    def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Store the next offset to consume for each ``(topic, partition)``.

        Only partitions whose owner node the member holds may be committed
        (its assignment, and inside ``on_revoked`` the partitions being
        revoked); any other raises :class:`raylog.PartitionNotAssignedError`
        and nothing is written. Raises :class:`raylog.ZooKeeperUnavailableError`
        while disconnected and :class:`raylog.SessionExpiredError` after a
        session loss (nothing written; the messages come again).
        """
        items = sorted(offsets.items())
        with self._ownership:
            with self._cond:
                if self._state in (MemberState.CREATED, MemberState.CLOSED):
                    raise ClosedError(f"consumer {self._id} is not in group {self.group!r}; nothing committed")
                lost = self._lost_pending or self._state is MemberState.LOST
                connected = self._conn == KazooState.CONNECTED
            if lost:
                raise SessionExpiredError(
                    f"cannot commit for group {self.group!r}: consumer {self._id} lost its ZooKeeper session "
                    f"and with it its partitions; nothing was committed and the messages are delivered again",
                    group=self.group)
            if not connected:
                raise ZooKeeperUnavailableError(
                    f"cannot commit for group {self.group!r}: consumer {self._id} lost its ZooKeeper "
                    f"connection; nothing was committed. Commit again once it is back",
                    group=self.group)
            foreign = [tp for tp, _ in items if tp not in self._owned]
            if foreign:
                raise PartitionNotAssignedError(
                    f"consumer {self._id} of group {self.group!r} does not own "
                    f"{', '.join(f'{t}/{p}' for t, p in foreign)} (it owns "
                    f"{', '.join(f'{t}/{p}' for t, p in sorted(self._owned)) or 'nothing'}); "
                    f"nothing was committed. Commit only the current assignment",
                    group=self.group, partitions=foreign)
            for (topic, partition), offset in items:
                self._offsets.commit(self.group, topic, partition, offset)

    def committed(self, topic: str, partition: int) -> int | None:
        """The group's committed offset of a partition (None if never committed)."""
        return self._offsets.committed(self.group, topic, partition)

    # ------------------------------------------------------------ event intake
    # On kazoo's threads: record, wake the member's thread, return (they only
    # touch the event queue under _cond).

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
                return Event.JOINED if self._zk_ops.register(self.topics, self._assignor_names) else Event.FAILED_STEP
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
            if not self._zk_ops.register(self.topics, self._assignor_names):
                return Event.FAILED_STEP
            members = sorted({*members, self._id})
        infos = self._zk_ops.subscriptions(members)
        own = infos.get(self._id)
        infos[self._id] = MemberInfo(self._id, frozenset(self.topics), self._assignor_names,
                                     own.joined if own is not None else UNKNOWN_JOINED)
        assignor = self._pick_assignor(infos.values())
        # Every topic of the group: an assignor may deal partitions across topics.
        group_topics = sorted({t for info in infos.values() for t in info.topics})
        counts = self._zk_ops.partition_counts(group_topics)
        with self._cond:
            self._last_members = frozenset(members)
            self._last_counts = dict(counts)
        self._watch_topics(group_topics)
        view = self._zk_ops.owners(self.topics) if assignors_.reads_owners(assignor) else None
        group_target = assignors_.assign(assignor, infos.values(), counts, view.holders() if view else None)
        target = group_target[self._id]

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
        if view is not None:
            # Computed from owners/ as this step read it: done only once the
            # group was seen holding exactly the assignment computed from it.
            elsewhere = self._not_yet_placed(view, group_target)
            if elsewhere:
                self._note_blocked(elsewhere, f"not yet where {assignor.name!r} puts them")
                return Event.INCOMPLETE
        self._blocked_since = None
        log.info("consumer %s of group %r: %d members, owns %s", self._id, self.group, len(members),
                 ", ".join(f"{t}/{p}" for t, p in sorted(target)) or "nothing")
        return Event.REBALANCED

    def _pick_assignor(self, infos) -> Assignor:
        """The assignor every member supports (:func:`raylog.groups.assignors.choose`)."""
        name = assignors_.choose(infos)
        chosen = next((a for a in self.assignors if a.name == name), None) or assignors_.BUILTIN[name]
        with self._cond:
            previous, self._assignor = self._assignor, name
        if previous != name:
            if name not in self._assignor_names:
                log.warning("consumer %s of group %r: no assignor is supported by every member (this one "
                            "lists %s); applying %r, which every member computes", self._id, self.group,
                            ", ".join(self._assignor_names), name)
            else:
                log.info("consumer %s of group %r: the group applies assignor %r", self._id, self.group, name)
        return chosen

    def _watch_topics(self, topics) -> None:
        """Watch the partition count of group topics this member does not
        subscribe to (an assignor may deal across topics)."""
        for topic in topics:
            if topic not in self._watched_topics:
                self._watched_topics.add(topic)
                self._watches.append(DataWatch(self.zk, self._zk_ops.paths.topic(topic), self._topic_watcher(topic)))

    def _not_yet_placed(self, view, group_target: Mapping[str, Assignment]) -> dict:
        """The partitions of this member's topics that ``view`` (owners/ read
        before assigning) did not show with the owner ``group_target`` gives
        them: ``{(topic, p): "held by X, assigned to Y"}``."""
        holders = view.holders()
        want = {tp: member for member, parts in group_target.items() for tp in parts if tp[0] in self.topics}
        return {tp: f"held by {holders.get(tp) or 'nobody'}, assigned to {want.get(tp) or 'nobody'}"
                for tp in sorted(set(want) | set(holders)) if holders.get(tp) != want.get(tp)}

    _blocked_since: float | None = None
    _warned = False

    def _note_blocked(self, busy: dict, what: str = "still held by another member") -> None:
        now = time.monotonic()
        if self._blocked_since is None:
            self._blocked_since, self._warned = now, False
        if not self._warned and now - self._blocked_since > self._warn_after_s:
            self._warned = True
            log.warning("consumer %s of group %r: %s %s after %.0fs; retrying until it lets go",
                        self._id, self.group, ", ".join(f"{t}/{p} ({h})" for (t, p), h in sorted(busy.items())),
                        what, now - self._blocked_since)

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
