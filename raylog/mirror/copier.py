"""One source partition copied into its target partition, exactly once.

**Identity.** The copier of ``(mirror, source topic, source partition)``
sends under one producer id (:func:`raylog.mirror.spec.producer_id`, a
function of the names: the same after any restart) and numbers its message
sets 0, 1, 2, ... The target partition judges every set by
:mod:`raylog.storage.producer_state`: a sequence it already stored is
answered as a duplicate, never stored again.

**Write-ahead intent.** Before a set is sent, its progress record
(:mod:`raylog.mirror.progress`) names its sequence and its exact source range
``[start, end)`` (record offsets: message boundaries, or the offsets of
inner messages of a compressed source wrapper, docs/design.md §2). A copier that starts (first time, or
after a kill anywhere between the intent, the send, the acknowledgement and
the source commit) reads the record; if the set was not acknowledged it
builds *the same set again* from the source range and sends it under the
same sequence: stored once either way. Then it continues at ``end`` with
the next sequence. The source group's commit is only a progress view for
``raylog groups describe`` on the source; the record is the truth.

**Sets.** A set is sent once it is full (:data:`MAX_SET_MESSAGES`
messages or :data:`MAX_SET_BYTES` bytes), or once its first message has
been held :data:`LINGER_S` (a trickle). Messages are forwarded with their
keys, values and create times, as the source stores them where the
consumer's batch has those bytes (:attr:`MessageBatch.has_stored_bytes`:
uncompressed messages always, compressed wrappers when a fetch's decoded
messages are held whole), else encoded again without compression (a part of
a wrapper). A resent set holds the same messages; its bytes may differ in
form (a wrapper whole the first time, in part the second), so the intent
keeps the set's size and a resend of another size leaves ``target_end``
unknown (the target keeps whichever came first). A set ends after any message (inside
a compressed source wrapper too: every message has an offset of its own;
only in an old, unpadded wrapper do its last messages share one, and a set
ends after the last of them), holds at most
:data:`MAX_SET_MESSAGES` messages and :data:`MAX_SET_BYTES` bytes of payload.

**Format 2.** Format-2 record batches (docs/design.md §2) are read (the
consumer decodes them, with their headers and null values) but not copied
yet: a set that holds any is refused with :class:`MirrorFormatError` before
its intent is written or anything is sent, so nothing is lost and the mirror
stays at its position. (Copying them needs their identity in the batch's own
fields, producerId and a baseSequence numbered per record, instead of the
idempotent PRODUCE's per-set sequence used here.)

**Continuity.** The copier accepts a message only at its cursor (the source
offset after the last whole message it holds); one before it is a
redelivery and is skipped, one after it is a gap (the consumer restarted
the partition from elsewhere): the copier asks to be sought back to its
position and drops what it held.

Thread-safety: confined to the member's loop thread.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time

from raylog.consumer.batch import MessageBatch
from raylog.errors import DuplicateSequenceError, MirrorFormatError, RaylogError, RequestTimeoutError
from raylog.mirror import progress
from raylog.storage.message import encode_message_set
from raylog.storage.record_batch import format_at
from raylog.transfer.protocol import ACKS_ALL

log = logging.getLogger(__name__)

MAX_SET_MESSAGES = 10_000
MAX_SET_BYTES = 512 * 1024
#: a set that is not full yet is held this long for more messages (a
#: backlog is copied in full sets: each set costs two ZooKeeper writes and a
#: produce that waits for the target's flush; a trickle waits at most this)
LINGER_S = 0.05
#: a set is resent (same sequence) on a retriable failure for this long
SEND_DEADLINE_S = 120.0
#: the pause between two tries of a set
RETRY_PAUSE_S = 0.2


class CopierStopped(Exception):
    """The mirror is stopping while a set waits for its target: the set stays
    an intent in its progress record and is sent again when the mirror
    resumes (the same sequence: stored once)."""


def _size(msg) -> int:
    """A message's bytes in a set (header, key, value; a null value takes none)."""
    return 22 + (len(msg.value) if msg.value is not None else 0) + (len(msg.key) if msg.key is not None else 0)


def _boundary(msg) -> bool:
    """Whether a set may end after ``msg``: not when the next message shares
    its offset (the clamped tail of an old, unpadded wrapper)."""
    return msg.next_offset > msg.offset


