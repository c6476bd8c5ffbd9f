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
been held :data:`LINGER_S` (a trickle). Messages are forwarded with their keys, values and create times,
re-encoded *uncompressed* (a resent set must be the same bytes; the
consumer hands messages out unpacked). A set ends after any message (inside
a compressed source wrapper too: every message has an offset of its own;
only in an old, unpadded wrapper do its last messages share one, and a set
ends after the last of them), holds at most
:data:`MAX_SET_MESSAGES` messages and :data:`MAX_SET_BYTES` bytes of payload.

**Continuity.** The copier accepts a message only at its cursor (the source
offset after the last whole message it holds); one before it is a
redelivery and is skipped, one after it is a gap (the consumer restarted
the partition from elsewhere): the copier asks to be sought back to its
position and drops what it held.

Thread-safety: confined to the member's loop thread.
"""

from __future__ import annotations

import logging
import time

from raylog.errors import DuplicateSequenceError, RaylogError, RequestTimeoutError
from raylog.mirror import progress
from raylog.storage.message import encode_message_set
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


def _size(msg) -> int:
    """A message's bytes in a set (header, key, value)."""
    return 22 + len(msg.value) + (len(msg.key) if msg.key is not None else 0)


def _boundary(msg) -> bool:
    """Whether a set may end after ``msg``: not when the next message shares
    its offset (the clamped tail of an old, unpadded wrapper)."""
    return msg.next_offset > msg.offset


class PartitionCopier:
    def __init__(self, *, zk, target_metadata, progress_path: str, checkpoints_path: str,
                 topic: str, partition: int, target_topic: str, producer_id: int,
                 checkpoint_interval_s: float = 2.0):
        self.zk = zk
        self.metadata = target_metadata
        self.progress_path = progress_path
        self.checkpoints_path = checkpoints_path
        self.topic, self.partition = topic, partition
        self.target_topic = target_topic
        self.producer_id = producer_id
        self.checkpoint_interval_s = checkpoint_interval_s
        self._conn = None
        self._buf: list = []
        self._buf_bytes = 0  # payload bytes of the messages in _buf (as _next_set counts them)
        self._record: dict | None = None
        self._version = -1
        self._seq = 0
        self._pos: int | None = None  # source offset after the last acknowledged set
        self._cursor: int | None = None  # source offset after the last whole buffered message
        self._redo: dict | None = None  # an intent not acknowledged: resend exactly it
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
        self._buf, self._buf_bytes = [], 0
        return self._pos

    def sought(self, offset: int) -> None:
        """The consumer now reads from ``offset`` (start: the partition's earliest)."""
        if self._pos is None:
            self._pos = offset
        self._cursor = self._pos
        self._buf, self._buf_bytes = [], 0
        self.need_seek = False

    def skip_to(self, offset: int) -> None:
        """Continue at ``offset`` (the source's retention removed what lay
        before it); an unacknowledged intent before it is given up."""
        self._pos = offset
        self._redo = None

    @property
    def position(self) -> int | None:
        return self._pos

    # -- messages in -------------------------------------------------------------

    def offer(self, messages) -> None:
        """Take the messages the consumer handed out for this partition."""
        for msg in messages:
            if self.need_seek or self._cursor is None:
                return
            if msg.offset < self._cursor:
                continue  # redelivered
            if msg.offset > self._cursor:
                log.info("%s-%d: a gap at %d (expected %d): seeking back to %s",
                         self.topic, self.partition, msg.offset, self._cursor, self._pos)
                self.need_seek = True
                self._buf, self._buf_bytes = [], 0
                return
            if not self._buf:
                self._held_since = time.monotonic()
            self._buf.append(msg)
            self._buf_bytes += _size(msg)
            if _boundary(msg):
                self._cursor = msg.next_offset

    # -- sets out ------------------------------------------------------------------

    @property
    def lingering(self) -> bool:
        """Whether messages are held for a set (full or not yet)."""
        return bool(self._buf)

    def due(self, now: float | None = None) -> bool:
        """Whether :meth:`pump` would send now: a set is full, or what is
        held has lingered :data:`LINGER_S`, or a resend's range is held."""
        if not self._buf:
            return False
        if self._redo is not None:
            return self._cursor >= self._redo["end"]
        now = time.monotonic() if now is None else now
        return (len(self._buf) >= MAX_SET_MESSAGES or self._buf_bytes >= MAX_SET_BYTES
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
            taken = self._next_set(partial=linger_over or self._redo is not None)
            if not taken:
                return sent
            self._send(taken)
            sent += len(taken)
            self._held_since = time.monotonic() if self._buf else None

    def _next_set(self, partial: bool = True) -> list:
        """The next set to send: the whole intent of a resend; else a full
        set, or (``partial``) what is held up to its last boundary."""
        buf = self._buf
        if self._redo is not None:
            end = self._redo["end"]
            # the same range as the intent: wait until it is all held
            if self._cursor < end:
                return []
            n = 0
            while n < len(buf) and buf[n].offset < end:
                n += 1
            return self._take(n)
        last, size, full = -1, 0, False
        for i, msg in enumerate(buf):
            if i >= MAX_SET_MESSAGES:
                full = True
                break
            size += _size(msg)
            if size > MAX_SET_BYTES and last >= 0:
                full = True
                break
            if _boundary(msg):
                last = i
        if last < 0 or not (full or partial):
            return []
        return self._take(last + 1)

    def _take(self, n: int) -> list:
        taken, self._buf = self._buf[:n], self._buf[n:]
        self._buf_bytes = sum(map(_size, self._buf)) if self._buf else 0
        return taken

    def _send(self, msgs: list) -> None:
        start = self._pos
        end = msgs[-1].next_offset
        if self._redo is not None:
            assert start == self._redo["start"] and end == self._redo["end"], (self._redo, start, end)
            self._redo = None
        else:
            intent = {"seq": self._seq, "start": start, "end": end, "count": len(msgs), "acked": False,
                      "target_end": None, "last_ts": msgs[-1].timestamp}
            self._version = progress.write_progress(self.zk, self.progress_path, intent, self._version)
        payload = encode_message_set([m.value for m in msgs], [m.key for m in msgs],
                                     [m.timestamp for m in msgs], None)
        base = self._produce(payload)
        record = {"seq": self._seq, "start": start, "end": end, "count": len(msgs), "acked": True,
                  "target_end": None if base is None else base + len(payload), "last_ts": msgs[-1].timestamp}
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
        deadline = time.monotonic() + SEND_DEADLINE_S
        error: Exception | None = None
        while time.monotonic() < deadline:
            try:
                conn = self._connection()
                [result] = conn.produce_sets(self.target_topic, self.partition, [payload], ACKS_ALL,
                                             producer_id=self.producer_id, sequences=[self._seq])
            except RaylogError as err:
                if not err.retriable and not err.refresh_metadata:
                    raise
                error = err
                self._reset()
                time.sleep(0.2)
                continue
            if isinstance(result, DuplicateSequenceError):
                return None  # stored before (sequence <= last), offset no longer remembered
            if isinstance(result, RaylogError):
                if result.retriable or result.refresh_metadata:
                    error = result
                    self._reset()
                    time.sleep(0.2)
                    continue
                raise result
            return int(result)
        raise RequestTimeoutError(f"{self.target_topic}-{self.partition}: the target did not take sequence "
                                  f"{self._seq} within {SEND_DEADLINE_S:.0f} s (last: {error})")

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

