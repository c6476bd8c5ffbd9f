"""The Kafka listener's socket server: one thread per client connection.

Each connection reads a request frame (``size i32`` then the payload; a size
outside :func:`raylog.kafka.frames.check_size`'s bounds closes the
connection before anything of that size is allocated), hands it to its
:class:`~raylog.kafka.handlers.Session` and writes the response, in order
(Kafka's one-request-at-a-time per connection). Frames that arrived
together (a client with several requests in flight) are answered together:
a run of Produce requests among them is pipelined to the partitions
(:meth:`~raylog.kafka.handlers.Session.handle_produce_run`, at most
:data:`MAX_RUN` requests), and their responses go back in one write, in
order. A Fetch response whose stored batches were located in their
segment file (:mod:`raylog.kafka.file_ranges`) goes out as its fixed fields
then the file's bytes by ``sendfile``. A malformed frame, an API
or version not served, or a failure inside a handler closes that connection
only; the others go on. A frame started but not finished within
``frame_timeout_s`` closes the connection too, so a stalled peer holds a
thread no longer than that.

TLS: a listener given an :class:`ssl.SSLContext` (``tls``) serves TLS only;
each connection's thread first completes the handshake
(:func:`raylog.kafka.tls.secure`) by the authentication deadline counted
from its accept (on a listener without a token too); a failed or late
handshake closes that connection only. File ranges then go through the TLS
socket, read from their file (no ``sendfile``).

Strangers: on a listener that requires SASL, a connection must complete it
within ``auth_timeout_s`` of its accept (a deadline that frames before it do
not restart; it is then closed), and its frames until then are at most
:data:`~raylog.kafka.frames.PRE_AUTH_MAX_REQUEST_BYTES` (a larger size field
closes it before anything of that size is received). The connections are a
:class:`~raylog.kafka.connections.ClientTable`: at most ``max_connections``,
strangers shed first at the limit so that an authenticated client always
gets in, and at most ``max_strangers_per_address`` strangers per source
address. Once authenticated, a connection costs nothing more than a flag
check and a clock read per batch of frames received together (the clock
read tells the table which connection is idle longest).

Thread-safety: :meth:`KafkaServer.close`, :meth:`KafkaServer.stats` and
:attr:`KafkaServer.connections` may be called from any thread; each
connection's :class:`_Frames` and :class:`Session` are confined to its thread.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import time

from raylog.kafka.connections import DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_STRANGERS_PER_ADDRESS, ClientTable
from raylog.kafka.file_ranges import RangeCut
from raylog.kafka.frames import MAX_REQUEST_BYTES, PRE_AUTH_MAX_REQUEST_BYTES, SIZE, BadFrame, check_size
from raylog.kafka.handlers import Session
from raylog.kafka.tls import HandshakeFailed, secure

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_MAX_CONNECTIONS", "DEFAULT_MAX_STRANGERS_PER_ADDRESS", "KafkaServer"]

FRAME_TIMEOUT_S = 30.0
#: how long a closing server waits for the requests being answered
CLOSE_WAIT_S = 5.0
#: a connection to a listener that requires SASL must complete it within this long of its accept
DEFAULT_AUTH_TIMEOUT_S = 10.0


#: the most Produce requests answered as one pipelined run
MAX_RUN = 64
#: the most bytes one receive takes (a larger frame is received in several)
RECV_BYTES = 1 << 20
_MSG_MORE = getattr(socket, "MSG_MORE", 0)


class _Closed(Exception):
    pass


class _AuthTimeout(Exception):
    pass


class _Frames:
    """The request frames of one connection: complete frames as they
    arrive, several at once when they came together.

    Until :meth:`authenticated` (only when the listener requires SASL), a
    frame is at most :data:`PRE_AUTH_MAX_REQUEST_BYTES`, a receive takes no
    more than that, and every wait ends at ``auth_deadline`` (monotonic)."""

    def __init__(self, sock: socket.socket, frame_timeout_s: float, auth_deadline: float | None = None):
        self._sock = sock
        self._frame_timeout_s = frame_timeout_s
        self._buf = bytearray()
        self._timeout = -1.0
        self._auth_deadline = auth_deadline
        self._limit = MAX_REQUEST_BYTES if auth_deadline is None else PRE_AUTH_MAX_REQUEST_BYTES
        self._recv_bytes = RECV_BYTES if auth_deadline is None else SIZE.size + PRE_AUTH_MAX_REQUEST_BYTES
        self._more = 0 if isinstance(sock, ssl.SSLSocket) else _MSG_MORE  # an SSL socket takes no flags

    def authenticated(self) -> None:
        """SASL has completed: full-size frames, no deadline."""
        self._auth_deadline = None
        self._limit = MAX_REQUEST_BYTES
        self._recv_bytes = RECV_BYTES

    def _set_timeout(self, timeout) -> None:
        if timeout != self._timeout:
            self._sock.settimeout(timeout)
            self._timeout = timeout

    def next(self) -> list[bytes]:
        """The complete frames received so far (at least one: waits for the
        first without a bound (but the authentication deadline), and for the
        rest of a started frame up to the frame timeout). A size outside
        :func:`check_size`'s bounds raises :class:`BadFrame` before a byte
        of that frame is kept; the deadline passing raises :class:`_AuthTimeout`."""
        buf = self._buf
        limit = self._limit
        while True:
            frames, pos, total = [], 0, len(buf)
            while total - pos >= SIZE.size:
                (size,) = SIZE.unpack_from(buf, pos)
                try:
                    check_size(size, limit)
                except BadFrame:
                    if frames:  # the frames before it are answered first; it is met at the next call
                        break
                    raise
                if total - pos - SIZE.size < size:
                    break
                frames.append(bytes(buf[pos + SIZE.size:pos + SIZE.size + size]))
                pos += SIZE.size + size
            if frames:
                del buf[:pos]
                return frames
            timeout = None if not buf else self._frame_timeout_s
            if self._auth_deadline is not None:
                left = self._auth_deadline - time.monotonic()
                if left <= 0:
                    raise _AuthTimeout()
                timeout = left if timeout is None else min(timeout, left)
            self._set_timeout(timeout)
            try:
                chunk = self._sock.recv(self._recv_bytes)
            except socket.timeout:
                if self._auth_deadline is not None and time.monotonic() >= self._auth_deadline:
                    raise _AuthTimeout() from None
                raise
            if not chunk:
                raise _Closed()
            buf += chunk

    def send(self, data: bytes, more: bool = False) -> None:
        """Write response bytes (a peer that takes none for the frame
        timeout closes the connection); with ``more``, the kernel may hold
        them for the bytes that follow (a file range)."""
        self._set_timeout(self._frame_timeout_s)
        self._sock.sendall(data, self._more if more else 0)

    def send_range(self, piece) -> None:
        """Write a :class:`~raylog.kafka.file_ranges.FileRange` (``sendfile``,
        read and sent over TLS; the frame timeout bounds each wait for
        room); closes its file."""
        self._set_timeout(self._frame_timeout_s)
        piece.send_to(self._sock)


class KafkaServer:
    """Accepts Kafka clients on ``host:port`` (0: any free port) and serves
    each with a :class:`Session` of ``backend`` (see the module docstring
    for the bounds)."""

    def __init__(self, backend, host: str, port: int = 0, *, max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 max_strangers_per_address: int = DEFAULT_MAX_STRANGERS_PER_ADDRESS,
                 auth_timeout_s: float = DEFAULT_AUTH_TIMEOUT_S, frame_timeout_s: float = FRAME_TIMEOUT_S,
                 tls: ssl.SSLContext | None = None):
        self.backend = backend
        self.tls = tls
        self.max_connections = max_connections
        self.auth_timeout_s = auth_timeout_s
        self.frame_timeout_s = frame_timeout_s
        self._table = ClientTable(max_connections=max_connections,
                                  max_strangers_per_address=max_strangers_per_address)
        self._sock = socket.create_server((host, port), reuse_port=False, backlog=128)
        self.host = host
        self.port = self._sock.getsockname()[1]
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name=f"kafka-listener-{self.port}", daemon=True)
        self._thread.start()

    @property
    def connections(self) -> int:
        return len(self._table)

    def stats(self) -> dict:
        """``connections``, ``strangers`` (not yet authenticated),
        ``connections_accepted``, ``connections_refused``, ``connections_shed``;
        ``fetch_bytes_sent_from_files`` and ``fetch_bytes_relayed`` (the
        record bytes of Fetch responses sent from segment files by
        ``sendfile``, and read through the data channel)."""
        return {**self._table.stats(), **self.backend.fetch_stats()}

    def close(self) -> None:
        self._closed.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        for sock in self._table.sockets():
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def wait_served(self, timeout_s: float = CLOSE_WAIT_S) -> bool:
        """After :meth:`close`: wait until every connection's request being
        answered has ended (its reply refused by the shut socket), so the
        backend can go without a request served from it half-closed.
        True if none is left."""
        deadline = time.monotonic() + timeout_s
        while len(self._table) and time.monotonic() < deadline:
            time.sleep(0.01)
        return not len(self._table)

    def _accept(self) -> None:
        open_door = self.backend.verifier is None
        while not self._closed.is_set():
            try:
                sock, peer = self._sock.accept()
            except OSError:
                if self._closed.is_set():
                    return
                continue
            client = self._table.admit(sock, peer, authenticated=open_door)
            if client is None:
                continue
            try:
                threading.Thread(target=self._serve, args=(client,), name=f"kafka-conn-{peer}", daemon=True).start()
            except RuntimeError:  # no thread to be had: this connection only
                log.warning("Kafka listener: no thread for the connection from %s; closing it", peer)
                self._table.release(client)
                sock.close()

    def _serve(self, client) -> None:
        sock, peer = client.sock, client.peer
        session = Session(self.backend, peer)
        authenticated = session.authenticated
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.tls is not None:
                sock = secure(client, self.tls, client.accepted_at + self.auth_timeout_s)
            frames = _Frames(sock, self.frame_timeout_s,
                             None if authenticated else client.accepted_at + self.auth_timeout_s)
            while not self._closed.is_set():
                client.waiting_since = time.monotonic()
                received = frames.next()
                client.waiting_since = None
                replies = _Replies(frames)
                try:
                    _answer(session, received, replies)
                finally:
                    replies.send()
                if session.closing:
                    return
                if not authenticated and session.authenticated:
                    authenticated = True
                    frames.authenticated()
                    self._table.authenticated(client)
                session.after_reply()
        except BadFrame as err:
            log.info("Kafka listener: closing the connection from %s: %s", peer, err)
        except RangeCut as err:
            log.warning("Kafka listener: closing the connection from %s in a Fetch response: %s", peer, err)
        except HandshakeFailed as err:
            log.info("Kafka listener: closing the connection from %s: %s", peer, err)
        except _AuthTimeout:
            log.info("Kafka listener: closing the connection from %s: no SASL authentication within %g s of "
                     "connecting", peer, self.auth_timeout_s)
        except (_Closed, OSError):
            pass
        except Exception:  # noqa: BLE001 - one connection's failure never ends the listener
            log.exception("Kafka listener: a request from %s failed; closing its connection", peer)
        finally:
            session.close()
            self._table.release(client)
            try:
                client.sock.close()
            except OSError:
                pass


class _Replies(list):
    """Response frames of one connection waiting to go out together; sent
    as soon as they hold :data:`RECV_BYTES` (so frames answered together
    never hold more than that, plus one response, in memory; the bytes of
    file ranges are not held, only counted). A response is bytes, or a
    list of pieces (bytes and :class:`~raylog.kafka.file_ranges.FileRange`)
    from :func:`~raylog.kafka.fetch_wire.encode_fetch_response`."""

    def __init__(self, frames: _Frames):
        super().__init__()
        self._frames = frames
        self._bytes = 0

    def append(self, reply) -> None:
        if isinstance(reply, list):
            self.extend(reply)
            self._bytes += sum(map(len, reply))
        else:
            super().append(reply)
            self._bytes += len(reply)
        if self._bytes >= RECV_BYTES:
            self.send()

    def send(self) -> None:
        """Write what is waiting, in order: runs of bytes joined, each file
        range by ``sendfile`` (every file range's file is closed, sent or not)."""
        if not self:
            return
        pieces = list(self)
        self.clear()
        self._bytes = 0
        frames, run = self._frames, []
        try:
            for i, piece in enumerate(pieces):
                if isinstance(piece, (bytes, bytearray, memoryview)):
                    run.append(piece)
                    continue
                if run:
                    frames.send(b"".join(run), more=True)
                    run = []
                pieces[i] = None
                frames.send_range(piece)
            if run:
                frames.send(b"".join(run))
        finally:
            for piece in pieces:
                if piece is not None and not isinstance(piece, (bytes, bytearray, memoryview)):
                    piece.close()


def _answer(session: Session, frames: list[bytes], out: list) -> None:
    """Append the response frames to ``frames`` to ``out``, in order: runs
    of Produce requests pipelined, every other request alone. Stops after a
    response that closes the connection."""
    i, total = 0, len(frames)
    while i < total and not session.closing:
        j = i
        while j < total and j - i < MAX_RUN and session.pipelines(frames[j]):
            j += 1
        if j > i:
            session.handle_produce_run(frames[i:j], out)
            i = j
            continue
        reply = session.handle(frames[i])
        if reply is not None:
            out.append(reply)
        i += 1
