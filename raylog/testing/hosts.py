"""Hosts: N hosts on one Linux machine, with real network boundaries (docs/design.md section 8).

Each host is a network namespace (``ip netns``) on a bridge of the kit's own,
with an address of its own in one private /24 that the kit chooses
(``10.231.<slot>.0/24``; traffic never leaves the bridge: the hosts have no
route beyond it), a private disk (a tmpfs mounted at raylog's data dir,
:data:`raylog.client.DEFAULT_DATA_DIR`, in a mount namespace of the host's
own: a file one host writes there is invisible to every other), and a Ray
node of its own (``ray start --address HEAD:6379 --node-ip-address IP``,
``raylog_disk`` and ``--labels raylog-node=<name>`` on disk hosts). The first
host, the head, runs ZooKeeper (``deploy/cluster_zookeeper.py``) and the Ray
head; by default every other host is a disk host.

raylog on the hosts is installed from a wheel built from the checkout
(``pip wheel --no-deps``, cached by the content of the sources) into a venv
of the hosts, non-editable; the venv takes its dependencies (Ray, kazoo ...)
from the site-packages of the interpreter that runs the kit (a ``.pth``
line placed after the wheel's own packages), so no dependency is installed
again.

The root namespace, the machine itself, is the client's machine: it has the
bridge's first address, runs a Ray node without disk (label
``raylog-node=client``) and the driver (this process, ``ray.init`` through
:meth:`HostsCluster.connect_ray`). Ray requires a driver to have a Ray node at
its own address, hence that node.

::

    from raylog.testing.hosts import HostsCluster
    from raylog.testing import faults

    with HostsCluster(hosts=3) as hosts:          # head + 2 disk hosts
        client = hosts.client()                  # raylog.connect(zookeeper=HEAD:2181, ray_address=HEAD:6379)
        client.create_topic("t", partitions=1, replication_factor=2)
        faults.cut_host(hosts.host("h2"))        # its link down, its processes alive
        faults.heal(hosts)

Everything the kit makes (namespaces, the bridge, veths, mounts, processes,
its temp dir) is removed by :meth:`HostsCluster.stop` (also on an exception
or a Ctrl-C inside the ``with``), by PID and by the names it made. The names
carry the slot: ``rlh<slot>br`` (the bridge), ``rlh<slot>v<i>`` (veths),
``rlh<slot>-<host>`` (namespaces), ``/tmp/rlh<slot>`` (temp dir). A slot is
held by an exclusive lock (``/run/raylog-hosts/slot-<n>.lock``) for the life
of the cluster, so several runs on one machine never share one; a slot whose
lock is free but whose names exist is a crashed run's, swept before use
(:func:`sweep` does it for every free slot).

Needs root, ``ip`` (iproute2), ``unshare``, ``nsenter`` and ``nft``
(nftables, for the partitions): :func:`unavailable` says what is missing.

Thread-safety: a :class:`HostsCluster` is started and stopped from one
thread; the fault functions (:mod:`raylog.testing.faults`) may run on
another.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import glob
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time

import raylog
from raylog.client import DEFAULT_DATA_DIR
from raylog.config import DISK_RESOURCE, NODE_LABEL
from raylog.errors import FaultInjectionError
from raylog.ray_join import present_ray_token
from raylog.testing.ray_token import ensure_ray_token

#: every name the kit makes starts with this
PREFIX = "rlh"
#: where the slot locks live
LOCK_DIR = "/run/raylog-hosts"
#: slots: 10.231.<slot>.0/24
SLOTS = 64
SUBNET = "10.231"
#: the name of the nftables table of the network faults, in each host's namespace
NFT_TABLE = "raylog_faults"
#: the node label of the client's Ray node (the root namespace)
CLIENT_LABEL = "client"
ZOOKEEPER_PORT = 2181
RAY_PORT = 6379
#: how many times a Ray node that failed to start is started again
START_RETRIES = 3
#: Ray's log files that :meth:`HostsCluster.keep_logs` copies, and how much of each (its end)
KEPT_LOGS = ("worker-*.err", "raylet.out", "raylet.err", "gcs_server.out")
KEPT_LOG_BYTES = 2 << 20
#: where the wheels and venvs of the hosts are cached
CACHE_DIR = os.path.join(os.path.expanduser("~"), ".cache", "raylog", "hosts")


def unavailable() -> str | None:
    """Why the kit cannot run here (``None``: it can)."""
    if not sys.platform.startswith("linux"):
        return "the hosts kit needs Linux (network and mount namespaces)"
    if os.geteuid() != 0:
        return "the hosts kit needs root (it makes network namespaces, a bridge and mounts)"
    for tool, package in (("ip", "iproute2"), ("unshare", "util-linux"), ("nsenter", "util-linux"),
                          ("nft", "nftables")):
        if shutil.which(tool) is None:
            return f"the hosts kit needs `{tool}` ({package}; `make venv` installs nftables when run as root)"
    return None


def _run(cmd: list[str], *, check: bool = True, timeout: float = 60.0, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if check and proc.returncode != 0:
        raise FaultInjectionError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()[:500]}")
    return proc


# -- the wheel and the venv of the hosts -------------------------------------------


def _checkout() -> str:
    """The source tree raylog is imported from (an editable install or a checkout)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(raylog.__file__)))
    if not os.path.exists(os.path.join(root, "setup.py")):
        raise FaultInjectionError(
            f"raylog is imported from {root}, not from a checkout; the hosts kit builds its wheel from a "
            f"checkout: run it from one (make venv installs it editable)"
        )
    return root


