"""Start and stop a local autoscaling raylog cluster (its Ray config,
``configs/local-autoscaling.yaml``, ships with the package)::

    python -m raylog.tools.local_cluster start [--disk-nodes 2]
    python -m raylog.tools.local_cluster status
    python -m raylog.tools.local_cluster stop

(``deploy/local_cluster.py`` in a checkout is the same.) ``start`` runs, from
the virtualenv of the Python that runs it:

1. a ZooKeeper on 127.0.0.1 (``raylog zookeeper start``; data under the
   state dir);
2. a Ray head with Ray's fake multi-node autoscaler
   (``RAY_FAKE_CLUSTER=1 ray start --head --block --autoscaling-config=...``)
   in a session of its own, with a Ray temp dir under the state dir (so
   that other Ray users of the machine never find this cluster through
   ``/tmp/ray``);
3. with ``--disk-nodes N``, a standing request for N nodes with
   ``raylog_disk``, which the autoscaler answers by starting disk nodes
   (``ray.autoscaler.sdk.request_resources``; kept until replaced);
4. raylog's supervisor (:meth:`raylog.Client.start_supervisor`): every topic
   registered in ZooKeeper (kept under the state dir across ``stop`` and
   ``start``) is served again on its node, with no client call, and the
   logs of topics deleted meanwhile are removed.

It writes the PIDs and addresses to ``<state dir>/cluster.json`` and prints,
on stdout, the shell line that points ``raylog`` at the cluster::

    export RAYLOG_ZOOKEEPER=127.0.0.1:41234 RAYLOG_RAY_ADDRESS=127.0.0.1:6390

(so ``eval "$(python -m raylog.tools.local_cluster start)"`` sets it; what
it does and how to stop it go to stderr). The ZooKeeper port chosen at the
first start is kept in ``<state dir>/ports.json`` and used again by every
later ``start`` (unless ``--zookeeper-port`` names another), so the exported
address stays right across ``stop`` and ``start``; when another process
has taken that port meanwhile, a new one is chosen, with a warning and a
new export line.

``stop`` ends exactly what ``start`` started, by PID: the ``ray start``
process and every process below it (GCS, raylets, the autoscaler, the
nodes it launched, their workers), plus any process that names this
cluster's Ray temp dir on its command line; then the ZooKeeper by its pid
file. It never runs ``ray stop``, which would end every Ray process of the
machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

from raylog.client import Client

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(HERE, "configs", "local-autoscaling.yaml")
DEFAULT_STATE_DIR = "/tmp/raylog-local"
STATE_FILE = "cluster.json"
BIN = os.path.dirname(sys.executable)


#: the ports kept across stop and start (the ZooKeeper port clients were given)
PORTS_FILE = "ports.json"


def _saved_zookeeper_port(state_dir: str) -> int | None:
    try:
        with open(os.path.join(state_dir, PORTS_FILE)) as f:
            port = json.load(f).get("zookeeper")
    except (OSError, ValueError, AttributeError):
        return None
    return port if isinstance(port, int) and 0 < port < 65536 else None


def _save_zookeeper_port(state_dir: str, port: int) -> None:
    tmp = os.path.join(state_dir, PORTS_FILE + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"zookeeper": port}, f)
    os.replace(tmp, os.path.join(state_dir, PORTS_FILE))


def _start_zookeeper(port: int, zk_dir: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "raylog.tools.cli", "zookeeper", "start", "--port", str(port), "--data-dir", zk_dir],
        capture_output=True, text=True,
    )


def export_line(zookeeper: str, ray_address: str, cluster: str) -> str:
    """The shell line that points ``raylog`` (and ``raylog.connect`` through
    the CLI's variables) at the cluster."""
    line = f"export RAYLOG_ZOOKEEPER={zookeeper} RAYLOG_RAY_ADDRESS={ray_address}"
    return line + (f" RAYLOG_CLUSTER={cluster}" if cluster != "default" else "")


def _state_path(state_dir: str) -> str:
    return os.path.join(state_dir, STATE_FILE)


def _load_state(state_dir: str) -> dict | None:
    try:
        with open(_state_path(state_dir)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _save_state(state_dir: str, state: dict) -> None:
    tmp = _state_path(state_dir) + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f, indent=2)
    os.replace(tmp, _state_path(state_dir))


def _config(port: int, out_path: str) -> dict:
    """The autoscaling config with the provider pointed at the head's port."""
    import yaml  # only here: imported when used

    with open(CONFIG) as f:
        config = yaml.safe_load(f)
    config["provider"]["gcs_address"] = f"127.0.0.1:{port}"
    with open(out_path, "w") as f:
        yaml.safe_dump(config, f, sort_keys=False)
    return config


def _wait_for_gcs(port: int, head, deadline: float) -> None:

    while True:
        if head.poll() is not None:
            raise SystemExit(f"ray start exited with {head.returncode}; see its log")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit(f"the Ray head did not listen on 127.0.0.1:{port} in time") from None
            time.sleep(0.5)


def _token_mode() -> bool:
    """Whether drivers must present Ray's token to this cluster: as ``ray
    start`` decides for the head, token mode unless RAY_AUTH_MODE says
    otherwise, when a token is at hand."""
    mode = os.environ.get("RAY_AUTH_MODE")
    if mode is not None:
        return mode.lower() == "token"
    return bool(
        os.environ.get("RAY_AUTH_TOKEN")
        or os.environ.get("RAY_AUTH_TOKEN_PATH")
        or os.path.exists(os.path.expanduser("~/.ray/auth_token"))
    )


def _join(ray, address: str, deadline: float) -> None:
    """``ray.init`` on the head just started: on a loaded machine its GCS
    may accept connections before the head node has registered, so a failed
    join is tried again (every 2 s) until ``deadline``."""
    while True:
        try:
            ray.init(address=address, logging_level="WARNING", log_to_driver=False)
            return
        except (ConnectionError, RuntimeError):
            if ray.is_initialized():
                ray.shutdown()
            if time.monotonic() > deadline:
                raise
            time.sleep(2.0)


def _bring_up(address: str, count: int, timeout_s: float, zookeeper: str, cluster: str) -> int:
    """Ask the autoscaler for ``count`` disk nodes and wait for them
    (bounded); then start raylog's supervisor, which serves every topic
    registered in ZooKeeper again on its node (and removes the logs of
    topics deleted meanwhile). Returns the disk nodes alive."""
    if _token_mode():
        # An explicit address never turns token mode on by itself; Ray reads
        # the mode when it is imported.
        os.environ["RAY_AUTH_MODE"] = "token"
    import ray  # heavy (Ray): imported when used
    from ray.autoscaler.sdk import request_resources  # heavy (Ray): imported when used


    _join(ray, address, time.monotonic() + timeout_s)
    try:
        alive = 0
        if count:
            request_resources(bundles=[{"raylog_disk": 1}] * count)
            deadline = time.monotonic() + timeout_s
            while True:
                alive = sum(
                    1 for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("raylog_disk", 0) > 0
                )
                if alive >= count or time.monotonic() > deadline:
                    break
                time.sleep(1.0)
        client = Client(zookeeper=zookeeper, cluster=cluster)
        try:
            client.start_supervisor(timeout_s=timeout_s)
        finally:
            client.close()
        return alive
    finally:
        ray.shutdown()


def start(args) -> None:
    state_dir = os.path.abspath(args.state_dir)
    state = _load_state(state_dir)
    if state is not None and _alive(state.get("ray_start_pid")):
        raise SystemExit(f"a local cluster from {state_dir} runs already; stop it first: {sys.argv[0]} stop")
    os.makedirs(state_dir, exist_ok=True)
    temp_dir = os.path.join(state_dir, "ray")
    zk_dir = os.path.join(state_dir, "zookeeper")
    state = {"state_dir": state_dir, "ray_temp_dir": temp_dir, "zookeeper_data_dir": zk_dir}
    _save_state(state_dir, state)

    # 1. ZooKeeper, on the port its clients were given at the first start
    saved = _saved_zookeeper_port(state_dir)
    port = args.zookeeper_port or saved or 0
    out = _start_zookeeper(port, zk_dir)
    if out.returncode != 0 and not args.zookeeper_port and saved is not None:
        print(f"warning: ZooKeeper's port {saved} of the earlier starts is not free now ({out.stderr.strip()}); "
              f"using another one: export the new address below", file=sys.stderr)
        out = _start_zookeeper(0, zk_dir)
    if out.returncode != 0:
        raise SystemExit(out.stderr.strip())
    match = re.search(r"at (\S+) \(pid (\d+)", out.stdout)
    state.update(zookeeper=match.group(1), zookeeper_pid=int(match.group(2)))
    _save_state(state_dir, state)
    _save_zookeeper_port(state_dir, int(state["zookeeper"].rsplit(":", 1)[1]))

    # 2. the Ray head with the fake multi-node autoscaler
    config = _config(args.port, os.path.join(state_dir, "autoscaling.yaml"))
    head_cpus = config["available_node_types"][config["head_node_type"]]["resources"].get("CPU", 1)
    log_path = os.path.join(state_dir, "ray-head.log")
    cmd = [
        os.path.join(BIN, "ray"), "start", "--head", "--block",
        f"--port={args.port}", "--node-ip-address=127.0.0.1", f"--num-cpus={head_cpus}",
        "--include-dashboard=false", "--disable-usage-stats",
        f"--temp-dir={temp_dir}", f"--autoscaling-config={os.path.join(state_dir, 'autoscaling.yaml')}",
    ]
    env = {**os.environ, "RAY_FAKE_CLUSTER": "1"}
    env.pop("RAY_ADDRESS", None)
    with open(log_path, "ab") as log:
        head = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True, close_fds=True)
    address = f"127.0.0.1:{args.port}"
    state.update(ray_start_pid=head.pid, ray_address=address, ray_log=log_path)
    _save_state(state_dir, state)
    try:
        _wait_for_gcs(args.port, head, time.monotonic() + args.timeout_s)
        alive = _bring_up(address, args.disk_nodes, args.timeout_s, state["zookeeper"], args.cluster)
        if args.disk_nodes:
            print(f"{alive} of {args.disk_nodes} disk nodes up", file=sys.stderr)
        print(f"raylog supervisor of cluster {args.cluster!r} started: it serves every registered topic "
              f"again", file=sys.stderr)
    except BaseException:
        stop(args)
        raise
    print(f"Ray head {address} (pid {head.pid}), ZooKeeper {state['zookeeper']}; state in {state_dir}",
          file=sys.stderr)
    # raylog presents Ray's token by itself (raylog.connect); other drivers
    # need RAY_AUTH_MODE=token when _token_mode() holds.
    print("point raylog at it with the line below (then: raylog topics create clicks --partitions 4); "
          f"stop it with: {sys.executable} -m raylog.tools.local_cluster stop --state-dir {state_dir}",
          file=sys.stderr)
    print(export_line(state["zookeeper"], address, args.cluster))


