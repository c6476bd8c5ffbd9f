"""A whole fault run: cluster, workload, nemesis, checker, report.

::

    from raylog.testing.runner import RunOptions, run
    report = run(RunOptions(duration_s=60, seed=7, out_dir="/tmp/faults"))
    assert report["valid"], report["forbidden"]

or from a shell (``raylog faults`` and ``bench/faults.py`` are the same)::

    python -m raylog.testing.runner --duration 60 --seed 7 --out /tmp/faults

What it does, in this order:

1. starts a ZooKeeper of its own (under ``<out>/zookeeper``, so the nemesis
   can stop and restart it) and a Ray cluster: with ``nodes >= 2`` a
   ``ray.cluster_utils.Cluster`` (a head for the driver and the consumers,
   plus ``nodes`` nodes labelled ``disk-a``, ``disk-b`` ... that hold the
   partitions), else a local Ray of one node;
2. creates a topic of ``partitions`` partitions (logs under ``<out>/data``),
   with ``replication_factor`` replicas each (on as many disk nodes) and
   ``min_insync_replicas``; the ``kill-leader`` fault runs only when the
   topic is replicated;
3. starts the consumer group (``consumers`` member actors, manual and
   automatic commits alternating) and the producers (acks ``"all"`` and
   ``1``, keyed and keyless, plain and compressed), see
   :mod:`raylog.testing.workload`;
4. runs the nemesis's seeded plan for ``duration_s`` (longer if a fault kind
   has not happened yet), then stops producing, lets the group read up to
   the end of every partition (at most ``drain_s``), stops the members;
5. checks the history (``<out>/history/*.jsonl``) and writes
   ``<out>/report.json``, the table, and ``<out>/timeline.png`` when
   matplotlib is there.

With ``workload="compact"`` (``--workload compact``) steps 2-5 are the
compaction workload's instead (:mod:`raylog.testing.compaction_workload`):
a compacted topic, writers of values and deletes per key with acks
``"all"``, a scan of the whole topic now and then and one at the end (after
the faults healed and the cleaner had ``delete_retention_ms`` and some passes
more), checked by :mod:`raylog.testing.compaction_checker`; no consumer
group (so no consumer faults, and no flip-byte), the cleaner faults
(``COMPACTION_KINDS``) instead. The partition actors then run with the
fault-injection switch of :mod:`raylog.storage.faults` on, and as root the
run's data dir is a tmpfs of its own (``disk-full-cleaning`` fills it).

With ``workload="txn"`` (``--workload txn``) steps 2-5 are the
transactional workload's (:mod:`raylog.testing.txn_workload`): ``producers``
transactional writers (transactions of 1-4 sends over the topic's
partitions, some committing the input group's offsets, some aborted on
purpose), a read_committed and a read_uncommitted reader of every partition
the whole run, the input group's offsets read now and then, and after the
faults healed a final read_committed read of everything, checked by
:mod:`raylog.testing.txn_checker`; no consumer group and no flip-byte, the
transaction faults (``TXN_KINDS``: a writer's producer dropped
mid-transaction, the transaction coordinator killed) instead.

Everything it started it stops by its own handle, in ``finally``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import shutil
import subprocess
import sys
import threading
import time

from raylog.client import Client
from raylog.config import DISK_RESOURCE, NODE_LABEL
from raylog.testing import checker, compaction_checker, compaction_workload, report as reporting
from raylog.testing import txn_checker, txn_workload
from raylog.testing.consumer_worker import consumer_actor_class
from raylog.testing.faults import FAULT_INJECTION_ENV
from raylog.testing.history import Recorder, history_files, read_history
from raylog.testing.ray_messages import divert_ray_messages
from raylog.testing.nemesis import (
    COMPACTION_KINDS, CONSUMER_KINDS, DISK_FULL_CLEANING, FAULT_KINDS, FLIP_BYTE, HOST_KINDS, MULTI_NODE_KINDS,
    REPLICATED_KINDS, TXN_KINDS, Nemesis, Target, plan,
)
from raylog.testing.workload import ProducerWorker
from raylog.zookeeper import EmbeddedZooKeeper

log = logging.getLogger(__name__)

TOPIC = "queue"
GROUP = "checkers"
WORKLOADS = ("queue", "compact", "txn")
#: the size of the compaction workload's data disk (a tmpfs, as root)
DATA_DISK_MB = 256

#: (name, acks, keyed, compression) of the producers, taken in turn
PRODUCERS = (
    ("producer-all-keyless", "all", False, None),
    ("producer-1-keyed", 1, True, None),
    ("producer-all-keyed-zstd", "all", True, "zstd"),
    ("producer-1-keyless-lz4", 1, False, "lz4"),
)


@dataclasses.dataclass
class RunOptions:
    duration_s: float = 60.0
    seed: int = 0
    #: None: every kind that applies (FAULT_KINDS, and REPLICATED_KINDS when replicated)
    faults: tuple | None = None
    out_dir: str = "faults-run"
    nodes: int = 2
    partitions: int = 6
    producers: int = 4
    consumers: int = 3
    rate: float = 150.0  # messages a second per producer
    drain_s: float = 60.0
    mean_gap_s: float = 6.0
    #: past ``duration_s``, how long the kinds not made yet still get (each
    #: kind is made once in every run; a busy machine makes faults slowly)
    fault_grace_s: float = 240.0
    replication_factor: int = 1
    min_insync_replicas: int = 1
    replica_lag_ms: int = 3000
    png: bool = True
    progress: bool = False
    #: acks levels whose unseen writes fail the run
    forbid_unseen_acks: tuple = ("all",)
    #: above 0: run on that many hosts of the hosts kit (raylog.testing.hosts:
    #: network namespaces, a disk and a Ray node each; the first runs ZooKeeper
    #: and the Ray head, the others hold the partitions), with the network
    #: faults in the mix; ``nodes`` is then ignored
    hosts: int = 0
    #: ``"queue"`` (producers and a consumer group) or ``"compact"`` (a
    #: compacted topic: writes and deletes per key, scans; see the module docstring)
    workload: str = "queue"
    #: the compaction workload: keys per writer
    keys: int = 24
    #: the compaction workload: seconds between two scans during the run
    scan_every_s: float = 15.0


def _start_ray(options: RunOptions, ray_tmp: str):
    """``(cluster or None, {label: (node, add_node kwargs)})``, Ray initialised."""
    import ray  # heavy (Ray): imported when used


    store = 200 * 1024 * 1024
    if options.nodes < 2:
        ray.init(
            address="local", num_cpus=4, resources={DISK_RESOURCE: 1}, labels={NODE_LABEL: "local"},
            include_dashboard=False, logging_level="WARNING", object_store_memory=store,
            _temp_dir=ray_tmp,
        )
        return None, {}
    from ray.cluster_utils import Cluster  # heavy (Ray): imported when used

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 4, "include_dashboard": False, "object_store_memory": store, "temp_dir": ray_tmp},
    )
    disks = {}
    try:
        for i in range(options.nodes):
            label = f"disk-{chr(ord('a') + i)}"
            kwargs = {"num_cpus": 1, "resources": {DISK_RESOURCE: 1}, "labels": {NODE_LABEL: label},
                      "object_store_memory": store}
            disks[label] = (cluster.add_node(**kwargs), kwargs)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, include_dashboard=False, logging_level="WARNING")
    except BaseException:
        cluster.shutdown()
        raise
    return cluster, disks


def run(options: RunOptions) -> dict:
    """Run, check, write the report files; returns the report (see
    :func:`raylog.testing.checker.check`, plus ``"run"``: what ran)."""
    import ray  # heavy (Ray): imported when used
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # heavy (Ray): imported when used


    if options.workload not in WORKLOADS:
        raise ValueError(f"unknown workload {options.workload!r}; one of {', '.join(WORKLOADS)}")
    compact = options.workload == "compact"
    txn = options.workload == "txn"
    kinds = run_kinds(options)
    schedule = plan(options.seed, options.duration_s, kinds, mean_gap_s=options.mean_gap_s)  # checks the kinds
    out = os.path.abspath(options.out_dir)
    history_dir = os.path.join(out, "history")
    if os.path.exists(history_dir):
        shutil.rmtree(history_dir)
    os.makedirs(history_dir)
    for old in ("data", "zookeeper"):
        shutil.rmtree(os.path.join(out, old), ignore_errors=True)
    # Ray's socket paths must stay short: a temp dir of its own under /tmp
    import tempfile

    ray_tmp = tempfile.mkdtemp(prefix="rlf-", dir="/tmp")
    data_disk = None
    switch_before = os.environ.get(FAULT_INJECTION_ENV)
    if compact:
        # the cleaner faults crash the partition actors at the cleaner's own steps
        os.environ[FAULT_INJECTION_ENV] = "1"
        if not options.hosts:
            data_disk = _mount_data_disk(os.path.join(out, "data"))
    hosts = None
    if options.hosts:
        from raylog.testing.hosts import HostsCluster  # only with --hosts: the kit needs root and starts Ray nodes

        hosts = HostsCluster(hosts=options.hosts)
        zookeeper = None
    else:
        zookeeper = EmbeddedZooKeeper(data_dir=os.path.join(out, "zookeeper"))
    cluster = client = diverted = None
    producers: list = []
    consumers: list = []
    nemesis = None
    watch = scanner = scans = None
    readers: list = []
    offsets_watch = None
    topic = compaction_workload.TOPIC if compact else txn_workload.TOPIC if txn else TOPIC
    run_info = {"seed": options.seed, "duration_s": options.duration_s, "nodes": options.nodes, "hosts": options.hosts,
                "partitions": options.partitions, "replication_factor": options.replication_factor,
                "min_insync_replicas": options.min_insync_replicas, "fault_kinds": list(kinds),
                "workload": options.workload, "data_disk": data_disk}
    started = time.time()
    try:
        if hosts is not None:
            hosts.start()
            zookeeper, disks = hosts.zookeeper, {}
            run_info["hosts"] = {h.name: {"address": h.address, "disk": h.disk} for h in hosts.hosts}
            run_info["hosts_slot"] = hosts.slot
            # raylog.connect(zookeeper=HEAD:2181, ray_address=HEAD:6379), each log on its host's disk
            client = hosts.client(cluster=f"faults-{options.seed}")
        else:
            zookeeper.start()
            cluster, disks = _start_ray(options, ray_tmp)
            client = Client(
                zookeeper=zookeeper.connect_string,
                cluster=f"faults-{options.seed}",
                data_dir=os.path.join(out, "data"),
                data_host="127.0.0.1",
            )
        # Ray's messages about the faults made on purpose: to a file, not before the report
        diverted = divert_ray_messages(os.path.join(out, "ray-messages.log"))
        replication = {}
        if options.replication_factor > 1:
            replication = dict(replication_factor=options.replication_factor,
                               min_insync_replicas=options.min_insync_replicas,
                               replica_lag_ms=options.replica_lag_ms)
        if compact:
            client.create_topic(topic, partitions=options.partitions, **compaction_workload.TOPIC_SETTINGS,
                                **replication)
        elif txn:
            client.create_topic(topic, partitions=options.partitions, **txn_workload.TOPIC_SETTINGS, **replication)
            client.create_topic(txn_workload.INPUT_TOPIC, partitions=1, **replication)
        else:
            client.create_topic(TOPIC, partitions=options.partitions, flush_ms=20, **replication)
        head = ray.get_runtime_context().get_node_id()
        actor_class = consumer_actor_class().options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=head, soft=False)
        )
        for i in range(0 if compact or txn else options.consumers):
            consumers.append(
                actor_class.remote(
                    zookeeper.connect_string, client.settings.cluster, client.settings.token, TOPIC, GROUP,
                    f"consumer-{i}", history_dir, "manual" if i % 2 == 0 else "auto", 6000, options.seed,
                )
            )
        ray.get([c.pid.remote() for c in consumers], timeout=120)
        for i in range(options.producers if compact else 0):
            producers.append(
                compaction_workload.CompactionWriter(client, topic, f"writer-{i}", history_dir, rate=options.rate,
                                                     seed=options.seed * 1000 + i, keys=options.keys).start()
            )
        if compact:
            watch = compaction_workload.CleanerWatch(client, topic, options.partitions).start()
            scanner = compaction_workload.Scanner(client, topic, options.partitions, history_dir)
            scans = _Scans(scanner, options.scan_every_s)
        if txn:
            for isolation in ("read_committed", "read_uncommitted"):
                readers.append(
                    txn_workload.TxnReader(client, topic, options.partitions, history_dir, isolation).start())
            offsets_watch = txn_workload.OffsetsWatch(
                client, history_dir, [f"txn-writer-{i}" for i in range(options.producers)]).start()
            for i in range(options.producers):
                producers.append(
                    txn_workload.TxnWriter(client, topic, f"txn-writer-{i}", i, history_dir,
                                           partitions=options.partitions, rate=options.rate / 10.0,
                                           seed=options.seed * 1000 + i).start()
                )
        for i in range(0 if compact or txn else options.producers):
            name, acks, keyed, codec = PRODUCERS[i % len(PRODUCERS)]
            producers.append(
                ProducerWorker(client, TOPIC, f"{name}-{i}" if i >= len(PRODUCERS) else name, history_dir,
                               acks=acks, keyed=keyed, compression=codec, rate=options.rate,
                               seed=options.seed * 1000 + i).start()
            )

        target = Target(client=client, topic=topic, partitions=options.partitions, zookeeper=zookeeper,
                        consumers=consumers, history_dir=history_dir, cluster=cluster, disk_nodes=disks,
                        hosts=hosts, data_disk=data_disk, writers=producers if txn else None)
        recorder = Recorder(os.path.join(history_dir, "nemesis.jsonl"), "nemesis")
        reader = Recorder(os.path.join(history_dir, "nemesis-reader.jsonl"), "nemesis-reader")
        nemesis = Nemesis(target, schedule, recorder, options.seed, reader=reader)
        workload_start = time.time()
        run_info["startup_s"] = round(workload_start - started, 1)
        # The nemesis runs on this (the main) thread: Ray adds nodes only from there.
        bar = _Progress(options, workload_start, producers, nemesis) if options.progress else None
        try:
            nemesis.run(workload_start, options.duration_s, grace_s=options.fault_grace_s)
            while time.time() - workload_start < options.duration_s:
                time.sleep(0.2)
        finally:
            if bar is not None:
                bar.close()
        recorder.close()
        reader.close()
        run_info["nemesis_errors"] = nemesis.errors[:20]
        run_info["workload_s"] = round(time.time() - workload_start, 1)

        t = time.time()
        for producer in producers:
            producer.stop()
        run_info["producers"] = [p.summary for p in producers]
        if compact:
            scans.stop()
            run_info["final_scan"] = _final_scan(client, topic, history_dir, scanner, watch, options)
            run_info["drain_s"] = round(time.time() - t, 1)
            watch.stop()
            run_info["cleaner"] = watch.summary()
            run_info["scans"] = scanner.scans
        elif txn:
            time.sleep(2.0)  # the readers read the tail of the run
            for reader in readers:
                reader.stop()
            offsets_watch.stop()
            run_info["readers"] = [r.summary for r in readers]
            run_info["final_read"] = txn_workload.final_read(
                client, topic, options.partitions, history_dir, [p.name for p in producers],
                stable_wait_s=txn_workload.TRANSACTION_TIMEOUT_MS / 1000.0 + 20.0, timeout_s=options.drain_s)
            run_info["drain_s"] = round(time.time() - t, 1)
        else:
            run_info["drained"] = _drain(client, consumers, options)
            run_info["drain_s"] = round(time.time() - t, 1)
        t = time.time()
        run_info["consumers"] = _stop_consumers(consumers)
        run_info["stop_s"] = round(time.time() - t, 1)
    finally:
        for producer in producers:
            if producer._thread.is_alive():
                producer._stop.set()
        for reader in readers:
            reader._stop.set()
        if offsets_watch is not None:
            offsets_watch._stop.set()
        if scans is not None:
            scans.stop()
        if watch is not None:
            watch._stop.set()
        if scanner is not None:
            scanner.close()
        for actor in consumers:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
        if client is not None:
            try:
                client.close()
            except Exception as err:  # noqa: BLE001
                log.warning("closing the client failed: %s", err)
        if hosts is not None:
            ending = "final_scan" if compact else "final_read" if txn else "drained"
            finished = run_info.get(ending, {}).get("complete")
            if not finished:  # a failed run: keep what the hosts logged
                with contextlib.suppress(Exception):
                    run_info["host_logs"] = os.path.join(out, "host-logs")
                    hosts.keep_logs(run_info["host_logs"])
            hosts.stop()  # the client, the driver's Ray, every host and what it made
        if ray.is_initialized():
            ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        if hosts is None:
            zookeeper.stop()
        shutil.rmtree(ray_tmp, ignore_errors=True)
        if data_disk is not None:
            _unmount(data_disk)
        if compact:
            if switch_before is None:
                os.environ.pop(FAULT_INJECTION_ENV, None)
            else:
                os.environ[FAULT_INJECTION_ENV] = switch_before
        if diverted is not None:
            diverted.close()
            run_info["ray_messages"] = {"lines": diverted.lines, "file": diverted.path}

    ops = read_history(history_files(history_dir))
    if compact:
        result = compaction_checker.check(
            ops, delete_retention_ms=compaction_workload.TOPIC_SETTINGS["delete_retention_ms"])
    elif txn:
        result = txn_checker.check(ops)
    else:
        # replicated: an acks=1 set the followers had not fetched is dropped at a leader change
        lossy = ("1",) if options.replication_factor > 1 else ()
        result = checker.check(ops, forbid_unseen_acks=options.forbid_unseen_acks, lossy_acks=lossy)
    run_info["elapsed_s"] = round(time.time() - started, 1)
    result["run"] = run_info
    with open(os.path.join(out, "report.json"), "w") as f:
        f.write(reporting.to_json(result))
    if options.png and not compact and not txn:
        try:
            result["run"]["timeline"] = reporting.timeline_png(
                ops, os.path.join(out, "timeline.png"), f"raylog fault run, seed {options.seed}"
            )
        except ImportError:
            result["run"]["timeline"] = None  # matplotlib is in the bench extra
    return result


def run_kinds(options: RunOptions) -> tuple:
    """The fault kinds a run schedules: ``options.faults`` (None: all), less
    those its cluster cannot have (a single node, no replication)."""
    replicated = options.replication_factor > 1
    compact = options.workload == "compact"
    txn = options.workload == "txn"
    if options.faults is not None:
        kinds = tuple(options.faults)
    elif txn:  # no consumer group, no damaged bytes: the writers and the coordinator instead
        kinds = tuple(k for k in FAULT_KINDS if k not in CONSUMER_KINDS + (FLIP_BYTE,)) + TXN_KINDS
        kinds += REPLICATED_KINDS if replicated else ()
    elif compact:  # no consumer group, no damaged bytes (the compaction checker reads no damage)
        kinds = tuple(k for k in FAULT_KINDS if k not in CONSUMER_KINDS + (FLIP_BYTE,)) + COMPACTION_KINDS
        if not options.hosts and os.geteuid() != 0:
            kinds = tuple(k for k in kinds if k != DISK_FULL_CLEANING)  # its disk is a tmpfs: root
        kinds += REPLICATED_KINDS if replicated else ()
    else:
        kinds = FAULT_KINDS + (REPLICATED_KINDS if replicated else ())
    if compact or txn:
        wrong = [k for k in kinds if k in CONSUMER_KINDS + (FLIP_BYTE,) + (TXN_KINDS if compact else COMPACTION_KINDS)]
        if wrong:
            raise ValueError(f"fault kinds {', '.join(wrong)} do not apply to the {options.workload} workload (it "
                             f"has no consumer group, and its checker reads no damaged bytes)")
    else:
        kinds = tuple(k for k in kinds if k not in COMPACTION_KINDS + TXN_KINDS)
    if options.hosts:
        if options.faults is None:
            kinds += HOST_KINDS
        kinds = tuple(k for k in kinds if k not in MULTI_NODE_KINDS)
    else:
        kinds = tuple(k for k in kinds if k not in HOST_KINDS)
    if not options.hosts and options.nodes < 2:
        kinds = tuple(k for k in kinds if k not in MULTI_NODE_KINDS)
    if not replicated:
        kinds = tuple(k for k in kinds if k not in REPLICATED_KINDS)
    return kinds


class _Progress:
    """A progress bar of the workload's seconds, updated by a thread of its own."""
    def __init__(self, options, workload_start, producers, nemesis):
        from tqdm import tqdm  # optional: imported when used

        self._bar = tqdm(total=int(options.duration_s), unit="s", desc="fault run", file=sys.stderr)
        self._stop = threading.Event()
        self._args = (options, workload_start, producers, nemesis)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        options, workload_start, producers, nemesis = self._args
        shown = 0
        while not self._stop.wait(0.5):
            now = min(int(time.time() - workload_start), int(options.duration_s))
            self._bar.update(now - shown)
            shown = now
            self._bar.set_postfix(sent=sum(p.sent for p in producers), faults=sum(nemesis.counts.values()))

    def close(self):
        self._stop.set()
        self._thread.join(2)
        self._bar.close()


