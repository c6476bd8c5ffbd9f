"""The autoscaled benchmark: throughput while the autoscaler adds nodes, and
the nodes' removal after the load stops (``raylog bench``, ``bench/autoscale.py``).

The run, in stages:

1. **cluster**: without an address, a local autoscaling cluster of this
   machine is started through ``deploy/local_cluster.py`` with the config
   ``bench/autoscale.yaml`` (Ray's fake multi-node provider: every node is
   a set of real Ray processes here; a head with no CPU for tasks, up to two
   disk nodes, up to two compute nodes of 2 CPUs; idle nodes go after 12 s).
   It is always stopped at the end, by the PIDs it recorded, also after an
   error or Ctrl-C. With ``--zookeeper`` and ``--ray-address`` the bench
   runs on that cluster instead and stops nothing but its own actors.
2. **disk nodes**: partition actors ask for no resources, so a topic does
   not make the autoscaler start disk nodes; the bench asks for them
   (``request_resources`` with ``raylog_disk`` bundles, which also keeps
   them from being scaled away), then creates a topic spread over them.
3. **phases**: phase *k* runs ``phases[k]`` producer actors
   (:meth:`raylog.Client.producer_actor`, ``num_cpus=1``, fed with batches
   by this driver) and as many consumer tasks (``num_cpus=1``, one consumer
   group) for ``phase_seconds``. Asking for more CPUs than the cluster has
   leaves actors and tasks pending, and the autoscaler adds nodes. Each
   phase reports the nodes alive, how many producers and consumers ran, and
   producer and consumer messages per second over the phase's wall time.
4. **scale down**: the load stops (producers flushed and killed, consumer
   tasks ended) and the bench waits, bounded, until every node added during
   the phases is gone.

Output: one JSON line per node event and per phase (plus the start, the
topic, the scale-down and the end), then a table; a progress bar on stderr
while it runs (when stderr is a terminal).

On this 2-core machine all fake nodes share the same cores, so more nodes
do not mean more throughput: the run shows the autoscaling at work, not
scaling of throughput.

Thread-safety: a run, its :class:`NodeTracker` and its progress bar belong
to the thread that calls :func:`run`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable

from raylog.actors.placement import DISK_RESOURCE
from raylog.errors import ConfigError, RaylogError

REPO = Path(__file__).resolve().parent.parent.parent
#: the helper that starts and stops a local autoscaling cluster by PID
LOCAL_CLUSTER = REPO / "deploy" / "local_cluster.py"
#: the bench's own cluster config (small, quick to scale down)
CONFIG = REPO / "bench" / "autoscale.yaml"
#: how often the autoscaler of the bench's own cluster looks at the load
AUTOSCALER_UPDATE_INTERVAL_S = 1
#: bounds on the waits between phases
CONSUMER_GRACE_S = 30.0
PRODUCER_CLOSE_S = 30.0
#: driver-side batches sent to each producer actor, and how many in flight
SEND_BATCH = 500
IN_FLIGHT_PER_PRODUCER = 2
#: the benchmark topic's segments and retention, per partition
TOPIC_SEGMENT_BYTES = 64 << 20
TOPIC_RETENTION_BYTES = 256 << 20


class BenchError(RaylogError):
    """The benchmark could not run to the end; the message says where it stopped."""


@dataclasses.dataclass(frozen=True)
class BenchSettings:
    """What a run does; ``validate`` says what is out of range."""

    phases: tuple[int, ...] = (1, 2, 3)
    phase_seconds: float = 30.0
    partitions: int = 4
    disk_nodes: int = 2
    message_bytes: int = 100
    scale_down_timeout_s: float = 180.0
    start_timeout_s: float = 300.0
    zookeeper: str | None = None
    ray_address: str | None = None
    cluster: str = "bench"
    token: bytes | None = None

    @property
    def external(self) -> bool:
        return self.zookeeper is not None

    def validate(self) -> "BenchSettings":
        if not self.phases or any(n < 1 for n in self.phases):
            raise ConfigError("phases must be one or more positive worker counts, e.g. 1,2,3")
        if self.phase_seconds < 5:
            raise ConfigError(f"phase seconds must be at least 5, got {self.phase_seconds:g}")
        if self.partitions < 1:
            raise ConfigError(f"partitions must be a positive integer, got {self.partitions}")
        if self.disk_nodes < 1:
            raise ConfigError(f"disk nodes must be a positive integer, got {self.disk_nodes}")
        if not 1 <= self.message_bytes <= 64 * 1024:
            raise ConfigError(f"message bytes must be between 1 and 65536, got {self.message_bytes}")
        if self.scale_down_timeout_s < 0 or self.start_timeout_s <= 0:
            raise ConfigError("timeouts must be positive")
        if (self.zookeeper is None) != (self.ray_address is None):
            raise ConfigError(
                "the bench runs on a cluster of its own unless both --zookeeper and --ray-address "
                "name an existing autoscaling cluster; pass both or neither"
            )
        if not self.external:
            if not CONFIG.exists() or not LOCAL_CLUSTER.exists():
                raise BenchError(
                    f"the bench's local cluster needs a raylog checkout ({LOCAL_CLUSTER}, {CONFIG}); "
                    f"or pass --zookeeper and --ray-address of an existing autoscaling cluster"
                )
            disk_types = _disk_node_types(_load_config())
            if self.disk_nodes > disk_types:
                raise ConfigError(
                    f"the bench's local cluster has {disk_types} disk node types ({CONFIG}); "
                    f"ask for at most {disk_types} disk nodes"
                )
        return self


def parse_phases(text: str) -> tuple[int, ...]:
    """``"1,2,3"`` -> ``(1, 2, 3)``: the workers (producer actors and
    consumer tasks each) of every phase."""
    parts = [p.strip() for p in text.split(",")]
    try:
        phases = tuple(int(p) for p in parts)
    except ValueError:
        raise ConfigError(f"phases must be comma-separated positive integers, e.g. 1,2,3; got {text!r}") from None
    if not phases or any(n < 1 for n in phases):
        raise ConfigError(f"phases must be comma-separated positive integers, e.g. 1,2,3; got {text!r}")
    return phases


def _load_config() -> dict:
    import yaml

    with open(CONFIG) as f:
        return yaml.safe_load(f)


def _disk_node_types(config: dict) -> int:
    return sum(
        t.get("max_workers", 0)
        for name, t in config["available_node_types"].items()
        if name != config["head_node_type"] and t["resources"].get(DISK_RESOURCE, 0) > 0
    )


# --------------------------------------------------------------------------
# nodes


@dataclasses.dataclass(frozen=True)
class NodeInfo:
    node_id: str
    kind: str  # "disk" (offers raylog_disk), "compute" (CPUs only) or "other"
    cpus: float
    label: str | None

    @property
    def name(self) -> str:
        return self.label or self.node_id[-8:]

    @classmethod
    def from_ray(cls, node: dict) -> "NodeInfo":
        from raylog.actors.placement import NODE_LABEL

        resources = node.get("Resources") or {}
        cpus = float(resources.get("CPU", 0))
        kind = "disk" if resources.get(DISK_RESOURCE, 0) > 0 else "compute" if cpus > 0 else "other"
        return cls(node["NodeID"], kind, cpus, (node.get("Labels") or {}).get(NODE_LABEL))


class NodeTracker:
    """The alive nodes, from successive ``ray.nodes()`` lists; ``update``
    returns what changed since the last call."""

    def __init__(self):
        self.alive: dict[str, NodeInfo] = {}

    def update(self, nodes: Iterable[dict]) -> list[tuple[str, NodeInfo]]:
        now = {}
        for node in nodes:
            if node.get("Alive"):
                known = self.alive.get(node["NodeID"])
                now[node["NodeID"]] = known or NodeInfo.from_ray(node)
        events = [("node_added", info) for node_id, info in now.items() if node_id not in self.alive]
        events += [("node_removed", info) for node_id, info in self.alive.items() if node_id not in now]
        self.alive = now
        return events

    def count(self, kind: str | None = None) -> int:
        return sum(1 for n in self.alive.values() if kind is None or n.kind == kind)

    @property
    def cpus(self) -> float:
        return sum(n.cpus for n in self.alive.values())


# --------------------------------------------------------------------------
# reports (pure)


def phase_report(
    *,
    phase: int,
    workers: int,
    seconds: float,
    produced: int,
    consumed: int,
    producers_running: int,
    consumers_running: int,
    nodes_alive: int,
    nodes_added: int,
    nodes_removed: int,
    cpus: float,
    message_bytes: int,
) -> dict:
    """One phase's JSON line."""
    seconds = max(seconds, 1e-9)
    return {
        "event": "phase",
        "phase": phase,
        "producers": workers,
        "consumers": workers,
        "cpus_asked": 2 * workers,
        "producers_running": producers_running,
        "consumers_running": consumers_running,
        "nodes_alive": nodes_alive,
        "nodes_added": nodes_added,
        "nodes_removed": nodes_removed,
        "cluster_cpus": cpus,
        "seconds": round(seconds, 1),
        "produced": produced,
        "consumed": consumed,
        "producer_msg_per_s": round(produced / seconds),
        "consumer_msg_per_s": round(consumed / seconds),
        "producer_mb_per_s": round(produced * message_bytes / seconds / 1e6, 2),
        "consumer_mb_per_s": round(consumed * message_bytes / seconds / 1e6, 2),
    }


