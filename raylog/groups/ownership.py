"""The ZooKeeper operations of one group member, and nothing else.

Nodes of a group (docs/design.md §4)::

    consumers/<group>/ids/<consumer id>        ephemeral  {"topics": [...], "assignors": [...]}
    consumers/<group>/owners/<topic>/<p>       ephemeral  the owning consumer id

**Reconciliation** (the rule kazoo's ``Lock`` recipe follows): a member never
deletes a node by path alone. It lists the owner nodes and deletes only those
whose ``ephemeralOwner`` is its *current* session and whose data is its own
id, with the version it read (a conditional delete). So a release that runs
after a session expiry (say while a slow ``on_revoked`` ran) cannot remove a
node another member has claimed meanwhile, and a claim interrupted by a
dropped connection (the create may or may not have happened) is found and
adopted or released by the next reconciliation, instead of lingering.

Every request has a bounded wait (``request_timeout_s``) and comes out as a
raylog error on a connection failure (:mod:`raylog.zk.errors`). The
number of reads (``get``, ``get_children``, ``exists``) is counted in
:attr:`Ownership.reads`, so a benchmark can report the ZooKeeper reads a
change costs.

Thread-safety: the member's thread makes every call; :attr:`reads` may be
read from any thread (an int, updated under a lock).
"""

from __future__ import annotations

import json
import threading
from typing import Callable, Iterable, Mapping

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from raylog.groups.assignment import TopicPartition, parse_assignors, parse_subscription, partition_count
from raylog.groups.assignors import DEFAULT_NAMES, MemberInfo
from raylog.zk.errors import ensure_connected, zookeeper_errors
from raylog.zk.paths import Paths


class Held(dict):
    """``{(topic, p): node version}`` of owner nodes, read with ``session``."""

    def __init__(self, session: int | None):
        super().__init__()
        self.session = session


class Owners(dict):
    """``{(topic, p): (holder id, node version, created by this session)}``,
    read with ``session``: a snapshot, made and read on the member's thread."""

    def __init__(self, session: int | None):
        super().__init__()
        self.session = session

    def holders(self) -> dict[TopicPartition, str]:
        """``{(topic, p): holder id}``."""
        return {tp: holder for tp, (holder, _, _) in self.items()}


