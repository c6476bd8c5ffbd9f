"""``raylog.connect()``: the embedded default's start-up, or joining an
existing cluster.

``raylog.connect()`` with no arguments is the **embedded default**: it
starts a local Ray (with one node that offers local disk), a ZooKeeper of
its own on 127.0.0.1, and keeps partition logs under a temporary directory
that ``close()`` removes (pass ``data_dir=`` to keep them); its Kafka
listeners start too, by a Ray task that ``connect`` does not wait for
(:mod:`raylog.kafka.launch`; ``client.kafka_config()`` waits for them). Given
``zookeeper="host:2181"`` and ``ray_address="auto"`` it joins an existing
cluster instead and starts nothing but the partition actors of the topics
it creates. What it starts, the returned :class:`raylog.Client` owns and
stops on ``close()``; if start-up fails, everything started so far is
stopped before the error is raised.

Ray is imported inside :func:`connect` (heavy, lazy on purpose).
"""

from __future__ import annotations

import fcntl
import logging
import os
import secrets
import shutil
import sys
import tempfile
import time

from raylog import quiet
from raylog.actors.placement import DISK_RESOURCE, NODE_LABEL
from raylog.auth import cluster_token
from raylog.client import (DEFAULT_DATA_DIR, Client, kafka_listener_coordinator, kafka_listener_placements,
                           kafka_listener_topics)
from raylog.errors import DataDirInUseError, RaylogError
from raylog.kafka.launch import start_soon as start_kafka_listeners_soon
from raylog.kafka.tls import checked_tls
from raylog.ray_join import check_ray_reachable, present_ray_token
from raylog.storage.owner_only import FILE_MODE, make_dirs as make_owner_only_dirs, tighten as tighten_to_owner
from raylog.zk.acl import owner_secret
from raylog.zk.server import EmbeddedZooKeeper
from raylog.zk.session import connect_kazoo

#: where the embedded default keeps its ZooKeeper's data inside a kept data_dir
EMBEDDED_ZOOKEEPER_DIR = ".zookeeper"
#: the node label of the embedded default's single Ray node
LOCAL_NODE = "local"
#: the lock file of the embedded default's kept data_dir (one owner at a time)
DATA_DIR_LOCK = ".raylog-owner.lock"
#: how long ``connect(data_dir=D)`` waits for D's partitions to be served again
RESTORE_WAIT_S = 120.0
#: pause between two rounds of asking the partitions that do not answer yet
RESTORE_POLL_S = 0.2

logger = logging.getLogger(__name__)
#: the embedded ZooKeeper owner's secret, in its kept data dir, when this
#: machine has no Ray auth token to derive it from
OWNER_SECRET_FILE = "owner.secret"


class DataDirLock:
    """The exclusive ownership of an embedded default's kept ``data_dir``:
    an ``flock`` on ``<data_dir>/.raylog-owner.lock``, which holds the
    owner's pid and command line (for the error a second owner gets).

    The kernel drops the lock when its file is closed, so a process that
    dies (even by SIGKILL) leaves no lock behind: a stale file never
    blocks. ``flock`` locks belong to the open file, so a second
    ``connect(data_dir=D)`` in the same process is refused too.

    Thread-safety: :meth:`release` may be called once from any thread.
    """

    def __init__(self, data_dir: str):
        make_owner_only_dirs(data_dir)
        self.path = os.path.join(os.path.abspath(data_dir), DATA_DIR_LOCK)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, FILE_MODE)  # close-on-exec: children never hold it
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 4096, 0).decode(errors="replace").strip()
            os.close(fd)
            pid, _, command = owner.partition(" ")
            raise DataDirInUseError(
                f"data_dir {os.path.dirname(self.path)} is in use by pid {pid or '?'} "
                f"({command or 'command unknown'}): close that process's client (or stop it) first, "
                f"or pass another data_dir",
                data_dir=os.path.dirname(self.path), pid=int(pid) if pid.isdigit() else None, command=command,
            ) from None
        except BaseException:
            os.close(fd)
            raise
        # a kept data_dir made before raylog kept its data its owner's only
        # (the logs, ZooKeeper's snapshots) is tightened, once, with a warning
        tighten_to_owner(data_dir, "the data directory")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {' '.join([sys.executable, *sys.argv])}\n".encode(), 0)
        self._fd: int | None = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # drops the lock; the file stays (harmless when unlocked)


class _LockedZooKeeper:
    """The embedded ZooKeeper of a kept data_dir together with the
    directory's lock: :meth:`stop` (run by ``Client.close``) stops the
    server, then releases the lock."""

    def __init__(self, server: EmbeddedZooKeeper, lock: DataDirLock):
        self._server = server
        self._lock = lock

    def stop(self) -> None:
        try:
            self._server.stop()
        finally:
            self._lock.release()

    def __getattr__(self, name):
        return getattr(self._server, name)


