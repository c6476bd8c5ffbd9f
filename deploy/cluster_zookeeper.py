"""The cluster's ZooKeeper: start, stop and check it on the Ray head node.

::

    python deploy/cluster_zookeeper.py start --host 10.0.1.5 --port 2181 --data-dir ~/raylog-state/zookeeper
    python deploy/cluster_zookeeper.py status --data-dir ~/raylog-state/zookeeper
    python deploy/cluster_zookeeper.py stop --data-dir ~/raylog-state/zookeeper

It runs the ZooKeeper server that raylog embeds (the jars inside the
pyspark wheel, ``java`` from ``JAVA_HOME`` or the ``PATH``), started by
raylog's one launcher (:func:`raylog.zk.launcher.launch`), but detached
and listening on ``--host``: an
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
import sys
import time

from raylog.zk.launcher import MAIN_CLASS

PID_FILE = "zookeeper.pid"


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
    from raylog.zk.launcher import four_letter_word

    try:
        return four_letter_word(port, "ruok", host=host, timeout_s=2.0) == "imok"
    except OSError:
        return False


def start(args) -> int:
    from raylog.zk.launcher import ServerSettings, launch

    data_dir = os.path.abspath(os.path.expanduser(args.data_dir))
    pid = _pid(data_dir)
    if pid is not None:
        print(f"ZooKeeper already running from {data_dir} (pid {pid})")
        return 0
    os.makedirs(data_dir, exist_ok=True)
    settings = ServerSettings(
        data_dir=data_dir, port=args.port, host=args.host, tick_ms=2000,
        min_session_timeout_ms=4000, max_session_timeout_ms=60000, heap_mb=args.heap_mb,
        four_letter_words="ruok,srvr,stat,mntr,conf", snapshots_kept=5, quick_jvm=False,
    )
    with open(os.path.join(data_dir, "zookeeper.out"), "ab") as out:
        proc = launch(settings, out, detached=True)
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


def _running(args) -> tuple[str, int | None]:
    """The data dir and the PID of its running server (None, said, if none)."""
    data_dir = os.path.abspath(os.path.expanduser(args.data_dir))
    pid = _pid(data_dir)
    if pid is None:
        print(f"no ZooKeeper running from {data_dir}")
    return data_dir, pid


def stop(args) -> int:
    data_dir, pid = _running(args)
    if pid is None:
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
    data_dir, pid = _running(args)
    if pid is None:
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