def _source_digest(checkout: str) -> str:
    """A digest of every file that goes into the wheel."""
    h = hashlib.sha256()
    tops = ("setup.py", "pyproject.toml", "README.md", "raylog", os.path.join("integrations", "spark"))
    for top in tops:
        path = os.path.join(checkout, top)
        files = [path] if os.path.isfile(path) else sorted(
            os.path.join(d, f) for d, dirs, names in os.walk(path) for f in names
            if "__pycache__" not in d and not f.endswith((".pyc", ".so")) and ".egg-info" not in d
        )
        for name in sorted(files):
            h.update(os.path.relpath(name, checkout).encode() + b"\0")
            with open(name, "rb") as f:
                h.update(f.read())
            h.update(b"\0")
    h.update(sys.version.encode())
    return h.hexdigest()[:16]


#: ``{venv root: open file}``: the venvs this process uses, each held with a
#: shared lock on its ``in-use`` file for the life of the process, so that
#: another process's prune leaves them alone (see :func:`_prune`)
_HELD: dict[str, object] = {}


def _hold(root: str) -> None:
    """Mark the venv under ``root`` as used by this process (the caller holds the cache lock)."""
    if root in _HELD:
        return
    f = open(os.path.join(root, "in-use"), "a")
    fcntl.flock(f, fcntl.LOCK_SH)
    _HELD[root] = f
    os.utime(root)  # the most recently used is pruned last


def hosts_venv(checkout: str | None = None, cache_dir: str = CACHE_DIR) -> str:
    """The venv of the hosts (its directory): raylog installed, non-editable,
    from a wheel of ``checkout``; built once per content of the sources. The
    venv is held for the life of this process: a prune by another process
    (another checkout's tests) never removes it while this one may use it."""
    checkout = checkout or _checkout()
    digest = _source_digest(checkout)
    root = os.path.join(cache_dir, digest)
    venv = os.path.join(root, "venv")
    os.makedirs(cache_dir, exist_ok=True)
    with open(os.path.join(cache_dir, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(os.path.join(root, "ready")):
            _hold(root)
            return venv
        shutil.rmtree(root, ignore_errors=True)
        wheels = os.path.join(root, "wheel")
        os.makedirs(wheels)
        with tempfile.TemporaryDirectory(prefix="rlh-src-") as src:
            # build from a copy: the build leaves build/ and egg-info behind
            ignore = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__",
                                            "*.so", ".pytest_cache", ".hypothesis", "results")
            for top in ("setup.py", "pyproject.toml", "README.md", "LICENSE"):
                if os.path.exists(os.path.join(checkout, top)):
                    shutil.copy(os.path.join(checkout, top), src)
            shutil.copytree(os.path.join(checkout, "raylog"), os.path.join(src, "raylog"), ignore=ignore)
            shutil.copytree(os.path.join(checkout, "integrations"), os.path.join(src, "integrations"), ignore=ignore)
            _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", src, "-w", wheels], timeout=600)
        wheel = [os.path.join(wheels, f) for f in os.listdir(wheels) if f.endswith(".whl")]
        if len(wheel) != 1:
            raise FaultInjectionError(f"building the wheel of {checkout} gave {wheel}")
        _run([sys.executable, "-m", "venv", "--without-pip", venv])
        python = os.path.join(venv, "bin", "python")
        _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "-q", wheel[0]],
             timeout=600)
        # the dependencies: this interpreter's site-packages, after the venv's own
        site = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
        deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
        with open(os.path.join(site, "zz_raylog_hosts_deps.pth"), "w") as f:
            f.write("".join(f"{d}\n" for d in sorted(deps)))
        open(os.path.join(root, "ready"), "w").close()
        _hold(root)
        _prune(cache_dir, keep=3)
    return venv


