"""The peer brokers of the paper's comparison, run as child processes.

Each broker listens on 127.0.0.1 only, on free ports, with its data and
logs under a temporary directory of its own, and runs as a child of this
process in a session (process group) of its own. Every process started here
is recorded by PID — in :data:`RUNNING` and in a ``pids`` file of the run
directory — and stopped by that PID: SIGTERM, a bounded wait, then SIGKILL
of its process group. Nothing goes through a system service manager and
nothing is looked up or killed by name. :func:`stop_all` runs at exit.

- :class:`RabbitMQ`: Debian's ``rabbitmq-server`` script with ``RABBITMQ_*``
  variables (node ``rabbit-bench@localhost``, AMQP and distribution ports
  on 127.0.0.1, mnesia and logs in the run directory, no plugins, an Erlang
  cookie in a per-run ``HOME``). The Erlang port mapper it needs is started
  here first, on 127.0.0.1 and a free port (``ERL_EPMD_PORT``), so that the
  node registers with it instead of daemonizing an ``epmd`` of its own
  that would outlive the run; it is stopped by its PID after the broker.
- :class:`ActiveMQ`: the ``org.apache.activemq.console.Main`` of Debian's
  ``activemq`` package on a generated ``activemq.xml``: one STOMP connector
  on 127.0.0.1, persistent messages in KahaDB, no JMX, no web console.
- :class:`Redis`: Debian's ``redis-server`` on 127.0.0.1 and a free port,
  in the foreground, its append-only file on (``appendfsync`` as asked:
  ``everysec``, Redis' default for the AOF, or ``always``), no RDB
  snapshots, its files in the run directory (the peer of the acknowledged
  round trip: Redis Streams' XADD).

Usage::

    with RabbitMQ() as rabbit:        # raises BrokerStartError with the reason
        rabbit.port                   # AMQP on 127.0.0.1
    with ActiveMQ() as amq:
        amq.port                      # STOMP on 127.0.0.1

    python bench/peers/brokers.py rabbitmq|activemq   # start, check, stop

Thread-safety: a broker object belongs to the thread that started it;
:func:`stop_all` may run from any thread (it is idempotent).
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

HOST = "127.0.0.1"
RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
ACTIVEMQ_HOME = "/usr/share/activemq"
EPMD = "epmd"
REDIS_SERVER = "/usr/bin/redis-server"

_lock = threading.Lock()
RUNNING: dict[int, "ChildProcess"] = {}  # pid -> every child started here and not yet stopped


class BrokerStartError(RuntimeError):
    """A broker did not start; the message says why and where its log is."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def port_accepts(port: int, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


def cpu_seconds(pids) -> float:
    """User + system CPU seconds used so far by the live processes ``pids``."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def _proc_stat(pid: int) -> tuple[int, str] | None:
    """(parent PID, start time in clock ticks) of a live process, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
    if fields[0] == "Z":
        return None  # a zombie: nothing left to stop
    return int(fields[1]), fields[19]