def _run_bytes(run, n: int) -> int:
    """The bytes the first ``n`` messages of a held run take in a set."""
    if n == 0:
        return 0
    if run.indexed:
        offsets = run.offsets
        return (run.next_offset if n == len(offsets) else offsets[n]) - offsets[0]
    return sum(map(_size, run.records[:n]))


def _fit(run, count: int, size: int, redo_end: int | None, have_boundary: bool):
    """How much of ``run`` joins a set that holds ``count`` messages of
    ``size`` bytes: ``(messages, their bytes, messages up to the last
    boundary among them (0: none), whether the set is full)``. A resend
    takes every message before ``redo_end`` whatever its size; otherwise a
    set holds at most :data:`MAX_SET_MESSAGES` messages and
    :data:`MAX_SET_BYTES` bytes, except a first message larger than that."""
    n = len(run)
    if run.indexed:  # every message a boundary; sizes from offsets
        offsets = run.offsets
        if redo_end is not None:
            taken = bisect.bisect_left(offsets, redo_end)
        else:
            taken = min(n, MAX_SET_MESSAGES - count)
            limit = offsets[0] + MAX_SET_BYTES - size
            if taken and (run.next_offset if taken == n else offsets[taken]) > limit:
                # the most messages whose end is within the limit: the end of message i is offsets[i + 1]
                taken = min(taken, bisect.bisect_right(offsets, limit, 1, n) - 1)
                if taken == 0 and count == 0 and not have_boundary:
                    taken = 1  # a message larger than a set goes alone
        return taken, _run_bytes(run, taken), taken, taken < n
    records = run.records
    taken = boundary = 0
    for i, msg in enumerate(records):
        if redo_end is not None:
            if msg.offset >= redo_end:
                break
        else:
            if count + i >= MAX_SET_MESSAGES:
                break
            grown = size + _size(msg)
            if grown > MAX_SET_BYTES and (have_boundary or boundary):
                break
            size = grown
        taken = i + 1
        if _boundary(msg):
            boundary = taken
    if taken < n and redo_end is None and run.has_stored_bytes:
        # cut where a stored message starts, so that both parts keep their stored bytes (a
        # compressed wrapper is not taken apart): back to the last such start, or, when that
        # leaves the set empty, on to the end of the first stored message, past the bounds
        cuts = run.stored_cuts()
        before = bisect.bisect_right(cuts, taken)
        if before:
            taken = cuts[before - 1]
        elif count == 0:
            taken = cuts[0] if cuts else n
        else:
            taken = 0
        boundary = taken
    return taken, _run_bytes(run, taken), boundary, taken < n


def _set_bytes(run) -> bytes:
    """A held run as a message set: its stored bytes as they came (an
    indexed run's, or a whole fetch's decoded messages with their compressed
    wrappers), else its messages encoded again, uncompressed."""
    if not run.indexed and (
            (run.has_stored_bytes and format_at(run.stored_bytes()) == 2)
            or any(m.value is None or m.headers for m in run.records)):
        first = run.records[0]
        raise MirrorFormatError(
            f"{first.topic}-{first.partition} holds format-2 record batches from offset {first.offset} on "
            f"(headers, null values), which this mirror does not copy yet: written again as format 1 they "
            f"would lose their headers and null values. Nothing of the set was sent; the mirror stays at "
            f"its position until it runs a raylog that copies format 2")
    if run.has_stored_bytes:
        return run.stored_bytes()
    records = run.records
    return encode_message_set([m.value for m in records], [m.key for m in records],
                              [m.timestamp for m in records], None)


