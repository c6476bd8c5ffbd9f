"""The Kafka listener's socket server: a network thread that holds every
idle connection, and a pool of worker threads that answer requests
(Kafka's own shape).

Connections: the network thread accepts, and keeps every connection that
waits for its next request in one ``selectors.DefaultSelector`` (epoll on
Linux), so an idle connection costs a socket and a few hundred bytes, not a
thread. When one becomes readable it leaves the selector and a worker
serves it: reads the request frames that came (``size i32`` then the
payload; a size outside :func:`raylog.kafka.frames.check_size`'s bounds
closes the connection before anything of that size is allocated), hands
them to the connection's :class:`~raylog.kafka.handlers.Session` and
writes the responses, in order (Kafka's one-request-at-a-time per
connection: a connection is never served by two workers at once). The
worker keeps the connection while frames keep coming (it waits up to
:data:`LINGER_S` for the next one, so a busy producer does not pay a
selector round trip per request), then parks it back in the selector; a
socket is parked only when nothing it received is buffered in user space
(an ``ssl.SSLSocket``'s ``pending()``). A long-poll Fetch keeps its worker
while it waits. The pool grows on demand up to ``max_workers`` threads and
shrinks back to :data:`MIN_WORKERS` when they idle :data:`WORKER_IDLE_S`
(work goes to the worker that went idle last, so under a light load the
others do idle that long).
A connection's first readiness runs :meth:`KafkaServer._start` on a worker
(where its session is made; the place for a handshake of the transport).

Frames that arrived together (a client with several requests in flight)
are answered together: a run of Produce requests among them is pipelined
to the partitions (:meth:`~raylog.kafka.handlers.Session.handle_produce_run`,
at most :data:`MAX_RUN` requests), and their responses go back in one
write, in order. A Fetch response whose stored batches were located in
their segment file (:mod:`raylog.kafka.file_ranges`) goes out as its fixed
fields then the file's bytes by ``sendfile``. A malformed frame, an API or
version not served, or a failure inside a handler closes that connection
only; the others go on. A frame started but not finished within
``frame_timeout_s`` of its first byte closes the connection too, parked or
not (a worker waits at most :data:`PARTIAL_WAIT_S` for the rest of a frame
before parking the connection), so a stalled peer holds neither a thread
nor its buffer longer than that.

TLS: a listener given an :class:`ssl.SSLContext` (``tls``) serves TLS only;
the handshake runs on the workers as the client's bytes arrive
(:func:`raylog.kafka.tls.handshake` on a non-blocking TLS socket; between
its flights the connection is parked like any other, so a client that
stalls in it holds no worker), and must be complete by the authentication
deadline counted from the accept (on a listener without a token too: until
then a parked connection is swept at that deadline); a failed or late
handshake closes that connection only. File ranges then go through
the TLS socket, read from their file (no ``sendfile``); a TLS socket's
decrypted bytes not read yet keep its worker (the selector cannot see them).

Strangers: on a listener that requires SASL, a connection must complete it
within ``auth_timeout_s`` of its accept (a deadline that frames before it do
not restart; it is then closed, by the network thread's sweep when it is
parked), and its frames until then are at most
:data:`~raylog.kafka.frames.PRE_AUTH_MAX_REQUEST_BYTES` (a larger size field
closes it before anything of that size is received). The connections are a
:class:`~raylog.kafka.connections.ClientTable`: at most ``max_connections``,
strangers shed first at the limit so that an authenticated client always
gets in, and at most ``max_strangers_per_address`` strangers per source
address. ``max_connections`` is bounded by the process's open files: the
server raises its soft ``RLIMIT_NOFILE`` to the hard limit when it starts
and serves at most that less :func:`fd_headroom` (the files a listener
needs besides its clients' sockets: segment files sent by ``sendfile``,
data channel connections, ZooKeeper, Ray); see :func:`connection_limit`.

Thread-safety: :meth:`KafkaServer.close`, :meth:`KafkaServer.stats` and
:attr:`KafkaServer.connections` may be called from any thread; the selector
and the parked connections belong to the network thread; each connection's
:class:`_Frames` and :class:`Session` to the one worker serving it (handed
over through the pool's lock and the network thread's queue, never
shared).
"""

