"""The client end of the data channel: one TCP connection to a data server.

Usage::

    with BrokerConnection(host, port, token=token) as conn:
        base = conn.produce("clicks", 0, encode_message_set([b"v1", b"v2"]))
        result = conn.fetch("clicks", 0, base, max_bytes=1 << 20, max_wait_ms=1000)
        messages, _ = decode_messages(result.data, result.offset)

A :class:`BrokerConnection` connects (and authenticates) on first use and
again on the first use after a connection failure; :meth:`close` ends it for
good. Errors:

* the server's error replies come back as the same typed raylog error
  (OffsetOutOfRangeError with ``earliest`` and ``latest``, NotOwnerError,
  CorruptMessageError ...);
* a socket failure (refused, reset, closed by the server) raises
  :class:`BrokerUnavailableError` (retriable) saying what happened;
* a connection not set up within ``connect_timeout_s`` (default
  :data:`raylog.config.CONNECT_TIMEOUT_MS`, never more than ``timeout_s``)
  raises :class:`BrokerUnavailableError` too: a host cut off drops the SYN,
  and a connect must not hold its caller for a whole request timeout;
* a peer that acknowledges nothing for :data:`raylog.config.DEAD_PEER_MS`
  (TCP keep-alive and ``TCP_USER_TIMEOUT``: a host cut off while a request
  waits) ends the connection: :class:`BrokerUnavailableError` as well;
* no reply within ``timeout_s`` (plus the request's ``max_wait_ms`` for a
  long poll) raises :class:`RequestTimeoutError` (retriable).

After a socket failure or a timeout the connection is dropped (replies
could be out of step) and the next call connects again. The connection never
retries by itself. A plain produce the caller retries after such an error
may store its set twice (at-least-once); an idempotent one (PRODUCE version
1: ``producer_id`` and a sequence number per set, see
:mod:`raylog.transfer.protocol`) resent with the same numbers is stored
once, and the reply carries the offset of the first store.
:meth:`BrokerConnection.produce_sets` pipelines many sets and returns each
set's own outcome (base offset or typed error), so that one refused set
does not hide the others'.

acks=0 produces get no reply. If the server refuses one, it sends the error
and closes the connection; the next request that reads a reply (or an acks=0
produce a millisecond or more later) raises that error, its message naming
the produce's correlation id. Sets sent after the refused one on that
connection are lost (acks=0 promises no more).

Timeouts are enforced by the kernel (SO_RCVTIMEO/SO_SNDTIMEO) on a blocking
socket, so that a send or a receive is one system call, without a poll()
before it.

Thread-safety: none, except that :meth:`BrokerConnection.close` may be
called from another thread to end a blocked call (a long poll). A connection
is used by one thread at a time; give each thread its own connection.
"""

from __future__ import annotations

import select
import socket
from typing import NamedTuple, Sequence

from raylog.config import CONNECT_TIMEOUT_MS, DEAD_PEER_MS, KiB, MiB
from raylog.errors import (
    AuthenticationError,
    BrokerUnavailableError,
    ClosedError,
    ConfigError,
    InvalidOffsetError,
    ProtocolError,
    RaylogError,
    RequestTimeoutError,
)
from raylog.transfer.handshake import check_hello_reply, new_nonce, unproven_peer
from raylog.transfer.protocol import (
    AUTH_HELLO_REPLY,
    AUTH_HELLO_REPLY_FIELDS,
    SIZE,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    DEFAULT_MAX_FRAME_BYTES,
    FETCH_REPLY_FIELDS,
    FETCH_V1_ABORTED,
    FETCH_V1_DATA_LENGTH,
    FETCH_V1_REPLY_FIELDS,
    OFFSETS_FOR_TIME_REPLY_FIELDS,
    COUNT_REPLY_FIELDS,
    LOCATE_REPLY_FIELDS,
    LOCATE_V1_REPLY_TAIL,
    OFFSETS_REPLY_FIELDS,
    STRING_LENGTH,
    REPLY_HEADER_BODY,
    REPLICA_FETCH_DATA_LENGTH,
    REPLICA_FETCH_REPLY_FIELDS,
)
from raylog.transfer.requests import (
    ProduceHeader,
    encode_auth_hello,
    encode_auth_proof,
    encode_count,
    encode_fetch,
    encode_locate,
    encode_offsets,
    encode_offsets_for_time,
    encode_replica_fetch,
)
from raylog.transfer.socket_io import FrameChannel, set_timeout

