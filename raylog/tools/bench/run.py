"""The load and the whole run of the autoscaled benchmark: disk nodes, the
topic, the phases of producer actors and consumer tasks, the scale-down
(see :mod:`raylog.tools.bench`)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import time
from typing import Callable

from raylog import Consumer
from raylog.client import DEFAULT_DATA_DIR, Client
from raylog.config import DISK_RESOURCE
from raylog.errors import RaylogError
from raylog.metadata import Metadata
from raylog.tools.bench.cluster import LocalCluster
from raylog.tools.bench.report import NodeTracker, phase_report
from raylog.tools.bench.settings import BenchError, BenchSettings, CONFIG, CONSUMER_GRACE_S, IN_FLIGHT_PER_PRODUCER, PRODUCER_CLOSE_S, PRODUCER_STATS_S, SEND_BATCH, TOPIC_RETENTION_BYTES, TOPIC_SEGMENT_BYTES


def consume_until(settings, topic: str, group: str, until: float) -> dict:
    """A consumer task: read ``topic`` in ``group`` until the wall clock
    reaches ``until``; the count and when it ran. A task that starts after
    ``until`` (its node came too late) reads nothing."""

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
        import ray  # heavy (Ray): imported when used

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
        import ray  # heavy (Ray): imported when used

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
        from ray.autoscaler.sdk import request_resources  # heavy (Ray): imported when used

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

    def _producer_counts(self, timeout_s: float, running: set[int] = frozenset()) -> set[int]:
        """Refresh ``self.sent`` from the producer actors that answer within
        ``timeout_s`` (a pending actor does not); the indexes that answered.
        Actors in ``running`` (they answered before) get up to
        ``PRODUCER_STATS_S`` on a busy machine."""
        import ray  # heavy (Ray): imported when used

        refs = {p.stats.remote(): i for i, p in enumerate(self.producers)}
        known = [ref for ref, i in refs.items() if i in running]
        ready, _ = ray.wait(known, num_returns=len(known), timeout=PRODUCER_STATS_S)
        rest = [ref for ref in refs if ref not in known]
        ready += ray.wait(rest, num_returns=len(rest), timeout=timeout_s)[0]
        answered = set()
        for ref in ready:
            stats = ray.get(ref)
            if stats.get("error"):
                raise BenchError(f"a producer actor failed: {stats['error']}")
            self.sent[refs[ref]] = stats["sent_messages"]
            answered.add(refs[ref])
        return answered

    def _resize_producers(self, workers: int) -> None:
        import ray  # heavy (Ray): imported when used

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
        import ray  # heavy (Ray): imported when used

        refs = [a.close.remote() for a in actors]
        ray.wait(refs, num_returns=len(refs), timeout=PRODUCER_CLOSE_S)

    def run_phase(self, k: int, workers: int) -> None:
        import ray  # heavy (Ray): imported when used

        s = self.settings
        self.stage = f"phase {k}"
        self.bar.set_description_str(f"phase {k}/{len(s.phases)}: {workers}+{workers} workers")
        added_before, removed_before = self._counts["node_added"], self._counts["node_removed"]
        self._resize_producers(workers)
        # The phase's clock starts once a producer runs: on a busy machine an
        # actor on a node that is up already can take seconds to start, and
        # a phase of 5 s would then produce nothing (producers waiting for
        # new nodes are what the bench measures: they are not waited for).
        running = self._producer_counts(timeout_s=2.0)
        deadline = time.monotonic() + s.start_timeout_s
        while not running:
            if time.monotonic() > deadline:
                raise BenchError(f"no producer actor of phase {k} started within {s.start_timeout_s:g} s")
            running = self._producer_counts(timeout_s=2.0)
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
        answered = self._producer_counts(timeout_s=5.0, running=running)
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
        import ray  # heavy (Ray): imported when used

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


def _progress(total: float):
    from tqdm import tqdm  # optional: imported when used

    return tqdm(total=total, unit="s", file=sys.stderr, disable=not sys.stderr.isatty(), leave=False,
                bar_format="{desc} {bar} {n:.0f}/{total:.0f} s{postfix}")


def _emit_line(row: dict) -> None:
    from tqdm import tqdm  # optional: imported when used

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
        cluster = None if settings.external else LocalCluster(settings.start_timeout_s, settings.cluster)
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
                about = {"cluster": "local", "config": CONFIG.name,
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

    import ray  # heavy (Ray): imported when used


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
