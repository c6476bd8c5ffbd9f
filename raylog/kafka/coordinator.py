"""Kafka-protocol consumer groups: JoinGroup, SyncGroup, Heartbeat and
LeaveGroup for Kafka clients that ``subscribe()`` (docs/design.md section 10).

**Where a group lives.** Each group is coordinated by one listener: the one
at ``crc32(group id) mod n`` over the registered listeners sorted by node
identity (:meth:`Coordinator.entry_for`; FindCoordinator answers it, every
other listener answers NOT_COORDINATOR). The group's state (members,
generation, leader, assignments) is in that listener's memory only. When
the set of listeners changes so that a group hashes elsewhere, the old
coordinator drops the group (its members get NOT_COORDINATOR, look the
coordinator up again and join the new one afresh); a listener that dies
loses its groups the same way. Committed offsets are not group state: they
are in ZooKeeper where raylog's groups keep them
(:mod:`raylog.kafka.group_offsets`), so a new coordinator's members resume
from them. While a group has members, the coordinator keeps an ephemeral
``consumers/<group>/kafka/<node>`` listing them
(:mod:`raylog.groups.kafka_members`), so raylog consumers refuse to join it,
and it refuses a JoinGroup while the group has raylog members
(INCONSISTENT_GROUP_PROTOCOL: the members' protocols are incompatible).

**The classic group protocol** (Kafka's GroupCoordinator, without the
MEMBER_ID_REQUIRED round trip). A :class:`Group` is in one
of four states::

    EMPTY --JoinGroup--> PREPARING_REBALANCE --every member joined, or the
          rebalance timeout--> COMPLETING_REBALANCE --the leader's SyncGroup-->
          STABLE --JoinGroup, LeaveGroup, a session expired--> PREPARING_REBALANCE

* JoinGroup from a new member (empty member id) gets a new id; any JoinGroup
  starts a rebalance unless one is under way. The JoinGroup answer waits
  until every known member has joined again (the others learn of the
  rebalance from REBALANCE_IN_PROGRESS in Heartbeat) or the largest
  rebalance timeout has passed since the rebalance began (members that did
  not join by then are removed). Then the generation goes up by one, the
  protocol is the leader's first one every member supports, the leader (the
  previous one if it joined again, else the first to join) gets every
  member's metadata, the others none.
* SyncGroup from the leader carries the assignment; it and every follower's
  SyncGroup are answered with the member's own part. A follower's SyncGroup
  waits for the leader's; a rebalance that starts meanwhile answers it
  REBALANCE_IN_PROGRESS.
* Heartbeat: REBALANCE_IN_PROGRESS while PREPARING_REBALANCE (the member
  must join again), else NONE (Kafka 2.3 on: a member may heartbeat between
  its JoinGroup and SyncGroup answers).
* UNKNOWN_MEMBER_ID for a member id the group does not have (it was removed;
  the client joins again with an empty id), ILLEGAL_GENERATION for an old
  generation (the client joins again with its id).
* A member not heard from (Heartbeat, JoinGroup, SyncGroup, OffsetCommit)
  within its session timeout is removed and the group rebalances; a member
  waiting for a JoinGroup or SyncGroup answer is not timed out meanwhile.
* LeaveGroup removes the member and the group rebalances (or becomes EMPTY).
* **Static membership** (KIP-345, ``group.instance.id``): a member that
  joins with an instance id keeps it as the group's name for it. A JoinGroup
  with an empty member id and an instance id the group knows *replaces* that
  member: it gets a new member id and the old one is fenced (its requests
  are answered FENCED_INSTANCE_ID, a wait of it is ended so). In STABLE the
  replacement takes the old member's assignment at the current generation,
  answered at once, **without a rebalance** (so a static member that
  restarts within its session timeout moves no partition; the clients do
  not send LeaveGroup for it); in a rebalance it joins it. Every request
  that names an instance id is checked against it (UNKNOWN_MEMBER_ID for an
  instance id the group does not have, FENCED_INSTANCE_ID for a member id
  that is not the instance's current one). A static member is removed as a
  dynamic one is: by LeaveGroup (v3 names it by instance id too) or when its
  session times out.
* OffsetCommit with a member id and generation is checked by
  :meth:`Coordinator.check_commit`: allowed in STABLE and PREPARING_REBALANCE
  (a member commits what it processed before it joins again), refused with
  REBALANCE_IN_PROGRESS while COMPLETING_REBALANCE.

Group administration (:mod:`raylog.kafka.group_admin`) reads a group here
through :meth:`Coordinator.snapshot` (state, members with their client id,
address, subscription and assignment).

:class:`Group` is the pure state machine (time is an argument; tested
alone). :class:`Coordinator` holds the groups of one listener behind one
lock: request threads block on its condition for JoinGroup and SyncGroup
answers, and a sweeper thread (started with the first JoinGroup) times out
sessions and rebalances every :data:`SWEEP_S`.

Thread-safety: :class:`Coordinator` is thread-safe; a :class:`Group` is
confined to its coordinator's lock.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
import zlib

from kafka.protocol.consumer import HeartbeatResponse, JoinGroupResponse, LeaveGroupResponse, SyncGroupResponse
from kazoo.exceptions import NoNodeError

from raylog.groups import kafka_members
from raylog.kafka.consumer_protocol import CONSUMER, assigned_partitions, subscribed_topics

log = logging.getLogger(__name__)

# Kafka error codes
NONE = 0
NOT_COORDINATOR = 16
ILLEGAL_GENERATION = 22
INCONSISTENT_GROUP_PROTOCOL = 23
INVALID_GROUP_ID = 24
UNKNOWN_MEMBER_ID = 25
INVALID_SESSION_TIMEOUT = 26
REBALANCE_IN_PROGRESS = 27
FENCED_INSTANCE_ID = 82
UNKNOWN_SERVER_ERROR = -1

EMPTY = "Empty"
PREPARING_REBALANCE = "PreparingRebalance"
COMPLETING_REBALANCE = "CompletingRebalance"
STABLE = "Stable"

#: the session timeouts accepted (Kafka's group.min/max.session.timeout.ms, the minimum lower for tests)
MIN_SESSION_TIMEOUT_MS = 1000
MAX_SESSION_TIMEOUT_MS = 1_800_000
#: how often sessions and rebalance deadlines are checked
SWEEP_S = 0.1
#: how long the listener set read from ZooKeeper is trusted
LISTENERS_TTL_S = 1.0
#: the longest a JoinGroup or SyncGroup answer waits beyond the rebalance timeout
WAIT_SLACK_S = 10.0


class Member:
    """One member of a group (fields only)."""

    __slots__ = ("member_id", "client_id", "client_host", "protocols", "session_timeout_ms", "rebalance_timeout_ms",
                 "last_seen", "join_result", "awaiting_join", "sync_result", "awaiting_sync", "assignment",
                 "instance_id")

    def __init__(self, member_id: str, client_id: str, instance_id: str | None = None):
        self.member_id, self.client_id = member_id, client_id
        #: the member's ``group.instance.id`` (static membership), None for a dynamic member
        self.instance_id = instance_id
        #: the client's address as Kafka shows it (``/127.0.0.1``), "" when not known
        self.client_host = ""
        self.protocols: list[tuple[str, bytes]] = []
        self.session_timeout_ms = self.rebalance_timeout_ms = 0
        self.last_seen = 0.0
        #: JoinResult once the member's pending JoinGroup is answered
        self.join_result = None
        self.awaiting_join = False
        #: (error, assignment) once the member's pending SyncGroup is answered
        self.sync_result = None
        self.awaiting_sync = False
        self.assignment = b""


class JoinResult:
    """What one JoinGroup is answered."""

    __slots__ = ("error", "generation", "protocol_type", "protocol", "leader", "member_id", "members", "instances")

    def __init__(self, error, generation=-1, protocol_type=None, protocol=None, leader="", member_id="",
                 members=(), instances=None):
        self.error, self.generation, self.protocol_type, self.protocol = error, generation, protocol_type, protocol
        self.leader, self.member_id, self.members = leader, member_id, list(members)
        #: member id -> instance id of the static members among ``members`` (the leader's answer)
        self.instances = instances or {}


class Group:
    """One group's state machine (see the module docstring). Pure: every
    method takes the time ``now`` (seconds, monotonic) and only changes the
    group; nothing blocks."""

    def __init__(self, group_id: str):
        self.group_id = group_id
        self.state = EMPTY
        self.generation = 0
        self.protocol_type: str | None = None
        self.protocol: str | None = None
        self.leader: str | None = None
        self.members: dict[str, Member] = {}
        #: instance id -> the member id of its current member (static members)
        self.static: dict[str, str] = {}
        self.rebalance_deadline = 0.0

    def __repr__(self) -> str:
        return (f"Group({self.group_id!r}, {self.state}, generation={self.generation}, leader={self.leader}, "
                f"members={sorted(self.members)})")

    # -- requests ----------------------------------------------------------------

    def join(self, member_id: str, client_id: str, protocol_type: str, protocols, session_timeout_ms: int,
             rebalance_timeout_ms: int, now: float, instance_id: str | None = None) -> tuple[int, str]:
        """Register a JoinGroup; ``(error, member id)``. With NONE the answer
        is in the member's ``join_result``, now or later. ``instance_id``:
        the member's ``group.instance.id`` (static membership), or None."""
        protocols = [(name, bytes(metadata or b"")) for name, metadata in protocols]
        if not MIN_SESSION_TIMEOUT_MS <= session_timeout_ms <= MAX_SESSION_TIMEOUT_MS:
            return INVALID_SESSION_TIMEOUT, member_id
        if not protocol_type or not protocols:
            return INCONSISTENT_GROUP_PROTOCOL, member_id
        if instance_id and member_id:
            error = self._check_instance(member_id, instance_id)
            if error != NONE:
                return error, member_id
        if member_id and member_id not in self.members:
            return UNKNOWN_MEMBER_ID, member_id
        replaced = self.static.get(instance_id) if instance_id and not member_id else None
        others = [m for m in self.members.values() if m.member_id not in (member_id, replaced)]
        if others:
            common = {name for name, _ in protocols}
            for other in others:
                common &= {name for name, _ in other.protocols}
            if protocol_type != self.protocol_type or not common:
                return INCONSISTENT_GROUP_PROTOCOL, member_id
        if replaced is not None:
            return self._replace(replaced, client_id, protocol_type, protocols, session_timeout_ms,
                                 rebalance_timeout_ms, now)
        if not member_id:
            member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
            self.members[member_id] = Member(member_id, client_id, instance_id or None)
            if instance_id:
                self.static[instance_id] = member_id
        member = self.members[member_id]
        member.protocols, member.client_id = protocols, client_id
        member.session_timeout_ms, member.rebalance_timeout_ms = session_timeout_ms, rebalance_timeout_ms
        member.last_seen = now
        member.awaiting_join, member.join_result = True, None
        self.protocol_type = protocol_type
        if self.state != PREPARING_REBALANCE:
            self._prepare_rebalance(now)
        self._maybe_complete_join(now)
        return NONE, member_id

    def sync(self, member_id: str, generation: int, assignments: dict[str, bytes] | None, now: float,
             instance_id: str | None = None) -> int:
        """Register a SyncGroup (``assignments`` from the leader); NONE: the
        answer is in the member's ``sync_result`` now or later."""
        error = self._check(member_id, generation, instance_id)
        if error != NONE:
            return error
        if self.state == PREPARING_REBALANCE:
            return REBALANCE_IN_PROGRESS
        member = self.members[member_id]
        member.last_seen = now
        member.sync_result = None
        if self.state == STABLE:
            member.sync_result = (NONE, member.assignment)
            return NONE
        member.awaiting_sync = True
        if member_id == self.leader and assignments is not None:
            for m in self.members.values():
                m.assignment = bytes(assignments.get(m.member_id, b""))
            self.state = STABLE
            for m in self.members.values():
                if m.awaiting_sync:
                    m.awaiting_sync, m.sync_result = False, (NONE, m.assignment)
                    m.last_seen = now
        return NONE

    def heartbeat(self, member_id: str, generation: int, now: float, instance_id: str | None = None) -> int:
        error = self._check(member_id, generation, instance_id)
        if error != NONE:
            return error
        self.members[member_id].last_seen = now
        return REBALANCE_IN_PROGRESS if self.state == PREPARING_REBALANCE else NONE

    def leave(self, member_id: str, now: float, instance_id: str | None = None) -> int:
        """LeaveGroup of a member, named by its member id, its instance id
        (``member_id`` empty: Kafka's removal of a static member), or both."""
        if instance_id:
            if not member_id:
                member_id = self.static.get(instance_id, "")
            error = self._check_instance(member_id, instance_id)
            if error != NONE:
                return error
        if member_id not in self.members:
            return UNKNOWN_MEMBER_ID
        self._remove(member_id, now)
        return NONE

    def check_commit(self, member_id: str, generation: int, now: float, instance_id: str | None = None) -> int:
        """May a member commit now (Kafka's rule for OffsetCommit)?"""
        if generation < 0 and not member_id:
            return NONE if not self.members else UNKNOWN_MEMBER_ID
        error = self._check(member_id, generation, instance_id)
        if error != NONE:
            return error
        if self.state == COMPLETING_REBALANCE:
            return REBALANCE_IN_PROGRESS
        self.members[member_id].last_seen = now
        return NONE

    # -- time --------------------------------------------------------------------

    def tick(self, now: float) -> bool:
        """Remove members whose session expired, end a join phase past its
        deadline; True if anything changed."""
        changed = False
        for member in list(self.members.values()):
            if member.awaiting_join or member.awaiting_sync:
                continue
            if now - member.last_seen > member.session_timeout_ms / 1000.0:
                log.info("group %s: member %s left no sign within its session timeout of %d ms; removed",
                         self.group_id, member.member_id, member.session_timeout_ms)
                self._remove(member.member_id, now)
                changed = True
        if self.state == PREPARING_REBALANCE and now >= self.rebalance_deadline:
            for member in list(self.members.values()):
                if not member.awaiting_join:
                    log.info("group %s: member %s did not join again within the rebalance timeout; removed",
                             self.group_id, member.member_id)
                    del self.members[member.member_id]
                    if member.instance_id and self.static.get(member.instance_id) == member.member_id:
                        del self.static[member.instance_id]
            self._maybe_complete_join(now, force=True)
            changed = True
        return changed

    def drop(self, error: int) -> None:
        """The group is no longer this coordinator's: answer every pending
        request with ``error`` and forget the members."""
        for member in self.members.values():
            if member.awaiting_join:
                member.awaiting_join, member.join_result = False, JoinResult(error, member_id=member.member_id)
            if member.awaiting_sync:
                member.awaiting_sync, member.sync_result = False, (error, b"")
        self.members.clear()
        self.static.clear()
        self.state, self.leader, self.protocol = EMPTY, None, None

    # -- inside ------------------------------------------------------------------

    def _check(self, member_id: str, generation: int, instance_id: str | None = None) -> int:
        if instance_id:
            error = self._check_instance(member_id, instance_id)
            if error != NONE:
                return error
        if member_id not in self.members:
            return UNKNOWN_MEMBER_ID
        if generation != self.generation:
            return ILLEGAL_GENERATION
        return NONE

    def _instances(self) -> dict[str, str]:
        return {member_id: instance for instance, member_id in self.static.items()}

    def _check_instance(self, member_id: str, instance_id: str) -> int:
        """A request naming ``instance_id``: UNKNOWN_MEMBER_ID when the group
        has no such instance, FENCED_INSTANCE_ID when ``member_id`` is not
        its current member (a replaced one), else NONE."""
        current = self.static.get(instance_id)
        if current is None:
            return UNKNOWN_MEMBER_ID
        return NONE if current == member_id else FENCED_INSTANCE_ID

    def _replace(self, old_id: str, client_id: str, protocol_type: str, protocols, session_timeout_ms: int,
                 rebalance_timeout_ms: int, now: float) -> tuple[int, str]:
        """A static member joined again with an empty member id: a new
        member id takes the old one's place (the old one is fenced). STABLE
        with the group's protocol among the new protocols: answered at once
        at the current generation, the assignment kept, no rebalance; else
        the new member joins the rebalance."""
        old = self.members.pop(old_id)
        if old.awaiting_join:
            old.awaiting_join, old.join_result = False, JoinResult(FENCED_INSTANCE_ID, member_id=old_id)
        if old.awaiting_sync:
            old.awaiting_sync, old.sync_result = False, (FENCED_INSTANCE_ID, b"")
        member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
        member = Member(member_id, client_id, old.instance_id)
        member.client_host, member.assignment = old.client_host, old.assignment
        member.protocols = protocols
        member.session_timeout_ms, member.rebalance_timeout_ms = session_timeout_ms, rebalance_timeout_ms
        member.last_seen = now
        self.members[member_id] = member
        self.static[old.instance_id] = member_id
        if self.leader == old_id:
            self.leader = member_id
        log.info("group %s: static member %s (instance %s) replaced by %s", self.group_id, old_id,
                 old.instance_id, member_id)
        self.protocol_type = protocol_type
        if self.state == STABLE and self.protocol in {name for name, _ in protocols}:
            metadata = [(m.member_id, dict(m.protocols).get(self.protocol, b"")) for m in self.members.values()]
            member.join_result = JoinResult(
                NONE, self.generation, self.protocol_type, self.protocol, self.leader, member_id,
                metadata if member_id == self.leader else (), self._instances())
            return NONE, member_id
        member.awaiting_join, member.join_result = True, None
        if self.state != PREPARING_REBALANCE:
            self._prepare_rebalance(now)
        self._maybe_complete_join(now)
        return NONE, member_id

    def _prepare_rebalance(self, now: float) -> None:
        for member in self.members.values():  # SyncGroups still waiting: the assignment they wait for is void
            if member.awaiting_sync:
                member.awaiting_sync, member.sync_result = False, (REBALANCE_IN_PROGRESS, b"")
        self.state = PREPARING_REBALANCE
        longest = max((m.rebalance_timeout_ms for m in self.members.values()), default=0)
        self.rebalance_deadline = now + longest / 1000.0

    def _remove(self, member_id: str, now: float) -> None:
        member = self.members.pop(member_id)
        if member.instance_id and self.static.get(member.instance_id) == member_id:
            del self.static[member.instance_id]
        if member.awaiting_join:
            member.join_result = JoinResult(UNKNOWN_MEMBER_ID, member_id=member_id)
        if member.awaiting_sync:
            member.sync_result = (UNKNOWN_MEMBER_ID, b"")
        member.awaiting_join = member.awaiting_sync = False
        if not self.members:
            if self.state != EMPTY:
                self.generation += 1
            self.state, self.leader, self.protocol, self.protocol_type = EMPTY, None, None, None
            return
        if self.state == PREPARING_REBALANCE:
            self._maybe_complete_join(now)
        else:
            self._prepare_rebalance(now)

    def _maybe_complete_join(self, now: float, force: bool = False) -> None:
        joined = [m for m in self.members.values() if m.awaiting_join]
        if not force and len(joined) < len(self.members):
            return
        self.generation += 1
        if not joined:
            self.state, self.leader, self.protocol, self.protocol_type = EMPTY, None, None, None
            return
        if self.leader not in self.members:
            self.leader = joined[0].member_id
        common = set.intersection(*({name for name, _ in m.protocols} for m in joined))
        leader = self.members[self.leader]
        self.protocol = next(name for name, _ in leader.protocols if name in common)
        self.state = COMPLETING_REBALANCE
        metadata = [(m.member_id, dict(m.protocols)[self.protocol]) for m in joined]
        for member in joined:
            member.awaiting_join, member.last_seen = False, now
            member.assignment = b""
            member.join_result = JoinResult(
                NONE, self.generation, self.protocol_type, self.protocol, self.leader, member.member_id,
                metadata if member.member_id == self.leader else (), self._instances())


