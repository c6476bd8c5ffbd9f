"""The one ZooKeeper server launcher: find Java and the server jars (they ship
inside the ``pyspark`` wheel), write a server's configuration, build its
command line and start it.

Used by :class:`raylog.zk.server.EmbeddedZooKeeper` (the embedded default,
a child of the caller on 127.0.0.1), by ``raylog zookeeper start`` (which
runs an embedded server in a detached process of its own) and by
``deploy/cluster_zookeeper.py`` (the cluster's server on the head node,
detached, on the node's private address).

The files of a server's data directory::

    <data dir>/zoo.cfg            the server configuration (:func:`write_config`)
    <data dir>/log4j2.properties  its logging
    <data dir>/zookeeper.out      its stdout and stderr
    <data dir>/data/              snapshots and transaction logs (``dataDir``)
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from raylog.errors import EmbeddedZooKeeperError
from raylog.jdk import jdk_tool
from raylog.storage.owner_only import make_dirs as make_owner_only_dirs, private_opener

#: the jars a standalone ZooKeeper server needs, as glob patterns in the
#: pyspark ``jars/`` folder (any version of each)
SERVER_JARS = (
    "zookeeper-[0-9]*.jar",
    "zookeeper-jute-[0-9]*.jar",
    "slf4j-api-[0-9]*.jar",
    "metrics-core-[0-9]*.jar",
    "snappy-java-[0-9]*.jar",
)

#: optional jars that give the server a logger (log4j 2 behind slf4j); without
#: them it runs silently and start-up failures are harder to diagnose
LOGGING_JARS = (
    "log4j-slf4j2-impl-[0-9]*.jar",
    "log4j-api-[0-9]*.jar",
    "log4j-core-[0-9]*.jar",
)

MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
LOG_NAME = "zookeeper.out"
CFG_NAME = "zoo.cfg"
LOG4J_CFG_NAME = "log4j2.properties"

_LOG4J_CONFIG = """\
status = error
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = %d{ISO8601} %-5p [%t] %c{1}: %m%n
rootLogger.level = {level}
rootLogger.appenderRef.out.ref = out
"""


#: connections a server takes from one address: every partition actor,
#: consumer and client of a node holds one (all from one address on a node),
#: so a few hundred partitions per node and a test run's shared server fit
MAX_CLIENT_CONNECTIONS = 300
#: the largest request (and znode) a server reads, ``jute.maxbuffer``: the
#: largest raylog writes is a topic's creation (one transaction with every
#: partition's znodes, :data:`raylog.admin.topics.MAX_PARTITIONS`), well below
MAX_REQUEST_BYTES = 1 << 20
#: requests a server holds at once before it stops reading from sockets
#: (``globalOutstandingLimit``)
MAX_OUTSTANDING_REQUESTS = 200
#: the heap beside the connections' buffers: the tree of znodes and the rest
BASE_HEAP_MB = 192
#: the four-letter words an embedded server answers: whether it runs, and its
#: version and counts (never its configuration, clients or sessions)
FOUR_LETTER_WORDS = "ruok,srvr"


def heap_for(max_client_connections: int, max_request_bytes: int) -> int:
    """A heap (MiB) that every connection's largest request fits in at once
    (ZooKeeper allocates a request's buffer from its length prefix, before
    the bytes arrive), plus :data:`BASE_HEAP_MB`."""
    return BASE_HEAP_MB + -(-max_client_connections * max_request_bytes // (1 << 20))


@dataclasses.dataclass(frozen=True)
class ServerSettings:
    """What a server's ``zoo.cfg`` and command line say."""

    data_dir: str
    port: int
    host: str = "127.0.0.1"
    tick_ms: int = 500
    min_session_timeout_ms: int = 1_000
    max_session_timeout_ms: int = 60_000
    #: the JVM heap, MiB; None: :func:`heap_for` the bounds below
    heap_mb: int | None = None
    log_level: str = "INFO"
    #: four-letter words the server answers ("*": all)
    four_letter_words: str = FOUR_LETTER_WORDS
    #: ``maxClientCnxns``: connections from one address (0: unbounded)
    max_client_connections: int = MAX_CLIENT_CONNECTIONS
    #: ``jute.maxbuffer``: the largest request and znode, bytes
    max_request_bytes: int = MAX_REQUEST_BYTES
    #: ``globalOutstandingLimit``
    max_outstanding_requests: int = MAX_OUTSTANDING_REQUESTS
    #: snapshots kept by the hourly purge
    snapshots_kept: int = 3
    #: a small, quickly started JVM (serial GC, C1 only): right for a
    #: development server, not for a cluster's
    quick_jvm: bool = True


def write_config(settings: ServerSettings) -> str:
    """Write ``zoo.cfg`` and the logging configuration into the data
    directory (creating ``data/``); return the path of ``zoo.cfg``."""
    data = os.path.join(settings.data_dir, "data")
    make_owner_only_dirs(data)  # its data is the owner's only (raylog.storage.owner_only)
    lines = [
        f"tickTime={settings.tick_ms}",
        f"dataDir={data}",
        f"clientPort={settings.port}",
        f"clientPortAddress={settings.host}",
        f"minSessionTimeout={settings.min_session_timeout_ms}",
        f"maxSessionTimeout={settings.max_session_timeout_ms}",
        f"maxClientCnxns={settings.max_client_connections}",
        f"globalOutstandingLimit={settings.max_outstanding_requests}",
        "admin.enableServer=false",
        f"4lw.commands.whitelist={settings.four_letter_words}",
        # keep the disk from filling with old snapshots
        f"autopurge.snapRetainCount={settings.snapshots_kept}",
        "autopurge.purgeInterval=1",
    ]
    cfg = os.path.join(settings.data_dir, CFG_NAME)
    with open(cfg, "w", opener=private_opener) as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(settings.data_dir, LOG4J_CFG_NAME), "w", opener=private_opener) as f:
        f.write(_LOG4J_CONFIG.replace("{level}", settings.log_level))
    return cfg