def wait_until_served(client: Client, timeout_s: float) -> list[tuple[str, int]]:
    """Wait until every registered partition of ``client``'s cluster answers
    on its data port (an OFFSETS request on a fresh connection to its
    endpoint, looked up anew each time: an endpoint an unclean stop left in
    ZooKeeper refuses until the partition's new actor registers its own).
    Returns the partitions that still did not answer after ``timeout_s``,
    after one warning naming them (they go on starting; the calls that
    reach them retry or raise a retriable error)."""
    deadline = time.monotonic() + timeout_s
    pending = [(topic, p) for topic in client.list_topics() for p in range(client.metadata.partitions(topic))]
    while pending:
        late = []
        for topic, partition in pending:
            try:
                client.offsets(topic, partition)
            except RaylogError:
                late.append((topic, partition))
        pending = late
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(RESTORE_POLL_S)
    if pending:
        shown = ", ".join(f"{t}-{p}" for t, p in pending[:10]) + (" ..." if len(pending) > 10 else "")
        logger.warning("%d partition(s) of data_dir %s are not served again after %g s (still starting): %s; "
                       "client.describe_topic(...) shows them, client.repair(...) serves one again",
                       len(pending), client.data_dir, timeout_s, shown)
    return pending
def _owner_secret(zk_dir: str | None) -> bytes:
    """The secret the embedded ZooKeeper's owner is derived from: this
    machine's Ray auth token (every cluster of this user shares it, so each
    can make its root, :mod:`raylog.zk.acl`), else a random one, kept
    (readable by its owner only) beside a kept ZooKeeper's data so that the
    next start is the same owner."""
    secret = owner_secret()
    if secret is not None:
        return secret
    if zk_dir is None:
        return secrets.token_bytes(32)
    os.makedirs(zk_dir, mode=0o700, exist_ok=True)
    path = os.path.join(zk_dir, OWNER_SECRET_FILE)
    try:
        with open(path, "rb") as f:
            return bytes.fromhex(f.read().decode().strip())
    except (OSError, ValueError):
        secret = secrets.token_bytes(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secret.hex())
        return secret