class ChildProcess:
    """One child process in its own session, stopped by its PID.

    ``stop`` sends SIGTERM to the PID, waits up to ``grace_s``, then sends
    SIGKILL to the process group the child leads (its session, created at
    start, so the group id is the child's PID) to take any helper it
    forked (Erlang's ``erl_child_setup``, ``inet_gethost``) with it."""

    def __init__(self, name: str, argv: list[str], *, env: dict, cwd: Path, log_path: Path, pid_file: Path):
        self.name = name
        self.log_path = log_path
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.pid = self.proc.pid
        with _lock:
            RUNNING[self.pid] = self
        with open(pid_file, "a") as f:
            f.write(f"{self.pid} {name}\n")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def descendants(self) -> dict[int, str]:
        """PID -> start time of every live descendant (some leave the group:
        Erlang's ``erl_child_setup`` starts a session of its own)."""
        parents: dict[int, list[int]] = {}
        starts: dict[int, str] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            stat = _proc_stat(int(entry))
            if stat is not None:
                parents.setdefault(stat[0], []).append(int(entry))
                starts[int(entry)] = stat[1]
        found: dict[int, str] = {}
        todo = [self.pid]
        while todo:
            for child in parents.get(todo.pop(), []):
                if child not in found:
                    found[child] = starts[child]
                    todo.append(child)
        return found

    def stop(self, grace_s: float = 30.0) -> None:
        try:
            helpers = self.descendants() if self.proc.poll() is None else {}
            if self.proc.poll() is None:
                try:
                    os.kill(self.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
                try:
                    self.proc.wait(grace_s)
                except subprocess.TimeoutExpired:
                    pass
            # The group outlives its leader when a helper is still in it.
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
            # Helpers that left the group: by PID, if still the same process.
            for pid, started in helpers.items():
                stat = _proc_stat(pid)
                if stat is not None and stat[1] == started:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        finally:
            self._log.close()
            with _lock:
                RUNNING.pop(self.pid, None)


def stop_all() -> None:
    """Stop every child still recorded, newest first."""
    with _lock:
        children = sorted(RUNNING.values(), key=lambda c: c.pid, reverse=True)
    for child in children:
        child.stop(grace_s=10.0)


atexit.register(stop_all)


class Broker:
    """Common start/stop logic: a run directory, children, a readiness wait."""

    name = "broker"
    start_timeout_s = 120.0

    def __init__(self, base_dir: str | None = None, keep_dir: bool = False):
        self.dir = Path(tempfile.mkdtemp(prefix=f"raylog-peer-{self.name}-", dir=base_dir))
        self.keep_dir = keep_dir
        self.pid_file = self.dir / "pids"
        self.children: list[ChildProcess] = []
        self.port: int | None = None

    def _spawn(self, name: str, argv: list[str], env: dict, log_name: str) -> ChildProcess:
        child = ChildProcess(name, argv, env=env, cwd=self.dir, log_path=self.dir / log_name, pid_file=self.pid_file)
        self.children.append(child)
        return child

    def start(self):
        try:
            self._start()
        except BaseException:
            self.keep_dir = True  # keep the logs that the error names
            self.stop()
            raise
        return self

    def _start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        """Stop the children, newest first (the broker before its helpers)."""
        for child in reversed(self.children):
            child.stop()
        self.children.clear()
        if not self.keep_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def pids(self) -> list[int]:
        return [c.pid for c in self.children]

    def cpu_seconds(self) -> float:
        """CPU seconds used so far by the broker's processes and their
        descendants (the Erlang VM under the ``rabbitmq-server`` script)."""
        pids = set()
        for child in self.children:
            pids.add(child.pid)
            pids.update(child.descendants())
        return cpu_seconds(pids)

    def _log_tail(self, main: ChildProcess) -> str:
        return f"its log {main.log_path} ends with:\n{tail(main.log_path)}"

    def _wait_ready(self, main: ChildProcess, ready, what: str) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        last_error = None
        while time.monotonic() < deadline:
            if not main.alive():
                raise BrokerStartError(
                    f"{self.name} exited with code {main.proc.returncode} while starting; {self._log_tail(main)}"
                )
            try:
                if ready():
                    return
            except Exception as err:  # noqa: BLE001 - not ready yet
                last_error = err
            time.sleep(0.5)
        raise BrokerStartError(
            f"{self.name} did not accept {what} within {self.start_timeout_s:g} s "
            f"(last error: {last_error!r}); {self._log_tail(main)}"
        )

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class RabbitMQ(Broker):
    """``rabbitmq-server`` on 127.0.0.1: AMQP 0-9-1 on :attr:`port`."""

    name = "rabbitmq"

    def _start(self) -> None:
        if not os.access(RABBITMQ_SERVER, os.X_OK):
            raise BrokerStartError(f"{RABBITMQ_SERVER} not found; run bench/peers/setup.sh")
        if shutil.which(EPMD) is None:
            raise BrokerStartError("epmd (Erlang) not found; run bench/peers/setup.sh")
        import pika  # noqa: F401 - fail early if the client is missing

        home = self.dir / "home"
        mnesia = self.dir / "mnesia"
        logs = self.dir / "log"
        for d in (home, mnesia, logs):
            d.mkdir()
        cookie = home / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(20))
        cookie.chmod(0o400)
        (self.dir / "enabled_plugins").write_text("[].\n")
        (self.dir / "rabbitmq-env.conf").write_text("")
        (self.dir / "rabbitmq.conf").write_text(
            "log.console = false\n"
            "log.file.level = warning\n"
            "disk_free_limit.absolute = 50MB\n"
        )
        self.port = free_port()
        self.dist_port = free_port()
        self.epmd_port = free_port()
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "ERL_EPMD_ADDRESS": HOST,
            "ERL_EPMD_PORT": str(self.epmd_port),
        }
        # Our own port mapper, on loopback, before the node needs one.
        epmd = self._spawn(
            "epmd", [EPMD, "-address", HOST, "-port", str(self.epmd_port)], env, "epmd.log"
        )
        self._wait_ready(epmd, lambda: port_accepts(self.epmd_port), f"connections on epmd port {self.epmd_port}")
        env.update(
            {
                "RABBITMQ_NODENAME": "rabbit-bench@localhost",
                "RABBITMQ_NODE_IP_ADDRESS": HOST,
                "RABBITMQ_NODE_PORT": str(self.port),
                "RABBITMQ_DIST_PORT": str(self.dist_port),
                "RABBITMQ_MNESIA_BASE": str(mnesia),
                "RABBITMQ_LOG_BASE": str(logs),
                "RABBITMQ_CONF_ENV_FILE": str(self.dir / "rabbitmq-env.conf"),
                "RABBITMQ_CONFIG_FILE": str(self.dir / "rabbitmq.conf"),
                "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.dir / "advanced.config"),  # absent
                "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),
                "RABBITMQ_PID_FILE": str(self.dir / "rabbitmq.pid"),
                # Erlang distribution (used by CLI tools only) on loopback too.
                "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
            }
        )
        server = self._spawn("rabbitmq-server", [RABBITMQ_SERVER], env, "rabbitmq-server.log")
        self._wait_ready(server, self._amqp_ready, f"AMQP on port {self.port}")

    def _log_tail(self, main: ChildProcess) -> str:
        node_log = self.dir / "log" / "rabbit-bench@localhost.log"
        if main.name == "rabbitmq-server" and node_log.exists() and node_log.stat().st_size:
            return f"its log {node_log} ends with:\n{tail(node_log)}"
        return super()._log_tail(main)

    def _amqp_ready(self) -> bool:
        import pika

        if not port_accepts(self.port):
            return False
        params = pika.ConnectionParameters(
            host=HOST, port=self.port, connection_attempts=1, socket_timeout=2, blocked_connection_timeout=5
        )
        pika.BlockingConnection(params).close()
        return True

    def connection_parameters(self, **kwargs):
        import pika

        return pika.ConnectionParameters(host=HOST, port=self.port, **kwargs)