from __future__ import annotations

import collections
import errno
import logging
import resource
import selectors
import socket
import ssl
import threading
import time

from raylog.kafka.connections import DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_STRANGERS_PER_ADDRESS, ClientTable
from raylog.kafka.file_ranges import RangeCut
from raylog.kafka.frames import MAX_REQUEST_BYTES, PRE_AUTH_MAX_REQUEST_BYTES, SIZE, BadFrame, check_size
from raylog.kafka.handlers import Session
from raylog.kafka.tls import HandshakeFailed, handshake, wrap

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_MAX_CONNECTIONS", "DEFAULT_MAX_STRANGERS_PER_ADDRESS", "KafkaServer", "connection_limit"]

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

#: how long a worker waits for a connection's next request after answering
#: one before it parks the connection in the selector
LINGER_S = 0.005
#: how long a worker waits for the rest of a started frame before it parks
#: the connection (the frame timeout still runs from the frame's first byte)
PARTIAL_WAIT_S = 0.05
#: the most worker threads of one listener (a long-poll Fetch holds one while it waits)
DEFAULT_MAX_WORKERS = 256
#: workers kept when there is nothing to do
MIN_WORKERS = 2
#: a worker beyond MIN_WORKERS that has had nothing to do this long ends
WORKER_IDLE_S = 10.0
#: how often the network thread looks for parked connections past a deadline
SWEEP_S = 0.25
#: the most connections accepted at one readiness of the listening socket
ACCEPT_BATCH = 256


