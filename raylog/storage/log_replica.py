"""A replica's writes to a partition log: a leader's bytes at the same byte
offsets, with the idempotent producers' sets they hold, and truncation back
to a leader epoch's boundary, and a fresh start at the leader's log start
when retention there deleted what the replica would fetch next (a mixin of :class:`~raylog.storage.log.PartitionLog`;
see :mod:`raylog.replication`).

A follower's producer-state table (:mod:`raylog.storage.producer_state`)
follows its leader's: :meth:`LogReplica.producer_records` hands out what the
leader remembers after an offset, the follower passes it to
:meth:`LogReplica.append_replica` with the bytes, and
:meth:`LogReplica.truncate_replica` forgets what it cuts off. A follower that
becomes leader therefore answers a retry of a set its old leader stored with
that set's offset instead of storing it again.

Thread-safety: as :class:`~raylog.storage.log.PartitionLog` (the writer's lock).
"""

from __future__ import annotations

from raylog.errors import InvalidOffsetError, StorageError
from raylog.storage.fileops import _sync_directory
from raylog.storage.segment import LogSegment


class LogReplica:
    """The replica writes of :class:`~raylog.storage.log.PartitionLog`."""

    def append_replica(self, message_set, offset: int, sequences=()) -> int:
        """Append a leader's set at ``offset``, which must be this log's end
        (replication: the same bytes at the same byte offset on every
        replica). Validated like :meth:`append`; :class:`InvalidOffsetError`
        when ``offset`` is not the log end or a sequence lies outside the set.

        ``sequences``: the idempotent producers' sets within the bytes, as
        :func:`~raylog.storage.producer_state.parse_records` gives them
        (``(producer id, epoch, first sequence, base offset, lengths)``);
        they are remembered as if appended here by their producers. A set
        is passed with the append that holds its end: it may begin in an
        earlier append (a set larger than one fetch comes in parts)."""
        size, count = len(message_set), self._validate(message_set)
        sequenced = []
        for producer_id, epoch, first_sequence, base, lengths in sequences:
            if not offset < base + sum(lengths) <= offset + size or base < self.log_start_offset:
                raise InvalidOffsetError(
                    f"producer {producer_id}'s sets at {base} do not end within the replica append "
                    f"{offset}..{offset + size} to {self._dir}"
                )
            sequenced.append((producer_id, epoch, first_sequence, base - offset, lengths))
        with self._lock:
            self._check_writable()
            if offset != self._leo:
                raise InvalidOffsetError(f"a replica append at {offset}, but {self._dir} ends at {self._leo}")
            return self._append_locked(message_set, size, count, sequenced) if count else self._leo

    def producer_records(self, offset: int, max_bytes: int) -> bytes:
        """The idempotent producers' sets remembered at or after ``offset``,
        as records of the producer-state journal (what a follower passes to
        :meth:`append_replica`, through ``parse_records``)."""
        with self._lock:
            return self._producers.records_from(offset, max_bytes)

    def truncate_replica(self, offset: int) -> None:
        """Cut the log back to ``offset`` (a replica of an older leader epoch,
        see :mod:`raylog.replication.state`), forgetting the producers' sets
        cut off; nothing at or past the end."""
        with self._flush_lock, self._lock:
            self._check_writable()
            if offset >= self._leo:
                return
            segments = self._view[1]
            keep = [s for s in segments if s.base_offset <= offset] or segments[:1]
            for segment in segments[len(keep):]:
                segment.delete()
            keep[-1].truncate(offset - keep[-1].base_offset)
            self._view, self._active, self._leo = ([s.base_offset for s in keep], keep), keep[-1], offset
            self._producers.truncate(offset)
            self._write_checkpoint(offset)
            with self._cond:
                self._hw = min(self._hw, offset)

    def restart_replica_at(self, offset: int) -> None:
        """Start over, empty, at ``offset``, past this log's end: the leader's
        log now begins there (its retention deleted what this replica would
        fetch next: a replica that was away long, or a new one), so the
        replica drops what it holds and follows from the leader's log start
        (Kafka's truncate-fully-and-start-at). The old segments go first, then
        the new empty one is made: a crash in between leaves no segment, and
        the log reopens empty at 0, which the follower restarts from again."""
        with self._flush_lock, self._lock:
            self._check_writable()
            if offset <= self._leo:
                raise InvalidOffsetError(
                    f"a replica starts over only past its log end ({self._leo}), not at {offset}", offset=offset
                )
            try:
                for segment in self._view[1]:
                    segment.delete()
                _sync_directory(self._dir)
                new = LogSegment.open(self._dir, offset)
                _sync_directory(self._dir)
            except OSError as err:
                self._fail(err)
                raise StorageError(f"cannot start the replica in {self._dir} over at {offset}: {err}") from err
            self._view, self._active, self._leo = ([offset], [new]), new, offset
            self._active_since = None
            self._producers.truncate(0)
            self._write_checkpoint(offset)
            with self._cond:
                self._hw = offset
