"""An embedded ZooKeeper server (started through :mod:`raylog.zk.launcher`).

:class:`EmbeddedZooKeeper` runs a real, single-node ZooKeeper 3.6 from the
jars that ship inside the ``pyspark`` wheel (no separate download)::

    with EmbeddedZooKeeper() as server:          # a free port, a temp data dir
        zk = connect_kazoo(server.connect_string)   # raylog.zk.session
        ...
        server.restart()                         # same port, same data
        ...
        zk.stop(); zk.close()

The server is a child process (``java -cp <jars>
org.apache.zookeeper.server.ZooKeeperServerMain <data dir>/zoo.cfg``) that
writes its output to ``<data dir>/zookeeper.out``. It listens on 127.0.0.1
only. It is stopped by PID (terminate, wait, kill) on :meth:`stop`, when the
``with`` block ends, and at interpreter exit; when started from the main
thread on Linux it also dies with its parent (``PR_SET_PDEATHSIG``), so a
crashed test run leaves no server behind.

The layout of a data directory::

    <data dir>/zoo.cfg          the server configuration
    <data dir>/zookeeper.out    the server's stdout and stderr
    <data dir>/data/            snapshots and transaction logs (``dataDir``)

A data directory the caller passes is kept on :meth:`stop`; one the server
created itself (a temp dir) is removed.

**Closed to strangers** (what ``raylog.connect()`` launches): with an
``owner_secret`` the server is locked at every start: ``/``, ``/raylog``
and ``/zookeeper`` may be written by the owner's digest identity only
(:func:`raylog.zk.acl.lock_server`; everyone reads), and a cluster's root is
made by the owner (:meth:`admit`, or a session that derives the owner's
password, :func:`raylog.zk.acl.secure_session`). Without one (a test's
scratch server) anyone may write outside raylog's clusters, as on any
ZooKeeper. Every server, locked or not, takes at most
``max_client_connections`` connections per address, requests of at most
``max_request_bytes`` (``jute.maxbuffer``), with a heap that all of them fit
in at once, and answers the four-letter words ``ruok`` and ``srvr`` only
(see :mod:`raylog.zk.launcher`).

**Watched** (``watchdog=True``, what ``raylog.connect()`` asks for): a
thread of the launching process restarts a server process that exits without
being asked to (killed, out of memory) on the same port and data dir, saying
so once in the log; if it cannot, it says that once and stops trying.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time

from raylog.errors import ConfigError, EmbeddedZooKeeperError
from raylog.retry import RetryPolicy
from raylog.storage.owner_only import make_dirs as make_owner_only_dirs, private_opener
from raylog.zk.launcher import (
    FOUR_LETTER_WORDS,
    LOG_NAME,
    MAX_CLIENT_CONNECTIONS,
    MAX_REQUEST_BYTES,
    ServerSettings,
    find_jars,
    find_java,
    four_letter_word,
    free_port,
    launch,
)

log = logging.getLogger(__name__)

#: how often the watchdog looks at the server process, seconds
WATCH_INTERVAL_S = 0.5
#: restarts the watchdog tries after one exit before it gives up
_WATCH_RESTART = RetryPolicy(max_tries=5, delay_s=0.5, max_delay_s=5.0, deadline_s=None)

_BIND_FAILURE_TRIES = 5
#: a start whose bind failed is tried again under this policy (a new port,
#: or after a pause when clients know the port); nothing else is retried
_BIND_RETRY = RetryPolicy(max_tries=_BIND_FAILURE_TRIES, delay_s=0.2, max_delay_s=1.0, deadline_s=None)


# --------------------------------------------------------------------------
# the server


# Running servers, held strongly so that one whose owner dropped it is still
# stopped at exit.
_LIVE: "set[EmbeddedZooKeeper]" = set()


@atexit.register
def _stop_all_at_exit():
    for server in list(_LIVE):
        try:
            server.stop()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


class EmbeddedZooKeeper:
    """A standalone ZooKeeper server in a child process, on 127.0.0.1.

    ``port=None`` picks a free port on the first :meth:`start` (retrying if
    another process grabs it first); once the server has served on a port,
    every later start (:meth:`restart`, or :meth:`start` after
    :meth:`kill_process` or :meth:`stop`) uses the same port again.
    ``data_dir=None`` uses a temp dir that :meth:`stop` removes.
    ``owner_secret``: lock the server to its owner (see the module
    docstring); ``watchdog``: restart a process that dies unasked.

    Thread-safety: :meth:`start`, :meth:`stop` and :meth:`restart` serialize
    on an internal lock, so any thread may call them; the read-only
    properties may be read from any thread. The watchdog is a daemon thread
    that restarts under the same lock; :meth:`stop` ends it first.
    """

    def __init__(
        self,
        data_dir: str | None = None,
        port: int | None = None,
        host: str = "127.0.0.1",
        *,
        tick_ms: int = 500,
        min_session_timeout_ms: int = 1_000,
        max_session_timeout_ms: int = 60_000,
        start_timeout_s: float = 60.0,
        heap_mb: int | None = None,
        log_level: str = "INFO",
        java: str | None = None,
        jars_dir: str | None = None,
        owner_secret: bytes | None = None,
        max_client_connections: int = MAX_CLIENT_CONNECTIONS,
        max_request_bytes: int = MAX_REQUEST_BYTES,
        four_letter_words: str = FOUR_LETTER_WORDS,
        watchdog: bool = False,
    ):
        if host != "127.0.0.1":
            # The embedded server is a development and test tool; it never
            # listens beyond the loopback interface.
            raise ConfigError(f"the embedded ZooKeeper listens on 127.0.0.1 only, not {host!r}")
        if port is not None and not (0 < port < 65536):
            raise ConfigError(f"port must be in 1..65535, got {port!r}")
        if min_session_timeout_ms > max_session_timeout_ms:
            raise ConfigError("min_session_timeout_ms must not exceed max_session_timeout_ms")
        self.host = host
        self.tick_ms = tick_ms
        self.min_session_timeout_ms = min_session_timeout_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self.start_timeout_s = start_timeout_s
        self.heap_mb = heap_mb
        self.log_level = log_level
        self._owner_secret = bytes(owner_secret) if owner_secret is not None else None
        self.max_client_connections = max_client_connections
        self.max_request_bytes = max_request_bytes
        self.four_letter_words = four_letter_words
        self._watch = watchdog
        self._watcher: threading.Thread | None = None
        self._watch_stop = threading.Event()
        self._java = java
        self._jars_dir = jars_dir
        self._port = port
        self._port_fixed = port is not None  # given by the caller: one try only
        self._port_sticky = False  # served once: clients know it, keep it
        self._data_dir = os.path.abspath(data_dir) if data_dir is not None else None
        self._owns_data_dir = data_dir is None
        self._proc: subprocess.Popen | None = None
        self._log_file = None
        self._lock = threading.RLock()

    # ---------------------------------------------------------------- state

    @property
    def port(self) -> int | None:
        return self._port

    @property
    def connect_string(self) -> str:
        """``"127.0.0.1:<port>"``, for :class:`kazoo.client.KazooClient`."""
        if self._port is None:
            raise EmbeddedZooKeeperError("the embedded ZooKeeper has no port yet; call start() first")
        return f"{self.host}:{self._port}"

    @property
    def pid(self) -> int | None:
        """The PID of the server process last started (None before start and
        after stop); see :attr:`running` for whether it still runs."""
        proc = self._proc
        return proc.pid if proc is not None else None

    @property
    def running(self) -> bool:
        proc = self._proc
        return proc is not None and proc.poll() is None

    @property
    def data_dir(self) -> str | None:
        return self._data_dir

    @property
    def log_path(self) -> str | None:
        return os.path.join(self._data_dir, LOG_NAME) if self._data_dir else None

    def __repr__(self):
        state = f"pid {self.pid}" if self.running else "stopped"
        return f"EmbeddedZooKeeper({self.host}:{self._port}, {state})"

    # ------------------------------------------------------------ lifecycle

    def start(self) -> "EmbeddedZooKeeper":
        """Start the server and wait until a client can connect; returns self.

        Raises :class:`EmbeddedZooKeeperError` (with the tail of the server's
        output) when java or the jars are missing, or when the server does
        not accept a client within ``start_timeout_s``.
        """
        with self._lock:
            if self.running:
                return self
            java = self._java or find_java()
            classpath = os.pathsep.join(find_jars(self._jars_dir, logging=True))
            created_dir = self._data_dir is None
            if created_dir:
                self._data_dir = tempfile.mkdtemp(prefix="raylog-zk-")
            try:
                self._start_process(java, classpath)
                if self._owner_secret is not None:
                    self._lock_down()
            except BaseException:
                if created_dir:
                    # the error carries the output tail; leave no temp dir
                    shutil.rmtree(self._data_dir, ignore_errors=True)
                    self._data_dir = None
                raise
            _LIVE.add(self)
            if self._watch and (self._watcher is None or not self._watcher.is_alive()):
                self._watch_stop.clear()
                self._watcher = threading.Thread(target=self._watch_loop, name=f"zookeeper-watchdog-{self._port}",
                                                 daemon=True)
                self._watcher.start()
            return self

    def admit(self, token: bytes, cluster: str) -> None:
        """Make ``cluster``'s root with the cluster's ACL, as the owner of a
        locked server (before the cluster's first client, which could not);
        nothing on a server without an owner, or for a root that exists."""
        from raylog.zk.acl import make_cluster_root  # only with an owner

        if self._owner_secret is None or token is None:
            return
        make_cluster_root(self.connect_string, self._owner_secret, bytes(token), cluster)

    def _lock_down(self) -> None:
        from kazoo.client import KazooClient  # only here: imported when used

        from kazoo.exceptions import NoAuthError

        from raylog.zk.acl import lock_server, owner_credential

        zk = KazooClient(hosts=self.connect_string, timeout=10.0,
                         auth_data=[("digest", owner_credential(self._owner_secret))])
        zk.start(timeout=self.start_timeout_s)
        try:
            lock_server(zk, self._owner_secret)
        except NoAuthError:
            raise EmbeddedZooKeeperError(
                f"the embedded ZooKeeper's data ({self._data_dir}) was locked by another owner than this "
                f"process's (another Ray auth token); start it with that token, or with a fresh data dir"
            ) from None
        finally:
            zk.stop()
            zk.close()

    def _watch_loop(self) -> None:
        """Restart the process when it exits unasked (see the module docstring)."""
        while not self._watch_stop.wait(WATCH_INTERVAL_S):
            proc = self._proc
            if proc is None or proc.poll() is None:
                continue  # running, or stopped on purpose
            with self._lock:
                if self._watch_stop.is_set() or self._proc is not proc:
                    continue
                code = proc.returncode
                log.warning("the embedded ZooKeeper on %s (pid %s) exited with code %s; restarting it on the same "
                            "port and data (its output: %s)", self.connect_string, proc.pid, code, self.log_path)
                backoff = _WATCH_RESTART.start()
                while True:
                    try:
                        self._reap()
                        self.start()
                        break
                    except Exception as err:  # noqa: BLE001 - said once below
                        pause = backoff.next_delay()
                        if pause is None or self._watch_stop.wait(pause):
                            log.error("the embedded ZooKeeper on %s could not be restarted (%s); clients fail "
                                      "until it is started again", self.connect_string, str(err).splitlines()[0])
                            return

    def _start_process(self, java: str, classpath: str) -> None:
        """Launch and wait for readiness, picking a new port on a bind race."""
        make_owner_only_dirs(os.path.join(self._data_dir, "data"))
        backoff = (_BIND_RETRY if not self._port_fixed else dataclasses.replace(_BIND_RETRY, max_tries=1)).start()
        while True:
            if self._port is None:
                self._port = free_port(self.host)
            self._launch(java, classpath)
            try:
                self._wait_ready()
                self._port_sticky = True
                return
            except _ServerExited as exited:
                self._reap()
                pause = backoff.next_delay() if exited.bind_failure else None
                if pause is not None:
                    if self._port_sticky:
                        # Clients know this port: wait for whoever holds it
                        # (usually our own previous process) to let go.
                        time.sleep(pause)
                    else:
                        # Another process took the port between our probe
                        # and the server's bind; pick a new one.
                        self._port = None
                    continue
                raise EmbeddedZooKeeperError(
                    f"the embedded ZooKeeper on {self.host}:{self._port} exited with "
                    f"code {exited.returncode} during start-up"
                    + (" (the port is in use; pass another port or none)" if exited.bind_failure else "")
                    + f"; its output ({self.log_path}) ends with:\n{self._log_tail()}",
                    port_in_use=exited.bind_failure,
                ) from None
            except BaseException:
                self._reap()
                raise

    def stop(self) -> None:
        """Stop the server by PID (terminate, wait, then kill) and, if the
        data dir is a temp dir this server created, remove it. Idempotent."""
        self._watch_stop.set()
        watcher = self._watcher
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(timeout=30)
        self._watcher = None
        with self._lock:
            self._reap()
            _LIVE.discard(self)
            if self._owns_data_dir and self._data_dir is not None:
                shutil.rmtree(self._data_dir, ignore_errors=True)
                self._data_dir = None

    def restart(self) -> "EmbeddedZooKeeper":
        """Stop the server process and start it again on the same port with
        the same data (znodes and sessions survive); returns self.

        Clients see the connection drop and, once the server is back, resume
        their sessions (unless a session timed out meanwhile).
        """
        with self._lock:
            self.kill_process()
            return self.start()

    def kill_process(self) -> None:
        """Stop the server process but keep its port and data dir, so that a
        later :meth:`start` resumes it (what :meth:`restart` does in one go).
        Tests use this to hold ZooKeeper down for a while."""
        with self._lock:
            self._reap()

    def __enter__(self) -> "EmbeddedZooKeeper":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------- internals

    def _launch(self, java: str, classpath: str) -> None:
        settings = ServerSettings(
            data_dir=self._data_dir, port=self._port, host=self.host, tick_ms=self.tick_ms,
            min_session_timeout_ms=self.min_session_timeout_ms,
            max_session_timeout_ms=self.max_session_timeout_ms,
            heap_mb=self.heap_mb, log_level=self.log_level, four_letter_words=self.four_letter_words,
            max_client_connections=self.max_client_connections, max_request_bytes=self.max_request_bytes,
        )
        self._log_file = open(os.path.join(self._data_dir, LOG_NAME), "ab", opener=private_opener)
        self._proc = launch(settings, self._log_file, java=java, classpath=classpath)

    def _wait_ready(self) -> None:
        """Wait until a kazoo client connects; raise _ServerExited if the
        process ends first, EmbeddedZooKeeperError on timeout."""
        deadline = time.monotonic() + self.start_timeout_s
        # First the cheap probe: a four-letter word answered once the server
        # serves requests, by a socket that *this* process listens on (another
        # server may hold a port we were told to use).
        while True:
            self._check_alive()
            try:
                srvr = four_letter_word(self._port, "srvr", self.host, timeout_s=1.0)
            except OSError:
                srvr = ""
            if "Zookeeper version" in srvr:
                if self._listens_here():
                    break
                time.sleep(0.2)  # someone else's server; wait for ours to exit
            if time.monotonic() > deadline:
                self._timed_out()
            time.sleep(0.05)
        # Then a real client session.
        from kazoo.client import KazooClient
        from kazoo.handlers.threading import KazooTimeoutError  # only here: imported when used

        while True:
            self._check_alive()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._timed_out()
            client = KazooClient(hosts=self.connect_string, timeout=10.0)
            try:
                client.start(timeout=min(remaining, 5.0))
                return
            except KazooTimeoutError:
                continue
            finally:
                client.stop()
                client.close()

    def _listens_here(self) -> bool:
        import psutil  # a dependency of Ray's; imported when used

        try:
            conns = psutil.Process(self._proc.pid).net_connections(kind="tcp")
        except (psutil.Error, OSError):
            return False
        return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == self._port for c in conns)

    def _check_alive(self) -> None:
        code = self._proc.poll()
        if code is not None:
            raise _ServerExited(code, self._bind_failed())

    def _timed_out(self):
        raise EmbeddedZooKeeperError(
            f"the embedded ZooKeeper (pid {self.pid}) did not accept a client on "
            f"{self.connect_string} within {self.start_timeout_s:g}s; the machine "
            f"may be overloaded (raise start_timeout_s). Its output ({self.log_path}) "
            f"ends with:\n{self._log_tail()}"
        )

    def _bind_failed(self) -> bool:
        tail = self._log_tail(64 * 1024)
        if "Address already in use" in tail or "BindException" in tail:
            return True
        # Without a logger the server exits silently; if something else
        # answers on the port now, the bind is what failed.
        try:
            socket.create_connection((self.host, self._port), timeout=0.5).close()
            return True
        except OSError:
            return False

    def _log_tail(self, limit: int = 4000) -> str:
        path = self.log_path
        try:
            with open(path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - limit))
                return f.read().decode(errors="replace").rstrip() or "(no output)"
        except (OSError, TypeError):
            return "(no output)"

    def _reap(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None


class _ServerExited(Exception):
    def __init__(self, returncode: int, bind_failure: bool):
        super().__init__(returncode)
        self.returncode = returncode
        self.bind_failure = bind_failure


# --------------------------------------------------------------------------
# a client