#: receive buffer for reply headers and small replies
READ_BUFFER_BYTES = 64 * KiB
#: produce_many writes at most this many frames ...
PIPELINE_FRAMES = 1024
#: ... or this many bytes before it reads their replies
PIPELINE_BYTES = 4 * MiB
#: message sets larger than this are sent with sendmsg instead of being
#: copied behind their header
GATHER_THRESHOLD = 64 * KiB

def _detect_dead_peer(sock: socket.socket) -> None:
    """A peer that acknowledges nothing for :data:`DEAD_PEER_MS` ends the
    connection (a host cut off: its link down, its process alive): keep-alive
    probes on an idle connection (a long poll, a reply not yet due) and a
    bound on unacknowledged data (Linux; elsewhere only the request timeout
    applies)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle_s = max(1, DEAD_PEER_MS // 3000)
    for name, value in (("TCP_KEEPIDLE", idle_s), ("TCP_KEEPINTVL", idle_s), ("TCP_KEEPCNT", 3),
                        ("TCP_USER_TIMEOUT", DEAD_PEER_MS)):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


_MAX_CORRELATION = 0x7FFFFFFF


class FetchResult(NamedTuple):
    """A fetch reply: ``data`` is the log from ``offset`` on as the server sent
    it (whole messages, possibly a partial last one; empty when nothing is
    there yet). Decode it with ``decode_messages(data, offset)``."""

    offset: int
    data: bytearray
    high_watermark: int
    log_start_offset: int
    #: FETCH version 1 (an isolation level asked): the partition's last
    #: stable offset (the high watermark for read_uncommitted); None for version 0
    last_stable_offset: int | None = None
    #: read_committed: ``(producer id, first offset, abort marker offset)`` of
    #: the aborted transactions that overlap ``data`` (see
    #: :mod:`raylog.transfer.protocol`)
    aborted: tuple = ()


class ReplicaFetched(NamedTuple):
    """A REPLICA_FETCH reply (:mod:`raylog.transfer.protocol`): ``data`` is
    the leader's log from ``offset`` on (whole messages, possibly a partial
    last one), ``sets`` the producers' sets it holds (producer-state journal
    records), then the leader's committed offset, log start and epoch."""

    offset: int
    data: memoryview
    sets: memoryview
    high_watermark: int
    log_start_offset: int
    leader_epoch: int


class Located(NamedTuple):
    """A LOCATE reply (:mod:`raylog.transfer.protocol`): ``kind`` 0 (the
    whole batches wanted are ``length`` bytes at ``position`` of the
    segment file ``path``, whose ``device`` and ``inode`` they are) or 1
    (not locatable: FETCH them); ``next_offset`` is where the reader goes
    on after them."""

    high_watermark: int
    log_start_offset: int
    kind: int
    next_offset: int
    position: int
    length: int
    device: int
    inode: int
    path: str
    #: LOCATE version 1 (an isolation level asked): the last stable offset and,
    #: read_committed, the aborted transactions of the range (as :class:`FetchResult`'s)
    last_stable_offset: int | None = None
    aborted: tuple = ()


class Offsets(NamedTuple):
    log_start_offset: int
    high_watermark: int