class Coordinator:
    """The groups one listener coordinates (see the module docstring).
    ``entry`` is a callable giving this listener's registry entry
    (``{"host", "port", "broker_id", "node"}``)."""

    def __init__(self, zk, paths, entry):
        self.zk, self.paths = zk, paths
        self._entry = entry
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._groups: dict[str, Group] = {}
        self._listeners: list[dict] = []
        self._listeners_at = float("-inf")
        self._zk_lock = threading.Lock()
        self._sweeper: threading.Thread | None = None
        self._closed = threading.Event()

    def close(self) -> None:
        self._closed.set()
        with self._cond:
            for group in self._groups.values():
                group.drop(NOT_COORDINATOR)
            groups = list(self._groups)
            self._groups.clear()
            self._cond.notify_all()
        for group_id in groups:
            self._publish(group_id)

    # -- which listener coordinates a group ----------------------------------------

    def entry_for(self, group_id: str) -> dict:
        """The registry entry of the listener that coordinates ``group_id``."""
        now = time.monotonic()
        if now - self._listeners_at > LISTENERS_TTL_S:
            from raylog.kafka import brokers

            found = brokers.listeners(self.zk, self.paths)
            own = self._entry()
            if own is not None and own["node"] not in found:
                found[own["node"]] = own
            self._listeners = [found[node] for node in sorted(found)]
            self._listeners_at = now
        listeners = self._listeners
        if not listeners:
            return self._entry()
        return listeners[zlib.crc32(group_id.encode("utf-8")) % len(listeners)]

    def _is_coordinator(self, group_id: str) -> bool:
        own, chosen = self._entry(), self.entry_for(group_id)
        return own is not None and chosen is not None and chosen["node"] == own["node"]

    # -- requests ------------------------------------------------------------------

    def join_group(self, body, version: int, client_id: str | None, client_host: str = ""):
        group_id = body.group_id
        if not group_id:
            return _join_response(version, JoinResult(INVALID_GROUP_ID, member_id=body.member_id or ""))
        if not self._is_coordinator(group_id):
            return _join_response(version, JoinResult(NOT_COORDINATOR, member_id=body.member_id or ""))
        if self._raylog_members(group_id):
            log.warning("JoinGroup to group %r refused: it has live raylog consumers; a group is either raylog's "
                        "or Kafka's (use another group.id, or close the raylog consumers)", group_id)
            return _join_response(version, JoinResult(INCONSISTENT_GROUP_PROTOCOL, member_id=body.member_id or ""))
        rebalance_ms = body.rebalance_timeout_ms if version >= 1 else body.session_timeout_ms
        protocols = [(p.name, p.metadata) for p in body.protocols]
        with self._cond:
            group = self._groups.setdefault(group_id, Group(group_id))
            error, member_id = group.join(body.member_id or "", client_id or "", body.protocol_type, protocols,
                                          body.session_timeout_ms, rebalance_ms, time.monotonic(),
                                          _instance_id(body))
            if error != NONE:
                if not group.members:
                    self._groups.pop(group_id, None)
                return _join_response(version, JoinResult(error, member_id=member_id))
            group.members[member_id].client_host = client_host
            self._cond.notify_all()
        self._start_sweeper()
        self._publish(group_id)
        with self._cond:
            member = group.members.get(member_id)
            deadline = time.monotonic() + rebalance_ms / 1000.0 + WAIT_SLACK_S
            while member is not None and member.join_result is None and time.monotonic() < deadline:
                self._cond.wait(SWEEP_S * 5)
            result = member.join_result if member is not None else None
        if result is None:
            result = JoinResult(UNKNOWN_MEMBER_ID if member is None else REBALANCE_IN_PROGRESS, member_id=member_id)
        self._publish(group_id)
        return _join_response(version, result)

    def sync_group(self, body, version: int):
        assignments = {a.member_id: a.assignment for a in body.assignments} if body.assignments else None
        with self._cond:
            group = self._groups.get(body.group_id)
        if group is None:
            return _sync_response(version, self._missing(body.group_id), b"")
        with self._cond:
            if self._groups.get(body.group_id) is not group:
                return _sync_response(version, NOT_COORDINATOR, b"")
            leader = group.leader == body.member_id
            error = group.sync(body.member_id, body.generation_id,
                               assignments if leader and assignments is not None else ({} if leader else None),
                               time.monotonic(), _instance_id(body))
            if error != NONE:
                return _sync_response(version, error, b"")
            self._cond.notify_all()
            member = group.members[body.member_id]
            deadline = time.monotonic() + member.session_timeout_ms / 1000.0 + WAIT_SLACK_S
            while member.sync_result is None and time.monotonic() < deadline:
                self._cond.wait(SWEEP_S * 5)
            error, assignment = member.sync_result or (REBALANCE_IN_PROGRESS, b"")
            member.awaiting_sync = False
            if error == NONE:
                member.last_seen = time.monotonic()
            protocol_type, protocol = group.protocol_type, group.protocol
        if error == NONE:
            self._publish(body.group_id)  # the members' assignments, for describe_group
        return _sync_response(version, error, assignment, protocol_type, protocol)

    def heartbeat(self, body, version: int):
        with self._cond:
            group = self._groups.get(body.group_id)
            if group is not None:
                error = group.heartbeat(body.member_id, body.generation_id, time.monotonic(), _instance_id(body))
        if group is None:
            error = self._missing(body.group_id)
        return HeartbeatResponse[version](throttle_time_ms=0, error_code=error)

    def leave_group(self, body, version: int):
        ids = [body.member_id] if version < 3 else [m.member_id for m in body.members]
        instances = [None] * len(ids) if version < 3 else [m.group_instance_id or None for m in body.members]
        with self._cond:
            group = self._groups.get(body.group_id)
            if group is not None:
                errors = [group.leave(member_id, time.monotonic(), instance)
                          for member_id, instance in zip(ids, instances)]
                if not group.members:
                    self._groups.pop(body.group_id, None)
                self._cond.notify_all()
        if group is None:
            errors = [self._missing(body.group_id)] * len(ids)
        self._publish(body.group_id)
        if version < 3:
            return LeaveGroupResponse[version](throttle_time_ms=0, error_code=errors[0])
        members = [LeaveGroupResponse.MemberResponse(member_id=m, group_instance_id=i, error_code=e)
                   for m, i, e in zip(ids, instances, errors)]
        return LeaveGroupResponse[version](throttle_time_ms=0, error_code=NONE, members=members)

    def check_commit(self, group_id: str, member_id: str, generation: int, instance_id: str | None = None) -> int:
        """The error code an OffsetCommit of ``(member_id, generation)`` (and
        ``instance_id``, a static member's) gets from the group's state here
        (NONE: commit)."""
        with self._cond:
            group = self._groups.get(group_id)
            if group is not None:
                return group.check_commit(member_id, generation, time.monotonic(), instance_id)
        if generation < 0 and not member_id:  # assign + commit: only into a group without Kafka members
            return UNKNOWN_MEMBER_ID if kafka_members.live(self.zk, self.paths, group_id) else NONE
        return self._missing(group_id)

    def describe(self, group_id: str) -> dict | None:
        """``{"state", "generation", "leader", "protocol", "members"}`` of a group here, or None."""
        with self._cond:
            group = self._groups.get(group_id)
            if group is None:
                return None
            return {"state": group.state, "generation": group.generation, "leader": group.leader,
                    "protocol": group.protocol, "members": sorted(group.members)}

    def snapshot(self, group_id: str) -> dict | None:
        """What DescribeGroups shows of a group here, or None:
        ``{"state", "protocol_type", "protocol", "members"}``, each member
        ``{"member_id", "instance_id", "client_id", "client_host", "metadata",
        "assignment", "topics"}`` (``metadata``: its subscription under the group's
        protocol; ``topics``: that subscription's topics and its assigned
        ones, for a ``consumer`` group). As Kafka answers it, the protocol,
        metadata and assignment are given only while the group is STABLE."""
        with self._cond:
            group = self._groups.get(group_id)
            if group is None or not group.members:
                return None
            stable = group.state == STABLE
            consumer = group.protocol_type == CONSUMER
            members = []
            for member in group.members.values():
                metadata = next((m for name, m in member.protocols if name == group.protocol), b"")
                topics = set()
                if consumer:
                    topics.update(subscribed_topics(metadata) if metadata else ())
                    for name, m in member.protocols:  # before the first join completes: any protocol's
                        topics.update(subscribed_topics(m))
                    topics.update(t for t, _ in assigned_partitions(member.assignment))
                members.append({"member_id": member.member_id, "instance_id": member.instance_id,
                                "client_id": member.client_id,
                                "client_host": member.client_host,
                                "metadata": metadata if stable else b"",
                                "assignment": member.assignment if stable else b"",
                                "topics": sorted(topics)})
            return {"state": group.state, "protocol_type": group.protocol_type or "",
                    "protocol": (group.protocol or "") if stable else "", "members": members}

    def group_ids(self) -> list[str]:
        """The groups with members here."""
        with self._cond:
            return sorted(g for g, group in self._groups.items() if group.members)

    def coordinates(self, group_id: str) -> bool:
        """Whether this listener coordinates ``group_id`` (:meth:`entry_for`)."""
        return self._is_coordinator(group_id)

    # -- inside --------------------------------------------------------------------

    def _missing(self, group_id: str) -> int:
        """The error for a request naming a group this listener does not hold."""
        return UNKNOWN_MEMBER_ID if self._is_coordinator(group_id) else NOT_COORDINATOR

    def _raylog_members(self, group_id: str) -> list[str]:
        try:
            return self.zk.get_children(self.paths.ids(group_id))
        except NoNodeError:
            return []

    def _publish(self, group_id: str) -> None:
        """Make ``consumers/<group>/kafka/<node>`` show the group's members here."""
        own = self._entry()
        if own is None:
            return
        with self._zk_lock:
            with self._cond:
                group = self._groups.get(group_id)
                members = _member_views(group) if group is not None else {}
            try:
                if members:
                    kafka_members.publish(self.zk, self.paths, group_id, own["node"], members)
                else:
                    kafka_members.withdraw(self.zk, self.paths, group_id, own["node"])
            except Exception as err:  # noqa: BLE001 - ZooKeeper away: the sweeper publishes again
                log.warning("group %s: publishing its Kafka members failed: %s", group_id, err)

    def _start_sweeper(self) -> None:
        with self._cond:
            if self._sweeper is not None or self._closed.is_set():
                return
            self._sweeper = threading.Thread(target=self._sweep, name="kafka-group-sweeper", daemon=True)
        self._sweeper.start()

    def _sweep(self) -> None:
        last_check = time.monotonic()
        while not self._closed.wait(SWEEP_S):
            changed = []
            with self._cond:
                now = time.monotonic()
                for group_id, group in list(self._groups.items()):
                    if group.tick(now):
                        changed.append(group_id)
                    if not group.members:
                        self._groups.pop(group_id, None)
                if changed:
                    self._cond.notify_all()
                groups = list(self._groups)
            recheck = time.monotonic() - last_check > LISTENERS_TTL_S
            if recheck:
                last_check = time.monotonic()
                try:
                    moved = [g for g in groups if not self._is_coordinator(g)]
                except Exception as err:  # noqa: BLE001 - ZooKeeper away: keep the groups until it is back
                    log.debug("checking which groups this listener coordinates failed: %s", err)
                    moved = []
                with self._cond:
                    for group_id in moved:
                        group = self._groups.pop(group_id, None)
                        if group is not None:
                            log.info("group %s is coordinated by another listener now; dropped here", group_id)
                            group.drop(NOT_COORDINATOR)
                    self._cond.notify_all()
                changed += moved
            for group_id in set(changed + (groups if recheck else [])):
                self._publish(group_id)