def _mount_data_disk(path: str) -> str | None:
    """As root: a tmpfs of :data:`DATA_DISK_MB` at ``path`` (the run's data
    dir: a disk the disk-full-cleaning fault can fill); else None."""
    if os.geteuid() != 0:
        return None
    os.makedirs(path, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DATA_DISK_MB}m,mode=0700", "raylog-faults-data", path],
                   check=True)
    return path


def _unmount(path: str) -> None:
    result = subprocess.run(["umount", path], capture_output=True, text=True)
    if result.returncode != 0:  # a process of the run still holds a file there: detach it now, freed when it ends
        log.warning("umount %s: %s; detaching it", path, result.stderr.strip())
        subprocess.run(["umount", "-l", path], check=False)


class _Scans:
    """The compaction workload's scans during the run, by a thread of their own."""

    def __init__(self, scanner, every_s: float):
        self._scanner = scanner
        self._every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fault-scans", daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(self._every_s):
            try:
                self._scanner.scan(timeout_s=self._every_s)
            except Exception as err:  # noqa: BLE001 - each partition's scan records its own error
                log.info("scan: %s", err)

    def stop(self):
        self._stop.set()
        self._thread.join(120)


#: the final scan: tries (a partition whose actor is restarting is scanned again)
FINAL_SCAN_TRIES = 4