class Ownership:
    def __init__(self, zk: KazooClient, cluster: str, group: str, consumer_id: str, *, request_timeout_s: float):
        self.zk = zk
        self.paths = Paths(cluster)
        self.group = group
        self.consumer_id = consumer_id
        self._id_bytes = consumer_id.encode()
        self.request_timeout_s = request_timeout_s
        self._lock = threading.Lock()
        self._reads = 0
        # ids/<member> nodes never change while they exist: their data is read once
        self._subscriptions: dict[str, MemberInfo] = {}

    # -- bookkeeping ----------------------------------------------------------

    @property
    def reads(self) -> int:
        with self._lock:
            return self._reads

    def count_reads(self, n: int = 1) -> None:
        with self._lock:
            self._reads += n

    def session_id(self) -> int | None:
        client_id = self.zk.client_id
        return client_id[0] if client_id else None

    def forget(self) -> None:
        """Drop cached reads (after a session loss: trust nothing)."""
        self._subscriptions.clear()

    def _wait(self, what: str, async_result):
        with zookeeper_errors(self.zk, what):
            return async_result.get(timeout=self.request_timeout_s)

    def _gather(self, what: str, requests: list) -> list:
        """Wait for several async requests; NoNodeError comes back as None."""
        out = []
        for request in requests:
            try:
                out.append(self._wait(what, request))
            except NoNodeError:
                out.append(None)
        return out

    # -- membership -------------------------------------------------------------

    def register(self, topics: Iterable[str], assignors: Iterable[str] = DEFAULT_NAMES) -> bool:
        """Create ``ids/<consumer id>`` (the subscribed topics and the names of
        the assignors the member supports, most preferred first); True when it
        exists and is this session's.

        False when another session holds the id (a previous incarnation whose
        session has not expired yet, or a duplicate id): try again later.
        """
        path = self.paths.member(self.group, self.consumer_id)
        data = json.dumps({"topics": sorted(topics), "assignors": list(assignors)}).encode()
        what = f"register consumer {self.consumer_id} in group {self.group!r}"
        ensure_connected(self.zk, what)
        try:
            self._wait(what, self.zk.create_async(path, data, ephemeral=True, makepath=True))
            return True
        except NodeExistsError:
            pass
        self.count_reads()
        try:
            _, stat = self._wait(what, self.zk.get_async(path))
        except NoNodeError:
            return False
        return stat.ephemeralOwner == self.session_id()

    def unregister(self) -> None:
        """Delete ``ids/<consumer id>`` if this session created it."""
        path = self.paths.member(self.group, self.consumer_id)
        what = f"leave group {self.group!r}"
        self.count_reads()
        try:
            _, stat = self._wait(what, self.zk.get_async(path))
            if stat.ephemeralOwner == self.session_id():
                self._wait(what, self.zk.delete_async(path, version=stat.version))
        except (NoNodeError, BadVersionError):
            pass

    def members(self) -> list[str]:
        what = f"read the members of group {self.group!r}"
        self.count_reads()
        return sorted(self._wait(what, self.zk.get_children_async(self.paths.ids(self.group))))

    def subscriptions(self, members: Iterable[str]) -> dict[str, MemberInfo]:
        """``{member: MemberInfo}`` (topics, assignors, when its node was
        created); only members not seen before are read."""
        members = list(members)
        for gone in set(self._subscriptions) - set(members):
            del self._subscriptions[gone]
        new = [m for m in members if m not in self._subscriptions]
        self.count_reads(len(new))
        what = f"read the members of group {self.group!r}"
        results = self._gather(what, [self.zk.get_async(self.paths.member(self.group, m)) for m in new])
        for member, result in zip(new, results):
            if result is None:
                continue  # left meanwhile: its watch event is on its way
            data, stat = result
            self._subscriptions[member] = MemberInfo(
                member, frozenset(parse_subscription(data) or ()), parse_assignors(data), stat.czxid)
        return {m: self._subscriptions[m] for m in members if m in self._subscriptions}

    def partition_counts(self, topics: Iterable[str]) -> dict[str, int]:
        topics = list(topics)
        self.count_reads(len(topics))
        results = self._gather("read subscribed topics", [self.zk.get_async(self.paths.topic(t)) for t in topics])
        return {t: partition_count(None if r is None else r[0]) for t, r in zip(topics, results)}

    # -- owner nodes ------------------------------------------------------------

    def owners(self, topics: Iterable[str]) -> "Owners":
        """Every owner node of these topics: ``{(topic, p): (holder id, node
        version, created by this session)}``, read with :attr:`Owners.session`.
        One listing per topic plus one read per owner node."""
        session = self.session_id()
        what = f"list the owner nodes of group {self.group!r}"
        topics = list(topics)
        self.count_reads(len(topics))
        listings = self._gather(what, [self.zk.get_children_async(self.paths.owners(self.group, t)) for t in topics])
        nodes = [(t, int(name)) for t, names in zip(topics, listings) for name in (names or ()) if name.isdigit()]
        self.count_reads(len(nodes))
        results = self._gather(what, [self.zk.get_async(self.paths.owner(self.group, *tp)) for tp in nodes])
        view = Owners(session)
        for tp, result in zip(nodes, results):
            if result is None:
                continue
            data, stat = result
            view[tp] = (data.decode(errors="replace"), stat.version, stat.ephemeralOwner == session)
        return view

    def held(self, topics: Iterable[str]) -> Held:
        """The owner nodes this session created holding this member's id:
        ``{(topic, p): node version}``. One listing per topic plus one read
        per owner node of those topics."""
        view = self.owners(topics)
        mine = Held(view.session)
        for tp, (holder, version, ours) in view.items():
            if ours and holder == self.consumer_id:
                mine[tp] = version
        return mine

    def release(self, versions: Mapping[TopicPartition, int], session: int | None = None) -> None:
        """Delete these owner nodes, each only at the version read by :meth:`held`,
        and only if the session is still ``session`` (the one :meth:`held` read with)."""
        what = f"release partitions of consumer {self.consumer_id} in group {self.group!r}"
        if session is not None and self.session_id() != session:
            return  # a new session since the read: those nodes are gone or not ours
        requests = [self.zk.delete_async(self.paths.owner(self.group, *tp), version=v) for tp, v in versions.items()]
        for request in requests:
            try:
                self._wait(what, request)
            except (NoNodeError, BadVersionError):
                pass  # gone already, or no longer the node we read: not ours to delete

    def claim(self, partitions: Iterable[TopicPartition], on_change: Callable) -> tuple[set, dict]:
        """Create the owner node of each partition.

        Returns ``(claimed, busy)``: the partitions now owned (created, or
        found already created by this session) and ``{tp: holder id}`` for
        those another member still holds; ``on_change`` is called (on a
        kazoo thread) when such a node changes or goes.
        """
        partitions = sorted(partitions)
        what = f"claim partitions for consumer {self.consumer_id} in group {self.group!r}"
        session = self.session_id()
        creates = [
            self.zk.create_async(self.paths.owner(self.group, *tp), self._id_bytes, ephemeral=True, makepath=True)
            for tp in partitions
        ]
        claimed, existing = set(), []
        for tp, request in zip(partitions, creates):
            try:
                self._wait(what, request)
                claimed.add(tp)
            except NodeExistsError:
                existing.append(tp)
        self.count_reads(len(existing))
        results = self._gather(what, [
            self.zk.get_async(self.paths.owner(self.group, *tp), watch=on_change) for tp in existing
        ])
        busy = {}
        for tp, result in zip(existing, results):
            if result is None:
                busy[tp] = None  # released just now: the next try takes it
                continue
            data, stat = result
            if stat.ephemeralOwner == session and data == self._id_bytes:
                claimed.add(tp)  # created by an earlier try whose answer was lost
            else:
                busy[tp] = data.decode(errors="replace")
        return claimed, busy