def format_table(rows: list[dict]) -> str:
    """The phases as a table, then one line on the scale-down."""
    headers = ["PHASE", "PRODUCERS", "CONSUMERS", "NODES", "ADDED", "PRODUCE MSG/S", "CONSUME MSG/S"]
    lines = [headers]
    for r in rows:
        if r.get("event") != "phase":
            continue
        lines.append([
            str(r["phase"]),
            f"{r['producers_running']}/{r['producers']}",
            f"{r['consumers_running']}/{r['consumers']}",
            str(r["nodes_alive"]),
            f"+{r['nodes_added']}" if r["nodes_added"] else "0",
            f"{r['producer_msg_per_s']:,}",
            f"{r['consumer_msg_per_s']:,}",
        ])
    widths = [max(len(line[i]) for line in lines) for i in range(len(headers))]
    out = ["  ".join(c.ljust(w) if i < 5 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths)))
           for line in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    for r in rows:
        if r.get("event") == "scale_down":
            if r["complete"]:
                out.append(
                    f"scale down: {r['removed']} added node{'s' if r['removed'] != 1 else ''} removed "
                    f"{r['seconds']:g} s after the load stopped; {r['nodes_alive']} nodes alive"
                )
            else:
                out.append(
                    f"scale down: {r['removed']} of {r['removed'] + r['remaining']} added nodes removed "
                    f"within {r['seconds']:g} s; {r['nodes_alive']} nodes alive"
                )
    return "\n".join(out)