def _final_scan(client, topic, history_dir, scanner, watch, options) -> dict:
    """After the writers stopped: give the cleaner ``delete_retention_ms``
    and a few passes more (fed by the ``churn`` writer, see
    :mod:`raylog.testing.compaction_workload`), then scan every partition to
    its end (again, while one did not get there)."""
    settings = compaction_workload.TOPIC_SETTINGS
    passes = watch.passes
    wait_s = settings["delete_retention_ms"] / 1000.0 + 5.0
    churn = compaction_workload.CompactionWriter(client, topic, "churn", history_dir, rate=options.rate,
                                                 seed=options.seed * 1000 + 999, keys=options.keys,
                                                 delete_share=0.0).start()
    try:
        time.sleep(wait_s)
    finally:
        churn.stop()
    time.sleep(10 * settings["retention_check_ms"] / 1000.0 + settings["segment_ms"] / 1000.0)
    watch.poll()
    summary: list = []
    for _ in range(FINAL_SCAN_TRIES):
        summary = scanner.scan(final=True, timeout_s=60)
        if all(s["complete"] for s in summary):
            break
        time.sleep(5)
    return {"complete": all(s["complete"] for s in summary), "waited_s": round(wait_s, 1),
            "cleaner_passes_while_waiting": watch.passes - passes, "partitions": summary}


