"""The requests of the data channel, served against a partition's log
(:class:`~raylog.storage.base.Log`): PRODUCE (joined runs, idempotent
sequences, acks), FETCH (long polls, the reply's bytes sent by the log's
slice: ``os.sendfile`` from a segment file), OFFSETS and OFFSETS_FOR_TIME
and COUNT (the messages of a range, walked and checked here: no data sent),
LOCATE (where a FETCH's whole batches lie in a segment file: no data sent),
each run on the thread of the connection it came on
(:class:`~raylog.transfer.serving.FrameLoop`)."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Callable, NoReturn

from raylog.errors import ClosedError, NotOwnerError, RaylogError
from raylog.storage.base import Log
from raylog.storage.counting import count_between, count_range, count_records
from raylog.storage.log import CommittedRead
from raylog.storage.log_reads import FileSlice
from raylog.storage.record_batch import HEADER_SIZE as BATCH_HEADER_SIZE
from raylog.storage.record_batch import (
    FORMAT_PREFIX,
    format_at,
    iter_batches,
    needs_reencode,
    whole_batches_in_file,
)
from raylog.transfer.replica_source import ReplicaRead, ReplicaSource
from raylog.transfer.protocol import (
    ACKS_ALL,
    COUNT_MAX_BYTES,
    FETCH_V1_MAX_ABORTED,
    LOCATED_BATCHES,
    NOT_LOCATABLE,
    READ_COMMITTED,
)
from raylog.transfer.replies import (
    encode_count_reply,
    encode_error,
    encode_fetch_reply_header,
    encode_fetch_v1_reply_header,
    encode_locate_reply,
    encode_locate_v1_reply,
    encode_offsets_for_time_reply,
    encode_offsets_reply,
    encode_produce_reply,
    encode_replica_fetch_reply_header,
)
from raylog.transfer.requests import (
    CountRequest,
    FetchRequest,
    LocateRequest,
    OffsetsForTimeRequest,
    OffsetsRequest,
    ProduceRequest,
    ReplicaFetchRequest,
)
from raylog.transfer.connections import CloseConnection, ServedConnection, peer_closed

# one logger for the whole data server
log = logging.getLogger("raylog.transfer.server")


#: a long poll re-checks for ``stop()`` and for a peer that closed this often
#: while it waits
LONG_POLL_SLICE_S = 0.5
#: how long a FETCH that would wait but finds every long-poll slot taken
#: pauses (holding no slot) before it is answered with what there is
NO_SLOT_PAUSE_S = 0.2


_MSG_MORE = getattr(socket, "MSG_MORE", 0)


def _length(answer) -> int:
    """Bytes of log in a long poll's answer: a slice, a replica read's data
    or a read_committed read's slice."""
    if type(answer) is ReplicaRead:
        return answer.data.length
    if type(answer) is CommittedRead:
        return answer.slice.length
    return answer.length


def _closing(topic: str, partition: int) -> NotOwnerError:
    """What a client hears when the log was closed under a request: the
    partition is going away here, so look up where it serves next."""
    return NotOwnerError(
        f"{topic}-{partition} is closing on this endpoint; refresh its endpoint from the registry",
        topic=topic,
        partition=partition,
    )


def _committed_answer(answer: CommittedRead, length: int) -> tuple[int, list]:
    """The bytes of a read_committed ``answer`` to send (at most
    ``length``) and its aborted transactions as the reply carries them,
    ``(producer id, first offset, marker offset)``. Past
    :data:`FETCH_V1_MAX_ABORTED` of them the data is cut before the first
    batch of the first transaction left out (offsets are the batches'
    positions), unless that is where the data starts."""
    aborted = [(txn.producer_id, txn.first_offset, txn.last_offset) for txn in answer.aborted]
    if len(aborted) > FETCH_V1_MAX_ABORTED:
        by_first = sorted(aborted, key=lambda txn: txn[1])
        cut = by_first[FETCH_V1_MAX_ABORTED][1]
        if cut > answer.slice.offset:
            length = min(length, cut - answer.slice.offset)
            aborted = by_first[:FETCH_V1_MAX_ABORTED]
    return length, aborted