def connect(
    zookeeper: str | None = None,
    ray_address: str | None = None,
    data_dir: str | None = None,
    *,
    cluster: str = "default",
    token: bytes | str | None = None,
    num_cpus: int | None = None,
    verbose: bool = False,
    kafka_tls=None,
) -> Client:
    """Connect to a raylog cluster, or start the embedded default.

    - ``raylog.connect()``: local Ray + a ZooKeeper started here + logs in a
      temporary directory removed by ``close()``;
    - ``raylog.connect(data_dir="/tmp/rl")``: the same, logs kept there,
      and ZooKeeper's data in ``/tmp/rl/.zookeeper``: a later connect with
      the same ``data_dir`` serves the topics again (its supervisor,
      :mod:`raylog.actors.supervisor`, starts every partition actor) and
      returns once every one answers (after an unclean stop too; bounded
      by :data:`RESTORE_WAIT_S`, past it a warning names the partitions
      still starting); the data dir is its owner's only (``0700``, files
      ``0600``; a looser kept one is tightened, with a warning);
    - ``raylog.connect(zookeeper="host:2181", ray_address="auto")``: an
      existing cluster (``data_dir`` defaults to ``~/.local/share/raylog`` on each node,
      :func:`raylog.client.default_data_dir`).

    ``token``: the cluster's token, for a process that cannot derive it
    (outside Ray, without Ray's auth token); by default the client derives
    it (see :mod:`raylog.auth`). Every data port requires it.

    ``kafka_tls``: :class:`raylog.TlsSettings` (certificate, key and CA
    files, e.g. ``raylog.TlsSettings.in_dir(DIR)`` after ``raylog tls init
    DIR``): the embedded default's Kafka listeners serve TLS only
    (``SASL_SSL``; ``client.kafka_config()`` says so), and it is the
    client's ``kafka_tls``, what :meth:`Client.start_kafka_listeners` uses
    on a joined cluster. Files that cannot be used: :class:`ConfigError`
    before anything starts.

    Every connection has a deadline: ZooKeeper 10 s, the Ray head
    :data:`raylog.ray_join.RAY_CONNECT_TIMEOUT_S`; past it a :class:`ZooKeeperUnavailableError`
    or :class:`RayUnavailableError` names the address and what to check
    (for Ray alike whether nothing listens, a listener stays silent or
    answers but is no GCS; ``ray_address="auto"`` with no Ray found fails
    at once). A malformed ZooKeeper address is a :class:`ConfigError`.

    Quiet by default (see :mod:`raylog.quiet`): raylog logs warnings only,
    and the embedded default keeps Ray's start-up notices and its Java
    workers' info lines out of the output; ``verbose=True`` (or
    ``RAYLOG_LOG_LEVEL=INFO``) lets them through.
    """
    import ray  # heavy (Ray): imported when used

    hushed = quiet.configure(verbose)
    if isinstance(token, str):
        token = token.encode()
    kafka_tls = checked_tls(kafka_tls, "kafka_tls")  # before anything starts
    embedded_zk = None
    data_dir_lock = None
    owns_ray = False
    owned_data_dir = None
    zk = None
    try:
        if zookeeper is not None:
            # A wrong address fails here, within its deadline, before Ray starts.
            zk = connect_kazoo(zookeeper, refused_fails_fast=True)
        if zookeeper is None:
            # With a kept data_dir the topics are kept too: ZooKeeper's data
            # lives beside the logs, and the supervisor serves them again.
            zk_dir = None if data_dir is None else os.path.join(data_dir, EMBEDDED_ZOOKEEPER_DIR)
            if data_dir is not None:
                # One owner per data_dir: a second embedded ZooKeeper on the
                # same data would write into this cluster.
                data_dir_lock = DataDirLock(data_dir)
            # Closed to strangers, and restarted should it die (raylog.zk.server).
            embedded_zk = EmbeddedZooKeeper(data_dir=zk_dir, owner_secret=_owner_secret(zk_dir), watchdog=True).start()
            zookeeper = embedded_zk.connect_string
        data_host = None
        if not ray.is_initialized():
            if ray_address is None:
                quiet.quiet_ray_start(hushed)
                ray.init(
                    address="local",  # a local Ray of our own, never a stray cluster
                    num_cpus=num_cpus,
                    resources={DISK_RESOURCE: 1},
                    labels={NODE_LABEL: LOCAL_NODE},
                    include_dashboard=False,
                    configure_logging=True,
                    logging_level=logging.WARNING,
                    log_to_driver=True,
                )
                if hushed:
                    quiet.quiet_forwarded_lines()
                owns_ray = True
                data_host = "127.0.0.1"
            else:
                present_ray_token()
                check_ray_reachable(ray_address)
                ray.init(address=ray_address, logging_level=logging.WARNING)
        elif ray_address is None and embedded_zk is not None:
            data_host = "127.0.0.1"
        if data_dir is None:
            if embedded_zk is not None:
                # A fresh embedded ZooKeeper knows no topic, so its logs must
                # be fresh too (also when the caller started Ray): a shared
                # default directory would serve an earlier run's messages
                # under a re-created topic's name.
                data_dir = owned_data_dir = tempfile.mkdtemp(prefix="raylog-data-")
            else:
                data_dir = DEFAULT_DATA_DIR
        if embedded_zk is not None:
            # Its owner makes the cluster's root (the cluster's token may not
            # create under the locked /raylog).
            embedded_zk.admit(token if token is not None else cluster_token(cluster), cluster)
        client = Client(
            zookeeper=zookeeper,
            cluster=cluster,
            data_dir=data_dir,
            token=token,
            data_host=data_host,
            kafka_tls=kafka_tls,
            _owned_zookeeper=embedded_zk if data_dir_lock is None else _LockedZooKeeper(embedded_zk, data_dir_lock),
            _owns_ray=owns_ray,
            _owned_data_dir=owned_data_dir,
            _zk=zk,
        )
        if owns_ray:
            # The embedded cluster's start-up: every topic kept in data_dir
            # is served again, with no client call.
            try:
                client.start_supervisor(wait=False)
                # and its Kafka listeners (docs/design.md section 10), started by a Ray task
                start_kafka_listeners_soon(zookeeper, cluster, data_host, kafka_listener_placements,
                                           kafka_listener_topics(data_dir, data_host),
                                           kafka_listener_coordinator(zookeeper, cluster), kafka_tls)
                if data_dir_lock is not None:
                    # a kept data_dir: return once its topics are served again
                    wait_until_served(client, RESTORE_WAIT_S)
            except BaseException:
                client.close()
                raise
        return client
    except BaseException:
        if zk is not None:
            zk.stop()
            zk.close()
        if owns_ray:
            ray.shutdown()
        if embedded_zk is not None:
            embedded_zk.stop()
        if data_dir_lock is not None:
            data_dir_lock.release()
        if owned_data_dir is not None:
            shutil.rmtree(owned_data_dir, ignore_errors=True)
        raise