# --------------------------------------------------------------------------
# the cluster of the bench


def _local_cluster_module():
    """deploy/local_cluster.py, loaded by path, pointed at the bench's config."""
    if not LOCAL_CLUSTER.exists() or not CONFIG.exists():
        raise BenchError(
            f"the bench's local cluster needs a raylog checkout ({LOCAL_CLUSTER}, {CONFIG}); "
            f"or pass --zookeeper and --ray-address of an existing autoscaling cluster"
        )
    spec = importlib.util.spec_from_file_location("raylog_bench_local_cluster", LOCAL_CLUSTER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.CONFIG = str(CONFIG)  # this loaded copy is the bench's alone
    return module


@contextlib.contextmanager
def _stdout_to_stderr():
    """The helper's messages (and its children's) go to stderr: stdout is
    for the JSON lines and the table."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


@contextlib.contextmanager
def _environ(**values):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class LocalCluster:
    """A local autoscaling cluster started for one run and stopped by PID."""

    def __init__(self, timeout_s: float):
        import argparse

        from raylog.zk.launcher import free_port

        self.module = _local_cluster_module()
        self.state_dir = tempfile.mkdtemp(prefix="raylog-autoscale-", dir="/tmp")  # short: Ray's socket paths
        self.args = argparse.Namespace(
            state_dir=self.state_dir, port=free_port(), zookeeper_port=0, disk_nodes=0, timeout_s=timeout_s
        )
        self.data_dir = os.path.join(self.state_dir, "data")
        self.zookeeper = self.ray_address = None
        self.failed = False

    def start(self) -> None:
        try:
            # What the helper prints (how to use and stop the cluster by
            # hand) is not for the bench's user.
            with contextlib.redirect_stdout(io.StringIO()), \
                    _environ(AUTOSCALER_UPDATE_INTERVAL_S=str(AUTOSCALER_UPDATE_INTERVAL_S)):
                self.module.start(self.args)
        except SystemExit as err:  # the helper reports its failures so
            self.failed = True
            raise BenchError(f"the local autoscaling cluster did not start: {err}; logs in {self.state_dir}") from None
        state = self.module._load_state(self.state_dir)
        self.zookeeper, self.ray_address = state["zookeeper"], state["ray_address"]
        if self.module._token_mode():
            # The head runs with token authentication; a driver given an
            # explicit address presents the token only in token mode, which
            # Ray reads when it is imported.
            os.environ["RAY_AUTH_MODE"] = "token"

    @property
    def head_pid(self) -> int | None:
        state = self.module._load_state(self.state_dir)
        return None if state is None else state.get("ray_start_pid")

    def stop(self) -> None:
        """Stop what was started, by PID; keep the state dir (its logs, not
        the partition logs) after a failure."""
        if self.module._load_state(self.state_dir) is not None:
            with _stdout_to_stderr():
                self.module.stop(self.args)
        shutil.rmtree(self.data_dir, ignore_errors=True)
        if self.failed:
            print(f"the bench's cluster logs are kept in {self.state_dir}", file=sys.stderr)
        else:
            shutil.rmtree(self.state_dir, ignore_errors=True)


# --------------------------------------------------------------------------
# the load


def consume_until(settings, topic: str, group: str, until: float) -> dict:
    """A consumer task: read ``topic`` in ``group`` until the wall clock
    reaches ``until``; the count and when it ran. A task that starts after
    ``until`` (its node came too late) reads nothing."""
    from raylog.consumer import Consumer
    from raylog.metadata import Metadata

    started = time.time()
    if started >= until:
        return {"count": 0, "started": None, "ended": started}
    metadata = Metadata.connect(settings)
    count = 0
    try:
        consumer = Consumer(metadata, topic, group=group, auto_offset_reset="earliest", session_timeout_ms=6000)
        try:
            while True:
                left = until - time.time()
                if left <= 0:
                    break
                count += len(consumer.poll(timeout_ms=int(min(left, 0.5) * 1000) + 1, max_messages=50_000))
        finally:
            consumer.close()  # commits: the next phase's consumers go on from here
    finally:
        metadata.close()
    return {"count": count, "started": started, "ended": time.time()}


class Run:
    """One benchmark run on a cluster that is up (the driver joined it)."""

    def __init__(self, settings: BenchSettings, client, emit: Callable[[dict], None], bar, about: dict | None = None):
        self.settings = settings
        self.about = about or {}
        self.client = client
        self.emit = emit
        self.bar = bar
        self.t0 = time.monotonic()
        self.nodes = NodeTracker()
        self.stage = "start"
        self.rows: list[dict] = []
        self.producers: list = []
        self.sent: list[int] = []  # last known sent_messages of each producer actor
        self.topic = f"bench-{int(time.time())}"
        self._last_poll = 0.0
        self._load_seconds = 0.0
        self._counts = {"node_added": 0, "node_removed": 0}
        self._consume = None
        self._payload = [os.urandom(settings.message_bytes) for _ in range(SEND_BATCH)]

    # -- reporting ------------------------------------------------------------

    def t(self) -> float:
        return round(time.monotonic() - self.t0, 1)

    def report(self, row: dict) -> None:
        row = {"event": row.pop("event"), "t": self.t(), **row}
        self.rows.append(row)
        self.emit(row)

    def poll_nodes(self, force: bool = False) -> None:
        import ray

        now = time.monotonic()
        if not force and now - self._last_poll < 1.0:
            return
        self._last_poll = now
        alive = self.nodes.count()
        for event, info in self.nodes.update(ray.nodes()):
            self._counts[event] += 1
            alive += 1 if event == "node_added" else -1  # as of this event, when several come at once
            self.report({
                "event": event, "stage": self.stage, "node": info.name, "kind": info.kind,
                "cpus": info.cpus, "nodes_alive": alive,
            })
        self.bar.set_postfix_str(f"{self.nodes.count()} nodes, {self.nodes.cpus:g} CPUs", refresh=False)
        self.bar.refresh()

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(min(0.25, max(0.0, end - time.monotonic())))
            self.poll_nodes()

    # -- stages ---------------------------------------------------------------

    def run(self) -> list[dict]:
        import ray

        s = self.settings
        self.nodes.update(ray.nodes())  # what runs already is no event
        self.report({"event": "start", **self.about, "nodes_alive": self.nodes.count(),
                     "nodes": sorted(n.name for n in self.nodes.alive.values()), "phases": list(s.phases),
                     "phase_seconds": s.phase_seconds, "message_bytes": s.message_bytes})
        self.disk_nodes()
        self.create_topic()
        try:
            base_nodes = set(self.nodes.alive)
            try:
                for k, workers in enumerate(s.phases, 1):
                    self.run_phase(k, workers)
            finally:
                self.stop_load()
            self.scale_down(base_nodes)
        finally:
            try:
                self.client.delete_topic(self.topic)
            except (RaylogError, ray.exceptions.RayError) as err:
                print(f"warning: could not delete topic {self.topic}: {err}", file=sys.stderr)
        self.report({"event": "end", "seconds": self.t()})
        return self.rows

    def disk_nodes(self) -> None:
        from ray.autoscaler.sdk import request_resources

        s = self.settings
        self.stage = "disk nodes"
        self.bar.set_description_str("waiting for disk nodes")
        # A request replaces the previous one: never ask an existing cluster
        # for fewer disk nodes than it runs, or it could scale some away.
        wanted = max(s.disk_nodes, self.nodes.count("disk"))
        request_resources(bundles=[{DISK_RESOURCE: 1}] * wanted)
        deadline = time.monotonic() + s.start_timeout_s
        while self.nodes.count("disk") < s.disk_nodes:
            if time.monotonic() > deadline:
                raise BenchError(
                    f"only {self.nodes.count('disk')} of {s.disk_nodes} disk nodes came up within "
                    f"{s.start_timeout_s:g} s; check the autoscaler's log (monitor.*) in the cluster's Ray logs"
                )
            self._sleep(1.0)

    def create_topic(self) -> None:
        s = self.settings
        self.stage = "topic"
        self.bar.set_description_str("creating the topic")
        # Retention bounds the disk a run takes (consumers keep up, far
        # behind the oldest segment).
        self.client.create_topic(self.topic, partitions=s.partitions, flush_ms=50,
                                 segment_bytes=TOPIC_SEGMENT_BYTES, retention_bytes=TOPIC_RETENTION_BYTES)
        placements = self.client.registry.placements(self.topic)
        spread: dict[str, int] = {}
        for p in range(s.partitions):
            node = placements.get(p, {}).get("node")
            spread[node] = spread.get(node, 0) + 1
        self.report({"event": "topic", "topic": self.topic, "partitions": s.partitions, "nodes": spread})

    def _producer_counts(self, timeout_s: float) -> set[int]:
        """Refresh ``self.sent`` from the producer actors that answer within
        ``timeout_s`` (a pending actor does not); the indexes that answered."""
        import ray

        refs = {p.stats.remote(): i for i, p in enumerate(self.producers)}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
        answered = set()
        for ref in ready:
            stats = ray.get(ref)
            if stats.get("error"):
                raise BenchError(f"a producer actor failed: {stats['error']}")
            self.sent[refs[ref]] = stats["sent_messages"]
            answered.add(refs[ref])
        return answered

    def _resize_producers(self, workers: int) -> None:
        import ray

        while len(self.producers) < workers:
            self.producers.append(
                self.client.producer_actor(num_cpus=1, batch_size=200, linger_ms=5, acks=1,
                                           max_buffered_messages=20_000)
            )
            self.sent.append(0)
        extra, self.producers, self.sent = self.producers[workers:], self.producers[:workers], self.sent[:workers]
        self._close_producers(extra)
        for actor in extra:
            ray.kill(actor)

    def _close_producers(self, actors: list) -> None:
        import ray

        refs = [a.close.remote() for a in actors]
        ray.wait(refs, num_returns=len(refs), timeout=PRODUCER_CLOSE_S)

    def run_phase(self, k: int, workers: int) -> None:
        import ray

        s = self.settings
        self.stage = f"phase {k}"
        self.bar.set_description_str(f"phase {k}/{len(s.phases)}: {workers}+{workers} workers")
        added_before, removed_before = self._counts["node_added"], self._counts["node_removed"]
        self._resize_producers(workers)
        self._producer_counts(timeout_s=2.0)
        base = sum(self.sent)

        if self._consume is None:
            self._consume = ray.remote(num_cpus=1, max_retries=0)(consume_until)
        consume = self._consume
        connection = self.client.metadata.settings
        start_wall = time.time()
        start = time.monotonic()
        until = start_wall + s.phase_seconds
        consumers = [consume.remote(connection, self.topic, "bench", until) for _ in range(workers)]

        in_flight: dict = {}
        for actor in self.producers:
            for _ in range(IN_FLIGHT_PER_PRODUCER):
                in_flight[actor.send_batch.remote(self.topic, self._payload)] = actor
        while time.monotonic() - start < s.phase_seconds:
            ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=0.25)
            for ref in ready:
                actor = in_flight.pop(ref)
                try:
                    ray.get(ref)
                except ray.exceptions.RayError as err:
                    raise BenchError(f"a producer actor failed: {_first_line(err)}") from None
                in_flight[actor.send_batch.remote(self.topic, self._payload)] = actor
            self.bar.update(min(s.phase_seconds, time.monotonic() - start) + self._load_seconds - self.bar.n)
            self.poll_nodes()
        seconds = time.monotonic() - start
        self._load_seconds += s.phase_seconds
        answered = self._producer_counts(timeout_s=5.0)
        produced = sum(self.sent) - base

        done, pending = ray.wait(consumers, num_returns=len(consumers), timeout=CONSUMER_GRACE_S)
        for ref in pending:
            ray.cancel(ref, force=True)  # never scheduled (or stuck closing): ran no part of the phase
        consumed = running = 0
        for ref in done:
            try:
                result = ray.get(ref)
            except ray.exceptions.RayError as err:
                raise BenchError(f"a consumer task failed: {_first_line(err)}") from None
            consumed += result["count"]
            running += result["started"] is not None
        # Sends still queued for actors that never started are dropped with
        # the actors at the end; the ones in flight finish in the next phase.
        self.poll_nodes(force=True)
        self.report(phase_report(
            phase=k, workers=workers, seconds=seconds, produced=produced, consumed=consumed,
            producers_running=len(answered), consumers_running=running,
            nodes_alive=self.nodes.count(), nodes_added=self._counts["node_added"] - added_before,
            nodes_removed=self._counts["node_removed"] - removed_before, cpus=self.nodes.cpus,
            message_bytes=s.message_bytes,
        ))

    def stop_load(self) -> None:
        import ray

        self.stage = "stop load"
        self.bar.set_description_str("stopping the load")
        try:
            self._close_producers(self.producers)
        finally:
            for actor in self.producers:
                ray.kill(actor)
            self.producers = []

    def scale_down(self, base_nodes: set[str]) -> None:
        s = self.settings
        self.stage = "scale down"
        self.bar.set_description_str("waiting for the added nodes to go")
        start = time.monotonic()
        removed_before = self._counts["node_removed"]
        added = lambda: [n for n in self.nodes.alive if n not in base_nodes]  # noqa: E731
        self.poll_nodes(force=True)
        while added() and time.monotonic() - start < s.scale_down_timeout_s:
            self._sleep(1.0)
        self.report({
            "event": "scale_down",
            "complete": not added(),
            "seconds": round(time.monotonic() - start, 1),
            "removed": self._counts["node_removed"] - removed_before,
            "remaining": len(added()),
            "nodes_alive": self.nodes.count(),
        })


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else type(err).__name__


# --------------------------------------------------------------------------
# the whole run


def _progress(total: float):
    from tqdm import tqdm

    return tqdm(total=total, unit="s", file=sys.stderr, disable=not sys.stderr.isatty(), leave=False,
                bar_format="{desc} {bar} {n:.0f}/{total:.0f} s{postfix}")


def _emit_line(row: dict) -> None:
    from tqdm import tqdm

    tqdm.write(json.dumps(row), file=sys.stdout)
    sys.stdout.flush()


@contextlib.contextmanager
def _sigterm_interrupts():
    """SIGTERM ends the run like Ctrl-C does: through the clean-up."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    try:
        old = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def run(settings: BenchSettings, emit: Callable[[dict], None] = _emit_line) -> list[dict]:
    """Run the benchmark; returns the rows it emitted. Starts (and always
    stops) a local autoscaling cluster unless ``settings`` name one."""
    settings.validate()
    with _sigterm_interrupts():
        cluster = None if settings.external else LocalCluster(settings.start_timeout_s)
        bar = _progress(len(settings.phases) * settings.phase_seconds)
        try:
            if cluster is not None:
                bar.set_description_str("starting the local autoscaling cluster")
                bar.refresh()
                started = time.monotonic()
                cluster.start()
                print(f"local autoscaling cluster: Ray {cluster.ray_address} (pid {cluster.head_pid}), "
                      f"ZooKeeper {cluster.zookeeper}, config {CONFIG}", file=sys.stderr)
                zookeeper, ray_address = cluster.zookeeper, cluster.ray_address
                data_dir = cluster.data_dir
                about = {"cluster": "local", "config": os.path.relpath(CONFIG, REPO),
                         "cluster_start_s": round(time.monotonic() - started, 1)}
            else:
                zookeeper, ray_address, data_dir = settings.zookeeper, settings.ray_address, None
                about = {"cluster": "existing"}
            about["ray_address"] = ray_address
            return _run_on(settings, zookeeper, ray_address, data_dir, emit, bar, about)
        except BaseException:
            if cluster is not None:
                cluster.failed = True
            raise
        finally:
            bar.close()
            if cluster is not None:
                cluster.stop()


def _run_on(settings: BenchSettings, zookeeper: str, ray_address: str, data_dir: str | None, emit, bar,
            about: dict) -> list[dict]:
    import logging

    import ray

    from raylog.client import DEFAULT_DATA_DIR, Client

    ray.init(address=ray_address, logging_level=logging.WARNING, log_to_driver=False)
    client = None
    try:
        client = Client(zookeeper=zookeeper, cluster=settings.cluster, data_dir=data_dir or DEFAULT_DATA_DIR,
                        token=settings.token)
        return Run(settings, client, emit, bar, about).run()
    finally:
        if client is not None:
            client.close()
        ray.shutdown()