def _prune(cache_dir: str, keep: int) -> None:
    """Keep the ``keep`` most recently used wheels and venvs of the cache,
    and every one that a live process holds (its ``in-use`` lock is
    shared-locked: :func:`_hold`); the caller holds the cache's lock."""
    entries = [os.path.join(cache_dir, e) for e in os.listdir(cache_dir) if not e.startswith(".")]
    entries.sort(key=os.path.getmtime, reverse=True)
    for old in entries[keep:]:
        if old in _HELD:
            continue
        try:
            f = open(os.path.join(old, "in-use"), "a")
        except OSError:  # no such file: an entry of an older kit, or a half-made one
            shutil.rmtree(old, ignore_errors=True)
            continue
        with f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # in use by a running process
            shutil.rmtree(old, ignore_errors=True)


# -- slots -----------------------------------------------------------------------


def _names(slot: int) -> dict:
    return {"bridge": f"{PREFIX}{slot}br", "veth": f"{PREFIX}{slot}v", "netns": f"{PREFIX}{slot}-",
            "tmp": f"/tmp/{PREFIX}{slot}"}


def _netns_pids(netns: str) -> list[int]:
    proc = _run(["ip", "netns", "pids", netns], check=False)
    return [int(p) for p in proc.stdout.split() if p.isdigit()]


def _pids_with(marker: str) -> list[int]:
    """Processes whose command line holds ``marker``."""
    found = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def _kill_all(pids, grace_s: float = 0.0) -> None:
    pids = [p for p in pids if p != os.getpid()]
    if grace_s > 0:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.1)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)  # a paused process dies only once it runs
            os.kill(pid, signal.SIGKILL)


def raylet_tail(ray_temp_dir: str, lines: int = 15) -> str:
    """The last lines of the newest raylet's own logs in a node's latest
    session (why it did not register; a node started again in the same
    session writes ``raylet.<n>.out``), or ``""``."""
    out = []
    logs = os.path.join(ray_temp_dir, "session_latest", "logs")
    for pattern in ("raylet*.err", "raylet*.out"):
        found = glob.glob(os.path.join(logs, pattern))
        if not found:
            continue
        path = max(found, key=os.path.getmtime)
        name = os.path.basename(path)
        try:
            with open(path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 8192))
                tail = f.read().decode(errors="replace").splitlines()[-lines:]
        except OSError:
            continue
        if tail:
            out.append(f"\n--- {name}:\n" + "\n".join(tail))
    return "".join(out)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1][1:2]
        return state != b"Z"
    except (OSError, IndexError):
        return False


def _sweep_slot(slot: int) -> list[str]:
    """Remove whatever a crashed run left under ``slot``'s names (the caller
    holds the slot's lock); returns what it removed."""
    names = _names(slot)
    removed = []
    netns = _run(["ip", "netns", "list"], check=False).stdout.split("\n")
    for line in netns:
        name = line.split(" ")[0].strip()
        if name.startswith(names["netns"]):
            _kill_all(_netns_pids(name))
            _run(["ip", "netns", "del", name], check=False)
            removed.append(f"netns {name}")
    stray = _pids_with(names["tmp"] + "/")
    if stray:
        _kill_all(stray)
        removed.append(f"{len(stray)} processes")
    links = _run(["ip", "-o", "link", "show"], check=False).stdout
    for line in links.splitlines():
        parts = line.split(":")
        if len(parts) > 1:
            link = parts[1].strip().split("@")[0]
            if link == names["bridge"] or link.startswith(names["veth"]):
                _run(["ip", "link", "del", link], check=False)
                removed.append(f"link {link}")
    if os.path.exists(names["tmp"]):
        shutil.rmtree(names["tmp"], ignore_errors=True)
        removed.append(names["tmp"])
    return removed


def _subnet_in_use(slot: int) -> bool:
    prefix = f"{SUBNET}.{slot}."
    out = _run(["ip", "-o", "addr", "show"], check=False).stdout + _run(["ip", "route", "show"], check=False).stdout
    return prefix in out


