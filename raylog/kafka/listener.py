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
order. A malformed frame, an API
or version not served, or a failure inside a handler closes that connection
only; the others go on. A frame started but not finished within
``frame_timeout_s`` closes the connection too, so a stalled peer holds a
thread no longer than that. At most ``max_connections`` are served at once;
one more is closed at once.

Thread-safety: :meth:`KafkaServer.close` may be called from any thread.
"""

from __future__ import annotations

import logging
import socket
import threading

from raylog.kafka.frames import SIZE, BadFrame, check_size
from raylog.kafka.handlers import Session

log = logging.getLogger(__name__)

DEFAULT_MAX_CONNECTIONS = 256
FRAME_TIMEOUT_S = 30.0


#: the most Produce requests answered as one pipelined run
MAX_RUN = 64
#: the most bytes one receive takes (a larger frame is received in several)
RECV_BYTES = 1 << 20


class _Closed(Exception):
    pass


class _Frames:
    """The request frames of one connection: complete frames as they
    arrive, several at once when they came together."""

    def __init__(self, sock: socket.socket, frame_timeout_s: float):
        self._sock = sock
        self._frame_timeout_s = frame_timeout_s
        self._buf = bytearray()
        self._timeout = -1.0

    def _set_timeout(self, timeout) -> None:
        if timeout != self._timeout:
            self._sock.settimeout(timeout)
            self._timeout = timeout

    def next(self) -> list[bytes]:
        """The complete frames received so far (at least one: waits for the
        first without a bound, and for the rest of a started frame up to
        the frame timeout). A size outside :func:`check_size`'s bounds
        raises :class:`BadFrame` before a byte of that frame is kept."""
        buf = self._buf
        while True:
            frames, pos, total = [], 0, len(buf)
            while total - pos >= SIZE.size:
                (size,) = SIZE.unpack_from(buf, pos)
                try:
                    check_size(size)
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
            self._set_timeout(None if not buf else self._frame_timeout_s)
            chunk = self._sock.recv(RECV_BYTES)
            if not chunk:
                raise _Closed()
            buf += chunk

    def send(self, data: bytes) -> None:
        """Write response bytes (a peer that takes none for the frame
        timeout closes the connection)."""
        self._set_timeout(self._frame_timeout_s)
        self._sock.sendall(data)


class KafkaServer:
    """Accepts Kafka clients on ``host:port`` (0: any free port) and serves
    each with a :class:`Session` of ``backend``."""

    def __init__(self, backend, host: str, port: int = 0, *, max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 frame_timeout_s: float = FRAME_TIMEOUT_S):
        self.backend = backend
        self.max_connections = max_connections
        self.frame_timeout_s = frame_timeout_s
        self._sock = socket.create_server((host, port), reuse_port=False, backlog=128)
        self.host = host
        self.port = self._sock.getsockname()[1]
        self._lock = threading.Lock()
        self._clients: set[socket.socket] = set()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name=f"kafka-listener-{self.port}", daemon=True)
        self._thread.start()

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._clients)

    def close(self) -> None:
        self._closed.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        with self._lock:
            clients = list(self._clients)
        for sock in clients:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                sock, peer = self._sock.accept()
            except OSError:
                if self._closed.is_set():
                    return
                continue
            with self._lock:
                full = len(self._clients) >= self.max_connections
                if not full:
                    self._clients.add(sock)
            if full:
                log.warning("Kafka listener %s:%s: %d connections already; closing one from %s",
                            self.host, self.port, self.max_connections, peer)
                sock.close()
                continue
            threading.Thread(target=self._serve, args=(sock, peer), name=f"kafka-conn-{peer}", daemon=True).start()

    def _serve(self, sock: socket.socket, peer) -> None:
        session = Session(self.backend)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            frames = _Frames(sock, self.frame_timeout_s)
            while not self._closed.is_set():
                replies = _Replies(frames)
                try:
                    _answer(session, frames.next(), replies)
                finally:
                    replies.send()
                if session.closing:
                    return
                session.after_reply()
        except BadFrame as err:
            log.info("Kafka listener: closing the connection from %s: %s", peer, err)
        except (_Closed, OSError):
            pass
        except Exception:  # noqa: BLE001 - one connection's failure never ends the listener
            log.exception("Kafka listener: a request from %s failed; closing its connection", peer)
        finally:
            session.close()
            with self._lock:
                self._clients.discard(sock)
            try:
                sock.close()
            except OSError:
                pass


class _Replies(list):
    """Response frames of one connection waiting to go out together; sent
    as soon as they hold :data:`RECV_BYTES` (so frames answered together
    never hold more than that, plus one response, in memory)."""

    def __init__(self, frames: _Frames):
        super().__init__()
        self._frames = frames
        self._bytes = 0

    def append(self, reply: bytes) -> None:
        super().append(reply)
        self._bytes += len(reply)
        if self._bytes >= RECV_BYTES:
            self.send()

    def send(self) -> None:
        if self:
            self._frames.send(b"".join(self))
            self.clear()
            self._bytes = 0


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
