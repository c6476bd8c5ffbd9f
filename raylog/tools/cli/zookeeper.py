"""``raylog zookeeper start|stop``: a local ZooKeeper for a development cluster."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import click

from raylog.tools.cli.base import DEFAULT_ZOOKEEPER_DIR, ZOOKEEPER_PID_FILE, ZOOKEEPER_LOG_FILE, CommandError, cli
from raylog.zookeeper import CONFIG_FILE_NAME
from raylog.zookeeper import EmbeddedZooKeeper


@cli.group()
def zookeeper():
    """Start and stop a local ZooKeeper (on 127.0.0.1) that outlives the command."""

def _pid_path(data_dir: str) -> str:
    return os.path.join(data_dir, ZOOKEEPER_PID_FILE)


def _read_pid(data_dir: str) -> int | None:
    try:
        with open(_pid_path(data_dir)) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except OSError:
        return True


def _is_our_zookeeper(pid: int) -> bool:
    """Whether ``pid`` runs 'raylog ... zookeeper start' (not a stranger that reused the PID)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().decode(errors="replace").split("\0")
    except OSError:
        return True  # no /proc here: trust the pid file
    return any("raylog" in a for a in args) and "zookeeper" in args and "start" in args


def _client_port(data_dir: str) -> int | None:

    try:
        with open(os.path.join(data_dir, CONFIG_FILE_NAME)) as f:
            for line in f:
                if line.startswith("clientPort="):
                    return int(line.split("=", 1)[1])
    except (OSError, ValueError):
        pass
    return None


@zookeeper.command("start")
@click.option("--port", type=click.IntRange(0, 65535), default=2181, show_default=True,
              help="Port on 127.0.0.1 (0: any free port).")
@click.option("--data-dir", type=click.Path(file_okay=False), default=DEFAULT_ZOOKEEPER_DIR, show_default=True,
              help="Snapshots, logs, the configuration and the pid file.")
@click.option("--foreground", is_flag=True, help="Run in this process until SIGTERM or Ctrl-C.")
@click.option("--timeout-s", type=click.FloatRange(min=1), default=120, show_default=True,
              help="How long to wait for the server to accept clients.")
def zookeeper_start(port, data_dir, foreground, timeout_s):
    """Start a ZooKeeper on 127.0.0.1 that keeps running after this command
    (in a process of its own, detached); print its connect string and PID
    and write the PID to DATA_DIR/raylog-zookeeper.pid. Stop it with
    'raylog zookeeper stop --data-dir DATA_DIR'.

    It listens on the loopback interface only: for a single machine. A
    cluster's ZooKeeper must be reachable from every node; see deploy/."""
    data_dir = os.path.abspath(data_dir)
    running = _read_pid(data_dir)
    if running is not None and _alive(running) and _is_our_zookeeper(running) and running != os.getpid():
        raise CommandError(
            f"a ZooKeeper started by raylog already runs from {data_dir} (pid {running}); "
            f"stop it first with: raylog zookeeper stop --data-dir {data_dir}"
        )
    os.makedirs(data_dir, mode=0o700, exist_ok=True)  # its data is the owner's only
    if foreground:
        _run_zookeeper(port, data_dir, timeout_s)
        return
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_pid_path(data_dir))
    log_path = os.path.join(data_dir, ZOOKEEPER_LOG_FILE)
    cmd = [sys.executable, "-m", "raylog.tools.cli", "zookeeper", "start", "--foreground",
           "--port", str(port), "--data-dir", data_dir, "--timeout-s", str(timeout_s)]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            cwd=data_dir, start_new_session=True, close_fds=True,
        )
    deadline = time.monotonic() + timeout_s + 10
    while _read_pid(data_dir) != proc.pid:
        if proc.poll() is not None:
            raise CommandError(f"ZooKeeper did not start: {_last_error(log_path)} (see {log_path})")
        if time.monotonic() > deadline:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise CommandError(f"ZooKeeper did not start within {timeout_s:g} s (see {log_path})")
        time.sleep(0.1)
    click.echo(f"ZooKeeper running at 127.0.0.1:{_client_port(data_dir)} (pid {proc.pid}, data dir {data_dir})")
    click.echo(f"stop it with: raylog zookeeper stop --data-dir {data_dir}", err=True)


def _last_error(log_path: str) -> str:
    try:
        with open(log_path, errors="replace") as f:
            lines = [line.rstrip() for line in f if line.strip()]
    except OSError:
        return "no output"
    errors = [line for line in lines if line.startswith("error:")]
    if errors:
        return errors[-1][len("error:"):].strip()
    return lines[-1] if lines else "no output"


def _run_zookeeper(port: int, data_dir: str, timeout_s: float) -> None:
    """The detached process of 'zookeeper start': run the server until told to stop."""
    def stop_on_signal(signum, frame):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop_on_signal)
    server = EmbeddedZooKeeper(data_dir=data_dir, port=port or None, start_timeout_s=timeout_s)
    pid_path = _pid_path(data_dir)
    try:
        server.start()
        tmp = f"{pid_path}.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(f"{os.getpid()}\n")
        os.replace(tmp, pid_path)  # written last: the starter waits for it
        click.echo(f"ZooKeeper running at {server.connect_string} (pid {os.getpid()}, java pid {server.pid})")
        sys.stdout.flush()
        while server.running:
            time.sleep(0.5)
        raise CommandError(f"the ZooKeeper server process exited; see {server.log_path}")
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
        if _read_pid(data_dir) == os.getpid():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(pid_path)


@zookeeper.command("stop")
@click.option("--data-dir", type=click.Path(file_okay=False), default=DEFAULT_ZOOKEEPER_DIR, show_default=True,
              help="The data dir the ZooKeeper was started with.")
@click.option("--timeout-s", type=click.FloatRange(min=1), default=30, show_default=True,
              help="How long to wait for a clean stop before killing it.")
def zookeeper_stop(data_dir, timeout_s):
    """Stop the ZooKeeper that 'zookeeper start' runs from DATA_DIR, by the
    PID in its pid file."""
    data_dir = os.path.abspath(data_dir)
    pid = _read_pid(data_dir)
    if pid is None:
        raise CommandError(f"no ZooKeeper started by raylog runs from {data_dir} (no {_pid_path(data_dir)})")
    if not _alive(pid):
        os.unlink(_pid_path(data_dir))
        raise CommandError(f"the ZooKeeper of {data_dir} (pid {pid}) is not running; removed its stale pid file")
    if not _is_our_zookeeper(pid):
        raise CommandError(
            f"pid {pid} from {_pid_path(data_dir)} is not a ZooKeeper started by raylog; not stopping it "
            f"(remove the stale pid file if that ZooKeeper is gone)"
        )
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _alive(pid):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)  # its server process dies with it
            break
        time.sleep(0.1)
    with contextlib.suppress(FileNotFoundError):
        if _read_pid(data_dir) == pid:
            os.unlink(_pid_path(data_dir))
    click.echo(f"Stopped ZooKeeper (pid {pid}).")
