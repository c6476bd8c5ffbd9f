"""Consumer-group membership and the paper's decentralized rebalance (DESIGN §4).

:class:`GroupMember` is one consumer's membership in a group. There is no
group leader: every member watches the same ZooKeeper nodes, computes the
same deterministic assignment from a fresh read, and claims its own share::

    /raylog/<cluster>/consumers/<group>/ids/<consumer id>        ephemeral  {"topics": [...]}
    /raylog/<cluster>/consumers/<group>/owners/<topic>/<p>       ephemeral  the owning consumer id
    /raylog/<cluster>/consumers/<group>/offsets/<topic>/<p>      persistent the next offset to consume

Usage (what a consumer does)::

    def revoked(partitions):            # stop fetching them, commit positions now
        try:
            member.commit({tp: positions[tp] for tp in partitions})
        except ZooKeeperUnavailableError:
            pass                        # revoked for a lost connection: re-read later (at-least-once)
        for tp in partitions:
            positions.pop(tp, None)

    def assigned(partitions):           # start fetching from the committed offsets
        for topic, p in partitions:
            offset = member.committed(topic, p)
            positions[(topic, p)] = offset if offset is not None else reset_offset(topic, p)

    member = GroupMember(zk, "default", "analytics", ["clicks"],
                         on_assigned=assigned, on_revoked=revoked)
    member.start(timeout_s=30)          # joined and holding its first assignment
    while running:
        member.check()                  # raises RebalanceError if the member failed
        for topic, p in member.assignment:      # empty while unsure of ownership
            ...fetch from positions[(topic, p)]...
        member.commit({...})            # only partitions it owns
    member.close()                      # on_revoked, then owner nodes and ids node go

State machine
-------------

:class:`MemberState` names the states; :attr:`GroupMember.state` shows the
current one. Apart from :meth:`GroupMember.start` leaving ``CREATED``, every
transition happens on the member's own thread.

``CREATED`` -> ``REGISTERING``
    :meth:`GroupMember.start` arms the watches (a ``ChildrenWatch`` on
    ``ids/`` and a ``DataWatch`` on each subscribed topic's node, whose
    JSON config holds the partition count) and wakes the member's thread,
    which creates the ephemeral ``ids/<consumer id>`` node.

``REGISTERING`` -> ``RELEASE`` -> ``ASSIGN`` -> ``CLAIM`` -> ``FETCHING``
    A rebalance. It runs after registering, whenever a watch reports a
    change under ``ids/`` or of a subscribed topic's partition count, and
    after every reconnection:

    ``RELEASE``
        ``on_revoked(partitions)`` is called with everything handed out
        (so the consumer commits its positions while it still owns the
        partitions), then the member deletes its own owner nodes.
    ``ASSIGN``
        A fresh read of ZooKeeper: the member ids and their subscriptions,
        and the partition count of each subscribed topic. For each topic
        the partitions ``0..P-1`` and the ids of the ``C`` members
        subscribed to it are sorted; member ``i`` takes the contiguous range
        of ``P // C`` partitions, plus one if ``i < P % C``
        (:func:`range_assignment`).
    ``CLAIM``
        The member creates the ephemeral owner node of each partition of
        its range, holding its id. A node still held by a previous owner
        (which has not finished its own ``RELEASE``) is retried with the
        bounded back-off of the member's :class:`~raylog.retry.RetryPolicy`;
        the member waits on a ZooKeeper watch of that node, so a claim
        proceeds as soon as the node is deleted. When the retries run out
        the whole rebalance is tried once more; if that fails as well the
        member goes to ``FAILED``.
    ``FETCHING``
        ``on_assigned(partitions)`` is called (the consumer reads the
        committed offsets and starts fetching); after it returns,
        :attr:`GroupMember.assignment` shows the partitions and
        :attr:`GroupMember.generation` has grown by one. If it raises, the
        rebalance starts over from ``RELEASE`` (which revokes the set
        again); a second failure in a row goes to ``FAILED``.

    A watch event during ``ASSIGN`` or ``CLAIM`` abandons the rebalance and
    starts another one (with ``RELEASE`` of what was claimed so far); events
    arriving while a rebalance is queued are absorbed by it, and every
    rebalance reads ZooKeeper afresh rather than trusting the events.

any -> ``SUSPENDED``
    The kazoo connection listener reports ``SUSPENDED`` (connection lost)
    or ``LOST`` (session expired). :attr:`GroupMember.assignment` is empty
    from that instant; the member's thread then calls ``on_revoked`` for
    what it had handed out (commits inside it fail with
    :class:`raylog.ZooKeeperUnavailableError`; the messages since the last
    commit are delivered again later, at-least-once). After ``LOST`` every
    ephemeral node is gone and the member forgets what it owned.

``SUSPENDED`` -> ``REGISTERING`` / ``RELEASE``
    On reconnection: after a lost session the member registers again, then
    rebalances from a fresh read (it never trusts local state); after a
    mere disconnection it rebalances (its owner nodes are still its own
    and are released first).

``CLAIM`` / ``FETCHING`` -> ``FAILED``
    The claims did not succeed within the retries, or ``on_assigned``
    raised, twice in a row. The
    member releases what it claimed, deletes its ids node (so the other
    members take over its share rather than leaving it unread) and
    :meth:`GroupMember.start`, :meth:`~GroupMember.check`,
    :meth:`~GroupMember.wait_for_assignment`, :meth:`~GroupMember.commit`
    and :attr:`~GroupMember.assignment` raise :class:`raylog.RebalanceError`.
    A failed member is finished; create a new one.

any -> ``CLOSED``
    :meth:`GroupMember.close`: ``on_revoked`` for what is handed out, then
    the owner nodes and the ids node are deleted, so the other members
    rebalance at once instead of waiting for a session timeout.

Threads: the kazoo listener and watch callbacks only record what happened
and wake the member's thread (no ZooKeeper calls there). The member's
thread does all the rebalance work and runs ``on_assigned``/``on_revoked``,
one at a time, in order; the callbacks may call :meth:`GroupMember.commit`
and :meth:`GroupMember.committed`. Every public method and property is safe
to call from any thread.

Two groups never interfere: everything of a group lives under its own
``consumers/<group>/`` node, and each group's members divide the whole of
each topic among themselves.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import socket
import threading
import time
import uuid
from typing import Callable, Iterable, Mapping, Sequence

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError
from kazoo.protocol.states import KazooState
from kazoo.recipe.watchers import ChildrenWatch, DataWatch

from raylog.config import TopicConfig
from raylog.errors import (
    ClosedError,
    ConfigError,
    PartitionNotAssignedError,
    RaylogError,
    RebalanceError,
    ZooKeeperUnavailableError,
)
from raylog.groups.offsets import REQUEST_TIMEOUT_S, OffsetStore
from raylog.groups.zkerrors import ensure_connected, zookeeper_errors
from raylog.groups.paths import Paths
from raylog.retry import RetryPolicy

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
Assignment = frozenset[TopicPartition]

def default_claim_retry(session_timeout_s: float) -> RetryPolicy:
    """The bounded back-off for claiming owner nodes a previous owner still holds.

    A claim proceeds as soon as the node is deleted (the member waits on a
    watch of it), so the back-off only bounds how long a stuck owner is
    tolerated. A previous owner that is cut off from ZooKeeper keeps its
    nodes until its session expires; the deadline therefore outlasts a
    session timeout (members of a group normally share one), with a floor
    of 15 s: ``max(15, 1.5 * session timeout + 5)`` seconds, probing at
    most every second.
    """
    deadline = max(15.0, 1.5 * session_timeout_s + 5.0)
    # 0.05 .. 0.8 s doubling (about 1.5 s in 5 tries), then once a second
    return RetryPolicy(
        max_tries=6 + int(deadline) + 1, delay_s=0.05, backoff=2.0, max_delay_s=1.0, jitter=0.2, deadline_s=deadline
    )

#: how long to wait before retrying a rebalance that ZooKeeper interrupted
_ZK_ERROR_PAUSE_S = 0.25


class MemberState(str, enum.Enum):
    """The states of a :class:`GroupMember` (see the module docstring)."""

    CREATED = "CREATED"
    REGISTERING = "REGISTERING"
    RELEASE = "RELEASE"
    ASSIGN = "ASSIGN"
    CLAIM = "CLAIM"
    FETCHING = "FETCHING"
    SUSPENDED = "SUSPENDED"
    FAILED = "FAILED"
    CLOSED = "CLOSED"

    def __str__(self) -> str:
        return self.value


def range_assignment(
    partition_counts: Mapping[str, int],
    subscriptions: Mapping[str, Iterable[str]],
) -> dict[str, Assignment]:
    """The paper's range assignment: ``{member id: frozenset((topic, p))}``.

    For each topic, the members subscribed to it are sorted by id and the
    partitions by number; member ``i`` of ``C`` takes a contiguous range of
    ``P // C`` partitions, plus one if ``i < P % C``. A topic missing from
    ``partition_counts`` has no partitions. Every member of
    ``subscriptions`` appears in the result (possibly with nothing).
    """
    owned: dict[str, set[TopicPartition]] = {member: set() for member in subscriptions}
    topics = sorted({topic for topics in subscriptions.values() for topic in topics})
    for topic in topics:
        members = sorted(m for m, ts in subscriptions.items() if topic in set(ts))
        count = partition_counts.get(topic, 0)
        share, extra = divmod(count, len(members))
        start = 0
        for i, member in enumerate(members):
            n = share + (1 if i < extra else 0)
            owned[member].update((topic, p) for p in range(start, start + n))
            start += n
    return {member: frozenset(parts) for member, parts in owned.items()}


def default_consumer_id() -> str:
    """``<host>-<pid>-<random>``: unique per member, readable in admin output."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _check_name(kind: str, name: str) -> str:
    if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
        raise ConfigError(f"a {kind} must be a non-empty string without '/', got {name!r}")
    return name


