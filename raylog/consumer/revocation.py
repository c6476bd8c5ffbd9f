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

:class:`GroupNotices` is a part of :class:`raylog.Consumer` (a mixin):
``_on_assigned``/``_on_revoked`` run on the group member's thread and only
queue a :class:`_Notice`; ``_run_notices`` runs them on the application's
thread. It uses the consumer's ``_lock``, ``_parts``, ``_notices``,
``_revoking``, ``_assigning``, ``_member``, the user's callbacks and the fetchers.
"""

from __future__ import annotations

import logging
import threading

from raylog.errors import RaylogError

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
    """Assignment and revocation, handed to the application's thread (part of
    :class:`raylog.Consumer`)."""

    # -- on the group member's thread ---------------------------------------------

    def _on_assigned(self, partitions: frozenset) -> None:
        with self._lock:
            for tp in sorted(partitions):
                if tp not in self._parts:
                    self._start_fetcher(tp, None)  # resolves its committed offset itself
            self._assigning |= partitions  # handed out once on_assigned has run
            self._notices.append(_Notice("assigned", partitions))

    def _on_revoked(self, partitions: frozenset) -> None:
        notice = _Notice("revoked", partitions)
        with self._lock:
            if self._closing:
                return  # close() revokes everything on the application's thread itself
            self._revoking |= partitions  # handed out no more, from now on
            self._notices.append(notice)
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
            self._revoking -= set(partitions)

    # -- on the application's thread ----------------------------------------------

    def _run_notices(self) -> None:
        while True:
            with self._lock:
                if not self._notices:
                    return
                notice = self._notices.popleft()
            if notice.kind == "assigned":
                try:
                    if self._user_on_assigned is not None:
                        self._user_on_assigned(notice.partitions)
                finally:
                    with self._lock:
                        self._assigning -= notice.partitions
                continue
            try:
                if not notice.abandoned:
                    self._revoke_here(notice.partitions)
            finally:
                with self._lock:
                    if not notice.abandoned:
                        self._drop(notice.partitions)
                    notice.done.set()

    def _revoke_here(self, partitions: frozenset) -> None:
        """on_revoked, then commit what was handed out (auto-commit), on this thread."""
        try:
            if self._user_on_revoked is not None:
                self._user_on_revoked(partitions)
        finally:
            if self.enable_auto_commit:
                positions = {tp: pos for tp, pos in self._handed_positions().items() if tp in partitions}
                if positions:
                    try:
                        self._member.commit(positions)
                    except RaylogError as err:
                        # The session was lost or ZooKeeper is down: the next
                        # owner starts from the last commit (at-least-once).
                        logger.info("group %r: could not commit %s while revoking them: %s",
                                    self.group, sorted(positions), err)
