"""The Kafka listener's socket server: one thread per client connection.

Each connection reads a request frame (``size i32`` then the payload; a size
outside :func:`raylog.kafka.frames.check_size`'s bounds closes the
connection before anything of that size is allocated), hands it to its
:class:`~raylog.kafka.handlers.Session` and writes the response, in order
(Kafka's one-request-at-a-time per connection). A malformed frame, an API
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


class _Closed(Exception):
    pass


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise _Closed()
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


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
            while not self._closed.is_set():
                sock.settimeout(None)
                head = _read_exactly(sock, SIZE.size)
                sock.settimeout(self.frame_timeout_s)
                (size,) = SIZE.unpack(head)
                check_size(size)
                frame = _read_exactly(sock, size)
                reply = session.handle(frame)
                if reply is not None:
                    sock.sendall(reply)
                if session.closing:
                    return
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
