"""One source partition copied into its target partition, exactly once.

**Identity.** The copier of ``(mirror, source topic, source partition)``
sends under one producer id (:func:`raylog.mirror.spec.producer_id`, a
function of the names: the same after any restart), producer epoch 0, and
numbers its RECORDS 0, 1, 2, ... Each set goes to the target as ONE
format-2 record batch (docs/design.md §2) carrying that producer id and the
sequence of its first record as its baseSequence (the next set's
baseSequence is this one's plus its count), sent through the same PRODUCE
as raylog's producer (the identity travels in the batch). The target
partition judges every batch by :mod:`raylog.storage.batch_producers`: a
batch it already stored is answered as that duplicate (the offset of its
first store), never stored again.

**Write-ahead intent.** Before a set is sent, its progress record
(:mod:`raylog.mirror.progress`) names its base record sequence and its exact
source range ``[start, end)`` (record offsets: message boundaries, the
offsets of inner messages of a compressed source wrapper, or of the records
of a source record batch, docs/design.md §2). A copier that starts (first
time, or after a kill anywhere between the intent, the send, the
acknowledgement and the source commit) reads the record; if the set was not
acknowledged it builds *the same batch again* from the source range (the
same records, base sequence, timestamps: the same bytes) and sends it:
stored once either way. Then it continues at ``end`` with the next
sequence. The source group's commit is only a progress view for ``raylog
groups describe`` on the source; the record is the truth.

**Sets.** A set is sent once it is full (:data:`MAX_SET_MESSAGES` records
or :data:`MAX_SET_BYTES` bytes of record batch), or once its first record
has been held :data:`LINGER_S` (a trickle). Whatever the source's format (1
or 2, compressed or not), the set is encoded again, uncompressed, as one
record batch of its records with their keys, values (a null value stays
null), headers and create times. Its size is measured as the batch takes it
(:func:`_size`: the batch header, then each record's upper bound), so a
set's batch never exceeds :data:`MAX_SET_BYTES`, except a single record
larger than that, which goes alone. A set ends after any record (inside a
compressed source wrapper too: every message has an offset of its own; only
in an old, unpadded wrapper do its last messages share one, and a set ends
after the last of them).

**Progress records of the previous version** (format-1 sets numbered 0, 1,
2, ... by set under the same producer id; no ``base_seq``): the target's
format-2 producer state knows nothing of those sets, so record sequences
start at 0 (a producer id the target does not know is accepted at any
sequence). An acknowledged old record resumes at its ``end``, exactly once.
An old record that is an unacknowledged intent is sent again as a format-2
batch from base sequence 0: if the old version's set never reached the
target, it is stored once; if it did (killed between the send and the
acknowledgement), the target cannot tell (it judged that set by its
format-1 state) and holds that range TWICE, once as the old format-1 set and
once as the new batch: at-least-once for that one set, exactly once after.
Its ``target_end`` is then unknown (the sizes differ).

**Continuity.** The copier accepts a message only at its cursor (the source
offset after the last whole message it holds); one before it is a
redelivery and is skipped, one after it is a gap (the consumer restarted
the partition from elsewhere): the copier asks to be sought back to its
position and drops what it held. A gap met again at the same place after
that seek is one of the source log itself (offsets the log cleaner of a
compacted topic removed, docs/design.md §3): the copier goes on at the
message after it, and from then on takes that gap at once. The sets of a
compacted source are its kept records; the target (made with the source's
``cleanup_policy``, :mod:`raylog.mirror.controller`) stores them at offsets
of its own and compacts them by its own cleaner, so it keeps the latest
record of each key as the source does.

Thread-safety: confined to the member's loop thread.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time

from raylog.consumer.batch import MessageBatch
from raylog.errors import DuplicateSequenceError, RaylogError, RequestTimeoutError
from raylog.mirror import progress
from raylog.storage import message as format_1
from raylog.storage import record_batch
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
#: the producerEpoch of the copier's batches (its id never gets a new epoch)
PRODUCER_EPOCH = 0
#: the most bytes a record takes in a batch besides its key, value and
#: headers: its length (varint, 5), attributes (1), timestamp delta
#: (varlong, 10), offset delta, key length, value length and header count
#: (varints, 5 each)
RECORD_OVERHEAD = 5 + 1 + 10 + 5 + 5 + 5 + 5
#: the most bytes a header takes besides its key and value: two varint lengths
HEADER_OVERHEAD = 5 + 5
#: record sequences are i32s that wrap to 0 after 2**31 - 1 (docs/design.md §2)
_SEQUENCE_MASK = 0x7FFFFFFF
#: the bytes of a format-1 message besides its key and value (an indexed run's offsets are format-1 bytes)
_FORMAT_1_OVERHEAD = format_1.HEADER_SIZE


class CopierStopped(Exception):
    """The mirror is stopping while a set waits for its target: the set stays
    an intent in its progress record and is sent again when the mirror
    resumes (the same batch: stored once)."""


def _size(msg) -> int:
    """The most bytes a message takes as a record of a set's batch (key,
    value and headers, a null taking none, and :data:`RECORD_OVERHEAD`)."""
    size = RECORD_OVERHEAD + (len(msg.value) if msg.value is not None else 0) + (
        len(msg.key) if msg.key is not None else 0)
    for key, value in msg.headers:
        size += HEADER_OVERHEAD + len(key.encode()) + (len(value) if value is not None else 0)
    return size


def _boundary(msg) -> bool:
    """Whether a set may end after ``msg``: not when the next message shares
    its offset (the clamped tail of an old, unpadded wrapper)."""
    return msg.next_offset > msg.offset


def _indexed_bytes(run, n: int) -> int:
    """:func:`_size` of the first ``n`` messages of an indexed run (format-1
    messages without headers: their offsets are byte positions, so the keys
    and values of ``n`` take their span less ``n`` format-1 headers)."""
    offsets = run.offsets
    span = (run.next_offset if n == len(offsets) else offsets[n]) - offsets[0]
    return span + n * (RECORD_OVERHEAD - _FORMAT_1_OVERHEAD)


def _run_bytes(run, n: int) -> int:
    """The bytes the first ``n`` messages of a held run take in a set's batch
    (at most; the batch header is counted once per set, by :func:`_fit`)."""
    if n == 0:
        return 0
    if run.indexed:
        return _indexed_bytes(run, n)
    return sum(map(_size, run.records[:n]))


def _fit(run, count: int, size: int, redo_end: int | None, have_boundary: bool):
    """How much of ``run`` joins a set that holds ``count`` messages of
    ``size`` bytes (records only): ``(messages, their bytes, messages up to
    the last boundary among them (0: none), whether the set is full)``. A
    resend takes every message before ``redo_end`` whatever its size;
    otherwise a set holds at most :data:`MAX_SET_MESSAGES` messages and its
    batch (header and records) at most :data:`MAX_SET_BYTES` bytes, except a
    first message larger than that."""
    n = len(run)
    room = MAX_SET_BYTES - record_batch.HEADER_SIZE - size
    if run.indexed:  # every message a boundary; sizes from offsets
        if redo_end is not None:
            taken = bisect.bisect_left(run.offsets, redo_end)
        else:
            taken = min(n, MAX_SET_MESSAGES - count)
            if taken and _indexed_bytes(run, taken) > room:
                # the most messages whose bytes fit the room (the bytes of k messages grow with k)
                taken = bisect.bisect_right(range(1, taken + 1), room, key=lambda k: _indexed_bytes(run, k))
                if taken == 0 and count == 0 and not have_boundary:
                    taken = 1  # a message larger than a set goes alone
        return taken, _run_bytes(run, taken), taken, taken < n
    taken = boundary = 0
    used = 0
    for i, msg in enumerate(run.records):
        if redo_end is not None:
            if msg.offset >= redo_end:
                break
        else:
            if count + i >= MAX_SET_MESSAGES:
                break
            grown = used + _size(msg)
            if grown > room and (have_boundary or boundary):
                break
            used = grown
        taken = i + 1
        if _boundary(msg):
            boundary = taken
    return taken, _run_bytes(run, taken), boundary, taken < n


def _columns(pieces: list) -> tuple[list, list, list, list]:
    """The values, keys, headers (None: none) and timestamps of held runs, in order."""
    values, keys, headers, timestamps = [], [], [], []
    for run in pieces:
        if run.indexed:  # format-1 messages: no headers, never a null value
            values += [bytes(v) for v in run.values]
            keys += [None if k is None else bytes(k) for k in run.keys]
            headers += [None] * len(run)
            timestamps += run.timestamps.tolist()
        else:
            for msg in run.records:
                values.append(msg.value)
                keys.append(msg.key)
                headers.append(list(msg.headers) or None)
                timestamps.append(msg.timestamp)
    return values, keys, headers, timestamps


def _set_batch(pieces: list, producer_id: int, base_sequence: int) -> bytes:
    """Held runs as one uncompressed record batch (format 2) under
    ``producer_id`` from record sequence ``base_sequence``: the same runs
    give the same bytes, whatever form the source stored them in. The
    progress record counts sequences on; the batch carries them modulo 2**31
    (an i32 that wraps to 0, as the target's producer state expects)."""
    values, keys, headers, timestamps = _columns(pieces)
    return record_batch.encode_batch(
        values, keys, headers if any(h is not None for h in headers) else None, timestamps,
        producer_id=producer_id, producer_epoch=PRODUCER_EPOCH, base_sequence=base_sequence & _SEQUENCE_MASK)


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
        self._held_bytes = 0  # the bytes their records take in a set's batch
        self._record: dict | None = None
        self._version = -1
        self._seq = 0  # the number of the next set (for people: the target judges by record sequences)
        self._base = 0  # the record sequence of the next set's first record
        self._lost_count = 0  # the records of an intent given up (see skip_to)
        self._pos: int | None = None  # source offset after the last acknowledged set
        self._cursor: int | None = None  # source offset after the last whole buffered message
        self._redo: dict | None = None  # an intent not acknowledged: resend exactly it
        #: (cursor, offset) of the gaps met since the last acknowledged set: met twice, a gap of the log
        self._gaps: set[tuple[int, int]] = set()
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
            self._seq, self._base, self._pos = 0, 0, None
        elif rec["acked"]:
            # a record of the previous version (format-1 sets, no base_seq): record sequences start
            # at 0, which the target's format-2 producer state takes (module docstring)
            base = rec["base_seq"] + rec["count"] if "base_seq" in rec else 0
            self._seq, self._base, self._pos = rec["seq"] + 1, base, rec["end"]
        else:
            self._seq, self._base, self._pos, self._redo = rec["seq"], rec.get("base_seq", 0), rec["start"], rec
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
        from its base sequence and is checked (:meth:`_send`)."""
        self._pos = offset
        if self._redo is not None:
            self._unsure = True
            self._lost_count = self._redo["count"]
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
        offset is checked against the cursor. A decoded batch (a compressed
        wrapper's messages, format-2 records) is checked message by message."""
        if not batch.indexed:
            self.offer(batch)
            return
        if self.need_seek or self._cursor is None:
            return
        offsets = batch.offsets
        first = bisect.bisect_left(offsets, self._cursor)
        if first == len(offsets):
            return  # redelivered
        if offsets[first] > self._cursor and not self._gap(offsets[first]):
            return
        self._hold(batch[first:] if first else batch)
        self._cursor = batch.next_offset

    def offer(self, messages) -> None:
        """Take the messages the consumer handed out for this partition, one
        by one (a decoded batch taken whole is held as it is)."""
        taken = []
        for msg in messages:
            if self.need_seek or self._cursor is None:
                return
            if msg.offset < self._cursor:
                continue  # redelivered
            if msg.offset > self._cursor and not self._gap(msg.offset):
                return
            taken.append(msg)
            if _boundary(msg):
                self._cursor = msg.next_offset
        if taken:
            whole = isinstance(messages, MessageBatch) and len(taken) == len(messages)
            self._hold(messages if whole else MessageBatch.of_records(taken))

    def _gap(self, offset: int) -> bool:
        """A message at ``offset``, past the cursor: True when the gap is one
        of the source log (met again after a seek back: the copier goes on
        at ``offset``); else False, and the copier asks to be sought back."""
        gap = (self._cursor, offset)
        if gap in self._gaps:
            self._cursor = offset
            return True
        log.info("%s-%d: a gap at %d (expected %d): seeking back to %s",
                 self.topic, self.partition, offset, self._cursor, self._pos)
        self._gaps.add(gap)
        self.need_seek = True
        self._drop_held()
        return False

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
        return (self._held_count >= MAX_SET_MESSAGES
                or record_batch.HEADER_SIZE + self._held_bytes >= MAX_SET_BYTES
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
        payload = _set_batch(pieces, self.producer_id, self._base)
        same_bytes = True
        if self._redo is not None:
            assert start == self._redo["start"] and end == self._redo["end"], (self._redo, start, end)
            # the same records from the same base sequence give the same batch; an intent of the
            # previous version was a format-1 set of another size: the target's end is then unknown
            same_bytes = self._redo.get("bytes") == len(payload)
            self._redo = None
        else:
            self._write_intent(start, end, count, len(payload), last_ts)
        if self._unsure:
            payload, base = self._send_after_a_lost_intent(pieces, payload, start, end, count, last_ts)
        else:
            base = self._produce(payload)
        if not same_bytes:
            base = None
        record = {"seq": self._seq, "base_seq": self._base, "start": start, "end": end, "count": count,
                  "bytes": len(payload), "acked": True,
                  "target_end": None if base is None else base + len(payload), "last_ts": last_ts}
        self._version = progress.write_progress(self.zk, self.progress_path, record, self._version)
        self._record = record
        self._seq += 1
        self._base += count
        self._pos = end
        self._gaps = {gap for gap in self._gaps if gap[0] >= end}  # those behind are passed for good
        now = time.monotonic()
        if base is not None and now - self._last_checkpoint >= self.checkpoint_interval_s:
            progress.append_checkpoint(self.zk, self.checkpoints_path, end, base + len(payload))
            self._last_checkpoint = now

    def _write_intent(self, start: int, end: int, count: int, size: int, last_ts: int) -> None:
        intent = {"seq": self._seq, "base_seq": self._base, "start": start, "end": end, "count": count,
                  "bytes": size, "acked": False, "target_end": None, "last_ts": last_ts}
        self._version = progress.write_progress(self.zk, self.progress_path, intent, self._version)

    def _produce(self, payload: bytes) -> int | None:
        """Send one set's batch until the target answers (retriable failures:
        the same batch again). The base offset (of its first store, for a
        batch stored before), or None for a batch stored before whose offset
        the target no longer remembers."""
        result = self._ask(lambda conn: conn.produce_sets(self.target_topic, self.partition, [payload], ACKS_ALL)[0],
                           f"take record sequence {self._base}")
        if isinstance(result, DuplicateSequenceError):
            return None  # stored before (sequence <= last), offset no longer remembered
        return int(result)

    def _high_watermark(self) -> int:
        return self._ask(lambda conn: conn.offsets(self.target_topic, self.partition),
                         "give its offsets").high_watermark

    def _send_after_a_lost_intent(self, pieces, payload, start: int, end: int, count: int,
                                  last_ts: int) -> tuple[bytes, int | None]:
        """Send the first set after an intent was given up, from that
        intent's base sequence. If the target had stored the lost set, it
        answers this one as that duplicate (an offset below its high
        watermark before the send: the same first and last sequence; or no
        offset at all: another count) and stores nothing: the set then goes
        again, its intent written first, from the sequence after the lost
        set's records. ``(the batch stored, its base offset)``."""
        before = self._high_watermark()
        base = self._produce(payload)
        if base is None or base < before:
            lost = self._base
            self._seq += 1
            self._base += self._lost_count
            log.warning("%s-%d: the target had stored record sequences %d.. of a range lost to the source's "
                        "retention; sending [%d, %d) from sequence %d", self.target_topic, self.partition, lost,
                        start, end, self._base)
            payload = _set_batch(pieces, self.producer_id, self._base)
            self._write_intent(start, end, count, len(payload), last_ts)
            base = self._produce(payload)
        self._unsure = False
        self._lost_count = 0
        return payload, base

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
            raise CopierStopped(f"{self.target_topic}-{self.partition}: the mirror stopped while the set from record "
                                f"sequence {self._base} waited for the target ({error}); it is sent again when the "
                                f"mirror resumes")

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