def command(settings: ServerSettings, java: str, classpath: str) -> list[str]:
    """The server's command line (after :func:`write_config`)."""
    quick = ["-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"] if settings.quick_jvm else []
    heap_mb = settings.heap_mb or heap_for(settings.max_client_connections or 1000, settings.max_request_bytes)
    return [
        java,
        f"-Xmx{heap_mb}m",
        *quick,
        # a request (or znode) past this is refused and its connection closed
        f"-Djute.maxbuffer={settings.max_request_bytes}",
        # a server out of memory exits (and is restarted by its watchdog,
        # raylog.zk.server) instead of living on half dead
        "-XX:+ExitOnOutOfMemoryError",
        "-Djava.net.preferIPv4Stack=true",
        "-Dzookeeper.jmx.log4j.disable=true",
        # raylog's nodes carry digest ACLs (raylog.zk.acl): never skip them
        "-Dzookeeper.skipACL=no",
        "-Dzookeeper.DigestAuthenticationProvider.enabled=true",
        f"-Dlog4j2.configurationFile={os.path.join(settings.data_dir, LOG4J_CFG_NAME)}",
        "-cp",
        classpath,
        MAIN_CLASS,
        os.path.join(settings.data_dir, CFG_NAME),
    ]


def launch(
    settings: ServerSettings,
    out,
    *,
    detached: bool = False,
    java: str | None = None,
    classpath: str | None = None,
) -> subprocess.Popen:
    """Write the configuration and start the server with its output going to
    the open binary file ``out``. ``detached=False``: a child that dies with
    the calling (main) thread on Linux; ``detached=True``: a session of its
    own that outlives the caller (stop it by its PID). ``java`` and
    ``classpath`` default to :func:`find_java` and :func:`find_jars`."""
    classpath = classpath or os.pathsep.join(find_jars(logging=True))
    cmd = command(settings, java or find_java(), classpath)
    write_config(settings)
    out.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(cmd)}\n".encode())
    out.flush()
    return subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=subprocess.STDOUT,
        cwd=settings.data_dir,
        close_fds=True,
        start_new_session=detached,
        preexec_fn=None if detached else _parent_death_signal(),
        umask=0o077,  # its snapshots and logs are its owner's only (raylog.storage.owner_only)
    )


# --------------------------------------------------------------------------
# finding java and the jars


def find_java() -> str:
    """The ``java`` executable: ``$JAVA_HOME/bin/java``, else ``java`` on PATH."""
    found = jdk_tool("java")
    if found is None:
        raise EmbeddedZooKeeperError(
            "java was not found (neither $JAVA_HOME/bin/java nor 'java' on PATH); "
            "install a Java runtime (11 or newer, e.g. 'apt-get install "
            "openjdk-17-jre-headless') or set JAVA_HOME, or pass the address of "
            "an existing ZooKeeper instead of starting an embedded one"
        )
    return found


def _pyspark_jars_dir() -> str:
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedZooKeeperError(
            "pyspark is not installed, and the embedded ZooKeeper runs from "
            "the jars inside it; install raylog's dependencies "
            "('pip install -e .') or pass the address of an existing ZooKeeper"
        )
    return os.path.join(list(spec.submodule_search_locations)[0], "jars")


def find_jars(jars_dir: str | None = None, *, logging: bool = False) -> list[str]:
    """The ZooKeeper server jars, from ``jars_dir`` or the installed pyspark;
    with ``logging=True`` also the log4j jars, where all of them are present."""
    if jars_dir is None:
        jars_dir = _pyspark_jars_dir()
    jars, missing = [], []
    for pattern in SERVER_JARS:
        matches = sorted(glob.glob(os.path.join(jars_dir, pattern)))
        if matches:
            jars.append(matches[-1])
        else:
            missing.append(pattern)
    if missing:
        raise EmbeddedZooKeeperError(
            f"the ZooKeeper server jars {', '.join(missing)} are missing from "
            f"{jars_dir}; reinstall pyspark (pyspark==3.5.x ships them) or pass "
            f"jars_dir= pointing at a folder that holds them"
        )
    if logging:
        extra = [sorted(glob.glob(os.path.join(jars_dir, p))) for p in LOGGING_JARS]
        if all(extra):
            jars.extend(found[-1] for found in extra)
    return jars


def four_letter_word(port: int, command: str = "ruok", host: str = "127.0.0.1", timeout_s: float = 2.0) -> str:
    """Send a ZooKeeper four-letter-word command (``ruok``, ``srvr``,
    ``conf``, ``cons``, ``mntr`` ...) and return the reply ("" if the server
    closed the connection without one, or reset it: a server shedding
    connections from an address over its bound does). Raises OSError if
    nobody listens."""
    chunks = []
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        try:
            sock.sendall(command.encode())
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
    return b"".join(chunks).decode(errors="replace")


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free on ``host`` a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


# --------------------------------------------------------------------------
# dying with the parent (Linux)


def _parent_death_signal():
    """A ``preexec_fn`` that asks Linux to SIGKILL the child when its parent
    thread exits, or None where that is not possible.

    ``PR_SET_PDEATHSIG`` fires when the *thread* that forked the child exits,
    so it is only used from the main thread (whose end is the process's end).
    The libc function is looked up here, before the fork, so the child only
    makes one foreign call between fork and exec.
    """
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        import ctypes  # only on Linux, before a fork: imported when used

        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1
    sigkill = int(signal.SIGKILL)

    def preexec():
        prctl(pr_set_pdeathsig, sigkill, 0, 0, 0)

    return preexec