def _drain(client, consumers, options) -> dict:
    """Wait until the group has read every partition to its end (or ``drain_s``)."""
    import ray  # heavy (Ray): imported when used

    deadline = time.time() + options.drain_s
    time.sleep(0.5)  # acknowledged (acks=1) sets become readable at the next flush
    ends = None
    positions: dict[str, int] = {}
    while time.time() < deadline:
        try:
            if ends is None:
                ends = {f"{TOPIC}/{p}": hw for p, hw in client.end_offsets(TOPIC).items()}
            for status in ray.get([c.status.remote() for c in consumers], timeout=10):
                for tp, pos in status["positions"].items():
                    if pos is not None:
                        positions[tp] = max(positions.get(tp, 0), pos)
        except Exception as err:  # noqa: BLE001 - a member restarting: ask again
            log.info("drain: %s", err)
        if ends is not None and all(positions.get(tp, 0) >= hw for tp, hw in ends.items()):
            time.sleep(1.0)  # let the last polls be recorded
            return {"complete": True, "ends": ends, "positions": positions}
        time.sleep(0.5)
    return {"complete": False, "ends": ends, "positions": positions}


def _stop_consumers(consumers) -> list:
    import ray  # heavy (Ray): imported when used

    out = []
    refs = [c.stop.remote() for c in consumers]
    for ref in refs:
        try:
            out.append(ray.get(ref, timeout=60))
        except Exception as err:  # noqa: BLE001
            out.append({"error": f"{type(err).__name__}: {err}"[:300]})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="raylog faults", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        return run_from_args(args)
    except ValueError as err:  # options that parse but do not make a run (an unknown fault kind)
        p.error(str(err))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--duration", type=float, default=60.0, help="seconds of workload under faults (default 60)")
    p.add_argument("--seed", type=int, default=0, help="seed of the fault plan and the workload (default 0)")
    p.add_argument("--faults", default=None,
                   help=f"comma-separated fault kinds (default all: {','.join(FAULT_KINDS)}, and "
                        f"{','.join(REPLICATED_KINDS)} with --replication-factor above 1)")
    p.add_argument("--out", default="faults-run", help="directory for history, report.json, timeline.png")
    p.add_argument("--nodes", type=int, default=2, help="disk nodes (>= 2: a multi-node Ray cluster; 1: local Ray)")
    p.add_argument("--hosts", type=int, default=0,
                   help="run on this many hosts of the hosts kit (network namespaces, needs root; the first runs "
                        "ZooKeeper and the Ray head, the others hold the partitions) with the network faults "
                        f"({','.join(HOST_KINDS)}); --nodes is then ignored")
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--replication-factor", type=int, default=1,
                   help="replicas of each partition, on distinct disk nodes (default 1; needs --nodes at least this)")
    p.add_argument("--min-insync", type=int, default=1,
                   help="min_insync_replicas of the topic: acks=all fails below this ISR size (default 1)")
    p.add_argument("--replica-lag-ms", type=int, default=3000,
                   help="replica_lag_ms of the topic: a follower this far behind leaves the ISR (default 3000)")
    p.add_argument("--producers", type=int, default=4)
    p.add_argument("--consumers", type=int, default=3)
    p.add_argument("--rate", type=float, default=150.0, help="messages a second per producer")
    p.add_argument("--drain", type=float, default=60.0, help="at most this long to read everything at the end")
    p.add_argument("--gap", type=float, default=6.0, help="mean seconds between faults")
    p.add_argument("--no-png", action="store_true", help="skip the timeline PNG")
    p.add_argument("--progress", action="store_true", help="show a progress bar")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of the table")
    p.add_argument("--workload", choices=WORKLOADS, default="queue",
                   help="queue (default: producers and a consumer group) or compact (a compacted topic: "
                        "writes and deletes per key with acks=all, the cleaner faults "
                        f"{','.join(COMPACTION_KINDS)}; checked against docs/design.md section 6's compaction "
                        "guarantee) or txn (transactional writers, read_committed and read_uncommitted readers, "
                        f"the faults {','.join(TXN_KINDS)}; checked against section 6's transactions guarantee)")
    p.add_argument("--keys", type=int, default=24, help="compact workload: keys per writer (default 24)")


def options_from_args(args) -> RunOptions:
    faults = None if args.faults is None else tuple(k.strip() for k in args.faults.split(",") if k.strip())
    return RunOptions(
        duration_s=args.duration, seed=args.seed, faults=faults, out_dir=args.out, nodes=args.nodes,
        partitions=args.partitions, producers=args.producers, consumers=args.consumers, rate=args.rate,
        drain_s=args.drain, mean_gap_s=args.gap, png=not args.no_png, progress=args.progress,
        replication_factor=args.replication_factor, min_insync_replicas=args.min_insync,
        replica_lag_ms=args.replica_lag_ms, hosts=args.hosts, workload=args.workload, keys=args.keys,
    )


def run_from_args(args) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    result = run(options_from_args(args))
    if args.json:
        print(reporting.to_json(result))
    else:
        print(reporting.table(result))
        print(f"report: {os.path.join(os.path.abspath(args.out), 'report.json')}")
    return 0 if result["valid"] else 1


if __name__ == "__main__":
    sys.exit(main())