def fd_headroom(soft: int) -> int:
    """The open files a listener keeps for itself besides its clients'
    sockets, out of a soft ``RLIMIT_NOFILE`` of ``soft``: a quarter of it,
    at least 512."""
    return max(512, soft // 4)


def raise_nofile() -> int:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit (as
    far as the system lets); the soft limit in force after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as err:
            log.info("Kafka listener: the open files limit stays at %d (%s)", soft, err)
    return soft


def connection_limit(max_connections: int) -> int:
    """The connections a listener of this process serves at most:
    ``max_connections``, bounded by the soft ``RLIMIT_NOFILE`` (raised to
    the hard limit first, :func:`raise_nofile`) less :func:`fd_headroom`."""
    soft = raise_nofile()
    room = max(1, soft - fd_headroom(soft))
    if room < max_connections:
        log.warning("Kafka listener: %d open files allowed; serving at most %d connections, not %d",
                    soft, room, max_connections)
    return min(max_connections, room)


class _Closed(Exception):
    pass


class _AuthTimeout(Exception):
    pass


class _FrameTimeout(Exception):
    pass


class _Frames:
    """The request frames of one connection: complete frames as they
    arrive, several at once when they came together.

    Until :meth:`authenticated` (only when the listener requires SASL), a
    frame is at most :data:`PRE_AUTH_MAX_REQUEST_BYTES`, a receive takes no
    more than that, and every wait ends at ``auth_deadline`` (monotonic).
    ``started_at`` is when the first byte of the frame not yet complete
    came (None: no such frame)."""

    def __init__(self, sock: socket.socket, frame_timeout_s: float, auth_deadline: float | None = None):
        self._sock = sock
        self._frame_timeout_s = frame_timeout_s
        self._buf = bytearray()
        self._timeout = -1.0
        self._auth_deadline = auth_deadline
        self._limit = MAX_REQUEST_BYTES if auth_deadline is None else PRE_AUTH_MAX_REQUEST_BYTES
        self._recv_bytes = RECV_BYTES if auth_deadline is None else SIZE.size + PRE_AUTH_MAX_REQUEST_BYTES
        self._more = 0 if isinstance(sock, ssl.SSLSocket) else _MSG_MORE  # an SSL socket takes no flags
        self.started_at: float | None = None

    def authenticated(self) -> None:
        """SASL has completed: full-size frames, no deadline."""
        self._auth_deadline = None
        self._limit = MAX_REQUEST_BYTES
        self._recv_bytes = RECV_BYTES

    @property
    def auth_deadline(self) -> float | None:
        return self._auth_deadline

    def deadline(self) -> float | None:
        """When this connection must be closed if nothing more comes: the
        authentication deadline, or the end of the started frame's time
        (the earlier); None: no deadline."""
        ends = [t for t in (self._auth_deadline,
                            None if self.started_at is None else self.started_at + self._frame_timeout_s)
                if t is not None]
        return min(ends) if ends else None

    def _set_timeout(self, timeout) -> None:
        if timeout != self._timeout:
            self._sock.settimeout(timeout)
            self._timeout = timeout

    def next(self, wait_s: float) -> list[bytes]:
        """The complete frames received so far, or [] when none is complete
        after waiting up to ``wait_s`` for bytes (for the rest of a started
        frame, up to :data:`PARTIAL_WAIT_S`). A size outside
        :func:`check_size`'s bounds raises :class:`BadFrame` before a byte of
        that frame is kept; the authentication deadline passing raises
        :class:`_AuthTimeout`, the frame timeout :class:`_FrameTimeout`, the
        peer closing :class:`_Closed`."""
        buf = self._buf
        limit = self._limit
        start = time.monotonic()
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
                self.started_at = time.monotonic() if buf else None
                return frames
            now = time.monotonic()
            until = start + (max(wait_s, PARTIAL_WAIT_S) if buf else wait_s)
            deadline = self.deadline()
            if deadline is not None and now >= deadline:
                raise (_AuthTimeout() if deadline == self._auth_deadline else _FrameTimeout())
            timeout = until - now if deadline is None else min(until, deadline) - now
            if timeout <= 0:
                return []
            self._set_timeout(timeout)
            try:
                chunk = self._sock.recv(self._recv_bytes)
            except socket.timeout:
                continue  # (a deadline passed, or nothing more came: the loop says which)
            if not chunk:
                raise _Closed()
            if not buf:
                self.started_at = time.monotonic()
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


class _Connection:
    """One accepted connection as the server moves it between the selector
    and a worker: its table entry, socket, and, from its first readiness
    on, its session and frames; ``expired`` names the deadline that the
    network thread found passed while it was parked."""

    __slots__ = ("client", "sock", "session", "frames", "expired")

    def __init__(self, client):
        self.client = client
        self.sock = client.sock
        self.session: Session | None = None
        self.frames: _Frames | None = None
        self.expired: str | None = None


class _Worker:
    """An idle worker's slot: the connection handed to it, and the event it waits on."""

    __slots__ = ("conn", "event")

    def __init__(self):
        self.conn: _Connection | None = None
        self.event = threading.Event()


class KafkaServer:
    """Accepts Kafka clients on ``host:port`` (0: any free port) and serves
    each with a :class:`Session` of ``backend`` (see the module docstring
    for the model and the bounds). ``max_connections`` is bounded by the
    process's open files (:func:`connection_limit`; the bound in force is
    :attr:`max_connections`)."""

    def __init__(self, backend, host: str, port: int = 0, *, max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 max_strangers_per_address: int = DEFAULT_MAX_STRANGERS_PER_ADDRESS,
                 auth_timeout_s: float = DEFAULT_AUTH_TIMEOUT_S, frame_timeout_s: float = FRAME_TIMEOUT_S,
                 tls: ssl.SSLContext | None = None, max_workers: int = DEFAULT_MAX_WORKERS):
        self.backend = backend
        self.tls = tls
        self.max_connections = connection_limit(max_connections)
        self.auth_timeout_s = auth_timeout_s
        self.frame_timeout_s = frame_timeout_s
        self.max_workers = max(1, max_workers)
        self._table = ClientTable(max_connections=self.max_connections,
                                  max_strangers_per_address=max_strangers_per_address)
        self._sock = socket.create_server((host, port), reuse_port=False, backlog=1024)
        self._sock.setblocking(False)
        self.host = host
        self.port = self._sock.getsockname()[1]
        self._closed = threading.Event()
        # the network thread's: the selector, the parked connections with a deadline
        self._selector = selectors.DefaultSelector()
        self._timed: dict[_Connection, float] = {}
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        # connections handed back by workers, to park (or close, after close())
        self._returns: collections.deque[_Connection] = collections.deque()
        # the pool: connections no worker has taken yet, workers alive, and the
        # idle ones, the last to go idle on top (handed work first, so the
        # others stay idle long enough to end)
        self._pool = threading.Lock()
        self._ready: collections.deque[_Connection] = collections.deque()
        self._workers = 0
        self._idle: list[_Worker] = []
        self._selector.register(self._sock, selectors.EVENT_READ, None)
        self._selector.register(self._wake_r, selectors.EVENT_READ, self._wake_r)
        self._thread = threading.Thread(target=self._network, name=f"kafka-listener-{self.port}", daemon=True)
        self._thread.start()

    @property
    def connections(self) -> int:
        return len(self._table)

    def stats(self) -> dict:
        """``connections``, ``strangers`` (not yet authenticated),
        ``connections_accepted``, ``connections_refused``, ``connections_shed``;
        ``max_connections`` (the bound in force), ``workers`` (the pool's
        threads now); ``fetch_bytes_sent_from_files`` and
        ``fetch_bytes_relayed`` (the record bytes of Fetch responses sent
        from segment files by ``sendfile``, and read through the data
        channel)."""
        with self._pool:
            workers = self._workers
        return {**self._table.stats(), "max_connections": self.max_connections, "workers": workers,
                **self.backend.fetch_stats()}

    def close(self) -> None:
        """Stop accepting and close every connection: parked ones at once,
        those being served once their request is answered (their replies
        are refused by the shut socket); the threads end."""
        self._closed.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        for sock in self._table.sockets():
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._wake()
        self._wake_workers()

    def wait_served(self, timeout_s: float = CLOSE_WAIT_S) -> bool:
        """After :meth:`close`: wait until every connection's request being
        answered has ended (its reply refused by the shut socket), so the
        backend can go without a request served from it half-closed.
        True if none is left."""
        deadline = time.monotonic() + timeout_s
        while len(self._table) and time.monotonic() < deadline:
            time.sleep(0.01)
        return not len(self._table)

    # -- the network thread -------------------------------------------------

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # full: the network thread has a wake-up to read already

    def _network(self) -> None:
        selector = self._selector
        next_sweep = time.monotonic() + SWEEP_S
        accept_paused_until = None
        try:
            while not self._closed.is_set():
                now = time.monotonic()
                timeout = max(0.0, next_sweep - now)
                if accept_paused_until is not None:
                    timeout = min(timeout, max(0.0, accept_paused_until - now))
                for key, _ in selector.select(timeout):
                    conn = key.data
                    if conn is None:
                        if not self._accept():
                            selector.unregister(self._sock)
                            accept_paused_until = time.monotonic() + 0.1
                    elif conn is self._wake_r:
                        try:
                            while self._wake_r.recv(4096):
                                pass
                        except (BlockingIOError, OSError):
                            pass
                    else:
                        selector.unregister(conn.sock)
                        self._timed.pop(conn, None)
                        self._dispatch(conn)
                self._park_returned()
                now = time.monotonic()
                if accept_paused_until is not None and now >= accept_paused_until and not self._closed.is_set():
                    accept_paused_until = None
                    selector.register(self._sock, selectors.EVENT_READ, None)
                if now >= next_sweep:
                    next_sweep = now + SWEEP_S
                    self._sweep(now)
        except Exception:  # noqa: BLE001 - logged; close() below ends every connection
            log.exception("Kafka listener on port %d: the network thread failed; closing", self.port)
            self._closed.set()
        finally:
            self._shut_down()

    def _accept(self) -> bool:
        """Accept what is waiting (at most :data:`ACCEPT_BATCH`); False when
        the process has no file to spare (accepting pauses briefly)."""
        open_door = self.backend.verifier is None
        for _ in range(ACCEPT_BATCH):
            try:
                sock, peer = self._sock.accept()
            except BlockingIOError:
                return True
            except OSError as err:
                if err.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    log.warning("Kafka listener: cannot accept a connection now (%s); pausing accepts", err)
                    return False
                return True  # (the peer went before it was accepted, or the server is closing)
            client = self._table.admit(sock, peer, authenticated=open_door)
            if client is None:
                continue
            conn = _Connection(client)
            try:
                self._selector.register(sock, selectors.EVENT_READ, conn)
            except (OSError, ValueError) as err:
                log.warning("Kafka listener: cannot watch the connection from %s (%s); closing it", peer, err)
                self._end(conn)
                continue
            deadline = self._deadline(conn)
            if deadline is not None:
                self._timed[conn] = deadline
        return True

    def _park_returned(self) -> None:
        """Watch again the connections workers handed back."""
        returns = self._returns
        while returns:
            conn = returns.popleft()
            if self._closed.is_set():
                self._end(conn)
                continue
            conn.client.waiting_since = time.monotonic()
            try:
                self._selector.register(conn.sock, selectors.EVENT_READ, conn)
            except (OSError, ValueError):  # closed meanwhile (shed): a worker finds out
                self._dispatch(conn)
                continue
            deadline = self._deadline(conn)
            if deadline is not None:
                self._timed[conn] = deadline

    def _deadline(self, conn: _Connection) -> float | None:
        """When parked ``conn`` must be closed if it sends nothing more (None:
        never): a stranger's authentication deadline, a started frame's end.
        A connection whose TLS handshake is still to come has the
        authentication deadline too, on a listener without a token as well."""
        if conn.frames is not None:
            return conn.frames.deadline()
        if conn.client.authenticated and self.tls is None:
            return None
        return conn.client.accepted_at + self.auth_timeout_s

    def _sweep(self, now: float) -> None:
        """Hand to a worker, to be closed, every parked connection past its
        deadline (a stranger's authentication, a started frame's timeout)."""
        passed = [conn for conn, deadline in self._timed.items() if deadline <= now]
        for conn in passed:
            del self._timed[conn]
            try:
                self._selector.unregister(conn.sock)
            except (KeyError, ValueError):
                pass
            auth = conn.frames.auth_deadline if conn.frames is not None else self._deadline(conn)
            conn.expired = "auth" if auth is not None and auth <= now else "frame"
            self._dispatch(conn)

    def _shut_down(self) -> None:
        """The server is closed: close every parked connection, the selector."""
        for key in list(self._selector.get_map().values()):
            if isinstance(key.data, _Connection):
                self._end(key.data)
        self._timed.clear()
        self._park_returned()
        self._selector.close()
        self._sock.close()
        self._wake_r.close()
        self._wake_w.close()  # (a worker's late wake-up then fails quietly)
        self._wake_workers()

    # -- the workers ------------------------------------------------------------

    def _dispatch(self, conn: _Connection) -> None:
        """Have a worker serve ``conn``: the idle worker that went idle last,
        else a new one while the pool is below ``max_workers``, else the
        first worker to finish what it serves."""
        with self._pool:
            if self._idle:
                worker = self._idle.pop()
                worker.conn = conn
                worker.event.set()
                return
            if self._workers < self.max_workers:
                try:
                    threading.Thread(target=self._work, args=(conn,), name=f"kafka-worker-{self.port}",
                                     daemon=True).start()
                    self._workers += 1
                    return
                except RuntimeError:  # no thread to be had now: a running worker takes it
                    if not self._workers:
                        log.warning("Kafka listener: no thread for the connection from %s; closing it",
                                    conn.client.peer)
                        self._end(conn)
                        return
            self._ready.append(conn)

    def _wake_workers(self) -> None:
        """The server is closed: idle workers end."""
        with self._pool:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.event.set()

    def _work(self, conn: _Connection) -> None:
        worker = _Worker()
        while conn is not None:
            self._serve(conn)
            conn = self._next(worker)

    def _next(self, worker: _Worker) -> _Connection | None:
        """The next connection for ``worker`` to serve; None: it ends (it had
        nothing to do for :data:`WORKER_IDLE_S` and the pool holds more than
        :data:`MIN_WORKERS`, or the server closed)."""
        while True:
            with self._pool:
                if self._ready:
                    return self._ready.popleft()
                if self._closed.is_set():
                    self._workers -= 1
                    return None
                worker.event.clear()
                self._idle.append(worker)
            worker.event.wait(WORKER_IDLE_S)
            with self._pool:
                conn, worker.conn = worker.conn, None
                if conn is not None:
                    return conn
                if worker in self._idle:
                    self._idle.remove(worker)
                if self._closed.is_set() or self._workers > MIN_WORKERS:
                    self._workers -= 1
                    return None

    def _start(self, conn: _Connection) -> bool:
        """A connection's first readiness, on its worker: on a TLS listener
        the handshake (:func:`raylog.kafka.tls.wrap` at the first readiness,
        the TLS socket replacing ``conn.sock``, then
        :func:`raylog.kafka.tls.handshake` at each until it is complete:
        False while it waits for the client, which is parked meanwhile with
        the authentication deadline), then the session and frames are made."""
        if self.tls is not None:
            if not isinstance(conn.sock, ssl.SSLSocket):
                conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                try:
                    wrap(conn.client, self.tls)
                finally:  # the TLS socket holds the connection's file now, wrapped or not
                    conn.sock = conn.client.sock
            if not handshake(conn.sock):
                return False
        else:
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.session = Session(self.backend, conn.client.peer)
        conn.frames = _Frames(conn.sock, self.frame_timeout_s,
                              None if conn.session.authenticated else conn.client.accepted_at + self.auth_timeout_s)
        return True

    def _hand_back(self, conn: _Connection) -> None:
        """Give ``conn`` back to the network thread to watch (or end it when
        the server is closing)."""
        self._returns.append(conn)
        self._wake()
        if self._closed.is_set():  # the network thread may be gone: whoever takes it ends it
            self._end_returned()

    def _serve(self, conn: _Connection) -> None:
        """Answer what ``conn`` sent, and what it sends within
        :data:`LINGER_S` of each answer; then park it (or close it)."""
        client, peer = conn.client, conn.client.peer
        try:
            if conn.expired is not None:
                raise _AuthTimeout() if conn.expired == "auth" else _FrameTimeout()
            if conn.session is None and not self._start(conn):
                self._hand_back(conn)  # a TLS handshake waiting for the client: parked, no worker held
                return
            session, frames = conn.session, conn.frames
            wait_s = LINGER_S
            while not self._closed.is_set():
                received = frames.next(wait_s)
                if not received:
                    if _pending(conn.sock):
                        continue
                    self._hand_back(conn)
                    return
                client.waiting_since = None
                replies = _Replies(frames)
                try:
                    _answer(session, received, replies)
                finally:
                    replies.send()
                if session.closing:
                    break
                if not client.authenticated and session.authenticated:
                    frames.authenticated()
                    self._table.authenticated(client)
                session.after_reply()
                client.waiting_since = time.monotonic()
        except BadFrame as err:
            log.info("Kafka listener: closing the connection from %s: %s", peer, err)
        except RangeCut as err:
            log.warning("Kafka listener: closing the connection from %s in a Fetch response: %s", peer, err)
        except HandshakeFailed as err:
            log.info("Kafka listener: closing the connection from %s: %s", peer, err)
        except _AuthTimeout:
            log.info("Kafka listener: closing the connection from %s: no SASL authentication within %g s of "
                     "connecting", peer, self.auth_timeout_s)
        except _FrameTimeout:
            log.info("Kafka listener: closing the connection from %s: a request frame not finished within %g s",
                     peer, self.frame_timeout_s)
        except (_Closed, OSError):
            pass
        except Exception:  # noqa: BLE001 - one connection's failure never ends the listener
            log.exception("Kafka listener: a request from %s failed; closing its connection", peer)
        self._end(conn)

    def _end_returned(self) -> None:
        while True:
            try:
                conn = self._returns.popleft()
            except IndexError:
                return
            self._end(conn)

    def _end(self, conn: _Connection) -> None:
        """Close ``conn``: its session, its table entry, its socket."""
        try:
            if conn.session is not None:
                conn.session.close()
        except Exception:  # noqa: BLE001 - the connection goes anyway
            log.exception("Kafka listener: closing the session of %s", conn.client.peer)
        finally:
            self._table.release(conn.client)
            try:
                conn.sock.close()
            except OSError:
                pass


def _pending(sock) -> bool:
    """Whether ``sock`` holds received bytes in user space that the selector
    cannot see (an ``ssl.SSLSocket``'s decrypted bytes not read yet)."""
    pending = getattr(sock, "pending", None)
    return bool(pending is not None and pending())


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
