"""The mirror's controller: a named detached Ray actor in the target cluster
(``mirror:<target cluster>:<name>`` in namespace
:data:`raylog.mirror.spec.NAMESPACE`), so that the CLI finds it.

It starts the members (Ray actors that Ray restarts when killed:
``max_restarts=-1``; they die with the controller, which Ray restarts too),
scans the source every ``scan_interval_s`` and creates the target topic of
each source topic that starts matching (same partition count and settings;
the replication factor is the target's default), and answers ``status``
and ``stop``.

Every :data:`METRICS_INTERVAL_S` it records each partition's lag
(messages, seconds, bytes) as Ray metrics (:func:`raylog.metrics.record_mirror_lag`).

Thread-safety: the scan and the metrics run on threads of their own; topic creation and
``status`` use the clients, which are thread-safe.
"""

from __future__ import annotations

import logging
import threading
import time

from raylog.errors import MirrorTopicMismatchError, TopicExistsError
from raylog.metrics import record_mirror_lag
from raylog.mirror import progress, spec as specs
from raylog.mirror.member import MirrorMember, source_client

log = logging.getLogger(__name__)

#: how often the lag gauges are recorded
METRICS_INTERVAL_S = 5.0
#: how long ``stop`` waits for the members to leave the group before it kills them
STOP_TIMEOUT_S = 30.0

#: source topic settings a target topic copies (replication is the target's choice)
COPIED_SETTINGS = ("retention_ms", "retention_bytes", "segment_bytes", "segment_ms", "flush_messages", "flush_ms",
                   "max_message_bytes", "max_inflated_bytes", "max_producer_ids", "cleanup_policy",
                   "delete_retention_ms", "min_compaction_lag_ms", "max_compaction_lag_ms",
                   "min_cleanable_dirty_ratio")


def missing_target_topics(spec, source, target) -> list[tuple[str, object]]:
    """``[(source topic, its config)]`` of the matching source topics whose
    target topic does not exist yet; :class:`MirrorTopicMismatchError` when
    one exists with another partition count."""
    missing = []
    for topic in source.list_topics():
        if not spec.matches(topic):
            continue
        config = source.registry.topic_config(topic)
        name = spec.target_topic(topic)
        if target.registry.topic_exists(name):
            have = target.registry.topic_config(name).partitions
            if have != config.partitions:
                raise MirrorTopicMismatchError(
                    f"target topic {name!r} has {have} partitions, source topic {topic!r} has "
                    f"{config.partitions}; delete it or mirror with another --rename", topic=name)
            continue
        missing.append((topic, config))
    return missing


def create_target_topics(spec, source, target) -> list[str]:
    """Create the missing target topics (after checking all of them); their names."""
    made = []
    for topic, config in missing_target_topics(spec, source, target):
        settings = {k: getattr(config, k) for k in COPIED_SETTINGS}
        name = spec.target_topic(topic)
        try:
            target.create_topic(name, partitions=config.partitions, **settings)
            made.append(name)
        except TopicExistsError:
            pass
    return made


def partition_status(spec, source, target, topic: str, partition: int) -> dict:
    """One row of ``status``: source end, mirrored position, lag."""
    cluster = target.settings.cluster
    record, _ = progress.read_progress(target._zk, specs.progress_path(cluster, spec.name, topic, partition))
    try:
        start, end = source.offsets(topic, partition)
    except Exception:  # noqa: BLE001 - a source partition not served now
        start, end = None, None
    if record is None:
        mirrored = None
    else:
        mirrored = record["end"] if record["acked"] else record["start"]
    lag_bytes = None if end is None else end - (mirrored if mirrored is not None else (start or 0))
    caught_up = lag_bytes == 0
    lag_messages = 0 if caught_up else None
    if lag_bytes is not None and lag_bytes > 0:
        try:  # counted on the source partition's node; None past the walk bound
            lag_messages = source.count_messages(topic, partition, max(mirrored or 0, start or 0), end)
        except Exception:  # noqa: BLE001 - a source partition moving: the bytes still say it
            lag_messages = None
    lag_s = 0.0 if caught_up else (
        None if record is None else max(0.0, time.time() - record["last_ts"] / 1000.0))
    return {"topic": topic, "partition": partition, "target_topic": spec.target_topic(topic),
            "source_end": end, "mirrored": mirrored, "lag_bytes": lag_bytes,
            "lag_messages": lag_messages, "lag_s": lag_s,
            "target_end": None if record is None else record.get("target_end")}


class MirrorController:
    def __init__(self, spec, client_cls, target_kwargs: dict):
        import ray  # heavy, lazy on purpose

        self.spec = spec
        self.target = client_cls(**target_kwargs)
        self.source = source_client(client_cls, spec)
        self._stop = threading.Event()
        member_actor = ray.remote(MirrorMember)
        cluster = self.target.settings.cluster
        self.members = [
            member_actor.options(name=specs.member_name(cluster, spec.name, i), namespace=specs.NAMESPACE,
                                 max_restarts=-1, max_task_retries=-1, num_cpus=0).remote(
                spec, client_cls, target_kwargs, i)
            for i in range(spec.members)
        ]
        self._scan_errors = ""
        self._thread = threading.Thread(target=self._scan_loop, name=f"mirror-scan-{spec.name}", daemon=True)
        self._thread.start()
        self._metrics = threading.Thread(target=self._metrics_loop, name=f"mirror-metrics-{spec.name}", daemon=True)
        self._metrics.start()

    def ready(self) -> bool:
        import ray

        ray.get([m.stats.remote() for m in self.members])
        return True

    def _scan_loop(self) -> None:
        while not self._stop.wait(self.spec.scan_interval_s):
            try:
                made = create_target_topics(self.spec, self.source, self.target)
                if made:
                    log.info("mirror %s: created target topics %s", self.spec.name, made)
                self._scan_errors = ""
            except Exception as err:  # noqa: BLE001 - reported by status; tried again next scan
                self._scan_errors = f"{type(err).__name__}: {err}"
                log.warning("mirror %s: scan failed: %s", self.spec.name, err)

    def _metrics_loop(self) -> None:
        while not self._stop.wait(METRICS_INTERVAL_S):
            try:
                record_mirror_lag(self.target.settings.cluster, self.spec.name, self._rows())
            except Exception as err:  # noqa: BLE001 - a source or target away now: the next round records
                log.debug("mirror %s: lag metrics not recorded: %s", self.spec.name, err)

    def _rows(self) -> list[dict]:
        rows = []
        for topic in self.source.list_topics():
            if not self.spec.matches(topic) or not self.target.registry.topic_exists(self.spec.target_topic(topic)):
                continue
            for p in range(self.source.registry.topic_config(topic).partitions):
                rows.append(partition_status(self.spec, self.source, self.target, topic, p))
        return rows

    def status(self) -> dict:
        import ray

        rows = self._rows()
        members = []
        for i, m in enumerate(self.members):
            try:
                members.append(ray.get(m.stats.remote(), timeout=10))
            except Exception as err:  # noqa: BLE001 - a member restarting
                members.append({"index": i, "alive": False, "last_error": f"{type(err).__name__}: {err}"})
        return {"name": self.spec.name, "spec": self.spec.public(), "partitions": rows, "members": members,
                "scan_error": self._scan_errors}

    def stop(self) -> None:
        import ray

        self._stop.set()
        refs = [m.stop.remote() for m in self.members]  # all at once: each leaves the group
        try:
            ray.wait(refs, num_returns=len(refs), timeout=STOP_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - killed below either way
            pass
        for m in self.members:
            ray.kill(m, no_restart=True)
