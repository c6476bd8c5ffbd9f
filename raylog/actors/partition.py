"""The partition actor: owns one partition log on its node's disk and serves it.

One detached, named Ray actor per partition (name ``<cluster>/<topic>/<p>``
in the ``raylog`` namespace), pinned to the node that holds its log. On
start (and on every restart by Ray after its process died) it

1. opens the log, which recovers it: a torn or corrupt tail is truncated
   and reported (see :attr:`PartitionLog.recovery_reports`);
2. runs a :class:`~raylog.transfer.server.DataServer` on its node's address
   and an OS-chosen port: produce requests in, fetch replies out with
   ``os.sendfile``;
3. takes a new **epoch** (the version of its placement node in ZooKeeper,
   bumped once per start) and registers its ephemeral endpoint
   ``{"host", "port", "actor", "epoch"}``, re-registering after a ZooKeeper
   session loss;
4. runs one timer thread: flush every few milliseconds when due
   (``flush_ms``), roll a segment older than ``segment_ms``, retention every
   ``retention_check_ms``;
5. watches its topic's config node (:mod:`raylog.zk.live_config`): the
   config as stored is taken before the endpoint is registered (a restarted
   actor's first arguments may be older), and each later change while it
   serves (``client.alter_topic``, Kafka's AlterConfigs): the log takes the
   live settings and the cleaner starts or stops with ``cleanup_policy``.

Data never goes through Ray method calls; the methods here are small control
calls (stats, offsets, flush, shutdown). A full disk is not a disk error:
the log refuses writes with the retriable ``DiskFullError`` while the actor
keeps serving reads, and its timer resumes writes once there is room
(``PartitionLog.maybe_resume``). Any other disk error of the log (append,
fsync, roll, retention; in any thread) ends the process (exit status
:data:`EXIT_DISK_ERROR`, after logging) so that Ray restarts the actor and
recovery runs again: a partition is never left wedged. Starting while
ZooKeeper is away, the actor retries it for a while, then ends its process
the same way (:mod:`raylog.actors.process_exit`).

Actor-confinement: the log is shared by the server's connection threads,
the timer thread and the method threads; :class:`PartitionLog` serializes its
writers and lets readers run concurrently. :attr:`PartitionActor.config` and the
cleaner are replaced by a live config change (kazoo's thread) under
``_config_lock``; everything else here is written only in ``__init__`` and
``shutdown``.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import shutil
import threading
import time

from raylog import auth
from raylog.actors.placement import scheduling_options
from raylog.actors.process_exit import (
    EXIT_DISK_ERROR,
    EXIT_TIMER_FAILED,
    STARTUP_ZOOKEEPER_WAIT_S,
    exit_process,
    until_zookeeper,
)
from raylog.config import NAMESPACE, TopicConfig, actor_name
from raylog.errors import AuthenticationError, ClosedError, HandoffError, NotOwnerError, OffsetOutOfRangeError
from raylog.metrics import PartitionMetrics
from raylog.replication.mend import damaged_ranges, mend_from_isr
from raylog.replication.preferred import PreferredWatch
from raylog.replication.replica import MAINTAIN_INTERVAL_S, ReplicaRole
from raylog.storage.cleaner_thread import CleanerThread
from raylog.replication.state import leave_isr, running_replicas
from raylog.retry import RetryPolicy
from raylog.storage import faults
from raylog.storage.log import PartitionLog
from raylog.storage.owner_only import tighten as tighten_to_owner
from raylog.transfer.protocol import FRAME_OVERHEAD_BYTES
from raylog.transfer.server import DataServer
from raylog.zk.errors import zookeeper_errors
from raylog.zk.live_config import watch_topic_config
from raylog.zk.registry import Registry
from raylog.zk.session import connect_kazoo
from raylog.zk.tombstones import check_before_serving

log = logging.getLogger(__name__)

#: exit status of a leader replica that found another replica leading
#: (beside :mod:`raylog.actors.process_exit`'s)
EXIT_DEPOSED = 77
#: exit status of a leader that could not register its endpoint (Ray starts it again)
EXIT_UNREGISTERED = 78
#: how long a replica retries registering its endpoint before that
REREGISTER_S = 120.0
#: how often a leader looks whether its preferred replica should lead again
PREFERRED_CHECK_S = 5.0
#: an idle log's timer sleeps at most this long between its duties (an
#: append wakes it at once): many idle partitions cost a node next to nothing
IDLE_WAIT_S = 0.5
#: how long a replica stopped with SIGTERM may take to leave in order (hand off its lead, leave the ISR)
SIGTERM_DRAIN_S = 15.0
#: how long a partition actor that Ray started again waits for its log
#: directory's lock: Ray starts it as soon as the process before it says it
#: is leaving, which may still be leaving in order (SIGTERM_DRAIN_S) and
#: closing its log; a first start waits LOCK_WAIT_FIRST_S (another owner is
#: then a misconfiguration, reported soon)
LOCK_WAIT_S = SIGTERM_DRAIN_S + 15.0
LOCK_WAIT_FIRST_S = 2.0


def _lock_wait_s() -> float:
    """LOCK_WAIT_S in an actor Ray started again, else LOCK_WAIT_FIRST_S."""
    try:
        import warnings

        import ray  # heavy (Ray): imported when used

        with warnings.catch_warnings():  # the property reads Ray's own deprecated actor_id
            warnings.simplefilter("ignore")
            restarted = ray.get_runtime_context().was_current_actor_reconstructed
    except Exception:  # noqa: BLE001 - outside an actor (tests constructing it directly)
        restarted = False
    return LOCK_WAIT_S if restarted else LOCK_WAIT_FIRST_S


class PartitionActor:
    """The body of the partition actor (wrapped with ``ray.remote`` by
    :func:`start_partition_actor`)."""

    def __init__(
        self,
        zookeeper: str,
        cluster: str,
        topic: str,
        partition: int,
        log_dir: str,
        config_json: bytes,
        host: str | None = None,
        token: bytes | None = None,
        replica: str | None = None,
        name: str | None = None,
    ):
        from kazoo.protocol.states import KazooState  # only here: imported when used


        import hmac  # only here: imported when used


        self.topic, self.partition, self.cluster = topic, partition, cluster
        # The actor derives the cluster token itself (raylog.auth); a caller
        # that names another one may not serve or restart the partition.
        self._token = auth.cluster_token(cluster)
        if token is not None and not hmac.compare_digest(bytes(token), self._token):
            raise AuthenticationError(
                f"refusing to serve {topic}-{partition}: the caller's token is not the token of "
                f"cluster {cluster!r}"
            )
        self.config = TopicConfig.from_json(config_json)
        self.log_dir = log_dir
        self.started_at = time.time()
        self._closed = threading.Event()
        self._handoff_lock = threading.Lock()
        self._preferred = PreferredWatch()
        #: replication (raylog.replication): this replica's node, its role once known
        self.replica, self.role = replica, None
        self.name = name or actor_name(cluster, topic, partition)

        deadline = time.monotonic() + STARTUP_ZOOKEEPER_WAIT_S
        what = f"partition {topic}-{partition}"
        until_zookeeper(deadline, what, check_before_serving, zookeeper, cluster, topic, partition, log_dir,
                        replica)
        # <data_dir>/<cluster>/<topic>-<partition> (raylog.admin.topics): the two
        # directories above the log's are the owner's only too (raylog.storage.owner_only)
        for directory in (os.path.dirname(os.path.dirname(log_dir)), os.path.dirname(log_dir)):
            tighten_to_owner(directory, "the data directory", recursive=False)
        self.log = PartitionLog(log_dir, self.config, on_disk_error=self._disk_error, on_flush=self._flush_timed,
                                lock_wait_s=_lock_wait_s())
        for report in self.log.recovery_reports:
            log.warning("partition %s-%d recovered with loss: %s", topic, partition, report)
        self._metrics = PartitionMetrics(cluster, topic, partition, self.log)

        if host is None:
            import ray  # heavy (Ray): imported when used

            host = ray.util.get_node_ip_address()

        self.server = DataServer(
            self._resolve,
            host=host,
            port=0,
            token=self._token,
            max_frame_bytes=self.config.max_message_bytes + FRAME_OVERHEAD_BYTES,
            resolve_replica=self._resolve_replica,
        )
        self.host, self.port = self.server.start()
        self.log.node = self.replica or self.host  # named in a DiskFullError (a full disk: see PartitionLog)

        self.zk = None
        #: live config changes (raylog.zk.live_config): the watch, and the lock that
        #: orders applying one with starting and stopping the cleaner
        self._config_watch = None
        self._config_lock = threading.Lock()
        self._cleaner, self._cleaner_ready = None, False
        until_zookeeper(deadline, what, self._join, zookeeper)

        def on_state(state):
            if state == KazooState.LOST and not self._closed.is_set():
                # Ephemeral nodes died with the session: register again from
                # a thread of our own (no ZooKeeper calls in the listener).
                threading.Thread(target=self._reregister, daemon=True).start()

        self.zk.add_listener(on_state)
        #: damaged ranges recovery kept, mended from an in-sync replica (raylog.replication.mend)
        self.mended: list[dict] = []
        if self.role is not None and damaged_ranges(self.log):
            threading.Thread(target=self._mend, name="raylog-mend", daemon=True).start()
        self._timer = threading.Thread(target=self._run_timers, name="raylog-timers", daemon=True)
        self._timer.start()
        #: the log cleaner of a compacted topic (raylog.storage.cleaner_thread); every replica
        #: runs its own, up to the committed offset (ReplicaRole.committed_offset)
        self._cleaner = CleanerThread.for_log(self.log)
        with self._config_lock:  # from now on a changed cleanup_policy starts or stops it
            self._cleaner_ready = True
        self._sync_cleaner()
        if self.role is not None:
            # SIGTERM (a node stopped): Ray's worker exits through atexit; leave in order first
            atexit.register(self.leave_on_exit)

    def _join(self, zookeeper: str) -> None:
        """Connect to ZooKeeper, take the replica's role, a new endpoint epoch
        (leaders), and register the endpoint. Run again from the start when
        ZooKeeper went away in between."""
        if self.zk is not None:
            self.zk.stop()
            self.zk.close()
        self.zk = connect_kazoo(zookeeper, token=self._token, cluster=self.cluster)
        self.registry = Registry(self.zk, self.cluster)
        topic, partition = self.topic, self.partition
        with zookeeper_errors(self.zk, f"start serving {topic}-{partition}"):
            if self.replica is None and self.config.replication_factor > 1:  # started by name alone (a repair)
                self.replica = self.registry.placement(topic, partition)["node"]
            if self.replica is not None:
                self.role = ReplicaRole(self.zk, self.registry, topic, partition, self.replica, self.log,
                                        self._token, on_promoted=self._take_lead, on_deposed=self._deposed)
            self.epoch = 0
            if self.role is None or self.role.is_leader:  # followers leave the endpoint's epoch alone
                self._new_epoch()
            # the topic's config as it is now (it may have changed since the actor was made:
            # Ray restarts it with its first arguments), then every change, before clients find it
            if self._config_watch is not None:
                self._config_watch.stop()
            self._config_watch = watch_topic_config(self.registry, topic, self._apply_config)
            self._register()

    def _apply_config(self, config: TopicConfig) -> None:
        """A live change of the topic's config (:mod:`raylog.zk.live_config`;
        kazoo's thread): the log takes what may change while it serves
        (:meth:`PartitionLog.reconfigure` says which), the timer reads
        retention_check_ms, flush_ms and segment_ms from :attr:`config`
        at its next tick, and the cleaner starts or stops with
        ``cleanup_policy``."""
        with self._config_lock:
            if config == self.config:
                return
            self.log.reconfigure(config)
            changed = {k: v for k, v in dataclasses.asdict(self.log.config).items() if getattr(self.config, k) != v}
            self.config = self.log.config
        if changed:
            log.warning("partition %s-%d takes its topic's changed config: %s", self.topic, self.partition, changed)
        self._sync_cleaner()

    def _sync_cleaner(self) -> None:
        """Start the cleaner when the topic is compacted now and none runs;
        stop it (after the pass in progress, without waiting here) when the
        topic no longer is. Where a cleaner runs at all is decided as at
        start (the line that makes :attr:`_cleaner` in ``__init__``)."""
        with self._config_lock:
            if not self._cleaner_ready or self._closed.is_set():
                return
            wanted = self.config.compacted
            running = self._cleaner is not None and self._cleaner.running
            if wanted and not running:
                self._cleaner = CleanerThread.for_log(self.log)
            elif not wanted and self._cleaner is not None:
                self._cleaner.stop(timeout_s=0)
                self._cleaner = None

    def cleaner_state(self) -> dict | None:
        """The cleaner's state for ``raylog topics describe``: None when the
        topic is not compacted, else ``{"dirty_ratio", "running", "passes",
        "bytes_cleaned", "bytes_removed", "records_removed", "last_run_ms",
        "failure"}``
        (:meth:`CleanerThread.state`; counted since this actor started)."""
        ratio = self.log.dirty_ratio()
        if ratio is None:
            return None
        cleaner = self._cleaner
        state = cleaner.state() if cleaner is not None else {
            "running": False, "passes": 0, "bytes_cleaned": 0, "bytes_removed": 0, "records_removed": 0,
            "last_run_ms": None, "failure": None}
        return {"dirty_ratio": ratio, **state}

    def _mend(self) -> None:
        try:
            self.mended = mend_from_isr(self.zk, self.registry.paths, self.topic, self.partition, self.replica,
                                        self.log, self._token, damaged_ranges(self.log))
        except Exception:  # noqa: BLE001 - the damage stays reported; readers can skip it
            log.exception("partition %s-%d: mending damaged bytes from a replica failed", self.topic, self.partition)

    def _flush_timed(self, seconds: float) -> None:
        """The log's flush hook: every flush is timed in the metrics (from
        whichever thread ran it: the timer, the log's flush thread)."""
        metrics = getattr(self, "_metrics", None)  # none yet while the log opens
        if metrics is not None:
            metrics.observe_flush(seconds)
        role = getattr(self, "role", None)
        if role is not None:
            role.on_flush()  # a leader's committed offset may move now

    def _disk_error(self, err: BaseException) -> None:
        """Any disk error of the log (append, fsync, roll, retention): end the
        process so that Ray restarts the actor and recovery runs. Never a
        wedged partition that answers a retriable error forever."""
        if self._closed.is_set():
            return
        exit_process(EXIT_DISK_ERROR, "disk error in partition %s-%d (%s); exiting so that Ray restarts the actor "
                     "and recovers the log", self.topic, self.partition, err)

    # -- data server ---------------------------------------------------------

    def _resolve(self, topic: str, partition: int):
        if partition != self.partition or self._closed.is_set():
            return None
        if self.replica is not None:  # replicated: the role decides (nothing before it is known)
            return None if self.role is None else self.role.resolve(topic)
        return self.log if topic == self.topic else None

    def _resolve_replica(self, topic: str, partition: int):
        """The leader that answers its followers' REPLICA_FETCH here, or None."""
        if partition != self.partition or self._closed.is_set() or self.role is None:
            return None
        return self.role.resolve_replica(topic)

    # -- registration --------------------------------------------------------

    def _register(self):
        if self.role is not None:
            self.role.register(self.host, self.port, self.name)
            if not self.role.is_leader:
                return
        self.registry.register_endpoint(
            self.topic,
            self.partition,
            self.host,
            self.port,
            self.name,
            self.epoch,
        )

    def _take_lead(self):
        """This follower became the leader (called on the follower's thread,
        which ends then): a new endpoint epoch, the endpoint. ZooKeeper away
        meanwhile (a host cut off) is retried; a leader that cannot register
        would hold the lead while no client finds it, so it ends its process
        instead (:meth:`_reregister`)."""
        log.warning("partition %s-%d: replica %s is the leader now", self.topic, self.partition, self.replica)
        self._reregister(new_epoch=True)

    def _deposed(self):
        """This leader found another replica leading (it was away: a dead
        process restarted late, or cut off from ZooKeeper): end the process,
        so that Ray starts the actor again as a follower, which truncates to
        the new leader's epoch boundary before it follows."""
        if self._closed.is_set():
            return
        exit_process(EXIT_DEPOSED, "partition %s-%d: replica %s is no longer the leader; exiting so that Ray "
                     "starts it again as a follower", self.topic, self.partition, self.replica)

    def _new_epoch(self) -> None:
        placement_path = self.registry.paths.partition(self.topic, self.partition)
        with zookeeper_errors(self.zk, f"take a new endpoint epoch for {self.topic}-{self.partition}"):
            data, _ = self.zk.get(placement_path)
            self.epoch = self.zk.set(placement_path, data).version

    def _register_once(self, new_epoch: bool) -> None:
        """One try of :meth:`_reregister`: a new endpoint epoch first (a replica taking the lead)."""
        if new_epoch:
            self._new_epoch()
        with zookeeper_errors(self.zk, f"register the endpoint of {self.topic}-{self.partition}"):
            self._register()

    def _reregister(self, new_epoch: bool = False):
        """Register the endpoint again (the session was lost: ephemeral
        nodes went with it), after a new endpoint epoch with ``new_epoch``.
        Retries what is retriable (ZooKeeper still away) for up to
        :data:`REREGISTER_S`. A newer epoch (StaleEpochError: another
        incarnation serves) or ZooKeeper away for longer ends the process of
        a replica that leads (or of an unreplicated partition): Ray starts
        it again and it reads its role afresh; a process that stayed would
        keep the lead while no client can find it."""
        try:
            RetryPolicy(max_tries=1000, delay_s=0.2, max_delay_s=2.0, deadline_s=REREGISTER_S).call(
                self._register_once, new_epoch)
        except Exception:  # noqa: BLE001
            if self._closed.is_set():
                return
            if self.role is None or self.role.is_leader:
                exit_process(EXIT_UNREGISTERED, "partition %s-%d could not register its endpoint; exiting so that "
                             "Ray starts it again", self.topic, self.partition, exc_info=True)
            log.exception("partition %s-%d could not register its replica again", self.topic, self.partition)

    # -- timers --------------------------------------------------------------

    def _tick_s(self) -> float:
        """The timer's tick, from ``flush_ms`` (which may change while it runs)."""
        return max(0.001, min(self.config.flush_ms, 50) / 2000.0)

    def _run_timers(self):
        next_retention = time.monotonic() + self.config.retention_check_ms / 1000.0
        next_sample = time.monotonic()
        next_preferred = time.monotonic() + PREFERRED_CHECK_S
        try:
            while not self._closed.wait(self._tick_s()):
                if not self.log.unflushed_messages and not self.log.disk_full:
                    # idle: sleep until an append (or the next periodic duty)
                    now = time.monotonic()
                    due = min(next_retention, next_sample, now + self._idle_wait_s())
                    if due > now:
                        self.log.wait_for_appends(due - now)
                    if self._closed.is_set():
                        break
                self.log.maybe_flush()  # timed by the log's on_flush, as every flush
                if self.role is not None:
                    self.role.tick()
                    if time.monotonic() >= next_preferred:
                        next_preferred = time.monotonic() + PREFERRED_CHECK_S
                        self._maybe_prefer()
                self.log.maybe_resume()  # a full disk: writes resume once there is room (one statvfs while full)
                if self.log.maybe_roll():
                    log.info("partition %s-%d rolled its segment after segment_ms", self.topic, self.partition)
                if time.monotonic() >= next_sample:
                    self._metrics.sample(self.log, self.server.stats())
                    next_sample = time.monotonic() + self._metrics.interval_s
                if time.monotonic() >= next_retention:
                    deleted = self.log.delete_old_segments()
                    if deleted:
                        log.info("partition %s-%d retention deleted %s", self.topic, self.partition, deleted)
                    next_retention = time.monotonic() + self.config.retention_check_ms / 1000.0
        except OSError:
            exit_process(EXIT_DISK_ERROR, "disk error in partition %s-%d; restarting the actor", self.topic,
                         self.partition, exc_info=True)
        except Exception:  # noqa: BLE001 - the timer is the partition's heartbeat: a bug here restarts the actor
            if not self._closed.is_set():
                exit_process(EXIT_TIMER_FAILED, "partition %s-%d timer failed; restarting the actor", self.topic,
                             self.partition, exc_info=True)

    def _idle_wait_s(self) -> float:
        """How long the timer of an idle log may sleep: :data:`IDLE_WAIT_S`,
        less for a leader of replicas (its ISR review runs every
        ``MAINTAIN_INTERVAL_S``) and for a short ``segment_ms``."""
        wait = min(IDLE_WAIT_S, self.config.segment_ms / 2000.0)
        if self.role is not None and self.role.leader is not None:
            wait = min(wait, MAINTAIN_INTERVAL_S)
        return wait

    def _maybe_prefer(self) -> None:
        """A leader that is not the preferred replica hands its lead there
        once that one has been in sync for a quiet period
        (:class:`~raylog.replication.preferred.PreferredWatch`), on a thread
        of its own (the timer goes on flushing)."""
        leader = self.role.leader
        if leader is None or leader.deposed or self._handoff_lock.locked():
            return
        state = leader.state
        if state.replicas[0] == self.replica:
            return
        try:
            running = running_replicas(self.zk, self.registry.paths, self.topic, self.partition)
        except Exception:  # noqa: BLE001 - ZooKeeper away: next time
            return
        target = self._preferred.due(state, self.replica, running)
        if target is not None:
            def move():
                try:
                    self.hand_off(target, token=self._token)
                except Exception as err:  # noqa: BLE001 - stays the leader; tried again after the next quiet period
                    log.info("%s-%d: handing the lead back to %s failed: %s", self.topic, self.partition, target, err)

            threading.Thread(target=move, name="raylog-preferred", daemon=True).start()

    # -- control methods -----------------------------------------------------

    def ping(self) -> bool:
        return True

    def pid(self) -> int:
        return os.getpid()

    def node_id(self) -> str:
        """The Ray node id this actor runs on (changes with a node restart)."""
        import ray  # heavy (Ray): imported when used

        return ray.get_runtime_context().get_node_id()

    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def offsets(self) -> tuple[int, int]:
        """``(log start offset, high watermark)``."""
        return self.log.log_start_offset, self.log.high_watermark

    def flush(self) -> int:
        self.log.flush()
        return self.log.high_watermark

    def stats(self) -> dict:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "pid": os.getpid(),
            "host": self.host,
            "port": self.port,
            "epoch": self.epoch,
            "log_dir": self.log_dir,
            "log_start_offset": self.log.log_start_offset,
            "high_watermark": self.log.high_watermark,
            "log_end_offset": self.log.log_end_offset,
            "size_bytes": self.log.size_bytes,
            "segments": len(self.log.segment_bases),
            "recovery_reports": [r._asdict() for r in self.log.recovery_reports],
            "disk_full": self.log.disk_full,
            # passes of this process's cleaner (None: the log is not cleaned here)
            "cleaner_passes": None if self._cleaner is None else self._cleaner.passes,
            "mended": list(self.mended),
            "cleaner": self.cleaner_state(),
            "uptime_s": time.time() - self.started_at,
            "server": self.server.stats(),
        }

    def replica_status(self) -> dict:
        """This replica's node, role and log end (replicated partitions)."""
        if self.role is None:
            return {"node": self.replica, "role": "single", "log_end_offset": self.log.log_end_offset}
        return self.role.status()

    def hand_off(self, target: str, timeout_s: float = 10.0, token: bytes | None = None) -> dict:
        """Hand this leader's lead to the in-sync replica on ``target``
        (:mod:`raylog.replication.handoff`): refuse new appends, let it
        reach the log end, switch by compare-and-set, remove this endpoint,
        follow the new leader in this process, and wait (at most
        ``timeout_s`` more) until the new leader registers its endpoint.
        Returns ``{"leader", "leader_epoch", "log_end", "refused_at",
        "leaderless_s"}`` (``leaderless_s`` None when the new endpoint did
        not appear in time). Raises ``HandoffError`` (retriable, nothing
        changed). Requires the cluster token."""
        self._check_token(token, "hand-off")
        with self._handoff_lock:
            if self.role is None:
                raise HandoffError(f"{self.topic}-{self.partition} is not replicated; there is no lead to hand off")
            result = self.role.hand_off(target, timeout_s)
            try:
                self.registry.unregister_endpoint(self.topic, self.partition, self.epoch)
            except Exception:  # noqa: BLE001 - ZooKeeper away: the new leader's registration replaces it
                log.warning("%s-%d: the old endpoint was not removed after the handoff", self.topic, self.partition,
                            exc_info=True)
            self.role.follow_new_leader()
            result["leaderless_s"] = None
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                endpoint = self.registry.endpoint(self.topic, self.partition)
                if endpoint is not None and endpoint.get("actor") != self.name:
                    result["leaderless_s"] = time.time() - result["refused_at"]
                    break
                time.sleep(0.005)
            log.warning("partition %s-%d: lead handed to %s (%s s without a leader)", self.topic, self.partition,
                        target, result["leaderless_s"])
            return result

    def shed_follower(self, node: str, hold_s: float = 600.0, token: bytes | None = None) -> bool:
        """This leader takes the follower on ``node`` out of the ISR and keeps
        it out until it restarts (at most ``hold_s``): a drain of ``node``.
        False when the ISR would fall below ``min_insync_replicas``."""
        self._check_token(token, "shed-follower")
        if self.role is None or self.role.leader is None:
            return False
        return self.role.leader.shed(node, hold_s)

    def leave_on_exit(self, deadline_s: float = SIGTERM_DRAIN_S) -> str | None:
        """A process ending without a shutdown (SIGTERM: its node stops),
        Kafka's controlled shutdown, bounded by ``deadline_s``: a leader
        hands its lead to an in-sync replica that runs; a follower leaves
        the ISR (while it stays at least ``min_insync_replicas``), so that
        ``acks="all"`` does not wait for it. What was done, or None."""
        if self._closed.is_set() or self.role is None:
            return None
        from raylog.replication.handoff import choose_target

        try:
            role, leader = self.role, self.role.leader
            if leader is not None and not leader.deposed:
                target = choose_target(leader.state, running_replicas(self.zk, self.registry.paths, self.topic,
                                                                      self.partition), avoid=(self.replica,))
                if target is None:
                    return None
                self.hand_off(target, timeout_s=deadline_s / 2, token=self._token)
                return f"handed to {target}"
            if role.follower is not None:
                return "left the ISR" if leave_isr(self.zk, self.registry.paths, self.topic, self.partition,
                                                   self.replica, self.config.min_insync_replicas) else None
        except Exception:  # noqa: BLE001 - exiting anyway: the followers take over as after a failure
            log.warning("%s-%d: leaving in order at exit failed", self.topic, self.partition, exc_info=True)
        return None

    def _check_token(self, token, what: str) -> None:
        import hmac  # only here: imported when used

        if token is None or not hmac.compare_digest(bytes(token), self._token):
            raise AuthenticationError(f"{what} of {self.topic}-{self.partition} refused: "
                                      f"{'no token' if token is None else 'a wrong token'}; pass the cluster's token")

    def metrics(self) -> dict:
        """The partition's metric values (sampled now; see :mod:`raylog.metrics`)."""
        self._metrics.sample(self.log, self.server.stats())
        return self._metrics.snapshot()

    def write_marker(self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int) -> int:
        """The transaction coordinator's call (docs/design.md section 6):
        append the marker ending ``producer_id``'s transaction here,
        committed or aborted (:meth:`PartitionLog.append_marker`), and
        return its offset once it is stored as an ``acks="all"`` write is:
        synced and below the high watermark; on a replicated partition
        confirmed by the in-sync replicas (the marker is replicated like
        any batch). Leader only: a follower, or a replica that is not
        serving, raises the retriable :class:`NotOwnerError` (the
        coordinator looks the leader up again and retries). The log's
        refusals come as they are: ``InvalidProducerEpochError`` and
        ``TransactionCoordinatorFencedError`` (nothing written),
        ``NotEnoughReplicasError``, ``DiskFullError``. A repeated marker
        (the coordinator trying again) is harmless: it ends no transaction
        a second time."""
        view = self._resolve(self.topic, self.partition)
        leader = None if self.role is None else self.role.leader
        if view is None or (self.role is not None and leader is None):
            raise NotOwnerError(f"{self.topic}-{self.partition}: this replica does not lead the partition now; "
                                f"look its endpoint up again and write the marker there",
                                topic=self.topic, partition=self.partition)
        try:
            if leader is None:
                offset = self.log.append_marker(producer_id, producer_epoch, bool(commit), coordinator_epoch)
            else:
                view.before_acks_all()  # refused before appending while the ISR is too small
                leader.begin_append()
                try:
                    offset = self.log.append_marker(producer_id, producer_epoch, bool(commit), coordinator_epoch,
                                                    leader_epoch=leader.state.leader_epoch)
                finally:
                    leader.end_append()
            view.flush()  # acks="all": synced, and (replicated) confirmed by the ISR
        except ClosedError:
            raise NotOwnerError(f"{self.topic}-{self.partition} is closing; write the marker where it is served "
                                f"next", topic=self.topic, partition=self.partition) from None
        return offset

    def active_producers(self) -> list[dict]:
        """The producers this replica's log remembers
        (:meth:`PartitionLog.active_producers`): Kafka's DescribeProducers
        asks the partition's leader for them."""
        return self.log.active_producers()

    def message_boundaries(self, start: int, end: int, targets: list[int]) -> list[int]:
        """For each target, the first message boundary at or after it within
        ``[start, end]`` (see :meth:`PartitionLog.message_boundaries`); the
        read planner splits large ranges with it."""
        return self.log.message_boundaries(start, end, targets)

    def delete_old_segments(self) -> list:
        return self.log.delete_old_segments()

    def delete_records(self, offset: int, token: bytes | None = None, validate_only: bool = False) -> int:
        """Delete the partition's records before ``offset`` (Kafka's
        DeleteRecords; :meth:`PartitionLog.delete_records_before`): the log
        start moves there (-1: the high watermark) and is kept on disk;
        returns the new log start. The high watermark bounding ``offset`` is
        the one readers see: on a replicated partition the leader's committed
        offset, and the followers take the new start from their next fetch
        (``log_start_offset`` of its answer). Leader only: a follower, or a
        replica not serving, raises the retriable :class:`NotOwnerError`.
        :class:`~raylog.errors.OffsetOutOfRangeError` (naming the bounds)
        for an offset past the high watermark: nothing changes.
        ``validate_only``: only that check, against the same high watermark,
        and the log start as it is answered. Requires the cluster token."""
        self._check_token(token, "delete-records")
        view = self._resolve(self.topic, self.partition)
        if view is None or (self.role is not None and self.role.leader is None):
            raise NotOwnerError(f"{self.topic}-{self.partition}: this replica does not lead the partition now; "
                                f"delete the records at its leader", topic=self.topic, partition=self.partition)
        if validate_only:
            hw, start = view.high_watermark, self.log.log_start_offset
            if offset != -1 and not 0 <= offset <= hw:
                raise OffsetOutOfRangeError(
                    f"cannot delete the records of {self.topic}-{self.partition} before offset {offset}: it lies "
                    f"outside [0, {hw}] (the log holds [{start}, {hw}]; -1 means the high watermark); nothing was "
                    f"deleted", topic=self.topic, partition=self.partition, offset=offset, earliest=start, latest=hw)
            return start
        try:
            start = self.log.delete_records_before(offset, high_watermark=view.high_watermark)
        except ClosedError:
            raise NotOwnerError(f"{self.topic}-{self.partition} is closing; delete the records where it is "
                                f"served next", topic=self.topic, partition=self.partition) from None
        log.info("partition %s-%d: records before %d deleted (asked: %d)", self.topic, self.partition, start,
                 offset)
        return start

    def shutdown(self, delete_data: bool = False, token: bytes | None = None) -> None:
        """Stop serving: endpoint gone, server stopped, log flushed and closed
        (``delete_data``: its directory removed). Requires the cluster token."""
        import hmac  # only here: imported when used


        if token is None or not hmac.compare_digest(bytes(token), self._token):
            raise AuthenticationError(
                f"shutdown of {self.topic}-{self.partition} refused: "
                f"{'no token' if token is None else 'a wrong token'}; pass the cluster's token"
            )
        if self._closed.is_set():
            return
        self._closed.set()
        self.log.wake_waiting_timer()
        if self.role is not None:
            self.role.stop()
        try:
            if self.role is None or self.role.is_leader:
                self.registry.unregister_endpoint(self.topic, self.partition, self.epoch)
        except Exception:  # noqa: BLE001 - ZooKeeper may already be gone
            pass
        self.server.stop()
        self._timer.join(timeout=5)
        if self._config_watch is not None:
            self._config_watch.stop()
        with self._config_lock:
            cleaner, self._cleaner = self._cleaner, None
        if cleaner is not None:
            cleaner.stop()
        try:
            self.log.flush()
        finally:
            self.log.close()
        try:
            self.zk.stop()
            self.zk.close()
        except Exception:  # noqa: BLE001
            pass
        if delete_data:
            shutil.rmtree(self.log_dir, ignore_errors=True)


def partition_actor_class():
    import ray  # heavy (Ray): imported when used

    return ray.remote(num_cpus=0, max_restarts=-1, max_concurrency=4)(PartitionActor)


def start_partition_actor(
    *,
    zookeeper: str,
    cluster: str,
    topic: str,
    partition: int,
    log_dir: str,
    config: TopicConfig,
    node_identity: str,
    nodes: list[dict],
    host: str | None = None,
    token: bytes | None = None,
    replica: str | None = None,
    name: str | None = None,
):
    """Start (or find, if it runs) the partition actor pinned to its node
    (``replica``, ``name``: a replica of a replicated partition, see
    :mod:`raylog.replication`)."""

    options = scheduling_options(node_identity, nodes)
    if faults.ENV in os.environ:
        # The fault-injection switch of the creating process travels to the
        # actor (tests of the disk-error paths).
        options["runtime_env"] = {"env_vars": {faults.ENV: os.environ[faults.ENV]}}
    return (
        partition_actor_class()
        .options(
            name=name or actor_name(cluster, topic, partition),
            namespace=NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            **options,
        )
        .remote(zookeeper, cluster, topic, partition, log_dir, config.to_json(), host, token, replica, name)
    )
