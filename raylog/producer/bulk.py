"""Many messages per call: ``send_batch``, ``send_many``, the producer
actor and audit events come through :meth:`BulkAppends.append_many`.

A keyless call (or one to a given partition) fills batches a slice at a
time; a keyed one is split by partition first (``crc32c(key) mod
partitions``, one compiled pass when built) and each group joins its
partition's open batch whole when it fits. Either way the call holds the
accumulator's lock throughout and wakes the sender at most once, as it
lets go of the lock (a sender woken earlier would only wait for the lock
the call holds).

Thread-safety: a part of :class:`~raylog.producer.accumulator.RecordAccumulator`
(split out for size); it uses that class's lock and fields.
"""

from __future__ import annotations

from typing import Sequence

from raylog.producer.batch import add_key_size
from raylog.producer.futures import CallFuture
from raylog.producer.partitioner import group_by_partition
from raylog.storage.message import HEADER_SIZE


class BulkAppends:
    def append_many(
        self,
        topic: str,
        values: Sequence[bytes],
        keys: Sequence[bytes | None] | None,
        partition: int | None,
        check=None,
    ) -> CallFuture:
        """Many messages at once, each partitioned by its key (or all to
        ``partition``, or keyless and sticky); batches fill a slice at a
        time, without a per-message lookup of the open batch. ``check``
        (values, keys), when given, is called before keyed messages are
        grouped by the reference (the compiled grouping checks their types
        itself)."""
        call = CallFuture()
        n = len(values)
        if not n:
            return call
        count = self._counts.get(topic) or self.partitions(topic)
        if keys is None or partition is not None:
            sizes = list(map(len, values)) if keys is None else list(map(add_key_size, map(len, values), keys))
            with self.lock:
                self.deferring = True
                try:
                    self._fill(topic, partition, values, keys, sizes, 0, count, call)
                finally:
                    self._end_deferring()
            return call
        # Keyed: split the call by partition (crc32c(key) mod partitions),
        # keeping the call's order within each; one compiled pass when built.
        groups = group_by_partition(values, keys, count, check)
        with self.lock:
            self.deferring = True
            try:
                self._append_groups(topic, groups, n, count, call)
            finally:
                self._end_deferring()
        call._count = n  # (_fill counted its own: now all n are in)
        return call

    #: the compiled common case of :meth:`_append_groups` (``_fastsend.GroupFill``),
    #: set by the producer when built; ``None``: this Python code alone
    fill_groups = None

    def _append_groups(self, topic, groups, n, count, call: CallFuture) -> None:
        """The groups of a keyed call into their partitions' batches (lock held)."""
        batch_size = self.batch_size
        parts = call._parts
        taken = 0  # messages of the fast path, not yet counted in buffered
        # Buffer room for the whole call: then no group needs its own check.
        room = not self.closed and self.buffered + n < self.max_buffered
        fill = self.fill_groups if room else None
        i = 0
        while i < len(groups):
            if fill is not None:
                # compiled: the groups from i on into their open batches, up
                # to one it leaves (or what is left of it) for the code below
                placed, i = fill(groups, i, self.open, topic, batch_size, HEADER_SIZE, parts, self._seal,
                                 self._open_keyed)
                self.buffered += placed
                if i == len(groups):
                    break
            p, positions, group_values, group_keys, total, largest = groups[i]
            i += 1
            k = len(positions)
            if room and p >= 0:
                batch = self.open.get((topic, p))
                if batch is None:
                    batch = self._open_keyed(topic, p)
                first = len(batch.values)
                if (
                    first + k <= batch_size
                    and batch.keys is not None
                    and batch.timestamps is None
                    and batch.size + k * (HEADER_SIZE + largest) <= batch.limit
                ):
                    # the common case: the open batch takes the whole group
                    parts.append((batch.future, first, k, positions))
                    batch.values += group_values
                    batch.keys += group_keys
                    batch.size += k * HEADER_SIZE + total
                    taken += k
                    if first + k == batch_size:
                        self._seal(batch)
                    continue
            self.buffered += taken
            taken = 0
            sizes = list(map(add_key_size, map(len, group_values), group_keys))
            self._fill(topic, None if p < 0 else p, group_values, group_keys, sizes, positions, count, call)
        self.buffered += taken

    def _open_keyed(self, topic: str, partition: int):
        """A new open batch of the topic-partition, for keyed messages (lock held)."""
        batch = self._batch_for(topic, partition, 0)
        batch.keys = []
        return batch

    def _fill(self, topic, partition, values, keys, sizes, positions, count, call: CallFuture) -> None:
        """Put ``values`` (with ``keys`` and their ``sizes`` without headers)
        into batches of ``partition`` (sticky when ``None``), a slice per
        batch; ``positions`` are their places in the call (a list, or the
        first place when consecutive). Lock held."""
        start, total = 0, len(values)
        largest = HEADER_SIZE + max(sizes)
        while start < total:
            self._wait_for_space()
            sticky = partition is None
            p = self._sticky.partition(topic, count) if sticky else partition
            batch = self._batch_for(topic, p, HEADER_SIZE + sizes[start])
            if sticky:
                self.keyless[topic] = batch
            room = max(1, min(self.batch_size - len(batch.values), total - start, self.max_buffered - self.buffered))
            size = batch.size
            if size + room * largest <= batch.limit:
                take = room  # the common case: it all fits, no per-message check
                size += room * HEADER_SIZE + sum(sizes[start : start + room])
            else:
                take = 0
                while take < room:
                    grow = HEADER_SIZE + sizes[start + take]
                    if take and size + grow > batch.limit:
                        break
                    size += grow
                    take += 1
            end = start + take
            first = len(batch.values)
            batch.values.extend(values[start:end])
            if keys is not None or batch.keys is not None:
                if batch.keys is None:
                    batch.keys = [None] * first
                batch.keys.extend(keys[start:end] if keys is not None else [None] * take)
            if batch.timestamps is not None:
                batch.timestamps.extend([int(batch.created * 1000)] * take)
            batch.size = size
            self.buffered += take
            call._add(batch.future, first, take, positions + start if isinstance(positions, int) else positions[start:end])
            start = end
            if len(batch.values) >= self.batch_size or start < total:
                self._seal(batch)