# -- stopping by PID -----------------------------------------------------------


def _alive(pid) -> bool:
    if not pid:
        return False
    import psutil  # only here: imported when used

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def cluster_processes(state: dict) -> list:
    """The processes of the cluster: the ``ray start`` process, everything
    below it, and whatever names the cluster's Ray temp dir (a process whose
    parent died is adopted by init and leaves the tree)."""
    import psutil  # only here: imported when used

    found = {}
    pid = state.get("ray_start_pid")
    if _alive(pid):
        root = psutil.Process(pid)
        found[root.pid] = root
        for child in root.children(recursive=True):
            found[child.pid] = child
    temp_dir = state.get("ray_temp_dir")
    if temp_dir:
        for proc in psutil.process_iter(["pid", "cmdline"]):
            try:
                if any(temp_dir in arg for arg in proc.info["cmdline"] or ()):
                    found.setdefault(proc.pid, proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
    found.pop(os.getpid(), None)
    return [p for p in found.values() if _alive(p.pid)]  # a zombie is gone (its parent has not reaped it)


#: seconds a stop waits for the Ray workers (the partition actors, which close their logs on SIGTERM)
WORKER_GRACE_S = 15.0
#: seconds a stop then waits for Ray's own processes before it kills them: a raylet whose GCS goes
#: away with it takes about 30 s to exit on SIGTERM, and nothing of raylog's lives in them
SYSTEM_GRACE_S = 3.0


#: Ray's own processes that are named like workers
_RAY_AGENTS = {"ray::DashboardAgent", "ray::RuntimeEnvAgent", "ray::IDLE"}


def _is_worker(proc) -> bool:
    """A Ray worker process (``ray::<actor or task>``): an actor's state ends with it."""
    import psutil  # only here: imported when used

    try:
        cmdline = proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
    return bool(cmdline) and cmdline[0].startswith("ray::") and cmdline[0] not in _RAY_AGENTS


def _terminate(procs: list) -> list:
    """SIGTERM every process at once; wait for the workers (at most
    :data:`WORKER_GRACE_S`), then for the rest (at most
    :data:`SYSTEM_GRACE_S`); returns those still alive."""
    import psutil  # only here: imported when used

    workers = [p for p in procs if _is_worker(p)]
    for proc in procs:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(workers, timeout=WORKER_GRACE_S)
    _, alive = psutil.wait_procs(procs, timeout=SYSTEM_GRACE_S)
    return alive


def stop(args) -> None:
    """Stop the cluster's Ray processes (every one at once: the workers
    first get their time to close the logs, Ray's own processes are then
    killed rather than waited for) and its ZooKeeper."""
    import psutil  # only here: imported when used

    state_dir = os.path.abspath(args.state_dir)
    state = _load_state(state_dir)
    if state is None:
        raise SystemExit(f"no local cluster recorded in {state_dir}")
    procs = cluster_processes(state)
    count = len(procs)
    for _ in range(3):  # then what is still there: a node the autoscaler's monitor started anew meanwhile
        for proc in _terminate(procs):
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        procs = cluster_processes(state)
        if not procs:
            break
        count += len(procs)
    print(f"stopped {count} Ray processes")  # the result: stdout, as the ZooKeeper's stop below
    if state.get("zookeeper_data_dir") and os.path.exists(os.path.join(state["zookeeper_data_dir"], "raylog-zookeeper.pid")):
        subprocess.run([sys.executable, "-m", "raylog.tools.cli", "zookeeper", "stop", "--data-dir",
                        state["zookeeper_data_dir"]], check=False)
    os.unlink(_state_path(state_dir))


def status(args) -> None:
    state = _load_state(os.path.abspath(args.state_dir))
    if state is None:
        raise SystemExit(f"no local cluster recorded in {args.state_dir}")
    procs = cluster_processes(state)
    print(json.dumps({**state, "ray_processes": len(procs), "running": _alive(state.get("ray_start_pid"))}, indent=2))


def _gcs_port(text: str) -> int:
    """``--port``: a port number, not 0 (the head's port is written into the
    nodes' config and the export line before the head starts, so it cannot
    be left to the system to choose)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"the head's port must be 1-65535, not {port} (it is given to the "
                                         f"nodes and clients before the head starts, so it cannot be 0)")
    return port


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--state-dir", default=DEFAULT_STATE_DIR,
                        help=f"PIDs, logs, the Ray temp dir, ZooKeeper's data (default {DEFAULT_STATE_DIR})")
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("start", parents=[common], help="start ZooKeeper and the autoscaling Ray head")
    p.add_argument("--port", type=_gcs_port, default=6390,
                   help="the head's GCS port on 127.0.0.1 (a fixed one: the nodes' config and clients are given it)")
    p.add_argument("--zookeeper-port", type=int, default=0, help="ZooKeeper's port on 127.0.0.1 (0: a free one)")
    p.add_argument("--disk-nodes", type=int, default=0, help="ask the autoscaler for this many disk nodes")
    p.add_argument("--cluster", default=os.environ.get("RAYLOG_CLUSTER", "default"),
                   help="the raylog cluster whose supervisor to start (default: $RAYLOG_CLUSTER or 'default')")
    p.add_argument("--timeout-s", type=float, default=180, help="wait this long for the head and the nodes")
    p.set_defaults(run=start)
    commands.add_parser("stop", parents=[common], help="stop what start started, by PID").set_defaults(run=stop)
    commands.add_parser("status", parents=[common], help="show the recorded cluster").set_defaults(run=status)
    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main()