def partition_count(data: bytes | None) -> int:
    """The partition count in a topic node's JSON (0 for a missing node)."""
    if not data:
        return 0
    try:
        return TopicConfig.from_json(data).partitions
    except ConfigError:
        # Settings this version does not know; the count is all we need.
        count = json.loads(data).get("partitions")
        if not isinstance(count, int) or count < 0:
            raise
        return count


class _Interrupted(Exception):
    """A rebalance step was abandoned (a new trigger, a lost connection, close)."""


class _AssignFailed(Exception):
    """on_assigned raised (the cause is chained)."""


class _ClaimsExhausted(Exception):
    def __init__(self, holders: dict[TopicPartition, str | None]):
        super().__init__(holders)
        self.holders = holders


class GroupMember:
    """One consumer's membership in a consumer group (see the module docstring).

    ``topics`` are the topics it subscribes to. ``on_assigned`` and
    ``on_revoked`` receive a ``frozenset`` of ``(topic, partition)``; they
    run on the member's thread, one at a time, and every ``on_assigned`` is
    followed by exactly one ``on_revoked`` of the same set before the next
    ``on_assigned``. An exception raised by ``on_revoked`` is logged and
    does not stop the rebalance (the owner nodes are released regardless, so
    the other members are never blocked by it). An exception raised by
    ``on_assigned`` means the consumer did not take its partitions: they
    are revoked again (``on_revoked``), released, and the rebalance is tried
    once more; a second failure fails the member (:class:`raylog.RebalanceError`
    chaining the cause), so no partition is held by a member that does not
    read it. ``retry`` bounds the claim
    back-off (default :func:`default_claim_retry` of the client's session
    timeout); each rebalance is tried twice, so a claim blocked for
    good fails after about twice the policy's deadline.

    The member uses ``zk`` but does not own it: closing the member leaves
    the client running. Several members may share one client (one session).

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
        request_timeout_s: float = REQUEST_TIMEOUT_S,
    ):
        if isinstance(topics, str):
            raise ConfigError(f"topics is a list of topic names, got the string {topics!r}")
        topics = tuple(sorted({_check_name("topic name", t) for t in topics}))
        if not topics:
            raise ConfigError("a group member subscribes to at least one topic")
        self.zk = zk
        self.cluster = cluster
        self.group = _check_name("group name", group)
        self.topics: tuple[str, ...] = topics
        self._id = _check_name("consumer id", consumer_id) if consumer_id is not None else default_consumer_id()
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked
        self._retry = retry or default_claim_retry(getattr(zk, "_session_timeout", 10_000) / 1000.0)
        self._request_timeout_s = request_timeout_s
        self._paths = Paths(cluster)
        self._offsets = OffsetStore(zk, cluster, request_timeout_s=request_timeout_s)
        self._id_bytes = self._id.encode()

        # Everything below is guarded by _cond (the state lock).
        self._cond = threading.Condition()
        self._state = MemberState.CREATED
        self._generation = 0
        self._handed_out: Assignment = frozenset()  # what on_assigned was given
        self._connected = False                     # the listener's view, updated at once
        self._suspended_seen = False                # a SUSPENDED not yet handled by the thread
        self._session_lost = False                  # a LOST not yet handled by the thread
        self._registered = False
        self._dirty = False                         # a rebalance is queued
        self._closing = False
        self._wakeups = 0                           # bumped by owner/ids node watches
        self._last_members: frozenset[str] | None = None
        self._last_counts: dict[str, int] = {}
        self._error: RaylogError | None = None
        self._thread: threading.Thread | None = None
        self._watches: list = []

        # Owner nodes this member holds. Guarded by _ownership, which commit
        # holds across its check and write and RELEASE holds while deleting,
        # so a commit that returns landed while the member held the node.
        self._ownership = threading.RLock()
        self._owned: set[TopicPartition] = set()

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
        """The number of rebalances this member completed."""
        with self._cond:
            return self._generation

    @property
    def assignment(self) -> Assignment:
        """The partitions this member owns and may fetch now.

        Empty whenever the member is not sure it owns anything: before the
        first rebalance, during a rebalance, while disconnected and after a
        session loss until it has registered and rebalanced again. Raises
        the :class:`raylog.RebalanceError` of a failed member.
        """
        with self._cond:
            if self._error is not None:
                raise self._error
            if self._state is MemberState.FETCHING and self._connected and not self._session_lost:
                return self._handed_out
            return frozenset()

    @property
    def error(self) -> RaylogError | None:
        """The error that made the member fail, if it did."""
        with self._cond:
            return self._error

    def __repr__(self) -> str:
        return (
            f"GroupMember({self._id!r}, group={self.group!r}, topics={list(self.topics)}, "
            f"state={self._state}, generation={self._generation})"
        )

    # ------------------------------------------------------------- lifecycle

    def start(self, timeout_s: float = 30.0) -> Assignment:
        """Join the group and return the first assignment (possibly empty,
        when there are more members than partitions).

        Raises :class:`raylog.ZooKeeperUnavailableError` if ZooKeeper is not
        reachable, :class:`raylog.RebalanceError` if the first rebalance
        fails or does not finish within ``timeout_s`` (the member then
        leaves the group again).
        """
        with self._cond:
            if self._state is not MemberState.CREATED:
                raise ConfigError(f"{self!r} was already started; create a new GroupMember")
            self._state = MemberState.REGISTERING
        try:
            ensure_connected(self.zk, f"join group {self.group!r}")
            with zookeeper_errors(self.zk, f"join group {self.group!r}"):
                self.zk.ensure_path(self._paths.ids(self.group))
        except BaseException:
            with self._cond:
                self._state = MemberState.CLOSED
            raise
        with self._cond:
            self._connected = True
            self._dirty = True
        self.zk.add_listener(self._on_connection_change)
        try:
            # Arm the watches before the first read, so no change falls between.
            with zookeeper_errors(self.zk, f"watch group {self.group!r}"):
                self._watches = [ChildrenWatch(self.zk, self._paths.ids(self.group), self._on_members_changed)]
                self._watches += [
                    DataWatch(self.zk, self._paths.topic(topic), self._topic_watcher(topic))
                    for topic in self.topics
                ]
        except BaseException:
            with self._cond:
                self._state = MemberState.CLOSED  # the watches stop at their next event
            self.zk.remove_listener(self._on_connection_change)
            raise
        self._thread = threading.Thread(
            target=self._run, name=f"raylog-group-{self.group}-{self._id}", daemon=True
        )
        self._thread.start()

        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._generation == 0 and self._error is None and self._state is not MemberState.CLOSED:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            if self._error is not None:
                raise self._error
            if self._generation > 0:
                return self._handed_out if self._state is MemberState.FETCHING else frozenset()
            state = self._state
        self.close()
        raise RebalanceError(
            f"consumer {self._id} did not complete its first rebalance of group {self.group!r} "
            f"within {timeout_s:g}s (it was in state {state}); it left the group. "
            f"Check ZooKeeper and the other members, then start a new member",
            group=self.group,
            consumer_id=self._id,
        )

    def close(self, timeout_s: float = 10.0) -> None:
        """Leave the group: ``on_revoked`` for what is handed out (so the
        consumer commits), then delete the owner nodes and the ids node.

        Idempotent. Called from a callback, it returns at once and the
        member leaves as soon as the callback returns.
        """
        with self._cond:
            if self._state is MemberState.CREATED:
                self._state = MemberState.CLOSED
            if self._state in (MemberState.CLOSED, MemberState.FAILED) and not self._thread_alive():
                return
            self._closing = True
            self._cond.notify_all()
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            return
        thread.join(timeout_s)
        if thread.is_alive():
            log.warning(
                "consumer %s of group %r did not finish leaving within %gs; its nodes vanish "
                "when its ZooKeeper session ends",
                self._id, self.group, timeout_s,
            )

    def __enter__(self) -> "GroupMember":
        if self.state is MemberState.CREATED:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _thread_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ------------------------------------------------------------- consumer API

    def check(self) -> None:
        """Raise the member's :class:`raylog.RebalanceError` if it failed,
        :class:`raylog.ClosedError` if it was closed."""
        with self._cond:
            self._check_usable_locked()

    def _check_usable_locked(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closing or self._state is MemberState.CLOSED:
            raise ClosedError(f"consumer {self._id} left group {self.group!r}; create a new member")

    def wait_for_assignment(self, timeout_s: float) -> Assignment:
        """Wait until the member holds a settled assignment and return it.

        Returns an empty frozenset after ``timeout_s`` if the member is still
        rebalancing or disconnected (see :attr:`state`); raises
        :class:`raylog.RebalanceError` for a failed member and
        :class:`raylog.ClosedError` for a closed one.
        """
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                self._check_usable_locked()
                if (
                    self._state is MemberState.FETCHING
                    and self._connected
                    and not self._session_lost
                    and not self._dirty
                ):
                    return self._handed_out
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return frozenset()
                self._cond.wait(remaining)

    def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Store the next offset to consume for each ``(topic, partition)``.

        Synchronous and persistent. Only partitions the member owns may be
        committed (its assignment, and inside ``on_revoked`` the partitions
        being revoked); any other raises :class:`PartitionNotAssignedError`
        and nothing is written. Raises
        :class:`raylog.ZooKeeperUnavailableError` while ZooKeeper is
        unreachable (nothing or only part is written then; commit again).
        """
        items = sorted(offsets.items())
        with self._ownership:
            with self._cond:
                if self._error is not None:
                    raise self._error
                if self._state in (MemberState.CLOSED, MemberState.CREATED):
                    raise ClosedError(f"consumer {self._id} is not in group {self.group!r}; nothing committed")
                # SUSPENDED: revoked for a lost connection or session; what
                # it owned is uncertain until it has rebalanced.
                connected = self._connected and not self._session_lost and self._state is not MemberState.SUSPENDED
            if not connected:
                raise ZooKeeperUnavailableError(
                    f"cannot commit for group {self.group!r}: consumer {self._id} lost its ZooKeeper "
                    f"connection; nothing was committed. It rejoins when ZooKeeper is reachable; the "
                    f"uncommitted messages are delivered again",
                    group=self.group,
                )
            foreign = [tp for tp, _ in items if tp not in self._owned]
            if foreign:
                raise PartitionNotAssignedError(
                    f"consumer {self._id} of group {self.group!r} does not own "
                    f"{', '.join(f'{t}/{p}' for t, p in foreign)} (it owns "
                    f"{', '.join(f'{t}/{p}' for t, p in sorted(self._owned)) or 'nothing'}); "
                    f"nothing was committed. Commit only the current assignment",
                    group=self.group,
                    partitions=foreign,
                )
            for (topic, partition), offset in items:
                self._offsets.commit(self.group, topic, partition, offset)

    def committed(self, topic: str, partition: int) -> int | None:
        """The group's committed offset of a partition (None if never committed)."""
        return self._offsets.committed(self.group, topic, partition)

    # ------------------------------------------------------------ event intake
    # These run on kazoo's threads: record, wake the member's thread, return.

    def _on_connection_change(self, state: str) -> bool:
        with self._cond:
            if self._state in (MemberState.CLOSED, MemberState.FAILED):
                return True  # remove the listener
            if state == KazooState.SUSPENDED:
                self._connected = False
                self._suspended_seen = True
            elif state == KazooState.LOST:
                self._connected = False
                self._session_lost = True
            else:  # CONNECTED
                self._connected = True
                self._dirty = True
            self._cond.notify_all()
        return False

    def _on_members_changed(self, children: list[str]):
        with self._cond:
            if self._state in (MemberState.CLOSED, MemberState.FAILED):
                return False  # stop watching
            if frozenset(children) != self._last_members:
                self._dirty = True
            self._wakeups += 1
            self._cond.notify_all()
        return None

    def _topic_watcher(self, topic: str):
        def on_topic_changed(data, stat):
            with self._cond:
                if self._state in (MemberState.CLOSED, MemberState.FAILED):
                    return False
                try:
                    count = partition_count(data)
                except (ValueError, RaylogError):
                    count = -1  # unreadable: let the rebalance read it and report
                if count != self._last_counts.get(topic):
                    self._dirty = True
                    self._cond.notify_all()
            return None

        return on_topic_changed

    def _on_node_event(self, event) -> None:
        """A watch on an owner (or ids) node this member waits for fired."""
        with self._cond:
            self._wakeups += 1
            self._cond.notify_all()

    # ------------------------------------------------------------ the member's thread

    def _has_work_locked(self) -> bool:
        return (
            self._closing
            or self._session_lost
            or self._suspended_seen
            or (self._connected and (self._dirty or not self._registered))
        )

    def _interrupt_pending_locked(self) -> bool:
        return (
            self._closing
            or self._dirty
            or self._session_lost
            or self._suspended_seen
            or not self._connected
            or not self._registered
        )

    def _check_interrupt(self) -> None:
        with self._cond:
            if self._interrupt_pending_locked():
                raise _Interrupted()

    def _set_state(self, state: MemberState) -> None:
        with self._cond:
            self._state = state
            self._cond.notify_all()

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._has_work_locked():
                        self._cond.wait()
                # Lock order: _ownership before _cond (as in commit). A lost
                # session's owner nodes are forgotten in the same step that
                # consumes the loss, so no commit slips in between.
                with self._ownership, self._cond:
                    closing = self._closing
                    lost, self._session_lost = self._session_lost, False
                    suspended, self._suspended_seen = self._suspended_seen, False
                    if lost:
                        self._registered = False
                        self._owned.clear()  # the session's ephemeral nodes are gone
                if closing:
                    self._leave()
                    return
                if lost or suspended:
                    self._suspend(lost)
                    continue
                try:
                    with self._cond:
                        registered = self._registered
                    if not registered:
                        self._register()
                    self._rebalance()
                except _Interrupted:
                    continue
                except (ZooKeeperUnavailableError, NodeExistsError, NoNodeError) as err:
                    # ZooKeeper went away mid-step, or a node changed under us;
                    # start over from a fresh read once the dust settles.
                    log.info("consumer %s of group %r: rebalance interrupted (%s); retrying",
                             self._id, self.group, err)
                    with self._cond:
                        self._dirty = True
                    self._pause(_ZK_ERROR_PAUSE_S, interruptible=False)
                except RebalanceError as err:
                    self._fail(err)
                    return
        except Exception as err:  # noqa: BLE001 - a bug must not leave partitions unread silently
            log.exception("consumer %s of group %r: rebalance thread failed", self._id, self.group)
            self._fail(RebalanceError(
                f"consumer {self._id} of group {self.group!r} failed during a rebalance: "
                f"{type(err).__name__}: {err}; it left the group. Start a new member",
                group=self.group, consumer_id=self._id,
            ))

    def _pause(self, seconds: float, *, interruptible: bool = True) -> None:
        """Sleep up to ``seconds``; wake early on a node watch or, if
        ``interruptible``, on anything that interrupts a rebalance."""
        deadline = time.monotonic() + seconds
        with self._cond:
            seen = self._wakeups
            while self._wakeups == seen and not self._closing:
                if interruptible and self._interrupt_pending_locked():
                    return
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self._cond.wait(remaining)

    def _call(self, what: str, fn, *args, **kwargs):
        """A ZooKeeper request with a bounded wait, failures as raylog errors."""
        with zookeeper_errors(self.zk, what):
            return fn(*args, **kwargs).get(timeout=self._request_timeout_s)

    def _session_id(self) -> int | None:
        client_id = self.zk.client_id
        return client_id[0] if client_id else None

    def _callback(self, name: str, fn, partitions: Assignment) -> None:
        if fn is None:
            return
        try:
            fn(partitions)
        except Exception:  # noqa: BLE001 - logged; the rebalance must go on
            log.exception(
                "consumer %s of group %r: %s(%s) raised; continuing the rebalance",
                self._id, self.group, name, sorted(partitions),
            )

    def _revoke_handed_out(self) -> None:
        """Take back what on_assigned gave out, calling on_revoked for it."""
        with self._cond:
            held, self._handed_out = self._handed_out, frozenset()
        if held:
            self._callback("on_revoked", self._on_revoked, held)

    # REGISTERING ----------------------------------------------------------

    def _register(self) -> None:
        self._set_state(MemberState.REGISTERING)
        path = self._paths.member(self.group, self._id)
        data = json.dumps({"topics": list(self.topics)}).encode()
        what = f"register consumer {self._id} in group {self.group!r}"
        started = time.monotonic()
        delays = self._retry.delays()
        while True:
            self._check_closing()
            try:
                self._call(what, self.zk.create_async, path, data, ephemeral=True, makepath=True)
                break
            except NodeExistsError:
                try:
                    _, stat = self._call(what, self.zk.get_async, path, watch=self._on_node_event)
                except NoNodeError:
                    continue
                if stat.ephemeralOwner == self._session_id():
                    break  # ours: an earlier try succeeded before the connection dropped
            # Held by another session: a previous incarnation of this id whose
            # session has not expired yet, or a live duplicate.
            pause = self._next_pause(delays, started)
            if pause is None:
                raise RebalanceError(
                    f"consumer id {self._id!r} is registered in group {self.group!r} by another "
                    f"ZooKeeper session; use a unique consumer id (or wait for the old session to expire)",
                    group=self.group, consumer_id=self._id,
                )
            self._pause(pause, interruptible=False)
        with self._cond:
            self._registered = True
            self._dirty = True
        log.info("consumer %s joined group %r (topics %s)", self._id, self.group, list(self.topics))

    def _check_closing(self) -> None:
        with self._cond:
            if self._closing or not self._connected or self._session_lost:
                raise _Interrupted()

    def _next_pause(self, delays, started: float) -> float | None:
        pause = next(delays, None)
        deadline = self._retry.deadline_s
        if pause is None or (deadline is not None and time.monotonic() - started + pause > deadline):
            return None
        return pause

    # the rebalance ----------------------------------------------------------

    def _rebalance(self) -> None:
        """RELEASE -> ASSIGN -> CLAIM -> FETCHING, the claims tried twice."""
        for attempt in (1, 2):
            self._release()
            wanted, members = self._assign()
            try:
                self._claim(wanted)
            except _ClaimsExhausted as err:
                held = ", ".join(
                    f"{t}/{p} (held by {holder or 'unknown'})" for (t, p), holder in sorted(err.holders.items())
                )
                if attempt == 1:
                    log.warning("consumer %s of group %r could not claim %s; retrying the rebalance",
                                self._id, self.group, held)
                    continue
                raise RebalanceError(
                    f"consumer {self._id} of group {self.group!r} could not claim {held} within "
                    f"{self._retry.max_tries} tries ({self._retry.deadline_s}s), twice; the owner does "
                    f"not release it. This member left the group so its share is not left unread; "
                    f"stop the stale owner, then start a new member",
                    group=self.group, consumer_id=self._id, partitions=sorted(err.holders),
                ) from None
            try:
                self._fetch(wanted, members)
            except _AssignFailed as err:
                cause = err.__cause__
                if attempt == 1:
                    log.warning("consumer %s of group %r: on_assigned raised %r; revoking and retrying the "
                                "rebalance", self._id, self.group, cause)
                    continue
                raise RebalanceError(
                    f"consumer {self._id} of group {self.group!r}: on_assigned failed twice "
                    f"({type(cause).__name__}: {cause}); the consumer could not take its partitions, so "
                    f"this member left the group rather than hold them unread. Fix the cause, then start "
                    f"a new member",
                    group=self.group, consumer_id=self._id,
                ) from cause
            return

    def _release(self) -> None:
        """RELEASE: on_revoked (commits land now), then delete own owner nodes."""
        self._set_state(MemberState.RELEASE)
        self._revoke_handed_out()
        with self._ownership:
            self._delete_owner_nodes()

    def _delete_owner_nodes(self) -> None:
        owned = sorted(self._owned)
        if not owned:
            return
        what = f"release partitions of consumer {self._id} in group {self.group!r}"
        pending = [(tp, self.zk.delete_async(self._paths.owner(self.group, *tp))) for tp in owned]
        for tp, result in pending:
            try:
                self._call(what, lambda: result)
            except NoNodeError:
                pass
            self._owned.discard(tp)

    def _assign(self) -> tuple[Assignment, frozenset[str]]:
        """ASSIGN: a fresh read of members, subscriptions and partition counts."""
        with self._cond:
            self._state = MemberState.ASSIGN
            self._dirty = False  # this read absorbs every trigger so far
            self._cond.notify_all()
        what = f"read the members of group {self.group!r}"
        children = self._call(what, self.zk.get_children_async, self._paths.ids(self.group))
        if self._id not in children:
            # Our ids node is gone (deleted from outside, or a session change
            # raced us): register again before taking anything.
            with self._cond:
                self._registered = False
                self._dirty = True
            raise _Interrupted()
        reads = [(m, self.zk.get_async(self._paths.member(self.group, m))) for m in children]
        subscriptions: dict[str, list[str]] = {}
        for member, result in reads:
            try:
                data, _ = self._call(what, lambda: result)
            except NoNodeError:
                continue  # left meanwhile; its watch event is on its way
            subscriptions[member] = self._parse_subscription(member, data)
        subscriptions[self._id] = list(self.topics)
        counts: dict[str, int] = {}
        for topic in self.topics:
            try:
                data, _ = self._call(f"read topic {topic!r}", self.zk.get_async, self._paths.topic(topic))
            except NoNodeError:
                data = None
            counts[topic] = partition_count(data)
            if data is None:
                log.info("consumer %s of group %r: topic %r does not exist (yet); it gets no partitions",
                         self._id, self.group, topic)
        members = frozenset(children)
        with self._cond:
            self._last_members = members
            self._last_counts = dict(counts)
        wanted = range_assignment(counts, subscriptions)[self._id]
        return wanted, members

    def _parse_subscription(self, member: str, data: bytes) -> list[str]:
        try:
            topics = json.loads(data)["topics"]
            if isinstance(topics, list) and all(isinstance(t, str) for t in topics):
                return topics
        except (ValueError, KeyError, TypeError):
            pass
        log.warning("group %r: member %s has an unreadable registration %r; it gets no partitions",
                    self.group, member, data[:200])
        return []

    def _claim(self, wanted: Assignment) -> None:
        """CLAIM: create each owner node, waiting (bounded) for previous owners."""
        self._set_state(MemberState.CLAIM)
        remaining = sorted(wanted)
        holders: dict[TopicPartition, str | None] = {}
        started = time.monotonic()
        delays = self._retry.delays()
        what = f"claim partitions for consumer {self._id} in group {self.group!r}"
        session = self._session_id()
        while remaining:
            self._check_interrupt()
            creates = [
                (tp, self.zk.create_async(self._paths.owner(self.group, *tp), self._id_bytes,
                                          ephemeral=True, makepath=True))
                for tp in remaining
            ]
            busy = []
            for tp, result in creates:
                try:
                    self._call(what, lambda: result)
                except NodeExistsError:
                    busy.append(tp)
                    continue
                with self._ownership:
                    self._owned.add(tp)
            still = []
            for tp in busy:
                try:
                    data, stat = self._call(what, self.zk.get_async, self._paths.owner(self.group, *tp),
                                            watch=self._on_node_event)
                except NoNodeError:
                    still.append(tp)  # released just now; claim again at once
                    continue
                if stat.ephemeralOwner == session:
                    with self._ownership:
                        self._owned.add(tp)  # ours: created before a connection hiccup
                    continue
                holders[tp] = data.decode(errors="replace")
                still.append(tp)
            remaining = still
            if not remaining:
                return
            if any(tp in holders for tp in remaining):
                pause = self._next_pause(delays, started)
                if pause is None:
                    raise _ClaimsExhausted({tp: holders.get(tp) for tp in remaining})
                self._pause(pause)

    def _fetch(self, wanted: Assignment, members: frozenset[str]) -> None:
        """FETCHING: hand the partitions out, then show them."""
        self._check_interrupt()
        with self._cond:
            self._handed_out = wanted  # from here on, RELEASE revokes it
        if self._on_assigned is not None:
            try:
                self._on_assigned(wanted)
            except Exception as err:  # noqa: BLE001 - judged just below
                self._check_interrupt()  # ZooKeeper went away meanwhile: not the consumer's fault
                raise _AssignFailed() from err
        with self._cond:
            self._generation += 1
            self._state = MemberState.FETCHING
            self._cond.notify_all()
        log.info("consumer %s of group %r: generation %d, %d members, owns %s",
                 self._id, self.group, self._generation, len(members),
                 ", ".join(f"{t}/{p}" for t, p in sorted(wanted)) or "nothing")

    # SUSPENDED, FAILED, CLOSED ----------------------------------------------

    def _suspend(self, lost: bool) -> None:
        self._set_state(MemberState.SUSPENDED)
        log.warning("consumer %s of group %r: ZooKeeper %s; holding nothing until it rejoins",
                    self._id, self.group, "session expired" if lost else "connection lost")
        self._revoke_handed_out()
        with self._cond:
            self._dirty = True

    def _leave(self) -> None:
        """Close: on_revoked, then delete the owner nodes and the ids node."""
        self._revoke_handed_out()
        try:
            ensure_connected(self.zk, f"leave group {self.group!r}")
            with self._ownership:
                self._delete_owner_nodes()
            with self._cond:
                registered = self._registered
            if registered:
                try:
                    self._call(f"leave group {self.group!r}", self.zk.delete_async,
                               self._paths.member(self.group, self._id))
                except NoNodeError:
                    pass
        except ZooKeeperUnavailableError as err:
            log.warning("consumer %s of group %r left while ZooKeeper is unreachable (%s); its nodes "
                        "vanish when its session ends", self._id, self.group, err)
        finally:
            with self._ownership:
                self._owned.clear()
            with self._cond:
                self._registered = False
                self._state = MemberState.CLOSED
                self._cond.notify_all()
            self.zk.remove_listener(self._on_connection_change)
        log.info("consumer %s left group %r", self._id, self.group)

    def _fail(self, err: RebalanceError) -> None:
        log.error("%s", err)
        self._revoke_handed_out()
        try:
            ensure_connected(self.zk, f"leave group {self.group!r}")
            with self._ownership:
                self._delete_owner_nodes()
            try:
                self._call(f"leave group {self.group!r}", self.zk.delete_async,
                           self._paths.member(self.group, self._id))
            except NoNodeError:
                pass
        except (RaylogError, NodeExistsError) as cleanup_err:
            log.warning("consumer %s of group %r: could not leave the group cleanly (%s); its nodes "
                        "vanish when its session ends", self._id, self.group, cleanup_err)
        finally:
            with self._ownership:
                self._owned.clear()
            with self._cond:
                self._error = err
                self._registered = False
                self._state = MemberState.FAILED
                self._cond.notify_all()
            self.zk.remove_listener(self._on_connection_change)