class RequestHandlers:
    """The request handlers of a :class:`~raylog.transfer.server.DataServer`
    (called on a connection's thread; they keep no state of their own).

    ``resolve(topic, partition)`` is the log served here or ``None``;
    ``max_fetch_bytes`` bounds a fetch reply's data and ``max_wait_ms_cap``
    a long poll; ``send(conn, data)`` sends replies that must go before a
    long poll; ``fail(conn, err, correlation_id, out)`` answers ``err`` after
    ``out`` and ends the connection (it raises); ``park(conn)`` takes a
    long-poll slot (False: none free, answer at once) and ``unpark(conn)``
    gives it back; a long poll ends when ``stopping`` is set;
    ``resolve_replica(topic, partition)`` is the leader that answers a
    follower's REPLICA_FETCH here (a
    :class:`~raylog.transfer.replica_source.ReplicaSource`) or ``None``.
    """

    def __init__(
        self,
        resolve: Callable[[str, int], Log | None],
        *,
        max_fetch_bytes: int,
        max_wait_ms_cap: int,
        send: Callable[[ServedConnection, bytes], None],
        fail: Callable[..., NoReturn],
        park: Callable[[ServedConnection], bool],
        unpark: Callable[[ServedConnection], None],
        stopping: threading.Event,
        resolve_replica: Callable[[str, int], ReplicaSource | None] | None = None,
    ):
        self._resolve = resolve
        self._resolve_replica = resolve_replica or (lambda topic, partition: None)
        self._max_fetch_bytes = max_fetch_bytes
        self.max_wait_ms_cap = max_wait_ms_cap
        self._send = send
        self._fail = fail
        self._park = park
        self._unpark = unpark
        self._stopping = stopping

    def _lookup(self, topic: str, partition: int) -> Log:
        owner = self._resolve(topic, partition)
        if owner is None:
            raise NotOwnerError(
                f"this endpoint does not serve {topic}-{partition}; refresh its endpoint from the registry",
                topic=topic,
                partition=partition,
            )
        return owner

    def produce(self, conn: ServedConnection, group: list[ProduceRequest], out: list) -> None:
        """Append a run of PRODUCE frames for one partition (clears ``group``):
        joined into sets of at most the log's ``max_message_bytes``."""
        if len(group) == 1:  # one set (one message at a time): no run to join
            request = group.pop()
            try:
                partition_log = self._lookup(request.topic, request.partition)
            except RaylogError as err:
                self._produce_failed(conn, request, err, out)
                return
            self._append(conn, partition_log, [request], out)
            return
        requests = list(group)
        group.clear()
        first = requests[0]
        try:
            partition_log = self._lookup(first.topic, first.partition)
        except RaylogError as err:
            for request in requests:
                self._produce_failed(conn, request, err, out)
            return
        limit = partition_log.config.max_message_bytes
        run: list[ProduceRequest] = []
        run_bytes = 0
        run_pid = next_sequence = -1
        run_format = None
        for request in requests:
            length = len(request.message_set)
            pid = request.producer_id
            fmt = _joinable_format(request.message_set)
            # A run joins sets of one producer id (or of none), in sequence,
            # of one format, each stored as sent (see _joinable_format).
            if run and (
                run_bytes + length > limit or pid != run_pid or (pid >= 0 and request.sequence != next_sequence)
                or fmt is None or fmt != run_format
            ):
                self._append(conn, partition_log, run, out)
                run, run_bytes = [], 0
            if pid >= 0:
                next_sequence = request.sequence + 1
            run_pid = pid
            run_format = fmt
            run.append(request)
            run_bytes += length
        self._append(conn, partition_log, run, out)

    def _append(self, conn: ServedConnection, partition_log: Log, run: list[ProduceRequest], out: list) -> None:
        """Append one run (its sets joined) and answer each set with its own
        base offset: the run's base plus the bytes of the sets before it
        (which is why a run joins only sets stored byte for byte as sent)."""
        first = run[0]
        try:
            # A replicated leader refuses acks="all" while its ISR is below
            # min_insync_replicas, before appending (raylog.replication.leader).
            if any(request.acks == ACKS_ALL for request in run):
                partition_log.before_acks_all()
            if len(run) == 1:
                data = bytes(first.message_set)
            else:
                data = b"".join([request.message_set for request in run])
            if first.producer_id < 0:
                base = partition_log.append(data)
            else:
                base = partition_log.append_sequenced(
                    data,
                    first.producer_id,
                    first.producer_epoch,
                    first.sequence,
                    [len(request.message_set) for request in run],
                    name=f"{first.topic}-{first.partition}",
                )
        except ClosedError:
            err = _closing(run[0].topic, run[0].partition)
            for request in run:
                self._produce_failed(conn, request, err, out)
            return
        except RaylogError as err:
            if len(run) == 1:
                self._produce_failed(conn, run[0], err, out)
                return
            # A set of the run was refused: append them one by one so that
            # each frame gets its own answer, as if they had come apart.
            for request in run:
                self._append(conn, partition_log, [request], out)
            return
        conn.message_sets_in += len(run)
        replies = []
        wait_for_sync = False
        end = base + len(data)
        for request in run:
            acks = request.acks
            if acks:
                replies.append(encode_produce_reply(request.correlation_id, base))
                if acks == ACKS_ALL:
                    wait_for_sync = True
            base += len(request.message_set)
        if wait_for_sync and partition_log.high_watermark < end:
            # acks=-1: reply once the sets are synced and below the high
            # watermark (a flush covers every append before it).
            try:
                partition_log.flush()
            except RaylogError as err:
                if isinstance(err, ClosedError):
                    err = _closing(first.topic, first.partition)
                for request in run:
                    self._produce_failed(conn, request, err, out)
                return
        out.extend(replies)

    def _refuse(self, conn: ServedConnection, request, err: RaylogError, out: list) -> None:
        """Answer ``request`` (of one topic-partition) with ``err``; a closing
        log's :class:`ClosedError` is answered as the partition moving away."""
        if isinstance(err, ClosedError):
            err = _closing(request.topic, request.partition)
        conn.count_error(err)
        out.append(encode_error(request.correlation_id, err))

    def _produce_failed(self, conn: ServedConnection, request: ProduceRequest, err: RaylogError, out: list) -> None:
        if request.acks:
            conn.count_error(err)
            out.append(encode_error(request.correlation_id, err))
        else:
            # No reply is expected: answer anyway and close, so that the
            # producer learns of it on its next call instead of never.
            self._fail(conn, err, request.correlation_id, out)

    def fetch(self, conn: ServedConnection, request: FetchRequest, out: list) -> None:
        """FETCH: version 0, or version 1 (an isolation level; READ_COMMITTED
        is :meth:`_fetch_committed`)."""
        if request.isolation == READ_COMMITTED:
            self._fetch_committed(conn, request, out)
            return
        max_bytes = min(request.max_bytes, self._max_fetch_bytes)
        try:
            partition_log = self._lookup(request.topic, request.partition)
            chunk = partition_log.read(request.offset, max_bytes)
            if chunk.length == 0 and request.max_wait_ms > 0:
                chunk = self._long_poll(conn, out, request.max_wait_ms, chunk, partition_log.wait_for_data,
                                        lambda: partition_log.read(request.offset, max_bytes), request.offset)
            high_watermark = partition_log.high_watermark
            log_start = partition_log.log_start_offset
        except RaylogError as err:
            self._refuse(conn, request, err, out)
            return
        length = min(chunk.length, self._max_fetch_bytes)
        if request.isolation is None:
            out.append(encode_fetch_reply_header(request.correlation_id, high_watermark, log_start, length))
        else:  # version 1, read_uncommitted: the last stable offset is not looked at
            out.append(encode_fetch_v1_reply_header(request.correlation_id, high_watermark, log_start,
                                                    high_watermark, (), length))
        if not length:
            return
        self._send_slice(conn, out, chunk, length)

    def _fetch_committed(self, conn: ServedConnection, request: FetchRequest, out: list) -> None:
        """A READ_COMMITTED FETCH (version 1): the log's ``read_committed``
        (bytes below the last stable offset and the aborted transactions
        they overlap). At the last stable offset with the high watermark
        past it (an open transaction) the long poll waits for the high
        watermark to move: a marker that ends the transaction moves it.
        A log without ``read_committed`` (a follower replica, which knows
        the transactions only as far as it has copied the log; a log held in
        memory) answers NotOwnerError: read from the partition's leader."""
        max_bytes = min(request.max_bytes, self._max_fetch_bytes)
        try:
            partition_log = self._lookup(request.topic, request.partition)
            answer = self._read_committed(request, partition_log, max_bytes)
            read = partition_log.read_committed
            if answer.slice.length == 0 and request.max_wait_ms > 0:
                answer = self._long_poll(
                    conn, out, request.max_wait_ms, answer,
                    lambda offset, timeout_s: partition_log.wait_for_data(
                        max(offset, partition_log.high_watermark), timeout_s),
                    lambda: read(request.offset, max_bytes), request.offset)
            high_watermark = partition_log.high_watermark
            log_start = partition_log.log_start_offset
        except RaylogError as err:
            self._refuse(conn, request, err, out)
            return
        chunk = answer.slice
        length, aborted = _committed_answer(answer, min(chunk.length, self._max_fetch_bytes))
        out.append(encode_fetch_v1_reply_header(request.correlation_id, high_watermark, log_start,
                                                answer.last_stable_offset, aborted, length))
        if not length:
            return
        self._send_slice(conn, out, chunk, length)

    @staticmethod
    def _read_committed(request, partition_log, max_bytes: int):
        """The log's ``read_committed`` of ``request``; NotOwnerError for a
        log without it (a follower replica, which knows the transactions
        only as far as it has copied the log; a log held in memory)."""
        read = getattr(partition_log, "read_committed", None)
        if read is None:
            raise NotOwnerError(
                f"this endpoint does not serve read_committed reads of {request.topic}-{request.partition} "
                f"(a follower replica, or a log without transactions); read them from the partition's leader",
                topic=request.topic, partition=request.partition,
            )
        return read(request.offset, max_bytes)

    def locate(self, conn: ServedConnection, request: LocateRequest, out: list) -> None:
        """LOCATE: where the whole batches a FETCH of ``request`` would
        answer lie in their segment file (read as a FETCH reads, at once:
        no long poll; the batches' headers walked, never their records)."""
        self._answer(conn, request, out, lambda partition_log: self._locate_reply(request, partition_log))

    def _locate_reply(self, request: LocateRequest, partition_log) -> bytes:
        """The LOCATE reply: of a read as a FETCH reads (version 0), or as its
        isolation asks for (version 1: a READ_COMMITTED one is the log's
        ``read_committed``, its last stable offset and aborted
        transactions answered after the version 0 fields)."""
        lso, aborted = None, ()
        max_bytes = min(request.max_bytes, self._max_fetch_bytes)
        if request.isolation == READ_COMMITTED:
            answer = self._read_committed(request, partition_log, max_bytes)
            chunk = answer.slice
            length, aborted = _committed_answer(answer, chunk.length)
            chunk = chunk._replace(length=length)
            lso = answer.last_stable_offset
        else:
            chunk = partition_log.read(request.offset, max_bytes)
        reply = self._locate_v0_reply(request, partition_log, chunk)
        if request.isolation is None:
            return reply
        return encode_locate_v1_reply(reply, partition_log.high_watermark if lso is None else lso, aborted)

    def _locate_v0_reply(self, request: LocateRequest, partition_log, chunk) -> bytes:
        """The version 0 fields of a LOCATE reply for the read ``chunk``."""
        high_watermark, log_start = partition_log.high_watermark, partition_log.log_start_offset
        if not isinstance(chunk, FileSlice) or not isinstance(chunk.file.name, str):  # a log held in memory
            return encode_locate_reply(request.correlation_id, high_watermark, log_start, NOT_LOCATABLE,
                                       request.offset)
        if not chunk.length:
            return encode_locate_reply(request.correlation_id, high_watermark, log_start, LOCATED_BATCHES,
                                       request.offset)
        fd = chunk.file.fileno()
        # the headers walked where they lie (never a copy of the slice)
        first, end, next_offset, walked = whole_batches_in_file(fd, chunk.position, chunk.length,
                                                                request.offset, request.max_bytes)
        if not walked and format_at(os.pread(fd, min(FORMAT_PREFIX, chunk.length), chunk.position)) != 2:
            # format-1 messages: FETCH converts them
            return encode_locate_reply(request.correlation_id, high_watermark, log_start, NOT_LOCATABLE,
                                       request.offset)
        stat = os.fstat(fd)
        return encode_locate_reply(
            request.correlation_id, high_watermark, log_start, LOCATED_BATCHES, next_offset,
            chunk.position + first, end - first, stat.st_dev, stat.st_ino, os.path.abspath(chunk.file.name))

    def _long_poll(self, conn: ServedConnection, out: list, max_wait_ms: int, empty, wait, read, offset: int):
        """A FETCH's (or REPLICA_FETCH's) long poll: earlier replies go out
        first, then, with a long-poll slot, ``wait(offset, seconds)`` and
        ``read()`` again until ``read()`` answers something, ``max_wait_ms``
        (capped) passed or the server stops; ``empty``, the answer read
        before, when nothing came. Every slot taken: answered after a short
        pause (no slot held) with what there is then, so that a reader
        without a slot asks again at most every ``NO_SLOT_PAUSE_S`` instead
        of spinning on empty replies. A peer that closed the connection
        meanwhile ends the wait and the connection (checked every
        ``LONG_POLL_SLICE_S``)."""
        max_wait_ms = min(max_wait_ms, self.max_wait_ms_cap)
        if out:  # earlier replies do not wait for the long poll
            self._send(conn, b"".join(out))
            out.clear()
        if not self._park(conn):  # no long-poll slot
            self._stopping.wait(min(max_wait_ms / 1000.0, NO_SLOT_PAUSE_S))
            return read()
        answer = empty
        try:
            deadline = time.monotonic() + max_wait_ms / 1000.0
            while not self._stopping.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                wait(offset, min(left, LONG_POLL_SLICE_S))
                # Read again after every wait, whatever it said: a closed
                # log says so here (instead of returning at once forever).
                answer = read()
                if _length(answer):
                    break
                if not conn.long_polling or peer_closed(conn.sock):
                    raise CloseConnection()  # nobody is waiting for the reply
        finally:
            self._unpark(conn)
        return answer

    def replica_fetch(self, conn: ServedConnection, request: ReplicaFetchRequest, out: list) -> None:
        """REPLICA_FETCH: the leader records the follower's progress
        (:meth:`~raylog.transfer.replica_source.ReplicaSource.record_progress`),
        then answers its log from the follower's log end, flushed or not,
        with the producers' sets those bytes hold (a long poll while there
        is nothing new); the bytes go with ``os.sendfile``."""
        max_bytes = min(request.max_bytes, self._max_fetch_bytes)
        try:
            source = self._resolve_replica(request.topic, request.partition)
            if source is None:
                raise NotOwnerError(
                    f"this endpoint does not lead {request.topic}-{request.partition}: a replica fetch goes to the "
                    f"partition's leader; read its endpoint from the registry again",
                    topic=request.topic, partition=request.partition,
                )
            source.record_progress(request.replica, request.leader_epoch, request.log_end, request.flushed)
            answer = source.replica_read(request.replica, request.log_end, max_bytes)
            if answer.data.length == 0 and request.max_wait_ms > 0:
                answer = self._long_poll(conn, out, request.max_wait_ms, answer, source.wait_for_end,
                                         lambda: source.replica_read(request.replica, request.log_end, max_bytes),
                                         request.log_end)
        except RaylogError as err:
            self._refuse(conn, request, err, out)
            return
        chunk = answer.data
        length = min(chunk.length, self._max_fetch_bytes - len(answer.sets))
        out.append(encode_replica_fetch_reply_header(
            request.correlation_id, answer.high_watermark, answer.log_start_offset, answer.leader_epoch,
            answer.sets, max(length, 0)))
        if length <= 0:
            return
        self._send_slice(conn, out, chunk, length)

    def _send_slice(self, conn: ServedConnection, out: list, chunk, length: int) -> None:
        """Send the replies in ``out`` (the last one's header before its data),
        then ``length`` bytes of ``chunk`` (``os.sendfile`` from a segment file)."""
        data = b"".join(out)
        out.clear()
        sock = conn.sock
        sock.sendall(data, _MSG_MORE)  # the header leaves with the first data
        conn.bytes_out += len(data)
        sent = chunk.send_to(sock, length)
        conn.bytes_out += sent
        if sent < length:
            # The log lost bytes of the slice (a segment deleted and cut
            # under us); the reply cannot be completed.
            raise CloseConnection()

    def _answer(self, conn: ServedConnection, request, out: list, reply_for) -> None:
        """A one-frame reply: ``reply_for(partition_log)``, or the error frame
        (a partition closing answers not-owner: the client looks it up again)."""
        try:
            reply = reply_for(self._lookup(request.topic, request.partition))
        except ClosedError:
            err = _closing(request.topic, request.partition)
            conn.count_error(err)
            reply = encode_error(request.correlation_id, err)
        except RaylogError as err:
            conn.count_error(err)
            reply = encode_error(request.correlation_id, err)
        out.append(reply)

    def offsets(self, conn: ServedConnection, request: OffsetsRequest, out: list) -> None:
        self._answer(conn, request, out, lambda partition_log: encode_offsets_reply(
            request.correlation_id, partition_log.log_start_offset, partition_log.high_watermark))

    def offsets_for_time(self, conn: ServedConnection, request: OffsetsForTimeRequest, out: list) -> None:
        self._answer(conn, request, out, lambda partition_log: encode_offsets_for_time_reply(
            request.correlation_id, partition_log.offset_for_time(request.timestamp_ms)))

    def count(self, conn: ServedConnection, request: CountRequest, out: list) -> None:
        """COUNT: the messages of [start, end), walked and checked on this
        node (at most ``COUNT_MAX_BYTES`` of log per request); version 1
        stops after at most ``max_messages``."""

        def reply_for(partition_log):
            max_bytes = min(request.max_bytes, COUNT_MAX_BYTES)
            if request.max_messages is None:
                counted = count_between(partition_log, request.start, request.end, max_bytes)  # record counts
                if counted is None:  # a log without segments
                    counted = count_range(partition_log, request.start, request.end, max_bytes)
            else:
                counted = count_records(partition_log, request.start, request.end, max_bytes, request.max_messages)
            return encode_count_reply(request.correlation_id, counted.messages, counted.next_offset)

        self._answer(conn, request, out, reply_for)


def _joinable_format(message_set) -> int | None:
    """The format (1 or 2) of a PRODUCE set that may join a run, or None
    when it must be appended alone: a set of record batches of which one is
    re-encoded at append (a compressed batch shorter than its count,
    docs/design.md section 2: then the stored bytes are not the sent bytes
    and the sets after it in a run would be answered wrong offsets), or
    whose batches cannot be walked (the append refuses it alone)."""
    fmt = format_at(message_set)
    if fmt != 2:
        return fmt
    n = len(message_set)
    if n >= BATCH_HEADER_SIZE and int.from_bytes(message_set[8:12], "big") + 12 == n and not message_set[22] & 7:
        return 2  # one whole batch without a codec (what raylog's producer sends): stored as sent
    try:
        walked = 0
        for pos, header in iter_batches(message_set):
            if needs_reencode(header):
                return None
            walked = pos + header.size
    except RaylogError:
        return None
    return 2 if walked == len(message_set) else None