class PartitionCopier:
    def __init__(self, *, zk, target_metadata, progress_path: str, checkpoints_path: str,
                 topic: str, partition: int, target_topic: str, producer_id: int,
                 checkpoint_interval_s: float = 2.0, stopping: threading.Event | None = None):
        self.zk = zk
        self.metadata = target_metadata
        self.progress_path = progress_path
        self.checkpoints_path = checkpoints_path
        self.topic, self.partition = topic, partition
        self.target_topic = target_topic
        self.producer_id = producer_id
        self.checkpoint_interval_s = checkpoint_interval_s
        #: set when the mirror stops: a set retried against its target is given up (sent again on resume)
        self.stopping = stopping if stopping is not None else threading.Event()
        self._conn = None
        self._runs: list = []  # held messages: MessageBatch runs, in source order
        self._held_count = 0  # messages in _runs
        self._held_bytes = 0  # the bytes they take in a set
        self._record: dict | None = None
        self._version = -1
        self._seq = 0
        self._pos: int | None = None  # source offset after the last acknowledged set
        self._cursor: int | None = None  # source offset after the last whole buffered message
        self._redo: dict | None = None  # an intent not acknowledged: resend exactly it
        self._unsure = False  # an intent given up (its source range gone): was its sequence stored?
        self._held_since: float | None = None  # when the oldest message held came (monotonic)
        self._last_checkpoint = 0.0
        self.need_seek = False

    # -- start -------------------------------------------------------------------

    def start(self) -> int | None:
        """Read the progress record; the source offset to seek to (None: the
        partition's start, nothing mirrored yet)."""
        self._record, self._version = progress.read_progress(self.zk, self.progress_path)
        rec = self._record
        if rec is None:
            self._seq, self._pos = 0, None
        elif rec["acked"]:
            self._seq, self._pos = rec["seq"] + 1, rec["end"]
        else:
            self._seq, self._pos, self._redo = rec["seq"], rec["start"], rec
        self._cursor = self._pos
        self._drop_held()
        return self._pos

    def sought(self, offset: int) -> None:
        """The consumer now reads from ``offset`` (start: the partition's earliest)."""
        if self._pos is None:
            self._pos = offset
        self._cursor = self._pos
        self._drop_held()
        self.need_seek = False

    def skip_to(self, offset: int) -> None:
        """Continue at ``offset`` (the source's retention removed what lay
        before it); an unacknowledged intent before it is given up. Whether
        the target stored that intent's set is unknown: the next set goes
        under its sequence and is checked (:meth:`_send`)."""
        self._pos = offset
        if self._redo is not None:
            self._unsure = True
        self._redo = None

    @property
    def position(self) -> int | None:
        return self._pos

    # -- messages in -------------------------------------------------------------

    def offer_batch(self, batch) -> None:
        """Take a :class:`~raylog.consumer.batch.MessageBatch` the consumer
        handed out for this partition. An indexed batch (uncompressed
        messages) is held as it is: its messages are contiguous (the index
        walks the fetched bytes message by message), so only its first
        offset is checked against the cursor, and its stored bytes are sent
        as they are. A decoded batch (a compressed wrapper's messages) is
        checked message by message; taken whole, its stored bytes go on too."""
        if not batch.indexed:
            self.offer(batch)
            return
        if self.need_seek or self._cursor is None:
            return
        offsets = batch.offsets
        first = bisect.bisect_left(offsets, self._cursor)
        if first == len(offsets):
            return  # redelivered
        if offsets[first] > self._cursor:
            self._gap(offsets[first])
            return
        self._hold(batch[first:] if first else batch)
        self._cursor = batch.next_offset

    def offer(self, messages) -> None:
        """Take the messages the consumer handed out for this partition, one
        by one. A decoded batch taken whole is held as it is: its stored
        bytes (a compressed wrapper as it came) can go on."""
        taken = []
        for msg in messages:
            if self.need_seek or self._cursor is None:
                return
            if msg.offset < self._cursor:
                continue  # redelivered
            if msg.offset > self._cursor:
                self._gap(msg.offset)
                return
            taken.append(msg)
            if _boundary(msg):
                self._cursor = msg.next_offset
        if taken:
            whole = isinstance(messages, MessageBatch) and len(taken) == len(messages)
            self._hold(messages if whole else MessageBatch.of_records(taken))

    def _gap(self, offset: int) -> None:
        log.info("%s-%d: a gap at %d (expected %d): seeking back to %s",
                 self.topic, self.partition, offset, self._cursor, self._pos)
        self.need_seek = True
        self._drop_held()

    def _hold(self, run) -> None:
        if not self._runs:
            self._held_since = time.monotonic()
        self._runs.append(run)
        self._held_count += len(run)
        self._held_bytes += _run_bytes(run, len(run))

    def _drop_held(self) -> None:
        self._runs, self._held_count, self._held_bytes = [], 0, 0

    # -- sets out ------------------------------------------------------------------

    @property
    def lingering(self) -> bool:
        """Whether messages are held for a set (full or not yet)."""
        return bool(self._runs)

    def due(self, now: float | None = None) -> bool:
        """Whether :meth:`pump` would send now: a set is full, or what is
        held has lingered :data:`LINGER_S`, or a resend's range is held."""
        if not self._runs:
            return False
        if self._redo is not None:
            return self._cursor >= self._redo["end"]
        now = time.monotonic() if now is None else now
        return (self._held_count >= MAX_SET_MESSAGES or self._held_bytes >= MAX_SET_BYTES
                or (self._held_since is not None and now - self._held_since >= LINGER_S))

    def pump(self, now: float | None = None, *, flush: bool = False) -> int:
        """Send every set that is full, and the rest once it has been held
        :data:`LINGER_S` (at once with ``flush``); the number of messages
        sent. Raises :class:`progress.LostPartition` if another copier took
        over."""
        now = time.monotonic() if now is None else now
        linger_over = flush or (self._held_since is not None and now - self._held_since >= LINGER_S)
        sent = 0
        while True:
            pieces = self._next_set(partial=linger_over or self._redo is not None)
            if not pieces:
                return sent
            self._send(pieces)
            sent += sum(len(piece) for piece in pieces)
            self._held_since = time.monotonic() if self._runs else None

    def _next_set(self, partial: bool = True) -> list:
        """The next set to send, as runs of held messages (taken from what is
        held): the whole intent of a resend; else a full set, or
        (``partial``) what is held up to its last boundary."""
        redo_end = None
        if self._redo is not None:
            redo_end = self._redo["end"]
            if self._cursor < redo_end:
                return []  # the same range as the intent: wait until it is all held
        fits: list = []  # (run, messages of it in the set)
        count = size = 0
        cut = None  # (len(fits), messages of the last run) at the set's last boundary
        full = False
        for run in self._runs:
            taken, taken_bytes, boundary, full = _fit(run, count, size, redo_end, cut is not None)
            if boundary:
                cut = (len(fits), boundary)
            if taken:
                fits.append((run, taken))
                count += taken
                size += taken_bytes
            if full or taken < len(run):
                full = True
                break
        if cut is None or not (full or partial or redo_end is not None):
            return []
        whole, last = cut
        pieces = [run for run, _ in fits[:whole]] + [fits[whole][0][:last]]
        self._release(whole, last)
        return pieces

    def _release(self, whole: int, last: int) -> None:
        """Let go of the first ``whole`` runs held and ``last`` messages of the next."""
        runs = self._runs
        for run in runs[:whole]:
            self._held_count -= len(run)
            self._held_bytes -= _run_bytes(run, len(run))
        run = runs[whole]
        self._held_count -= last
        self._held_bytes -= _run_bytes(run, last)
        rest = [run[last:]] if last < len(run) else []
        self._runs = rest + runs[whole + 1 :]

    def _send(self, pieces: list) -> None:
        start = self._pos
        tail = pieces[-1]
        end = tail.next_offset
        count = sum(len(piece) for piece in pieces)
        last_ts = tail.records[-1].timestamp if not tail.indexed else tail.timestamps[len(tail) - 1]
        parts = [_set_bytes(piece) for piece in pieces]
        payload = parts[0] if len(parts) == 1 else b"".join(parts)
        same_bytes = True
        if self._redo is not None:
            assert start == self._redo["start"] and end == self._redo["end"], (self._redo, start, end)
            # the set sent before may have had other bytes (a wrapper sent on as it came, now encoded
            # again): the target keeps whichever came first, so its end is known only for equal sizes
            same_bytes = self._redo.get("bytes") == len(payload)
            self._redo = None
        else:
            intent = {"seq": self._seq, "start": start, "end": end, "count": count, "bytes": len(payload),
                      "acked": False, "target_end": None, "last_ts": last_ts}
            self._version = progress.write_progress(self.zk, self.progress_path, intent, self._version)
        if self._unsure:
            base = self._send_after_a_lost_intent(payload, start, end, count, last_ts)
        else:
            base = self._produce(payload)
        if not same_bytes:
            base = None
        record = {"seq": self._seq, "start": start, "end": end, "count": count, "bytes": len(payload),
                  "acked": True, "target_end": None if base is None else base + len(payload), "last_ts": last_ts}
        self._version = progress.write_progress(self.zk, self.progress_path, record, self._version)
        self._record = record
        self._seq += 1
        self._pos = end
        now = time.monotonic()
        if base is not None and now - self._last_checkpoint >= self.checkpoint_interval_s:
            progress.append_checkpoint(self.zk, self.checkpoints_path, end, base + len(payload))
            self._last_checkpoint = now

    def _produce(self, payload: bytes) -> int | None:
        """Send one set under the copier's sequence until the target answers
        (retriable failures: the same set again). The base offset, or None for
        a set stored before whose offset the target no longer remembers."""
        result = self._ask(lambda conn: conn.produce_sets(
            self.target_topic, self.partition, [payload], ACKS_ALL, producer_id=self.producer_id,
            sequences=[self._seq])[0], f"take sequence {self._seq}")
        if isinstance(result, DuplicateSequenceError):
            return None  # stored before (sequence <= last), offset no longer remembered
        return int(result)

    def _high_watermark(self) -> int:
        return self._ask(lambda conn: conn.offsets(self.target_topic, self.partition),
                         "give its offsets").high_watermark

    def _send_after_a_lost_intent(self, payload, start: int, end: int, count: int, last_ts: int) -> int | None:
        """Send the first set after an intent was given up, under that
        intent's sequence. If the target had stored the lost set, it answers
        this one as that duplicate (an offset below its high watermark before
        the send, or no offset at all) and stores nothing: the set then goes
        again under the next sequence, its intent written first."""
        before = self._high_watermark()
        base = self._produce(payload)
        if base is None or base < before:
            log.warning("%s-%d: the target had stored sequence %d of a range lost to the source's retention; "
                        "sending [%d, %d) under %d", self.target_topic, self.partition, self._seq, start, end,
                        self._seq + 1)
            self._seq += 1
            intent = {"seq": self._seq, "start": start, "end": end, "count": count, "bytes": len(payload),
                      "acked": False, "target_end": None, "last_ts": last_ts}
            self._version = progress.write_progress(self.zk, self.progress_path, intent, self._version)
            base = self._produce(payload)
        self._unsure = False
        return base

    def _ask(self, call, what: str):
        """``call(connection)`` until the target answers: retriable failures
        (raised or answered) try again on a new connection, for at most
        :data:`SEND_DEADLINE_S`; a :class:`DuplicateSequenceError` answer is
        returned as it is."""
        deadline = time.monotonic() + SEND_DEADLINE_S
        error: Exception | None = None
        while time.monotonic() < deadline:
            try:
                result = call(self._connection())
            except RaylogError as err:
                if not err.retriable and not err.refresh_metadata:
                    raise
                error = err
                self._reset()
                self._pause_before_retry(error)
                continue
            if isinstance(result, RaylogError) and not isinstance(result, DuplicateSequenceError):
                if result.retriable or result.refresh_metadata:
                    error = result
                    self._reset()
                    self._pause_before_retry(result)
                    continue
                raise result
            return result
        raise RequestTimeoutError(f"{self.target_topic}-{self.partition}: the target did not {what} "
                                  f"within {SEND_DEADLINE_S:.0f} s (last: {error})")

    def _pause_before_retry(self, error: Exception) -> None:
        if self.stopping.wait(RETRY_PAUSE_S):
            raise CopierStopped(f"{self.target_topic}-{self.partition}: the mirror stopped while sequence {self._seq} "
                                f"waited for the target ({error}); it is sent again when the mirror resumes")

    def _connection(self):
        if self._conn is None:
            host, port = self.metadata.endpoint(self.target_topic, self.partition, refresh=True, wait_s=5.0)
            max_bytes = self.metadata.config(self.target_topic).max_message_bytes
            self._conn = self.metadata.settings.broker_connection(host, port, max_message_bytes=max_bytes)
            self._conn.connect()
        return self._conn

    def _reset(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # noqa: BLE001 - a broken connection
                pass
            self._conn = None

    def close(self) -> None:
        self._reset()