ACTIVEMQ_XML = """\
<beans xmlns="http://www.springframework.org/schema/beans"
       xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
       xsi:schemaLocation="http://www.springframework.org/schema/beans http://www.springframework.org/schema/beans/spring-beans-2.0.xsd
                           http://activemq.apache.org/schema/core http://activemq.apache.org/schema/core/activemq-core.xsd">
  <!-- Generated by bench/peers/brokers.py: STOMP on 127.0.0.1 only,
       persistent messages in KahaDB, journal synced periodically
       (the paper's brokers flushed to their stores asynchronously). -->
  <broker xmlns="http://activemq.apache.org/schema/core"
          brokerName="raylog-bench" useJmx="false" persistent="true"
          advisorySupport="false" schedulerSupport="false"
          dataDirectory="{data}">
    <persistenceAdapter>
      <kahaDB directory="{data}/kahadb" journalDiskSyncStrategy="periodic"/>
    </persistenceAdapter>
    <systemUsage>
      <systemUsage>
        <memoryUsage><memoryUsage percentOfJvmHeap="70"/></memoryUsage>
        <storeUsage><storeUsage limit="8 gb"/></storeUsage>
        <tempUsage><tempUsage limit="2 gb"/></tempUsage>
      </systemUsage>
    </systemUsage>
    <transportConnectors>
      <transportConnector name="stomp" uri="stomp://{host}:{port}"/>
    </transportConnectors>
  </broker>
</beans>
"""

LOG4J_PROPERTIES = """\
log4j.rootLogger=INFO, file
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File={data}/activemq.log
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=%d | %-5p | %m | %c%n
log4j.logger.org.springframework=WARN
log4j.logger.org.apache.xbean=WARN
"""

# What Debian's /usr/bin/activemq passes to a JDK newer than 8.
JDK_MODULE_FLAGS = [
    "--add-reads=java.xml=java.logging",
    "--add-opens", "java.base/java.security=ALL-UNNAMED",
    "--add-opens", "java.base/java.net=ALL-UNNAMED",
    "--add-opens", "java.base/java.lang=ALL-UNNAMED",
    "--add-opens", "java.base/java.util=ALL-UNNAMED",
    "--add-opens", "java.naming/javax.naming.spi=ALL-UNNAMED",
    "--add-opens", "java.rmi/sun.rmi.transport.tcp=ALL-UNNAMED",
    "--add-opens", "java.base/java.util.concurrent=ALL-UNNAMED",
    "--add-opens", "java.base/java.util.concurrent.atomic=ALL-UNNAMED",
]  # fmt: skip