class BrokerConnection:
    """One connection to a :class:`~raylog.transfer.server.DataServer` (see
    the module docstring). Not thread-safe: one connection per thread.

    It connects, authenticates and encodes the requests; its socket, read
    buffer and reply reading are a :class:`~raylog.transfer.socket_io.FrameChannel`
    given the host, port, ``timeout_s`` and ``max_frame_bytes``."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        token: bytes | None = None,
        timeout_s: float = 30.0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        socket_buffer_bytes: int | None = None,
        connect_timeout_s: float | None = None,
    ):
        if timeout_s <= 0:
            raise ConfigError(f"timeout_s must be positive, got {timeout_s}")
        if connect_timeout_s is None:
            connect_timeout_s = CONNECT_TIMEOUT_MS / 1000.0
        if connect_timeout_s <= 0:
            raise ConfigError(f"connect_timeout_s must be positive, got {connect_timeout_s}")
        self.host, self.port = host, port
        self.timeout_s = timeout_s
        self.connect_timeout_s = min(connect_timeout_s, timeout_s)
        self.max_frame_bytes = max_frame_bytes
        self._token = bytes(token) if token is not None else None
        self._socket_buffer_bytes = socket_buffer_bytes
        self._channel = FrameChannel(
            host, port, timeout_s=timeout_s, max_frame_bytes=max_frame_bytes, buffer_bytes=READ_BUFFER_BYTES
        )
        self._correlation = 0
        #: topic -> its precompiled PRODUCE headers
        self._topics: dict[str, ProduceHeader] = {}

    # -- life cycle ------------------------------------------------------------

    def connect(self) -> None:
        """Connect and authenticate now (calls do it themselves on first use)."""
        channel = self._channel
        if channel.closed:
            raise ClosedError("connection was closed; create a new BrokerConnection")
        if channel.sock is not None:
            return
        where = f"{self.host}:{self.port}"
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout_s)
        except socket.timeout:
            raise BrokerUnavailableError(
                f"connecting to {where} timed out after {self.connect_timeout_s:g}s; its host may be "
                f"unreachable or the endpoint moved: look it up again and retry",
                host=self.host,
                port=self.port,
            ) from None
        except OSError as err:
            raise BrokerUnavailableError(
                f"cannot connect to {where}: {err}; the endpoint may be restarting", host=self.host, port=self.port
            ) from err
        try:
            sock.settimeout(None)  # blocking; the kernel enforces the timeouts
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _detect_dead_peer(sock)
            if self._socket_buffer_bytes:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._socket_buffer_bytes)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._socket_buffer_bytes)
            set_timeout(sock, socket.SO_SNDTIMEO, self.timeout_s)
            set_timeout(sock, socket.SO_RCVTIMEO, self.timeout_s)
        except OSError as err:
            sock.close()
            raise BrokerUnavailableError(f"cannot set up the connection to {where}: {err}") from err
        channel.attach(sock)
        if self._token is not None:
            self._authenticate(self._token)

    def _authenticate(self, token: bytes) -> None:
        """The client side of the challenge–response (:mod:`raylog.transfer.handshake`):
        the proof goes out only after the peer proved it holds the token."""
        channel = self._channel
        where = f"{self.host}:{self.port}"
        nonce = new_nonce()
        correlation_id = self._next_correlation()
        channel.send(encode_auth_hello(correlation_id, nonce))
        try:
            pos = channel.read_reply(correlation_id, REPLY_HEADER_BODY, whole=False)
        except ProtocolError as err:  # not a raylog endpoint's answer
            channel.drop()
            raise unproven_peer(where, f"answered the AUTH HELLO out of protocol ({err})") from None
        except RequestTimeoutError:
            raise RequestTimeoutError(
                f"{where} did not answer the AUTH HELLO within {channel.recv_timeout}s (nothing derived from the "
                f"token was sent); it may be overloaded, or not the partition's data endpoint (check the "
                f"endpoint registered in ZooKeeper)",
                host=self.host, port=self.port,
            ) from None
        if channel.reply_size != AUTH_HELLO_REPLY.size - SIZE.size:
            channel.drop()
            raise unproven_peer(where, f"answered the AUTH HELLO with a reply of {channel.reply_size} bytes")
        channel.fill(AUTH_HELLO_REPLY.size)
        body = bytes(channel.view[pos : pos + AUTH_HELLO_REPLY_FIELDS.size])
        channel.consume_reply()
        try:
            proof = check_hello_reply(token, nonce, body, where)
        except AuthenticationError:
            channel.drop()
            raise
        correlation_id = self._next_correlation()
        channel.send(encode_auth_proof(correlation_id, proof))
        channel.read_reply(correlation_id, REPLY_HEADER_BODY)
        channel.consume_reply()

    def close(self) -> None:
        """Close the connection; further calls raise ClosedError. The one
        method that may be called from another thread: a call blocked on
        this connection (a long poll) then ends with ClosedError."""
        self._channel.close()

    def __enter__(self) -> "BrokerConnection":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def connected(self) -> bool:
        return self._channel.sock is not None

    # -- requests --------------------------------------------------------------

    def produce(
        self,
        topic: str,
        partition: int,
        message_set: bytes,
        acks: int = 1,
        *,
        producer_id: int = NO_PRODUCER_ID,
        sequence: int = NO_SEQUENCE,
    ) -> int | None:
        """Append ``message_set`` (whole messages, docs/design.md §2) to the partition.

        acks=1 (appended) and acks=-1 (flushed and visible) return the base
        offset (the offset of the set's first message); acks=0 returns
        ``None`` as soon as the frame is written. With a ``producer_id`` the
        request is an idempotent PRODUCE version 1 carrying ``sequence``."""
        channel = self._channel
        self._before_request(replies=bool(acks))
        correlation_id = self._next_correlation()
        header = self._topic(topic).pack(
            correlation_id, partition, acks, len(message_set), producer_id, sequence, max_frame_bytes=self.max_frame_bytes
        )
        if len(message_set) > GATHER_THRESHOLD:
            channel.send_gather([header, message_set])
        else:
            channel.send(header + message_set)
        if not acks:
            channel.unacked = correlation_id
            return None
        channel.expect_wait(0)
        return channel.read_produce_reply(correlation_id)

    def produce_many(
        self, topic: str, partition: int, message_sets: Sequence[bytes], acks: int = 1
    ) -> list[int] | None:
        """Send one PRODUCE frame per set, pipelined (see :meth:`produce_sets`).
        Returns the base offsets (acks 1 or -1) or ``None``. When the server
        refuses a set the other sets are still stored; the first error is
        raised with ``index`` and ``base_offsets`` (``None`` for refused sets)."""
        results = self.produce_sets(topic, partition, message_sets, acks)
        if results is None:
            return None
        bases = [None if isinstance(r, RaylogError) else r for r in results]
        for index, result in enumerate(results):
            if isinstance(result, RaylogError):
                result.details.update(index=index, base_offsets=bases)
                result.index, result.base_offsets = index, bases
                raise result
        return bases

    def produce_sets(
        self,
        topic: str,
        partition: int,
        message_sets: Sequence[bytes],
        acks: int = 1,
        *,
        producer_id: int = NO_PRODUCER_ID,
        sequences: Sequence[int] | None = None,
    ) -> list | None:
        """Send one PRODUCE frame per set, pipelined (frames written together,
        one send per up to :data:`PIPELINE_FRAMES` frames or
        :data:`PIPELINE_BYTES`), then read every reply.

        Returns, set by set, the base offset or the typed error the server
        answered for that set alone (the connection stays in step and the
        other sets are unaffected); ``None`` for acks=0. With a
        ``producer_id`` each frame is an idempotent PRODUCE version 1 with
        ``sequences[i]``. A failure of the connection itself (reset, timeout,
        closed) raises, and then which sets were stored is unknown: an
        idempotent producer resends them with the same sequence numbers."""
        channel = self._channel
        self._before_request(replies=bool(acks))
        results: list | None = [] if acks else None
        i, total = 0, len(message_sets)
        if acks:
            channel.expect_wait(0)
        header = self._topic(topic)
        while i < total:
            parts = []
            ids = []
            size = 0
            j = i
            while j < total and j - i < PIPELINE_FRAMES and (size < PIPELINE_BYTES or j == i):
                message_set = message_sets[j]
                correlation_id = self._next_correlation()
                ids.append(correlation_id)
                sequence = NO_SEQUENCE if sequences is None else sequences[j]
                parts.append(
                    header.pack(
                        correlation_id, partition, acks, len(message_set), producer_id, sequence,
                        max_frame_bytes=self.max_frame_bytes,
                    )
                )
                parts.append(message_set)
                size += len(message_set)
                j += 1
            channel.send(b"".join(parts))
            if acks:
                for correlation_id in ids:
                    try:
                        results.append(channel.read_produce_reply(correlation_id))
                    except RaylogError as err:
                        if channel.sock is None:  # the connection itself failed
                            raise
                        results.append(err)
            else:
                channel.unacked = ids[-1]
            i = j
        return results

    def write_set(
        self,
        topic: str,
        partition: int,
        message_set: bytes,
        acks: int,
        *,
        producer_id: int = NO_PRODUCER_ID,
        sequence: int = NO_SEQUENCE,
    ) -> int:
        """The first half of an acknowledged :meth:`produce_sets` of one set:
        send its PRODUCE frame and return its correlation id, for
        :meth:`read_set_reply` (the reply is not read here: no other request
        may go on this connection between the two)."""
        channel = self._channel
        self._before_request()
        channel.expect_wait(0)
        correlation_id = self._next_correlation()
        frame = self._topic(topic).pack(
            correlation_id, partition, acks, len(message_set), producer_id, sequence,
            max_frame_bytes=self.max_frame_bytes,
        )
        channel.send(frame + message_set)
        return correlation_id

    def write_sets(self, sets: Sequence[tuple]) -> list:
        """The first half of acknowledged produces of several sets, to any
        partitions: ``sets`` holds ``(topic, partition, message_set, acks,
        producer_id, sequence)`` (acks 1 or -1). Their PRODUCE frames go out
        in one write; returns, set by set, the correlation id for
        :meth:`read_set_reply` (to be read in this order, no other request
        on this connection before) or the typed error that refused the set
        before it was sent (a frame over ``max_frame_bytes``). A failure of
        the connection itself raises, and then none of them was sent whole."""
        channel = self._channel
        self._before_request()
        channel.expect_wait(0)
        parts, results = [], []
        for topic, partition, message_set, acks, producer_id, sequence in sets:
            correlation_id = self._next_correlation()  # (an id refused below is never used)
            try:
                header = self._topic(topic).pack(
                    correlation_id, partition, acks, len(message_set), producer_id, sequence,
                    max_frame_bytes=self.max_frame_bytes,
                )
            except RaylogError as err:
                results.append(err)
                continue
            results.append(correlation_id)
            parts.append(header)
            parts.append(message_set)
        if parts:
            if sum(map(len, parts)) > GATHER_THRESHOLD:
                channel.send_gather(parts)
            else:
                channel.send(b"".join(parts))
        return results

    def reply_waiting(self, timeout_s: float) -> bool:
        """Whether reply bytes are there to read within ``timeout_s``
        (nothing is read: a False leaves the connection as it was)."""
        channel = self._channel
        if channel.end > channel.start:
            return True
        sock = channel.sock
        if sock is None:
            return True  # (the read then raises what happened)
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(max(0.0, timeout_s) * 1000.0))

    def read_set_reply(self, correlation_id: int):
        """The second half: the base offset, or the typed error the server
        answered for that set (as :meth:`produce_sets` returns them); a
        failure of the connection itself raises."""
        channel = self._channel
        try:
            return channel.read_produce_reply(correlation_id)
        except RaylogError as err:
            if channel.sock is None:  # the connection itself failed
                raise
            return err

    def fetch(
        self, topic: str, partition: int, offset: int, max_bytes: int, max_wait_ms: int = 0, *,
        inside_wrapper: bool = False, isolation: int | None = None,
    ) -> FetchResult:
        """Read up to ``max_bytes`` of the log from ``offset`` (at least one
        whole message if there is one). With ``max_wait_ms`` > 0 the server
        waits up to that long for data when there is none yet.

        An ``offset`` inside a compressed wrapper (the record offset of an
        inner message, docs/design.md §2) is an :class:`InvalidOffsetError`
        with a ``wrapper_offset`` detail; with ``inside_wrapper`` the read is
        made again from the wrapper's start and the result's ``offset`` is
        that start (below ``offset``): the caller decodes from there and
        skips the messages whose offset is below the one it asked for. Any
        other offset that is not a message boundary stays an error.

        ``isolation`` (``READ_UNCOMMITTED`` or ``READ_COMMITTED`` of
        :mod:`raylog.transfer.protocol`) sends FETCH version 1: the result
        then carries the last stable offset and, read_committed, the
        aborted transactions of its data (only bytes below the last stable
        offset come; the caller drops the aborted transactions' records)."""
        try:
            return self._fetch(topic, partition, offset, max_bytes, max_wait_ms, isolation)
        except InvalidOffsetError as err:
            start = err.details.get("wrapper_offset")
            if not inside_wrapper or not isinstance(start, int) or not start < offset:
                raise
        return self._fetch(topic, partition, start, max(max_bytes, 1), 0, isolation)

    def _fetch(self, topic: str, partition: int, offset: int, max_bytes: int, max_wait_ms: int,
               isolation: int | None = None) -> FetchResult:
        channel = self._channel
        self._before_request()
        correlation_id = self._next_correlation()
        frame = encode_fetch(correlation_id, self._topic(topic).encoded_topic, partition, offset, max_bytes,
                             max_wait_ms, isolation)
        channel.expect_wait(max_wait_ms)
        channel.send(frame)
        if isolation is None:
            return self._read_fetch(correlation_id, offset)
        return self._read_fetch_v1(correlation_id, offset)

    def _read_fetch_v1(self, correlation_id: int, offset: int) -> FetchResult:
        channel = self._channel
        fixed = REPLY_HEADER_BODY + FETCH_V1_REPLY_FIELDS.size
        header = channel.read_reply(correlation_id, fixed, whole=False)
        high_watermark, log_start, lso, count = FETCH_V1_REPLY_FIELDS.unpack_from(channel.buf, header)
        rest = channel.reply_size - fixed
        entries = count * FETCH_V1_ABORTED.size
        if count < 0 or entries + FETCH_V1_DATA_LENGTH.size > rest:
            channel.drop()
            raise ProtocolError(f"fetch reply of {channel.reply_size} bytes carries {count} aborted transactions")
        body = channel.take(header + FETCH_V1_REPLY_FIELDS.size, rest)
        aborted = tuple(FETCH_V1_ABORTED.unpack_from(body, i * FETCH_V1_ABORTED.size) for i in range(count))
        (length,) = FETCH_V1_DATA_LENGTH.unpack_from(body, entries)
        start = entries + FETCH_V1_DATA_LENGTH.size
        if length != len(body) - start:
            channel.drop()
            raise ProtocolError(f"fetch reply carries a data length of {length} for {len(body) - start} bytes")
        del body[:start]  # the data alone, in the buffer the caller keeps
        return FetchResult(offset, body, high_watermark, log_start, lso, aborted)

    def replica_fetch(
        self, topic: str, partition: int, replica: str, leader_epoch: int, log_end: int, flushed: int,
        max_bytes: int, max_wait_ms: int = 0,
    ) -> ReplicaFetched:
        """A follower's REPLICA_FETCH: tell the leader that ``replica`` holds
        its log up to ``log_end`` (synced up to ``flushed``) in
        ``leader_epoch``, and read the leader's log from ``log_end`` with the
        producers' sets it holds (waiting up to ``max_wait_ms`` for an
        append when there is nothing new)."""
        channel = self._channel
        self._before_request()
        correlation_id = self._next_correlation()
        channel.expect_wait(max_wait_ms)
        channel.send(encode_replica_fetch(correlation_id, self._topic(topic).encoded_topic, partition, replica,
                                          leader_epoch, log_end, flushed, max_bytes, max_wait_ms))
        fixed = REPLY_HEADER_BODY + REPLICA_FETCH_REPLY_FIELDS.size
        header = channel.read_reply(correlation_id, fixed, whole=False)
        high_watermark, log_start, epoch, sets_length = REPLICA_FETCH_REPLY_FIELDS.unpack_from(channel.buf, header)
        rest = channel.reply_size - fixed
        if not 0 <= sets_length <= rest - REPLICA_FETCH_DATA_LENGTH.size:
            channel.drop()
            raise ProtocolError(f"replica fetch reply of {channel.reply_size} bytes carries {sets_length} bytes of "
                                f"producers' sets")
        body = memoryview(channel.take(header + REPLICA_FETCH_REPLY_FIELDS.size, rest))
        (length,) = REPLICA_FETCH_DATA_LENGTH.unpack_from(body, sets_length)
        data = body[sets_length + REPLICA_FETCH_DATA_LENGTH.size:]
        if length != len(data):
            channel.drop()
            raise ProtocolError(f"replica fetch reply carries a data length of {length} for {len(data)} bytes")
        return ReplicaFetched(log_end, data, body[:sets_length], high_watermark, log_start, epoch)

    def _read_fetch(self, correlation_id: int, offset: int) -> FetchResult:
        channel = self._channel
        header = channel.read_reply(correlation_id, REPLY_HEADER_BODY + FETCH_REPLY_FIELDS.size, whole=False)
        high_watermark, log_start, length = FETCH_REPLY_FIELDS.unpack_from(channel.buf, header)
        expected = REPLY_HEADER_BODY + FETCH_REPLY_FIELDS.size + length
        if length < 0 or channel.reply_size != expected:
            channel.drop()
            raise ProtocolError(f"fetch reply of {channel.reply_size} bytes carries a data length of {length}")
        data = channel.take(header + FETCH_REPLY_FIELDS.size, length)
        return FetchResult(offset, data, high_watermark, log_start)

    def offsets(self, topic: str, partition: int) -> Offsets:
        """``(log start offset, high watermark)`` of the partition."""
        channel = self._channel
        self._before_request()
        correlation_id = self._next_correlation()
        channel.send(encode_offsets(correlation_id, self._topic(topic).encoded_topic, partition))
        channel.expect_wait(0)
        pos = channel.read_reply(correlation_id, REPLY_HEADER_BODY + OFFSETS_REPLY_FIELDS.size)
        result = Offsets(*OFFSETS_REPLY_FIELDS.unpack_from(channel.buf, pos))
        channel.consume_reply()
        return result

    def offset_for_time(self, topic: str, partition: int, timestamp_ms: int) -> int:
        """The offset of the partition's first message at or after
        ``timestamp_ms`` (the high watermark when there is none); see
        OFFSETS_FOR_TIME in :mod:`raylog.transfer.protocol`."""
        channel = self._channel
        self._before_request()
        correlation_id = self._next_correlation()
        channel.send(encode_offsets_for_time(correlation_id, self._topic(topic).encoded_topic, partition, int(timestamp_ms)))
        channel.expect_wait(0)
        pos = channel.read_reply(correlation_id, REPLY_HEADER_BODY + OFFSETS_FOR_TIME_REPLY_FIELDS.size)
        (offset,) = OFFSETS_FOR_TIME_REPLY_FIELDS.unpack_from(channel.buf, pos)
        channel.consume_reply()
        return offset

    def count(
        self, topic: str, partition: int, start: int, end: int, max_bytes: int, max_messages: int | None = None
    ) -> tuple[int, int]:
        """``(messages, next offset)``: how many messages a read of
        ``[start, next offset)`` returns, counted and checked by the
        partition (at most ``max_bytes`` walked; ``next offset`` is ``end``
        when the range is done); see COUNT in :mod:`raylog.transfer.protocol`.
        With ``max_messages`` (COUNT version 1; -1 for no bound) ``start``
        may be a record offset inside a compressed wrapper and the count
        stops after at most that many messages."""
        channel = self._channel
        self._before_request()
        correlation_id = self._next_correlation()
        encoded = self._topic(topic).encoded_topic
        channel.send(encode_count(correlation_id, encoded, partition, start, end, max_bytes, max_messages))
        channel.expect_wait(0)
        pos = channel.read_reply(correlation_id, REPLY_HEADER_BODY + COUNT_REPLY_FIELDS.size)
        messages, next_offset = COUNT_REPLY_FIELDS.unpack_from(channel.buf, pos)
        channel.consume_reply()
        return messages, next_offset

    def locate(self, topic: str, partition: int, offset: int, max_bytes: int, isolation: int | None = None) -> Located:
        """Where the whole batches a FETCH from ``offset`` would answer lie
        in the partition's segment file (at most ``max_bytes`` of them, the
        first whole), for a reader on the partition's machine that sends
        them itself; see LOCATE in :mod:`raylog.transfer.protocol`. Errors as
        :meth:`fetch`'s. ``isolation`` sends LOCATE version 1 (read_committed:
        the batches below the last stable offset, the aborted transactions
        named), as :meth:`fetch`'s does."""
        return self.read_locate(self.send_locate(topic, partition, offset, max_bytes, isolation), isolation)

    def send_locate(self, topic: str, partition: int, offset: int, max_bytes: int,
                    isolation: int | None = None) -> int:
        """Send a LOCATE (:meth:`locate`) without waiting for its reply;
        returns its correlation id for :meth:`read_locate`, which must read
        the reply (with the same ``isolation``) before any other request is
        made on this connection."""
        channel = self._channel
        self._before_request()
        correlation_id = self._next_correlation()
        channel.send(encode_locate(correlation_id, self._topic(topic).encoded_topic, partition, offset, max_bytes,
                                   isolation))
        return correlation_id

    def read_locate(self, correlation_id: int, isolation: int | None = None) -> Located:
        """The reply of the LOCATE sent as ``correlation_id`` (:meth:`send_locate`)."""
        channel = self._channel
        channel.expect_wait(0)
        fixed = REPLY_HEADER_BODY + LOCATE_REPLY_FIELDS.size + STRING_LENGTH.size
        pos = channel.read_reply(correlation_id, fixed, whole=False)
        fields = LOCATE_REPLY_FIELDS.unpack_from(channel.buf, pos)
        (length,) = STRING_LENGTH.unpack_from(channel.buf, pos + LOCATE_REPLY_FIELDS.size)
        tail = channel.reply_size - fixed - length
        if tail < 0 or (isolation is None and tail) or (isolation is not None and tail < LOCATE_V1_REPLY_TAIL.size):
            channel.drop()
            raise ProtocolError(f"LOCATE reply of {channel.reply_size} bytes carries a path of {length} bytes")
        rest = bytes(channel.take(pos + LOCATE_REPLY_FIELDS.size + STRING_LENGTH.size, length + tail))
        path = rest[:length].decode("utf-8")
        if isolation is None:
            return Located(*fields, path)
        lso, count = LOCATE_V1_REPLY_TAIL.unpack_from(rest, length)
        start = length + LOCATE_V1_REPLY_TAIL.size
        if count < 0 or start + count * FETCH_V1_ABORTED.size != len(rest):
            raise ProtocolError(f"LOCATE reply of {channel.reply_size} bytes carries {count} aborted transactions")
        aborted = tuple(FETCH_V1_ABORTED.unpack_from(rest, start + i * FETCH_V1_ABORTED.size) for i in range(count))
        return Located(*fields, path, lso, aborted)

    # -- frames ------------------------------------------------------------------

    def _before_request(self, replies: bool = True) -> None:
        """Connect if needed; after acks=0 produces, check whether the server
        answered one with an error (see :meth:`FrameChannel.check_unacked`)."""
        channel = self._channel
        if channel.sock is None:
            self.connect()
        else:
            channel.check_unacked(replies)

    def _next_correlation(self) -> int:
        correlation = self._correlation + 1
        self._correlation = correlation if correlation <= _MAX_CORRELATION else 1
        return self._correlation

    def _topic(self, topic: str) -> ProduceHeader:
        """The encoded topic and its precompiled PRODUCE headers (kept per
        topic): ``pack`` writes version 0 for a plain acks 0/1 request,
        version 1 when idempotent or with acks=-1, and refuses a frame over
        ``max_frame_bytes`` before anything is sent."""
        header = self._topics.get(topic)
        if header is None:
            header = self._topics[topic] = ProduceHeader(topic)
        return header