def _member_views(group: Group) -> dict[str, dict]:
    """``{member id: {"client_id", "topics", "assigned"}}``: what
    ``consumers/<group>/kafka/<node>`` shows of each member (the topics of
    its subscription and its partitions, decoded when the group is a
    ``consumer`` group)."""
    consumer = group.protocol_type == CONSUMER
    views = {}
    for member_id, member in group.members.items():
        metadata = next((m for name, m in member.protocols if name == group.protocol), b"") if consumer else b""
        views[member_id] = {
            "client_id": member.client_id,
            "topics": subscribed_topics(metadata),
            "assigned": [list(tp) for tp in assigned_partitions(member.assignment)] if consumer else [],
        }
    return views


def _join_response(version: int, result: JoinResult):
    Member_ = JoinGroupResponse.JoinGroupResponseMember
    return JoinGroupResponse[version](
        throttle_time_ms=0, error_code=result.error, generation_id=result.generation,
        protocol_type=result.protocol_type, protocol_name=result.protocol or "", leader=result.leader or "",
        skip_assignment=False, member_id=result.member_id,
        members=[Member_(member_id=m, group_instance_id=result.instances.get(m), metadata=md)
                 for m, md in result.members])


def _sync_response(version: int, error: int, assignment: bytes, protocol_type=None, protocol=None):
    return SyncGroupResponse[version](throttle_time_ms=0, error_code=error, protocol_type=protocol_type,
                                      protocol_name=protocol, assignment=assignment)


def _instance_id(body) -> str | None:
    """The ``group_instance_id`` a request carries (JoinGroup 5+, SyncGroup
    and Heartbeat 3+, OffsetCommit 7+), None when it has none."""
    return getattr(body, "group_instance_id", None) or None
