"""Group changes reach the application's thread: revocation and assignment
notices of a consumer in a group.

**Revocation runs on the application's thread.** When a rebalance moves a
partition away, the consumer stops handing it out at once, and the next
``poll`` (or the iterator) runs ``on_revoked(partitions)`` there, on the
application's thread, then commits the positions of those partitions (with
auto-commit): inside ``on_revoked`` the partitions are still owned, so a
manual ``commit()`` also stores them. Only then are the owner nodes
released. If the application does not poll within ``revoke_timeout_ms`` the
partitions are released without a commit (their messages come again to the
next owner). ``on_assigned`` runs on the application's thread too, in the
next ``poll``, before any message of those partitions is handed out (as
in Kafka); the partitions' starting positions are resolved by their
fetchers, concurrently and outside any lock.

:class:`GroupNotices` is a part of :class:`raylog.Consumer`:
:meth:`~GroupNotices.on_assigned`/:meth:`~GroupNotices.on_revoked` run on
the group member's thread and only queue a :class:`_Notice`;
:meth:`~GroupNotices.run` runs them on the application's thread.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Callable, Iterable

logger = logging.getLogger(__name__)


class _Notice:
    """A group change for the application's thread: ``kind`` is "assigned" or
    "revoked". ``done`` is set once handled (or abandoned after the revoke
    timeout); fields change only under the consumer's lock."""

    __slots__ = ("kind", "partitions", "done", "abandoned")

    def __init__(self, kind: str, partitions: frozenset):
        self.kind = kind
        self.partitions = partitions
        self.done = threading.Event()
        self.abandoned = False


class GroupNotices:
    """Assignment and revocation, handed to the application's thread (a part
    of :class:`raylog.Consumer`, see the module docstring).

    Given: ``lock``, the consumer's lock (these notices and sets change under
    it and the consumer reads them under it); ``fetch(tp)``, read a newly
    assigned partition (from its committed offset) unless it is read
    already; ``stop_fetchers(partitions)``; the application's
    ``on_assigned``/``on_revoked`` (or ``None``); ``commit_revoked(partitions)``,
    store what was handed out of them (auto-commit) after ``on_revoked``;
    ``revoke_timeout_s``; and ``group``, named in the log.

    ``revoking`` (handed out no more) and ``assigning`` (on_assigned not run
    yet: not handed out yet) are the partitions the consumer holds back;
    ``closing`` is set by the consumer's ``close``, which revokes everything
    itself (:meth:`revoke_here`).
    """

    def __init__(
        self,
        lock: threading.RLock,
        *,
        fetch: Callable[[tuple], None],
        stop_fetchers: Callable[[Iterable], None],
        on_assigned: Callable[[frozenset], None] | None,
        on_revoked: Callable[[frozenset], None] | None,
        commit_revoked: Callable[[frozenset], None],
        revoke_timeout_s: float,
        group: str,
    ):
        self._lock = lock
        self._fetch = fetch
        self._stop_fetchers = stop_fetchers
        self._user_on_assigned = on_assigned
        self._user_on_revoked = on_revoked
        self._commit_revoked = commit_revoked
        self.revoke_timeout_s = revoke_timeout_s
        self.group = group
        self.notices: collections.deque = collections.deque()  # _Notice, oldest first
        self.revoking: set = set()
        self.assigning: set = set()
        self.closing = False

    # -- on the group member's thread ---------------------------------------------

    def on_assigned(self, partitions: frozenset) -> None:
        with self._lock:
            for tp in sorted(partitions):
                self._fetch(tp)  # resolves its committed offset itself
            self.assigning |= partitions  # handed out once on_assigned has run
            self.notices.append(_Notice("assigned", partitions))

    def on_revoked(self, partitions: frozenset) -> None:
        notice = _Notice("revoked", partitions)
        with self._lock:
            if self.closing:
                return  # close() revokes everything on the application's thread itself
            self.revoking |= partitions  # handed out no more, from now on
            self.notices.append(notice)
        # The application's thread runs on_revoked and commits in its next poll.
        if not notice.done.wait(self.revoke_timeout_s):
            with self._lock:
                if not notice.done.is_set():
                    notice.abandoned = True
                    logger.warning("group %r: the application did not poll within %.0fs; releasing %s without "
                                   "a commit (their messages since the last commit come again)",
                                   self.group, self.revoke_timeout_s, sorted(partitions))
                    self._drop(partitions)

    def _drop(self, partitions) -> None:
        with self._lock:
            self._stop_fetchers(partitions)
            self.revoking -= set(partitions)

    # -- on the application's thread ----------------------------------------------

    def run(self) -> None:
        """Run the queued notices: ``on_assigned``, or ``on_revoked`` and its commit."""
        while True:
            with self._lock:
                if not self.notices:
                    return
                notice = self.notices.popleft()
            if notice.kind == "assigned":
                try:
                    if self._user_on_assigned is not None:
                        self._user_on_assigned(notice.partitions)
                finally:
                    with self._lock:
                        self.assigning -= notice.partitions
                continue
            try:
                if not notice.abandoned:
                    self.revoke_here(notice.partitions)
            finally:
                with self._lock:
                    if not notice.abandoned:
                        self._drop(notice.partitions)
                    notice.done.set()

    def revoke_here(self, partitions: frozenset) -> None:
        """on_revoked, then commit what was handed out (auto-commit), on this thread."""
        try:
            if self._user_on_revoked is not None:
                self._user_on_revoked(partitions)
        finally:
            self._commit_revoked(partitions)

    def release_waiters(self) -> None:
        """On close (lock held): no notice is waited for any more."""
        for notice in self.notices:
            notice.done.set()
