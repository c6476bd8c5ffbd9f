"""The cluster's ZooKeeper: start, stop and check it on the Ray head node.

::

    python deploy/cluster_zookeeper.py start --host 10.0.1.5 --port 2181 --data-dir ~/raylog-state/zookeeper
    python deploy/cluster_zookeeper.py status --data-dir ~/raylog-state/zookeeper
    python deploy/cluster_zookeeper.py stop --data-dir ~/raylog-state/zookeeper

It runs the ZooKeeper server that raylog embeds (the jars inside the
pyspark wheel, ``java`` from ``JAVA_HOME`` or the ``PATH``), found through
:func:`raylog.zk.server.find_jars`, but listening on ``--host``: an
address the other nodes reach. (``raylog zookeeper start`` listens on
127.0.0.1 only, for one machine.) ZooKeeper has no authentication here:
keep the port reachable by the cluster's nodes only (on AWS the security
group ``ray up`` creates admits the cluster's own nodes).

``start`` is idempotent (a running server is left alone, as ``ray up``
reruns its start commands), detaches the server into a session of its own,
writes its PID to ``<data dir>/zookeeper.pid`` and waits until it answers
``ruok``. ``stop`` ends it by that PID. Files in the data dir::

    zoo.cfg             the configuration
    log4j2.properties   its logging
    zookeeper.out       its output
    zookeeper.pid       its PID while it runs
    data/               snapshots and transaction logs
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

PID_FILE = "zookeeper.pid"
MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"

_LOG4J = """\
status = error
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = %d{ISO8601} %-5p [%t] %c{1}: %m%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = out
"""


def _pid(data_dir: str) -> int | None:
    try:
        with open(os.path.join(data_dir, PID_FILE)) as f:
            pid = int(f.read().strip())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if MAIN_CLASS.encode() not in f.read():
                return None  # the PID was reused by another program
    except OSError:
        pass
    return pid


def _ruok(host: str, port: int) -> bool:
    from raylog.zk.server import four_letter_word

    try:
        return four_letter_word(port, "ruok", host=host, timeout_s=2.0) == "imok"
    except OSError:
        return False


def start(args) -> int:
    from raylog.zk.server import find_java, find_jars

    data_dir = os.path.abspath(os.path.expanduser(args.data_dir))
    pid = _pid(data_dir)
    if pid is not None:
        print(f"ZooKeeper already running from {data_dir} (pid {pid})")
        return 0
    os.makedirs(os.path.join(data_dir, "data"), exist_ok=True)
    cfg = os.path.join(data_dir, "zoo.cfg")
    with open(cfg, "w") as f:
        f.write(
            "\n".join(
                [
                    "tickTime=2000",
                    f"dataDir={os.path.join(data_dir, 'data')}",
                    f"clientPort={args.port}",
                    f"clientPortAddress={args.host}",
                    "minSessionTimeout=4000",
                    "maxSessionTimeout=60000",
                    "maxClientCnxns=0",
                    "admin.enableServer=false",
                    "4lw.commands.whitelist=ruok,srvr,stat,mntr,conf",
                    "autopurge.snapRetainCount=5",
                    "autopurge.purgeInterval=1",
                ]
            )
            + "\n"
        )
    log4j = os.path.join(data_dir, "log4j2.properties")
    with open(log4j, "w") as f:
        f.write(_LOG4J)
    cmd = [
        find_java(),
        f"-Xmx{args.heap_mb}m",
        "-Djava.net.preferIPv4Stack=true",
        "-Dzookeeper.jmx.log4j.disable=true",
        f"-Dlog4j2.configurationFile={log4j}",
        "-cp",
        os.pathsep.join(find_jars(logging=True)),
        MAIN_CLASS,
        cfg,
    ]
    with open(os.path.join(data_dir, "zookeeper.out"), "ab") as out:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            cwd=data_dir, start_new_session=True, close_fds=True,
        )
    with open(os.path.join(data_dir, PID_FILE), "w") as f:
        f.write(f"{proc.pid}\n")
    deadline = time.monotonic() + args.timeout_s
    while not _ruok(args.host, args.port):
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
            os.unlink(os.path.join(data_dir, PID_FILE))
            print(f"ZooKeeper did not start on {args.host}:{args.port}; see {data_dir}/zookeeper.out", file=sys.stderr)
            return 1
        time.sleep(0.2)
    print(f"ZooKeeper running at {args.host}:{args.port} (pid {proc.pid}, data dir {data_dir})")
    return 0


def stop(args) -> int:
    data_dir = os.path.abspath(os.path.expanduser(args.data_dir))
    pid = _pid(data_dir)
    if pid is None:
        print(f"no ZooKeeper running from {data_dir}")
        return 0
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + args.timeout_s
    while _pid(data_dir) == pid and time.monotonic() < deadline:
        time.sleep(0.2)
    if _pid(data_dir) == pid:
        os.kill(pid, signal.SIGKILL)
    try:
        os.unlink(os.path.join(data_dir, PID_FILE))
    except FileNotFoundError:
        pass
    print(f"stopped ZooKeeper (pid {pid})")
    return 0


def status(args) -> int:
    data_dir = os.path.abspath(os.path.expanduser(args.data_dir))
    pid = _pid(data_dir)
    if pid is None:
        print(f"no ZooKeeper running from {data_dir}")
        return 3
    print(f"ZooKeeper running from {data_dir} (pid {pid})")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data-dir", default="~/raylog-state/zookeeper", help="configuration, data, output, pid file")
    common.add_argument("--timeout-s", type=float, default=60, help="how long to wait for start or stop")
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("start", parents=[common], help="start the server (if it does not run)")
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on (the node's private address)")
    p.add_argument("--port", type=int, default=2181)
    p.add_argument("--heap-mb", type=int, default=512)
    p.set_defaults(run=start)
    commands.add_parser("stop", parents=[common], help="stop the server by its PID").set_defaults(run=stop)
    commands.add_parser("status", parents=[common], help="exit 0 if it runs, 3 if not").set_defaults(run=status)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