def sweep() -> list[str]:
    """Remove the leftovers of every crashed run (slots whose lock is free)."""
    removed = []
    os.makedirs(LOCK_DIR, exist_ok=True)
    for slot in range(SLOTS):
        path = os.path.join(LOCK_DIR, f"slot-{slot}.lock")
        if not os.path.exists(path):
            continue
        with open(path, "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live run's
            removed += _sweep_slot(slot)
    return removed


def _take_slot() -> tuple[int, object]:
    os.makedirs(LOCK_DIR, exist_ok=True)
    for slot in range(SLOTS):
        f = open(os.path.join(LOCK_DIR, f"slot-{slot}.lock"), "a")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            continue
        _sweep_slot(slot)
        if _subnet_in_use(slot):  # someone else's network: leave it alone
            f.close()
            continue
        f.truncate(0)
        f.write(f"{os.getpid()}\n")
        f.flush()
        return slot, f
    raise FaultInjectionError(f"all {SLOTS} slots of the hosts kit are in use (see {LOCK_DIR})")


# -- one host ----------------------------------------------------------------------


class Host:
    """One host: a network namespace, a mount namespace with a private disk at
    raylog's data dir (held by an anchor process), a Ray node.

    ``run``/``popen`` run a command on the host (inside both namespaces)."""

    def __init__(self, cluster: "HostsCluster", index: int, name: str, address: str, disk: bool):
        self.cluster = cluster
        self.index = index
        self.name = name
        self.address = address
        self.disk = disk
        self.netns = f"{PREFIX}{cluster.slot}-{name}"
        self.veth = f"{PREFIX}{cluster.slot}v{index}"
        self.data_dir = cluster.data_dir
        self.temp_dir = os.path.join(cluster.tmp, name)
        self.anchor: subprocess.Popen | None = None
        self.ray: subprocess.Popen | None = None
        #: when its link went down (monotonic), None while it is up (set_link)
        self.silent_since: float | None = None

    def __repr__(self):
        return f"Host({self.name}, {self.address}{', disk' if self.disk else ''})"

    @property
    def label(self) -> str:
        """The raylog node identity of this host's Ray node."""
        return self.name

    def _enter(self) -> list[str]:
        if self.anchor is None:
            raise FaultInjectionError(f"host {self.name} is not started")
        return ["nsenter", f"--target={self.anchor.pid}", "--mount", "--net", "--"]

    def run(self, cmd: list[str], *, check: bool = True, timeout: float = 60.0, **kw) -> subprocess.CompletedProcess:
        """Run ``cmd`` on this host and wait for it."""
        return _run(self._enter() + list(cmd), check=check, timeout=timeout, **kw)

    def popen(self, cmd: list[str], **kw) -> subprocess.Popen:
        return subprocess.Popen(self._enter() + list(cmd), **kw)

    def python(self, code: str, *args: str, timeout: float = 120.0) -> str:
        """Run ``code`` with the hosts' Python (raylog from the wheel) on this
        host; returns its standard output."""
        return self.run([self.cluster.python, "-c", code, *args], timeout=timeout).stdout

    def pids(self) -> list[int]:
        """Every process of this host (its network namespace), the anchor included."""
        return _netns_pids(self.netns)

    def process_pids(self) -> list[int]:
        """Every process of this host but the anchor (which holds its disk)."""
        anchor = None if self.anchor is None else self.anchor.pid
        return [p for p in self.pids() if p != anchor]

    def nft(self, script: str) -> None:
        """Apply an nftables script inside this host's network namespace."""
        self.run(["nft", "-f", "-"], input=script)

    def set_link(self, up: bool) -> None:
        """Its link to the bridge up or down (the bridge's side of its veth:
        the host sees no carrier, as with a cable pulled). ``silent_since``
        is when it went down (monotonic), None while it is up."""
        _run(["ip", "link", "set", self.veth, "up" if up else "down"])
        if not up:
            self.silent_since = self.silent_since or time.monotonic()
        else:
            self.silent_since = None

    # -- life ------------------------------------------------------------------

    def _make_network(self) -> None:
        c = self.cluster
        peer = f"{PREFIX}{c.slot}p{self.index}"
        _run(["ip", "netns", "add", self.netns])
        _run(["ip", "link", "add", self.veth, "type", "veth", "peer", "name", peer])
        _run(["ip", "link", "set", peer, "netns", self.netns])
        _run(["ip", "link", "set", self.veth, "master", c.bridge, "up"])
        for cmd in (["ip", "link", "set", peer, "name", "eth0"],
                    ["ip", "addr", "add", f"{self.address}/24", "dev", "eth0"],
                    ["ip", "link", "set", "eth0", "up"],
                    ["ip", "link", "set", "lo", "up"]):
            _run(["ip", "netns", "exec", self.netns] + cmd)

    def _start_anchor(self) -> None:
        os.makedirs(self.temp_dir, exist_ok=True)
        script = (f"mkdir -p {self.data_dir} && mount -t tmpfs -o size={self.cluster.disk_mb}m "
                  f"{PREFIX}-disk-{self.name} {self.data_dir} && exec sleep infinity")
        log = open(os.path.join(self.temp_dir, "anchor.log"), "wb")
        self.anchor = subprocess.Popen(
            ["ip", "netns", "exec", self.netns, "unshare", "--mount", "--propagation", "private", "sh", "-c", script],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + 30
        marker = f" {self.data_dir} "
        while time.monotonic() < deadline:
            if self.anchor.poll() is not None:
                raise FaultInjectionError(f"host {self.name}: its disk could not be mounted; see {log.name}")
            try:
                with open(f"/proc/{self.anchor.pid}/mountinfo") as f:
                    if any(marker in line and "tmpfs" in line for line in f):
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise FaultInjectionError(f"host {self.name}: its disk was not mounted within 30 s")

    def start_ray(self) -> None:
        """Start (or start again, after :func:`raylog.testing.faults.kill_host`) this host's Ray node."""
        c = self.cluster
        args = ["--node-ip-address", self.address, "--block", "--disable-usage-stats",
                "--num-cpus", str(c.host_cpus), "--object-store-memory", str(c.object_store_mb * 1024 * 1024),
                "--dashboard-agent-listen-port", "0", "--temp-dir", os.path.join(self.temp_dir, "ray"),
                "--labels", f"{NODE_LABEL}={self.label}"]
        if self.disk:
            args += ["--resources", json.dumps({DISK_RESOURCE: 1})]
        if self is c.head:
            args = ["--head", "--port", str(RAY_PORT), "--include-dashboard", "false"] + args
        else:
            args = ["--address", c.ray_address] + args
        self.ray = self.popen(c.ray_command("start", *args), **c.process_io(self.name + "-ray"))

    def stop_processes(self, grace_s: float = 5.0) -> None:
        """Stop every process of the host but its anchor (the disk stays)."""
        _kill_all(self.process_pids(), grace_s)
        if self.ray is not None:
            with contextlib.suppress(Exception):
                self.ray.wait(10)
            self.ray = None

    def remove(self) -> None:
        """Every process (the anchor too: the disk goes), then the namespace."""
        _kill_all(self.pids())
        if self.anchor is not None:
            with contextlib.suppress(Exception):
                self.anchor.wait(10)
        deadline = time.monotonic() + 10
        while self.pids() and time.monotonic() < deadline:
            _kill_all(self.pids())
            time.sleep(0.1)
        _run(["ip", "netns", "del", self.netns], check=False)
        _run(["ip", "link", "del", self.veth], check=False)


class HostZooKeeper:
    """ZooKeeper on the head host, started by ``deploy/cluster_zookeeper.py``;
    :func:`raylog.testing.faults.zookeeper_outage` takes it as it takes an
    ``EmbeddedZooKeeper`` (``kill_process`` then ``start``)."""

    def __init__(self, cluster: "HostsCluster"):
        self.cluster = cluster
        self.data_dir = os.path.join(cluster.data_dir, ".zookeeper")

    @property
    def connect_string(self) -> str:
        return f"{self.cluster.head.address}:{ZOOKEEPER_PORT}"

    def _script(self, command: str, *args: str) -> list[str]:
        c = self.cluster
        return [c.python, os.path.join(c.checkout, "deploy", "cluster_zookeeper.py"), command,
                "--data-dir", self.data_dir, *args]

    def start(self) -> "HostZooKeeper":
        c = self.cluster
        c.head.run(self._script("start", "--host", c.head.address, "--port", str(ZOOKEEPER_PORT),
                                "--heap-mb", "256"), timeout=120)
        return self

    def pid(self) -> int | None:
        out = self.cluster.head.run(["cat", os.path.join(self.data_dir, "zookeeper.pid")], check=False).stdout
        return int(out.strip()) if out.strip().isdigit() else None

    @property
    def running(self) -> bool:
        pid = self.pid()
        return pid is not None and _alive(pid)

    def kill_process(self) -> None:
        """SIGKILL the server (no clean shut-down: sessions are not closed)."""
        pid = self.pid()
        if pid is None:
            raise FaultInjectionError("ZooKeeper on the head host has no pid file")
        _kill_all([pid])
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)

    def stop(self) -> None:
        self.cluster.head.run(self._script("stop"), check=False, timeout=90)


# -- the cluster -----------------------------------------------------------------


class HostsCluster:
    """N hosts on this machine; see the module docstring.

    ``hosts``: how many (at least 2); the first (``h1``) is the head.
    ``disk_hosts``: names of the hosts that offer disk (default: all but the
    head). ``host_cpus``: CPUs of each host's Ray node; ``client_cpus``: of
    the client's node (consumer actors run there)."""

    def __init__(self, hosts: int = 3, *, disk_hosts=None, host_cpus: int = 1, client_cpus: int = 4,
                 object_store_mb: int = 80, disk_mb: int = 1024, startup_timeout_s: float = 180.0,
                 venv: str | None = None):
        if hosts < 2:
            raise ValueError("a hosts cluster needs at least 2 hosts (the head and a disk host)")
        self.count = hosts
        self.names = [f"h{i}" for i in range(1, hosts + 1)]
        self.disk_names = set(disk_hosts) if disk_hosts is not None else set(self.names[1:])
        unknown = self.disk_names - set(self.names)
        if unknown:
            raise ValueError(f"disk hosts {sorted(unknown)} are not among {self.names}")
        self.host_cpus = host_cpus
        self.client_cpus = client_cpus
        self.object_store_mb = object_store_mb
        self.disk_mb = disk_mb
        self.startup_timeout_s = startup_timeout_s
        self.data_dir = DEFAULT_DATA_DIR
        self._venv = venv
        self.slot: int | None = None
        self._lock = None
        self.hosts: list[Host] = []
        self.zookeeper: HostZooKeeper | None = None
        self.client_ray: subprocess.Popen | None = None
        self._clients: list = []
        self._ray_connected = False
        self.started = False

    # -- addresses ---------------------------------------------------------------

    @property
    def subnet(self) -> str:
        return f"{SUBNET}.{self.slot}.0/24"

    @property
    def client_address(self) -> str:
        """The root namespace's (the client machine's) address on the bridge."""
        return f"{SUBNET}.{self.slot}.1"

    @property
    def head(self) -> Host:
        return self.hosts[0]

    @property
    def ray_address(self) -> str:
        return f"{self.head.address}:{RAY_PORT}"

    @property
    def zookeeper_address(self) -> str:
        return f"{self.head.address}:{ZOOKEEPER_PORT}"

    @property
    def bridge(self) -> str:
        return f"{PREFIX}{self.slot}br"

    @property
    def tmp(self) -> str:
        return f"/tmp/{PREFIX}{self.slot}"

    @property
    def python(self) -> str:
        return os.path.join(self.venv, "bin", "python")

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(f"no host {name!r} (hosts: {', '.join(self.names)})")

    def host_of(self, address: str) -> Host:
        """The host whose address is ``address`` (or whose Ray label is it)."""
        for h in self.hosts:
            if address in (h.address, h.label):
                return h
        raise KeyError(f"no host at {address!r}")

    @property
    def disk_hosts(self) -> list[Host]:
        return [h for h in self.hosts if h.disk]

    def ray_command(self, *args: str) -> list[str]:
        """``ray ARGS`` in the hosts' venv, through the kit's launcher (a
        longer wait for a node's registration: :mod:`raylog.testing.ray_node`)."""
        return [self.python, "-m", "raylog.testing.ray_node", *args]

    def process_io(self, name: str) -> dict:
        log = open(os.path.join(self.tmp, f"{name}.log"), "ab")
        return {"stdout": log, "stderr": subprocess.STDOUT, "stdin": subprocess.DEVNULL,
                "start_new_session": True, "env": self._env(), "cwd": self.tmp}

    def _env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "PYTHONPATH", "VIRTUAL_ENV"))}
        # a node's registration waits for the GCS this long (Ray's default is
        # missed on a busy machine, and the node's start then fails)
        env.setdefault("RAY_raylet_start_wait_time_s", "120")
        env.update(RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1", PATH=os.path.join(self.venv, "bin") + ":" +
                   env.get("PATH", "/usr/bin:/bin"))
        # every node as the driver will be (raylog.ray_join.present_ray_token): token auth
        # when a Ray token is at hand, else none; never each node deciding by itself
        if "RAY_AUTH_MODE" not in env:
            token = (env.get("RAY_AUTH_TOKEN") or env.get("RAY_AUTH_TOKEN_PATH")
                     or os.path.exists(os.path.expanduser("~/.ray/auth_token")))
            env["RAY_AUTH_MODE"] = "token" if token else "disabled"
        return env

    # -- life --------------------------------------------------------------------

    def __enter__(self) -> "HostsCluster":
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self) -> "HostsCluster":
        why = unavailable()
        if why is not None:
            raise FaultInjectionError(why)
        ensure_ray_token()  # as a local ray.init() would: one token for the whole run, made before the nodes
        try:
            self.checkout = _checkout()
            self.venv = self._venv or hosts_venv(self.checkout)
            self.slot, self._lock = _take_slot()
            atexit.register(self.stop)  # a run that ends without leaving the ``with``
            os.makedirs(self.tmp, exist_ok=True)
            _run(["ip", "link", "add", self.bridge, "type", "bridge"])
            _run(["ip", "addr", "add", f"{self.client_address}/24", "dev", self.bridge])
            _run(["ip", "link", "set", self.bridge, "up"])
            for i, name in enumerate(self.names):
                host = Host(self, i + 1, name, f"{SUBNET}.{self.slot}.{10 + i + 1}", name in self.disk_names)
                self.hosts.append(host)
                host._make_network()
                host._start_anchor()
            self.zookeeper = HostZooKeeper(self).start()
            self.head.start_ray()
            self._wait_started(self.head, retries=START_RETRIES)
            # one node after the other: Ray gives a starting node 30 s to
            # register, which nodes starting together on a busy machine miss
            for host in self.hosts[1:]:
                host.start_ray()
                self._wait_started(host, retries=START_RETRIES)
            self._start_client_node()
            self._wait_started(None, retries=START_RETRIES)
            self.started = True
            return self
        except BaseException:
            self.stop()
            raise

    def _start_client_node(self) -> None:
        args = ["start", "--address", self.ray_address, "--node-ip-address", self.client_address, "--block",
                "--disable-usage-stats", "--num-cpus", str(self.client_cpus),
                "--object-store-memory", str(self.object_store_mb * 1024 * 1024),
                "--dashboard-agent-listen-port", "0", "--temp-dir", os.path.join(self.tmp, "client", "ray"),
                "--labels", f"{NODE_LABEL}={CLIENT_LABEL}"]
        os.makedirs(os.path.join(self.tmp, "client"), exist_ok=True)
        self.client_ray = subprocess.Popen(self.ray_command(*args), **self.process_io("client-ray"))

    def _wait_started(self, host: Host | None, retries: int = 0) -> None:
        """Wait until ``ray start`` on ``host`` (None: the client node) says the
        node runs; a start that failed (Ray gives a node 30 s to register, which
        a loaded machine can miss) is tried again ``retries`` times."""
        name = "client" if host is None else host.name
        log = os.path.join(self.tmp, f"{name}-ray.log")
        for attempt in range(retries + 1):
            proc = self.client_ray if host is None else host.ray
            deadline = time.monotonic() + self.startup_timeout_s
            text = b""
            while time.monotonic() < deadline:
                with open(log, "rb") as f:
                    text = f.read()
                if b"Ray runtime started" in text.rsplit(b"--- start attempt", 1)[-1]:
                    return
                if proc.poll() is not None:
                    break
                time.sleep(0.2)
            if attempt == retries:
                break
            # what the failed attempt left, then again
            with open(log, "ab") as f:
                f.write(b"\n--- start attempt %d\n" % (attempt + 2))
            if host is None:
                _kill_all([self.client_ray.pid] + _pids_with(os.path.join(self.tmp, "client") + "/"))
                self._start_client_node()
            else:
                keep = {self.zookeeper.pid()} if host is self.head else set()
                _kill_all([p for p in host.process_pids() if p not in keep])
                host.start_ray()
        lines = [line for line in text.decode(errors="replace").splitlines() if line.strip()]
        cause = lines[-1].strip() if lines else "no output"
        temp = os.path.join(self.tmp, "client", "ray") if host is None else os.path.join(host.temp_dir, "ray")
        raise FaultInjectionError(f"the Ray node of {name} did not start ({cause}); its output:\n"
                                  f"{text[-3000:].decode(errors='replace')}{raylet_tail(temp)}")

    def restart_ray(self, host: Host, retries: int = 2 * START_RETRIES) -> None:
        """Start ``host``'s Ray node again and wait until it runs (tried
        ``retries`` more times if it misses Ray's registration deadline)."""
        with open(os.path.join(self.tmp, f"{host.name}-ray.log"), "wb"):
            pass
        host.start_ray()
        self._wait_started(host, retries=retries)

    def release_clients(self, timeout_s: float = 90.0) -> None:
        """Delete the topics of every client made by :meth:`client` since the
        last release (their partition actors stop, their logs go) and close
        the clients: users of a shared kit (the test modules) leave no idle
        partition actor behind for the next ones. Failures are ignored (a
        host may still be cut); bounded by ``timeout_s`` in all."""
        deadline = time.monotonic() + timeout_s
        for client in reversed(self._clients):
            with contextlib.suppress(Exception):
                for topic in client.list_topics():
                    left = deadline - time.monotonic()
                    if left <= 1:
                        break
                    with contextlib.suppress(Exception):
                        client.delete_topic(topic, timeout_s=min(15.0, left))
            with contextlib.suppress(Exception):
                client.close()
        self._clients = []

    def stop(self) -> None:
        """Remove everything the cluster made (safe to call more than once)."""
        for client in reversed(self._clients):
            with contextlib.suppress(Exception):
                client.close()
        self._clients = []
        if self._ray_connected:
            import ray  # heavy (Ray): imported when used

            with contextlib.suppress(Exception):
                ray.shutdown()
            self._ray_connected = False
        if self.slot is None:
            return
        # the Ray nodes first (the client's, then the hosts'), then everything else
        if self.client_ray is not None:
            _kill_all([self.client_ray.pid], grace_s=5)
            with contextlib.suppress(Exception):
                self.client_ray.wait(10)
            self.client_ray = None
        for host in self.hosts:
            with contextlib.suppress(Exception):
                host.stop_processes(grace_s=0 if self.hosts.index(host) else 2)
        for host in self.hosts:
            with contextlib.suppress(Exception):
                host.remove()
        self.hosts = []
        _sweep_slot(self.slot)  # stray processes of the client node, links, the temp dir
        if self._lock is not None:
            self._lock.close()
            self._lock = None
        self.slot = None
        self.started = False
        atexit.unregister(self.stop)

    def keep_logs(self, dest: str, max_bytes: int = KEPT_LOG_BYTES) -> list[str]:
        """Copy each host's Ray logs that raylog writes to (workers' stderr,
        the raylet's and GCS's output) into ``dest/<host>/`` before
        :meth:`stop` removes them: what a failed run leaves to read. Each
        file keeps its last ``max_bytes``. The paths copied."""
        kept = []
        for host in self.hosts:
            pattern = os.path.join(host.temp_dir, "ray", "session_*", "logs")
            for logs in glob.glob(pattern):
                session = os.path.basename(os.path.dirname(logs))
                for name in KEPT_LOGS:
                    for path in glob.glob(os.path.join(logs, name)):
                        target = os.path.join(dest, host.name, session, os.path.basename(path))
                        os.makedirs(os.path.dirname(target), exist_ok=True)
                        with open(path, "rb") as src, open(target, "wb") as out:
                            src.seek(max(0, os.path.getsize(path) - max_bytes))
                            out.write(src.read())
                        kept.append(target)
        return kept

    # -- the driver ------------------------------------------------------------------

    def connect_ray(self) -> None:
        """Join this process to the hosts' Ray cluster as a driver, through the
        client's node (a process may be in one Ray cluster at a time)."""
        import ray  # heavy (Ray): imported when used

        if ray.is_initialized():
            if self._ray_connected:
                return
            raise FaultInjectionError("this process is already in another Ray cluster; ray.shutdown() it first")
        present_ray_token()
        # Ray puts the driver's current directory on the workers' sys.path; a
        # checkout there would shadow the hosts' installed raylog (on separate
        # machines that path would not exist): join from a neutral directory.
        here = os.getcwd()
        os.chdir(self.tmp)
        try:
            ray.init(address=self.ray_address, _node_ip_address=self.client_address, logging_level="WARNING",
                     log_to_driver=False)
        finally:
            os.chdir(here)
        self._ray_connected = True

    def disconnect_ray(self) -> None:
        import ray  # heavy (Ray): imported when used

        for client in reversed(self._clients):
            with contextlib.suppress(Exception):
                client.close()
        self._clients = []
        if self._ray_connected:
            ray.shutdown()
            self._ray_connected = False

    def client(self, cluster: str = "default", **kw):
        """``raylog.connect(zookeeper=HEAD:2181, ray_address=HEAD:6379, cluster=...)``
        from this process (joined to Ray first); closed by :meth:`release_clients`
        (its topics deleted) or :meth:`stop`."""
        self.connect_ray()
        client = raylog.connect(zookeeper=self.zookeeper_address, ray_address=self.ray_address, cluster=cluster, **kw)
        self._clients.append(client)
        return client

    # -- checks ------------------------------------------------------------------

    def can_connect(self, source: Host | None, target: Host | str, port: int, timeout_s: float = 3.0) -> bool:
        """Whether a TCP connect from ``source`` (None: the client machine) to
        ``target``'s address reaches a listener within ``timeout_s``."""
        address = target if isinstance(target, str) else target.address
        if source is None:
            try:
                with socket.create_connection((address, port), timeout=timeout_s):
                    return True
            except OSError:
                return False
        code = ("import socket,sys\ntry:\n socket.create_connection((sys.argv[1], int(sys.argv[2])), "
                "timeout=float(sys.argv[3])).close(); print('ok')\nexcept OSError as e: print('no', e)")
        out = source.run([sys.executable, "-c", code, address, str(port), str(timeout_s)], check=False,
                         timeout=timeout_s + 30).stdout
        return out.startswith("ok")
