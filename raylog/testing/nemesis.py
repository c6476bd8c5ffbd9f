"""The nemesis: faults from the kit at seeded random times, every kind at
least once per run.

:func:`plan` is pure: from a seed, the run's duration and the fault kinds,
it gives the schedule (every kind once, in a seeded order, then seeded
random kinds), with seeded gaps between faults. :class:`Nemesis` carries a
plan out against a running cluster, one fault after the other, recording
each as a ``fault`` operation (``t0`` when it began, ``t1`` when it was over
and healed). A fault that could not be made is recorded with
``detail["error"]`` and retried later in the run, so that every kind
happens at least once.

The kinds:

==================== ================================================================
``kill-partition``   SIGKILL a partition actor's process (Ray restarts it; recovery runs)
``pause-partition``  SIGSTOP a partition actor for 2-4 s, then SIGCONT
``kill-consumer``    SIGKILL a consumer-group member's process (Ray restarts it)
``expire-session``   expire a member's ZooKeeper session
``drop-connection``  break a member's ZooKeeper connection (the session survives)
``zookeeper-outage`` stop ZooKeeper for 2-4 s, then start it again
``flip-byte``        damage one byte of a flushed message of a partition
``remove-node``      remove a Ray node holding partitions, then add it back after 2-4 s
``kill-leader``      SIGKILL the process of a replicated partition's current leader
                     replica (only with a replication factor above 1; a partition
                     whose ISR is whole is chosen), then wait for a leader to serve
``reassign``         reassign a replicated partition whose ISR is whole: its leader's
                     replica moves to a spare disk node when there is one, else the
                     replicas are reordered and the lead handed to the new first
                     (a handoff either way, :mod:`raylog.replication.handoff`)
``rolling-restart``  restart every disk node's raylog actors in turn, each drained
                     first (:meth:`raylog.Client.rolling_restart`)
``cut-host``         take a disk host's link down for 4-10 s (its processes live on), then up
``partition-hosts``  split the hosts in two random sides for 4-10 s, then heal
``one-way-partition`` drop the packets of one disk host to another for 4-10 s, then heal
``zombie-leader``    cut the host of a partition's leader from ZooKeeper (clients still
                     reach it) for 12-18 s, longer than a session, then heal
``kill-host``        SIGKILL every process of a disk host, start its Ray node again after 2-4 s
``pause-host``       SIGSTOP every process of a disk host for 2-4 s, then SIGCONT
``kill-cleaning``    a partition actor whose cleaner runs SIGKILLs itself in the middle of
                     a cleaning pass's swap (at a random one of the cleaner's fault points
                     after the cleaned segment was written), then Ray restarts it
``crash-before-swap`` the same at ``clean-written``: the cleaned segment written, the
                     swap not begun
``kill-producer``    drop a transactional writer's producer in the middle of a transaction
                     (no abort, its state lost); the writer's next producer of the id comes
                     after the transaction's timeout (the coordinator aborts it), the next
                     time at once (it fences the old one) (the transactional workload)
``kill-coordinator`` SIGKILL the transaction coordinator's process (Ray restarts it; it
                     completes what it left prepared), then wait until it answers
``disk-full-cleaning`` the disk of the partitions full (a filler file takes its room) for
                     3-5 s while the cleaners pass every few hundred ms, then room again
                     (needs the run's data dir on a tmpfs of its own, or the hosts kit)
==================== ================================================================

:data:`FAULT_KINDS` are the kinds of every run; :data:`REPLICATED_KINDS`
join them when the topic is replicated, :data:`HOST_KINDS` on the hosts kit
(:mod:`raylog.testing.hosts`), where ``remove-node`` does not apply.
:data:`TXN_KINDS` need the transactional workload (its writers and the
coordinator). :data:`COMPACTION_KINDS` need a compacted topic (the compaction workload)
and a partition actor that runs the cleaner (those crash the actor through
:mod:`raylog.storage.faults`: the runner switches it on).

Thread-safety: a :class:`Nemesis` runs on one thread (``run``); ``stop`` may
be called from another.
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from typing import Sequence

from raylog.errors import CorruptMessageError, RaylogError
from raylog.testing import faults as kit
from raylog.testing.clusters import wait_until
from raylog.testing.host_checks import NODE_DEATH_WAIT_S, ray_node_alive
from raylog.testing.workload import DAMAGED_FILE

log = logging.getLogger(__name__)

KILL_PARTITION = "kill-partition"
PAUSE_PARTITION = "pause-partition"
KILL_CONSUMER = "kill-consumer"
EXPIRE_SESSION = "expire-session"
DROP_CONNECTION = "drop-connection"
ZOOKEEPER_OUTAGE = "zookeeper-outage"
FLIP_BYTE = "flip-byte"
REMOVE_NODE = "remove-node"
KILL_LEADER = "kill-leader"

FAULT_KINDS = (
    KILL_PARTITION, PAUSE_PARTITION, KILL_CONSUMER, EXPIRE_SESSION, DROP_CONNECTION, ZOOKEEPER_OUTAGE,
    FLIP_BYTE, REMOVE_NODE,
)
#: kinds that need a multi-node Ray cluster
MULTI_NODE_KINDS = (REMOVE_NODE,)
#: kinds that need a replicated topic (replication factor above 1)
REASSIGN = "reassign"
ROLLING_RESTART = "rolling-restart"
REPLICATED_KINDS = (KILL_LEADER, REASSIGN, ROLLING_RESTART)
CUT_HOST = "cut-host"
PARTITION_HOSTS = "partition-hosts"
ONE_WAY_PARTITION = "one-way-partition"
ZOMBIE_LEADER = "zombie-leader"
KILL_HOST = "kill-host"
PAUSE_HOST = "pause-host"
#: kinds that need the hosts kit (real network boundaries)
HOST_KINDS = (CUT_HOST, PARTITION_HOSTS, ONE_WAY_PARTITION, ZOMBIE_LEADER, KILL_HOST, PAUSE_HOST)
KILL_CLEANING = "kill-cleaning"
CRASH_BEFORE_SWAP = "crash-before-swap"
DISK_FULL_CLEANING = "disk-full-cleaning"
#: kinds that need a compacted topic whose partition actors run the cleaner
COMPACTION_KINDS = (KILL_CLEANING, CRASH_BEFORE_SWAP, DISK_FULL_CLEANING)
KILL_PRODUCER = "kill-producer"
KILL_COORDINATOR = "kill-coordinator"
#: kinds that need the transactional workload (its writers, the transaction coordinator)
TXN_KINDS = (KILL_PRODUCER, KILL_COORDINATOR)
#: kinds that need the consumer group (the queue workload's)
CONSUMER_KINDS = (KILL_CONSUMER, EXPIRE_SESSION, DROP_CONNECTION)
KNOWN_KINDS = FAULT_KINDS + REPLICATED_KINDS + HOST_KINDS + COMPACTION_KINDS + TXN_KINDS
#: how long a cleaner fault waits for a pass to reach its point, and for the actor to serve again
CLEAN_WAIT_S = 30.0
#: how long kill-leader waits for a leader to serve again
LEADER_WAIT_S = 60.0
#: how long the reassign and rolling-restart faults may take (each step)
OPERATION_WAIT_S = 120.0


def plan(seed: int, duration_s: float, kinds: Sequence[str], *, start_s: float = 3.0, mean_gap_s: float = 6.0) -> list[tuple[float, str]]:
    """``[(seconds after the start, kind), ...]``: every kind once (seeded
    order) from ``start_s`` on, then random kinds until ``duration_s``; gaps
    uniform in ``[0.5, 1.5] * mean_gap_s``, shrunk so that the first round
    fits in the run."""
    unknown = set(kinds) - set(KNOWN_KINDS)
    if unknown:
        raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {', '.join(KNOWN_KINDS)}")
    if not kinds:
        return []
    rng = random.Random(seed)
    first = list(kinds)
    rng.shuffle(first)
    gap = max(0.5, min(mean_gap_s, (duration_s - start_s) / (len(first) + 1)))
    out, at = [], start_s
    for kind in first:
        out.append((round(at, 3), kind))
        at += gap * rng.uniform(0.5, 1.5)
    while at < duration_s:
        out.append((round(at, 3), rng.choice(list(kinds))))
        at += gap * rng.uniform(0.5, 1.5)
    return out


class Target:
    """What the nemesis may hurt: filled in by the runner.

    ``client`` (a :class:`raylog.Client`), ``topic`` and ``partitions``;
    ``zookeeper`` (an EmbeddedZooKeeper); ``consumers`` (the member actors);
    ``history_dir``; for multi-node runs ``cluster`` (a
    ``ray.cluster_utils.Cluster``) and ``disk_nodes`` ``{label: (node,
    add_node kwargs)}``; on the hosts kit ``hosts`` (a
    :class:`raylog.testing.hosts.HostsCluster`); for the transactional
    workload ``writers`` (its :class:`~raylog.testing.txn_workload.TxnWriter`)."""

    def __init__(self, *, client, topic, partitions, zookeeper, consumers, history_dir, cluster=None, disk_nodes=None,
                 hosts=None, data_disk=None, writers=None):
        self.writers = writers or []
        self.hosts = hosts
        #: the run's data dir when it is a file system of its own (disk-full-cleaning fills it)
        self.data_disk = data_disk
        self.client = client
        self.topic = topic
        self.partitions = partitions
        self.zookeeper = zookeeper
        self.consumers = consumers
        self.history_dir = history_dir
        self.cluster = cluster
        self.disk_nodes = disk_nodes or {}


class Nemesis:
    def __init__(self, target: Target, schedule: list[tuple[float, str]], recorder, seed: int, *, reader=None, on_fault=None):
        self.target = target
        self.schedule = list(schedule)
        self.recorder = recorder
        self.rng = random.Random(seed * 7919 + 1)
        self.on_fault = on_fault
        self.done_kinds: set[str] = set()
        self.counts: dict[str, int] = {}
        self.errors: list[str] = []
        self._stop = threading.Event()
        #: records what :meth:`_read_back` was served (a process of its own)
        self.reader = reader

    def stop(self) -> None:
        self._stop.set()

    def every_kind_done(self) -> bool:
        return {kind for _, kind in self.schedule} <= self.done_kinds

    def run(self, started_at: float, duration_s: float, grace_s: float = 60.0) -> None:
        """Carry the schedule out; past ``duration_s`` only kinds not yet done
        run (until ``grace_s`` more), so that each happens at least once."""
        queue = list(self.schedule)
        retries = []
        while queue or retries:
            if self._stop.is_set():
                return
            now = time.time() - started_at
            if now > duration_s:
                # the run is over: only what is still missing
                queue = [(at, k) for at, k in queue + retries if k not in self.done_kinds]
                retries = []
                if not queue or now > duration_s + grace_s:
                    return
                at, kind = queue.pop(0)
            elif queue and queue[0][0] <= now:
                at, kind = queue.pop(0)
            elif retries and not queue:
                at, kind = retries.pop(0)
                if self._stop.wait(1.0):
                    return
            else:
                self._stop.wait(min(0.2, max(0.01, queue[0][0] - now)))
                continue
            if not self._inject(kind):
                retries.append((at, kind))

    # -- one fault ----------------------------------------------------------------

    def _inject(self, kind: str) -> bool:
        t0 = time.time()
        try:
            target, detail = getattr(self, "_" + kind.replace("-", "_"))()
        except Exception as err:  # noqa: BLE001 - recorded, tried again later
            message = f"{type(err).__name__}: {err}"[:300]
            log.warning("fault %s could not be injected: %s", kind, message)
            self.errors.append(f"{kind}: {message}")
            return False
        self.recorder.record("fault", t0=t0, kind=kind, target=target, detail=detail)
        self.done_kinds.add(kind)
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if self.on_fault is not None:
            self.on_fault(kind)
        return True

    def _partition_actor(self):
        p = self.rng.randrange(self.target.partitions)
        return p, self.target.client.partition_actor(self.target.topic, p)

    def _kill_partition(self):
        p, actor = self._partition_actor()
        pid = kit.kill_actor(actor)
        return f"{self.target.topic}/{p}", {"partition": p, "pid": pid}

    def _kill_leader(self):
        t = self.target
        registry = t.client.registry
        whole = []
        for row in t.client.describe_topic(t.topic)["partitions"]:
            p = row["partition"]
            if (row.get("leader") is None or len(row["isr"]) != len(row["replicas"])
                    or registry.endpoint(t.topic, p) is None):
                continue
            try:
                whole.append((p, row, t.client.leader_actor(t.topic, p)))
            except RaylogError:
                continue
        if not whole:
            raise kit.FaultInjectionError(f"no partition of {t.topic} is replicated with a whole ISR and a leader")
        p, row, actor = self.rng.choice(whole)
        before = registry.endpoint(t.topic, p)
        pid = kit.kill_actor(actor)
        detail = {"partition": p, "pid": pid, "leader": row["leader"], "leader_epoch": row["leader_epoch"]}
        detail.update(self._wait_for_leader(p, before))
        return f"{t.topic}/{p}", detail

    def _whole_partitions(self):
        t = self.target
        whole = []
        for p in range(t.partitions):
            state = t.client.replication_state(t.topic, p)
            if state is not None and set(state.isr) == set(state.replicas):
                whole.append((p, state))
        if not whole:
            raise kit.FaultInjectionError(f"no partition of {t.topic} is replicated with a whole ISR")
        return whole

    def _reassign(self):
        t = self.target
        p, state = self.rng.choice(self._whole_partitions())
        nodes = set(t.disk_nodes) | ({h.name for h in t.hosts.disk_hosts} if t.hosts is not None else set())
        spare = sorted(nodes - set(state.replicas))
        if spare:
            replicas = [self.rng.choice(spare) if n == state.leader else n for n in state.replicas]
        else:
            others = [n for n in state.replicas if n != state.leader]
            replicas = others + [state.leader]
        started = time.time()
        after = t.client.reassign_partition(t.topic, p, replicas, timeout_s=OPERATION_WAIT_S)
        if after["leader"] != replicas[0]:
            after = t.client.hand_off(t.topic, p, replicas[0], timeout_s=30)
        return f"{t.topic}/{p}", {"partition": p, "leader": state.leader, "replicas": replicas,
                                  "new_leader": after["leader"], "new_leader_epoch": after["leader_epoch"],
                                  "took_s": round(time.time() - started, 3)}

    def _rolling_restart(self):
        started = time.time()
        rows = self.target.client.rolling_restart(timeout_s=OPERATION_WAIT_S)
        return "disk-nodes", {"nodes": [r["node"] for r in rows], "took_s": round(time.time() - started, 3),
                              "longest_leaderless_s": max((r["longest_leaderless_s"] or 0 for r in rows), default=0)}

    def _wait_for_leader(self, partition: int, before) -> dict:
        """Wait until the partition's endpoint is registered anew (a new
        epoch: the restarted replica or a follower that took over)."""
        t = self.target
        registry = t.client.registry
        started = time.time()
        while time.time() - started < LEADER_WAIT_S and not self._stop.is_set():
            now = registry.endpoint(t.topic, partition)
            if now is not None and (before is None or now.get("epoch") != before.get("epoch")):
                row = t.client.describe_topic(t.topic)["partitions"][partition]
                return {"new_leader": row["leader"], "new_leader_epoch": row["leader_epoch"],
                        "serving_after_s": round(time.time() - started, 3)}
            time.sleep(0.05)
        return {"new_leader": None, "serving_after_s": None}

    def _pause_partition(self):
        p, actor = self._partition_actor()
        seconds = round(self.rng.uniform(2.0, 4.0), 2)
        pid = kit.pause_actor(actor, seconds)
        return f"{self.target.topic}/{p}", {"partition": p, "pid": pid, "seconds": seconds}

    def _consumer(self):
        i = self.rng.randrange(len(self.target.consumers))
        return i, self.target.consumers[i]

    def _kill_consumer(self):
        i, actor = self._consumer()
        pid = kit.kill_actor(actor)
        return f"consumer-{i}", {"pid": pid}

    def _expire_session(self):
        import ray  # heavy (Ray): imported when used

        i, actor = self._consumer()
        ray.get(actor.expire_session.remote(), timeout=60)
        return f"consumer-{i}", {}

    def _drop_connection(self):
        import ray  # heavy (Ray): imported when used

        i, actor = self._consumer()
        ray.get(actor.drop_connection.remote(), timeout=60)
        return f"consumer-{i}", {}

    def _zookeeper_outage(self):
        seconds = round(self.rng.uniform(2.0, 4.0), 2)
        kit.zookeeper_outage(self.target.zookeeper, seconds)
        return "zookeeper", {"seconds": seconds}

    def _flip_byte(self):
        import ray  # heavy (Ray): imported when used

        t = self.target
        p, actor = self._partition_actor()
        stats = ray.get(actor.stats.remote(), timeout=30)
        start, end = stats["log_start_offset"], stats["high_watermark"]
        if end - start < 1024:
            raise kit.FaultInjectionError(f"{t.topic}/{p} holds too little flushed data to damage yet")
        # a message near the end of the flushed data: likely still to be read
        target_offset = end - self.rng.randrange(256, min(end - start, 64 * 1024))
        offset = ray.get(actor.message_boundaries.remote(start, end, [target_offset]), timeout=30)[0]
        on_host = None if t.hosts is None else t.hosts.host_of(stats["host"])
        size = (kit.message_size(stats["log_dir"], offset) if on_host is None
                else self._on_host(on_host, "message_size", stats["log_dir"], offset))
        if offset + size > end:
            raise kit.FaultInjectionError(f"no whole flushed message of {t.topic}/{p} after {target_offset}")
        entry = {"topic": t.topic, "partition": p, "offset": offset, "next": offset + size}
        # tell the consumers first, so that one meeting the damage knows where to go on
        with open(os.path.join(t.history_dir, DAMAGED_FILE), "a") as f:
            f.write(json.dumps(entry) + "\n")
        if on_host is None:
            flipped = kit.flip_byte(stats["log_dir"], offset, self.rng)
        else:  # the log is on that host's own disk
            flipped = self._on_host(on_host, "flip_byte", stats["log_dir"], offset, self.rng.randrange(2**31))
        detail = {**entry, "position": flipped["position"], "segment": os.path.basename(flipped["segment"])}
        detail.update(self._read_back(p, offset, size))
        return f"{t.topic}/{p}", detail

    def _read_back(self, partition: int, offset: int, size: int) -> dict:
        """Fetch the damaged message through the data path, as a consumer
        would: the damage must be detected. What was served is recorded as a
        poll of the process ``nemesis-reader`` (so a damaged value served as
        good is a garbage-read)."""

        t = self.target
        t0 = time.time()
        # Each read-back is a point read (a seek, then one fetch), not the
        # next read of a stream: without the seek, two read-backs of one
        # partition that were served would look like a poll-skip.
        self.reader.record("seek", t0=t0, topic=t.topic, partition=partition, offset=offset, reason="read back")
        consumer = None
        try:
            consumer = t.client.consumer(t.topic, auto_offset_reset="error")
            consumer.assign([(t.topic, partition)])
            consumer.seek(t.topic, partition, offset)
            records: list = []
            deadline = time.monotonic() + 10
            while not records and time.monotonic() < deadline:
                records = [m for m in consumer.poll(timeout_ms=1000) if m.offset < offset + size]
        except CorruptMessageError as err:
            self.reader.record("poll", t0=t0, reads=[], error=f"CorruptMessageError: {err}"[:300])
            return {"detected": True}
        except RaylogError as err:
            return {"detected": None, "read_back_error": f"{type(err).__name__}: {err}"[:200]}
        finally:
            if consumer is not None:
                consumer.close()
        if not records:
            return {"detected": None, "read_back_error": "nothing was served within 10 s"}
        self.reader.record("poll", t0=t0, reads=[[t.topic, partition, m.offset, m.value.decode(errors="replace")]
                                                 for m in records], error=None)
        return {"detected": False}

    def _remove_node(self):
        t = self.target
        if t.cluster is None or not t.disk_nodes:
            raise kit.FaultInjectionError("remove-node needs a multi-node cluster")
        label = self.rng.choice(sorted(t.disk_nodes))
        node, kwargs = t.disk_nodes[label]
        kit.remove_node(t.cluster, node)
        seconds = round(self.rng.uniform(2.0, 4.0), 2)
        time.sleep(seconds)
        t.disk_nodes[label] = (t.cluster.add_node(**kwargs), kwargs)
        return label, {"down_s": seconds}

    # -- transactions (the transactional workload) -----------------------------------

    def _kill_producer(self):
        writers = self.target.writers
        if not writers:
            raise kit.FaultInjectionError("kill-producer needs the transactional workload's writers")
        writer = self.rng.choice(writers)
        # the first, third ... successor comes after the transaction's timeout, the others at once (fencing)
        return writer.name, writer.kill(wait_timeout=self.counts.get(KILL_PRODUCER, 0) % 2 == 0, timeout_s=60)

    def _kill_coordinator(self):
        import ray  # heavy (Ray): imported when used

        coordinator = self.target.client.transaction_coordinator()  # the running one (or one started)
        pid = ray.get(coordinator.status.remote(), timeout=30)["pid"]
        kit.kill_process(pid)
        started = time.time()
        new_pid = None
        while time.time() - started < OPERATION_WAIT_S and not self._stop.is_set():
            try:  # Ray restarts it; it completes what the killed one left prepared before it answers
                new_pid = ray.get(coordinator.status.remote(), timeout=10)["pid"]
                break
            except Exception:  # noqa: BLE001 - still restarting
                time.sleep(0.2)
        return "transaction-coordinator", {"pid": pid, "new_pid": new_pid,
                                           "serving_after_s": round(time.time() - started, 3)}

    # -- the log cleaner (the compaction workload) ------------------------------------

    def _cleaning_partition(self):
        """(partition, its leader's actor, its stats) of a partition whose actor runs the cleaner."""
        import ray  # heavy (Ray): imported when used

        t = self.target
        partitions = list(range(t.partitions))
        self.rng.shuffle(partitions)
        for p in partitions:
            try:
                actor = t.client.leader_actor(t.topic, p)
                stats = ray.get(actor.stats.remote(), timeout=30)
            except Exception:  # noqa: BLE001 - away under another fault: another partition
                continue
            if stats.get("cleaner_passes") is not None:
                return p, actor, stats
        raise kit.FaultInjectionError(f"no partition actor of {t.topic} runs the log cleaner (a compacted topic "
                                      f"is cleaned by its unreplicated partitions' actors)")

    def _crash_cleaner(self, points) -> tuple[str, dict]:
        """Arm a crash at one of ``points`` in a cleaning partition's log,
        wait for a pass to reach it, then for the actor to serve again."""
        t = self.target
        p, actor, stats = self._cleaning_partition()
        point = self.rng.choice(points)
        on_host = None if t.hosts is None else t.hosts.host_of(stats["host"])
        trigger = self._at_log(on_host, "crash_at", stats["log_dir"], point)
        started = time.time()
        fired = wait_until(lambda: not self._at_log(on_host, "exists", trigger), timeout_s=CLEAN_WAIT_S,
                           interval_s=0.1)
        if not fired and self._at_log(on_host, "disarm", trigger):
            raise kit.FaultInjectionError(f"no cleaning pass of {t.topic}/{p} reached {point} within "
                                          f"{CLEAN_WAIT_S:g} s")
        crashed_after_s = round(time.time() - started, 3)
        new_pid = None
        try:  # Ray restarts it: the fault is over once it answers again
            new_pid = kit.actor_pid(actor, timeout_s=60)
        except kit.FaultInjectionError as err:
            log.warning("%s/%d did not answer after its crash: %s", t.topic, p, err)
        return f"{t.topic}/{p}", {"partition": p, "point": point, "pid": stats["pid"], "new_pid": new_pid,
                                  "cleaner_passes_before": stats["cleaner_passes"],
                                  "crashed_after_s": crashed_after_s}

    def _kill_cleaning(self):
        return self._crash_cleaner(kit.CLEAN_POINTS[1:])

    def _crash_before_swap(self):
        return self._crash_cleaner(("clean-written",))

    def _disk_full_cleaning(self):
        t = self.target
        seconds = round(self.rng.uniform(3.0, 5.0), 2)
        if t.hosts is not None:
            host = self._disk_host()
            path, where = host.data_dir, host.name
        elif t.data_disk is not None:
            host, path, where = None, t.data_disk, "data-disk"
        else:
            raise kit.FaultInjectionError("disk-full-cleaning needs the run's data dir on a file system of its "
                                          "own (a tmpfs: root) or the hosts kit")
        self._cleaning_partition()  # a cleaner runs there
        taken = self._at_log(host, "fill_disk", path)
        try:
            self._for(seconds, seconds)
        finally:
            self._at_log(host, "free_disk", path)
        return where, {"filled_bytes": taken, "full_s": seconds}

    def _at_log(self, host, function: str, path: str, point: str | None = None):
        """A file function of the fault kit on the disk of ``host`` (None: this machine)."""
        if host is None:
            if function == "exists":
                return os.path.exists(path)
            if function == "crash_at":
                return kit.crash_at(path, point)
            return getattr(kit, function)(path)
        code = ("import json, os, sys\nfrom raylog.testing import faults\n"
                "function, path, point = sys.argv[1], sys.argv[2], sys.argv[3]\n"
                "if function == 'exists':\n    out = os.path.exists(path)\n"
                "elif function == 'crash_at':\n    out = faults.crash_at(path, point)\n"
                "else:\n    out = getattr(faults, function)(path)\n"
                "print(json.dumps(out))\n")
        try:
            out = host.python(code, function, path, point or "")
        except kit.FaultInjectionError as err:
            raise kit.FaultInjectionError(f"{function} on {host.name}: {err}") from None
        return json.loads(out.strip().splitlines()[-1])

    # -- hosts and the network (the hosts kit) ---------------------------------------

    @staticmethod
    def _on_host(host, function: str, log_dir: str, offset: int, seed: int | None = None):
        """A disk function of the fault kit, run on ``host`` (its disk is its own)."""
        code = ("import json, random, sys\nfrom raylog.testing import faults\n"
                "log_dir, offset, seed = sys.argv[1], int(sys.argv[2]), sys.argv[3]\n"
                f"if {function!r} == 'flip_byte':\n"
                "    print(json.dumps(faults.flip_byte(log_dir, offset, random.Random(int(seed)))))\n"
                "else:\n"
                "    print(json.dumps(faults.message_size(log_dir, offset)))\n")
        try:
            out = host.python(code, log_dir, str(offset), str(seed))
        except kit.FaultInjectionError as err:
            raise kit.FaultInjectionError(f"{function} on {host.name}: {err}") from None
        return json.loads(out.strip().splitlines()[-1])

    def _hosts(self):
        if self.target.hosts is None:
            raise kit.FaultInjectionError("this fault needs the hosts kit (raylog.testing.hosts)")
        return self.target.hosts

    def _disk_host(self):
        return self.rng.choice(self._hosts().disk_hosts)

    def _leader_host(self):
        """(partition, the host of its leader now)."""
        t, hosts = self.target, self._hosts()
        partitions = list(range(t.partitions))
        self.rng.shuffle(partitions)
        for p in partitions:
            endpoint = t.client.registry.endpoint(t.topic, p)
            if endpoint is not None:
                try:
                    return p, hosts.host_of(endpoint["host"])
                except KeyError:
                    continue
        raise kit.FaultInjectionError(f"no partition of {t.topic} has a leader serving now")

    def _for(self, low: float, high: float) -> float:
        seconds = round(self.rng.uniform(low, high), 2)
        self._stop.wait(seconds)
        return seconds

    def _cut_host(self):
        hosts = self._hosts()
        host = self._disk_host()
        kit.cut_host(host)
        try:
            seconds = self._for(4.0, 10.0)
        finally:
            kit.heal(hosts)
        return host.name, {"address": host.address, "down_s": seconds}

    def _partition_hosts(self):
        hosts = self._hosts()
        members = list(hosts.hosts)
        self.rng.shuffle(members)
        cut = self.rng.randrange(1, len(members))
        side_a, side_b = sorted(members[:cut], key=lambda h: h.name), sorted(members[cut:], key=lambda h: h.name)
        kit.partition(side_a, side_b)
        try:
            seconds = self._for(4.0, 10.0)
        finally:
            kit.heal(hosts)
        return "hosts", {"sides": [[h.name for h in side_a], [h.name for h in side_b]], "down_s": seconds}

    def _one_way_partition(self):
        hosts = self._hosts()
        source, target = self.rng.sample(hosts.disk_hosts, 2)
        kit.one_way_partition([source], [target])
        try:
            seconds = self._for(4.0, 10.0)
        finally:
            kit.heal(hosts)
        return f"{source.name}->{target.name}", {"from": source.name, "to": target.name, "down_s": seconds}

    def _zombie_leader(self):
        hosts = self._hosts()
        p, host = self._leader_host()
        if host is hosts.head:
            raise kit.FaultInjectionError(f"the leader of {self.target.topic}/{p} runs on ZooKeeper's host")
        kit.cut_from_zookeeper(host, hosts)
        try:
            seconds = self._for(12.0, 18.0)
        finally:
            kit.heal(hosts)
        return host.name, {"partition": p, "cut_from_zookeeper_s": seconds}

    def _kill_host(self):
        hosts = self._hosts()
        host = self._disk_host()
        pids = kit.kill_host(host)
        seconds = self._for(2.0, 4.0)
        # started again once Ray counts the old node dead (its health checks:
        # slower on a busy machine), never two nodes of one address alive; a
        # start beside the old node fails each of its tries at once
        dead = wait_until(lambda: not ray_node_alive(host), timeout_s=NODE_DEATH_WAIT_S, interval_s=0.5)
        hosts.restart_ray(host, retries=1)  # a start waits up to 2 min for its registration
        return host.name, {"pids": len(pids), "down_s": seconds, "old_node_dead_first": dead}

    def _pause_host(self):
        host = self._disk_host()
        seconds = round(self.rng.uniform(2.0, 4.0), 2)
        pids = kit.pause_host(host, seconds)
        return host.name, {"pids": len(pids), "seconds": seconds}