class ActiveMQ(Broker):
    """ActiveMQ 5 on 127.0.0.1: STOMP on :attr:`port`, KahaDB in the run directory."""

    name = "activemq"
    heap = "1g"

    def _start(self) -> None:
        jar = Path(ACTIVEMQ_HOME) / "bin" / "activemq.jar"
        if not jar.exists():
            raise BrokerStartError(f"{jar} not found; run bench/peers/setup.sh")
        java = shutil.which("java")
        if java is None:
            raise BrokerStartError("java not found on the PATH (ActiveMQ needs a JRE)")
        conf = self.dir / "conf"
        data = self.dir / "data"
        tmp = self.dir / "tmp"
        for d in (conf, data, tmp):
            d.mkdir()
        self.port = free_port()
        (conf / "activemq.xml").write_text(ACTIVEMQ_XML.format(data=data, host=HOST, port=self.port))
        (conf / "log4j.properties").write_text(LOG4J_PROPERTIES.format(data=data))
        argv = [
            java,
            f"-Xms{self.heap}",
            f"-Xmx{self.heap}",
            "-Djava.net.preferIPv4Stack=true",
            "-Dorg.apache.activemq.UseDedicatedTaskRunner=true",
            f"-Djava.io.tmpdir={tmp}",
            f"-Dlog4j.configuration=file:{conf / 'log4j.properties'}",
            *JDK_MODULE_FLAGS,
            f"-Dactivemq.classpath={conf}",
            f"-Dactivemq.home={ACTIVEMQ_HOME}",
            f"-Dactivemq.base={self.dir}",
            f"-Dactivemq.conf={conf}",
            f"-Dactivemq.data={data}",
            "-jar",
            str(jar),
            "start",
            f"xbean:file:{conf / 'activemq.xml'}",
        ]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.dir), "LANG": "C.UTF-8"}
        server = self._spawn("activemq", argv, env, "activemq.out")
        self._wait_ready(server, self._stomp_ready, f"STOMP on port {self.port}")

    def _stomp_ready(self) -> bool:
        """A STOMP CONNECT answered by CONNECTED."""
        with socket.create_connection((HOST, self.port), timeout=2) as s:
            s.sendall(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00")
            reply = s.recv(4096)
            if not reply.startswith(b"CONNECTED"):
                raise BrokerStartError(f"unexpected STOMP reply {reply[:80]!r}")
            s.sendall(b"DISCONNECT\n\n\x00")
        return True


class Redis(Broker):
    """``redis-server`` on 127.0.0.1: RESP on :attr:`port`, an append-only
    file in the run directory fsynced per ``appendfsync``."""

    name = "redis"
    start_timeout_s = 30.0

    def __init__(self, base_dir: str | None = None, keep_dir: bool = False, appendfsync: str = "everysec"):
        super().__init__(base_dir, keep_dir)
        if appendfsync not in ("always", "everysec", "no"):
            raise ValueError(f"appendfsync must be always, everysec or no, not {appendfsync!r}")
        self.appendfsync = appendfsync

    def _start(self) -> None:
        if not os.access(REDIS_SERVER, os.X_OK):
            raise BrokerStartError(f"{REDIS_SERVER} not found; apt-get install redis-server (bench/peers/setup.sh)")
        self.port = free_port()
        argv = [
            REDIS_SERVER, "--bind", HOST, "--port", str(self.port), "--dir", str(self.dir),
            "--appendonly", "yes", "--appendfsync", self.appendfsync, "--save", "",
            "--daemonize", "no", "--protected-mode", "yes", "--logfile", "",
        ]  # fmt: skip
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.dir), "LANG": "C.UTF-8"}
        server = self._spawn("redis", argv, env, "redis.out")
        self._wait_ready(server, self._ping, f"RESP on port {self.port}")

    def _ping(self) -> bool:
        with socket.create_connection((HOST, self.port), timeout=2) as s:
            s.sendall(b"PING\r\n")
            reply = s.recv(64)
            if not reply.startswith(b"+PONG"):
                raise BrokerStartError(f"unexpected reply {reply[:40]!r}")
        return True


BROKERS = {"rabbitmq": RabbitMQ, "activemq": ActiveMQ, "redis": Redis}


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Start a peer broker on 127.0.0.1, check it, stop it.")
    parser.add_argument("broker", choices=sorted(BROKERS))
    parser.add_argument("--hold", type=float, default=0.0, help="seconds to keep it running")
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    with BROKERS[args.broker]() as broker:
        print(f"{broker.name} ready on {HOST}:{broker.port} in {time.monotonic() - t0:.1f} s, pids {broker.pids()}")
        time.sleep(args.hold)
    print(f"{args.broker} stopped")
    return 0


if __name__ == "__main__":
    import sys

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
