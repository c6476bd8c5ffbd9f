"""The client's administration of topics: create, alter (a live topic's
config, :mod:`raylog.zk.live_config`), add partitions, delete, list, describe;
the partition actors that serve them; repair through the cluster's
supervisor.

:class:`TopicAdmin` is a part of :class:`raylog.Client`, given what it
uses when the client is made (see its docstring); the client's methods of
the same names call it.

A topic's partitions are spread round-robin over the nodes that offer local
disk, starting at a node chosen by the stable hash of the topic's name
(CRC32C, as keys are partitioned: :mod:`raylog.producer.partitioner`), so
that the first partitions of many topics do not all land on one node.

Thread-safety: as the client's (its state lives in ZooKeeper and Ray).
Ray is imported inside the methods that use it (heavy, lazy on purpose).
"""

from __future__ import annotations

import os
import time

from raylog.actors.partition import start_partition_actor
from raylog.actors.placement import disk_nodes, place_topic
from raylog.actors.replica_actors import PARTITION_ACTORS
from raylog.actors.supervisor import DEFAULT_INTERVAL_S, remove_deleted
from raylog.actors.supervisor import start_supervisor as _start_supervisor
from raylog.auth import check
from raylog.config import NAMESPACE, TopicConfig, actor_name
from raylog.errors import (
    ArgumentTypeError,
    BrokerUnavailableError,
    ConfigError,
    InvalidPartitionsError,
    RaylogError,
)
from raylog.groups.admin import delete_topic_offsets
from raylog.replication.admin import describe_replicas, follower_actors, leader_actor, record_replicas, start_followers
from raylog.replication.reassign import reassign_partition
from raylog.zk.live_config import CONTENDED, LIVE_SETTINGS, alter_topic_config
from raylog.zk.registry import validate_topic_name


#: the most partitions a topic may have: each is a partition actor of its
#: own, and the topic with all its partition znodes is created in one
#: ZooKeeper transaction, which must stay within ZooKeeper's request size
#: (``jute.maxbuffer``, 1 MiB by default)
MAX_PARTITIONS = 1024


def check_new_topic(name, partitions) -> None:
    """Refuse a new topic's name and partition count that cannot work,
    before anything is asked of ZooKeeper or Ray: :class:`ArgumentTypeError`
    for a name that is not a str, :class:`ConfigError` for a bad name or a
    partition count outside ``1..MAX_PARTITIONS``."""
    if not isinstance(name, str):
        raise ArgumentTypeError(
            f"topic name must be a str, got {type(name).__name__}; pass e.g. create_topic('clicks')"
        )
    validate_topic_name(name)
    if not isinstance(partitions, int) or isinstance(partitions, bool):
        raise ArgumentTypeError(f"partitions must be an int, got {type(partitions).__name__}")
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise ConfigError(
            f"partitions must be between 1 and {MAX_PARTITIONS} (raylog.admin.topics.MAX_PARTITIONS: one "
            f"partition actor each), got {partitions}; use fewer partitions"
        )


def check_added(name: str, current: int, total) -> None:
    """Refuse a new partition count for topic ``name`` (``current`` now)
    that cannot work, before anything is asked of Ray:
    :class:`ArgumentTypeError` for a total that is not an int,
    :class:`InvalidPartitionsError` for one not above ``current`` (a topic's
    partitions only grow, as Kafka's) or above ``MAX_PARTITIONS``."""
    if not isinstance(total, int) or isinstance(total, bool):
        raise ArgumentTypeError(f"the new partition count must be an int, got {type(total).__name__}; pass e.g. "
                                f"add_partitions({name!r}, {current + 1})")
    if total <= current:
        raise InvalidPartitionsError(
            f"topic {name!r} has {current} partition{'s' if current != 1 else ''}; the new total must be larger "
            f"(partitions are only added, never removed), got {total}", topic=name, current=current)
    if total > MAX_PARTITIONS:
        raise InvalidPartitionsError(
            f"topic {name!r} has {current} partitions; a topic has at most {MAX_PARTITIONS} "
            f"(raylog.admin.topics.MAX_PARTITIONS: one partition actor each), got {total}",
            topic=name, current=current)


class TopicAdmin:
    """Topics and their partition actors (part of :class:`raylog.Client`).

    Given: ``zk``, the client's ZooKeeper session; ``registry``, its
    :class:`~raylog.zk.registry.Registry`; ``settings``, its
    :class:`~raylog.metadata.ConnectionSettings`; ``data_dir`` (where new
    partition logs go) and ``data_host`` (the node to serve on, or None);
    ``check_open()``, which raises once the client is closed; and
    ``offsets(topic, partition)``, a partition's ``(log start, high
    watermark)`` (for :meth:`describe_topic`)."""

    def __init__(self, *, zk, registry, settings, data_dir: str, data_host: str | None, check_open, offsets):
        self._zk = zk
        self.registry = registry
        self.settings = settings
        self.data_dir = data_dir
        self.data_host = data_host
        self._check_open = check_open
        self.offsets = offsets

    def create_topic(self, name: str, partitions: int = 1, *, timeout_s: float = 120.0, **settings) -> TopicConfig:
        """What :meth:`raylog.Client.create_topic` does (documented there)."""
        import ray  # heavy (Ray): imported when used

        self._check_open()
        check_new_topic(name, partitions)  # before ZooKeeper or Ray are asked anything
        config = TopicConfig(partitions=partitions, **settings)
        nodes = ray.nodes()
        disks = disk_nodes(nodes)
        placement = place_topic(name, partitions, disks, config.replication_factor)
        remove_deleted(self.registry, self.settings.zookeeper, nodes, topic=name, token=self.settings.token)
        self.registry.create_topic(name, config)
        try:
            for p, replicas in enumerate(placement):
                if len(replicas) == 1:  # not replicated: nothing of raylog.replication
                    self.registry.set_placement(name, p, replicas[0].identity, self.log_dir(name, p))
                else:
                    record_replicas(self._zk, self.registry, name, p, replicas, self.log_dir(name, p))
            self._serve(name, config, nodes, timeout_s)
        except BaseException:
            self._stop_actors(name, partitions, delete_data=True)
            self.registry.delete_topic(name)
            remove_deleted(self.registry, self.settings.zookeeper, ray.nodes(), topic=name, token=self.settings.token)
            raise
        return config

    def alter_topic(self, name: str, **settings) -> TopicConfig:
        """What :meth:`raylog.Client.alter_topic` does (documented there)."""
        self._check_open()
        if not isinstance(name, str):
            raise ArgumentTypeError(f"topic name must be a str, got {type(name).__name__}; pass e.g. "
                                    f"alter_topic('clicks', retention_ms=3600000)")
        if not settings:
            raise ConfigError(f"alter_topic({name!r}) names no setting; pass e.g. cleanup_policy='compact' "
                              f"(the settings a live topic takes: {', '.join(LIVE_SETTINGS)})")
        # ZooKeeper's ACL is the guard (a session without the cluster's token cannot write the
        # config: AuthenticationError); no Ray is needed, so a process outside it may alter too
        return alter_topic_config(self.registry, name, lambda _old: settings)

    def add_partitions(self, name: str, total: int, *, timeout_s: float = 120.0,
                       validate_only: bool = False) -> TopicConfig:
        """What :meth:`raylog.Client.add_partitions` does (documented there);
        ``validate_only`` checks everything and changes nothing (Kafka's
        CreatePartitions)."""
        import ray  # heavy (Ray): imported when used

        self._check_open()
        if not isinstance(name, str):
            raise ArgumentTypeError(f"topic name must be a str, got {type(name).__name__}; pass e.g. "
                                    f"add_partitions('clicks', 8)")
        config, _ = self.registry.topic_config_version(name)  # UnknownTopicError first
        check_added(name, config.partitions, total)
        if validate_only:
            return config.replace(partitions=total)
        check(self.settings.cluster, self.settings.token, f"adding partitions to {name!r}")
        nodes = ray.nodes()
        disks = disk_nodes(nodes)
        for pause in [0.0, *CONTENDED.delays()]:
            time.sleep(pause)
            config, version = self.registry.topic_config_version(name)
            check_added(name, config.partitions, total)  # another writer may have grown it meanwhile
            placement = place_topic(name, total, disks, config.replication_factor)
            added = range(config.partitions, total)
            places = {p: {"node": placement[p][0].identity, "log_dir": self._added_log_dir(name, p)} for p in added}
            remove_deleted(self.registry, self.settings.zookeeper, nodes, topic=name, token=self.settings.token)
            grown = config.replace(partitions=total)
            if self.registry.add_partitions(name, grown, version, places):
                break
        else:
            raise RaylogError(f"could not add partitions to topic {name!r}: its config kept changing under this "
                              f"writer; retry", topic=name, retriable=True)
        for p in added:
            if len(placement[p]) > 1:
                record_replicas(self._zk, self.registry, name, p, placement[p], places[p]["log_dir"])
        try:
            self._serve(name, grown, nodes, timeout_s, added, wait=timeout_s > 0)
        except BrokerUnavailableError as err:
            raise BrokerUnavailableError(
                f"{err}; partitions {added.start}..{total - 1} are recorded (the topic has {total} partitions "
                f"now): client.repair({name!r}) or the supervisor starts the rest", topic=name) from None
        return grown

    def _added_log_dir(self, topic: str, partition: int) -> str:
        """The log directory of a partition added to ``topic``: beside its
        partition 0's (the data directory the topic was made with, whoever
        adds), else this client's (:meth:`log_dir`)."""
        first = (self.registry.placement(topic, 0) or {}).get("log_dir")
        if first:
            return os.path.join(os.path.dirname(first), f"{topic}-{partition}")
        return self.log_dir(topic, partition)

    def log_dir(self, topic: str, partition: int) -> str:
        """What :meth:`raylog.Client.log_dir` does (documented there)."""
        return os.path.join(self.data_dir, self.settings.cluster, f"{topic}-{partition}")

    def repair(self, topic: str | None = None, timeout_s: float = 60.0) -> list[dict]:
        """What :meth:`raylog.Client.repair` does (documented there)."""
        import ray  # heavy (Ray): imported when used

        self._check_open()
        check(self.settings.cluster, self.settings.token, "repairing partitions")
        if topic is not None:
            self.registry.topic_config(topic)  # UnknownTopicError before anything starts
        supervisor = self.start_supervisor()
        return ray.get(supervisor.repair.remote(topic, timeout_s), timeout=3 * timeout_s + 30)

    def start_supervisor(self, interval_s: float | None = None, wait: bool = True, timeout_s: float = 60.0):
        """What :meth:`raylog.Client.start_supervisor` does (documented there)."""
        return _start_supervisor(
            self.settings.zookeeper,
            self.settings.cluster,
            host=self.data_host,
            interval_s=DEFAULT_INTERVAL_S if interval_s is None else interval_s,
            timeout_s=timeout_s,
            wait=wait,
        )

    def _serve(self, name: str, config: TopicConfig, nodes: list[dict], timeout_s: float,
               partitions: range | None = None, wait: bool = True) -> None:
        """Start the partition actors of ``partitions`` (all of the topic's
        by default) and (``wait``) wait for them to answer."""
        import ray  # heavy (Ray): imported when used

        check(self.settings.cluster, self.settings.token, f"serving topic {name!r}")
        actors = []
        for p in range(config.partitions) if partitions is None else partitions:
            place = self.registry.placement(name, p)
            replicated = config.replication_factor > 1
            start = dict(zookeeper=self.settings.zookeeper, cluster=self.settings.cluster, topic=name, partition=p,
                         log_dir=place["log_dir"], config=config, nodes=nodes, host=self.data_host,
                         token=self.settings.token)
            if replicated:
                actors.extend(start_followers(self._zk, self.registry, **start, actors=PARTITION_ACTORS))
            actors.append(start_partition_actor(**start, node_identity=place["node"],
                                                replica=place["node"] if replicated else None))
        if not wait:
            return
        refs = [a.ping.remote() for a in actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        if len(ready) < len(refs):
            raise BrokerUnavailableError(
                f"only {len(ready)} of {len(refs)} partition actors of {name!r} started within "
                f"{timeout_s:g} s; check that the nodes holding them are alive (ray status)"
            )
        ray.get(ready)  # raise a constructor's error, if any

    def _actor(self, topic: str, partition: int):
        import ray  # heavy (Ray): imported when used

        try:
            return ray.get_actor(actor_name(self.settings.cluster, topic, partition), namespace=NAMESPACE)
        except ValueError:
            return None

    def partition_actor(self, topic: str, partition: int):
        """What :meth:`raylog.Client.partition_actor` does (documented there)."""
        actor = self._actor(topic, partition)
        if actor is None:
            raise BrokerUnavailableError(f"no partition actor runs for {topic}-{partition}")
        return actor

    def leader_actor(self, topic: str, partition: int):
        """What :meth:`raylog.Client.leader_actor` does (documented there)."""
        self._check_open()
        if self.registry.topic_config(topic).replication_factor == 1:
            return self.partition_actor(topic, partition)
        try:
            return leader_actor(self._zk, self.registry, self.settings.cluster, topic, partition)[1]
        except ValueError as err:
            raise BrokerUnavailableError(f"{topic}-{partition}: no leader's actor runs ({err})") from None

    def _stop_actors(self, topic: str, partitions: int, delete_data: bool) -> None:
        import ray  # heavy (Ray): imported when used

        check(self.settings.cluster, self.settings.token, f"stopping the partitions of {topic!r}")
        actors = [a for a in (self._actor(topic, p) for p in range(partitions)) if a is not None]
        actors += follower_actors(self.settings.cluster, topic, partitions)
        refs = [a.shutdown.remote(delete_data=delete_data, token=self.settings.token) for a in actors]
        try:
            ray.wait(refs, num_returns=len(refs), timeout=30)
        finally:
            for actor in actors:
                ray.kill(actor, no_restart=True)

    def delete_topic(self, name: str, timeout_s: float = 30.0) -> None:
        """What :meth:`raylog.Client.delete_topic` does (documented there)."""
        import ray  # heavy (Ray): imported when used

        self._check_open()
        config = self.registry.topic_config(name)
        if ray.is_initialized():
            check(self.settings.cluster, self.settings.token, f"deleting topic {name!r}")
        self.registry.delete_topic(name)
        # Committed byte offsets would point mid-message in a re-created topic.
        delete_topic_offsets(self._zk, self.settings.cluster, name)
        if not ray.is_initialized():
            return  # the supervisor removes the logs
        self._stop_actors(name, config.partitions, delete_data=True)
        remove_deleted(self.registry, self.settings.zookeeper, ray.nodes(), topic=name, token=self.settings.token,
                       wait_s=timeout_s)

    def reassign_partition(self, topic: str, partition: int, replicas: list[str], timeout_s: float = 120.0):
        """What :meth:`raylog.Client.reassign_partition` does (documented there)."""
        import ray  # heavy (Ray): imported when used

        self._check_open()
        check(self.settings.cluster, self.settings.token, f"reassigning {topic}-{partition}")
        state = reassign_partition(self._zk, self.registry, zookeeper=self.settings.zookeeper, topic=topic,
                                   partition=partition, replicas=list(replicas), nodes=ray.nodes(),
                                   actors=PARTITION_ACTORS, host=self.data_host, token=self.settings.token, timeout_s=timeout_s)
        return {"leader": state.leader, "leader_epoch": state.leader_epoch, "replicas": list(state.replicas),
                "isr": list(state.isr)}

    def drain_node(self, node: str, timeout_s: float = 60.0) -> dict:
        """What :meth:`raylog.Client.drain_node` does (documented there)."""
        from raylog.replication.drain import drain_node

        self._check_open()
        check(self.settings.cluster, self.settings.token, f"draining {node}")
        return drain_node(self._zk, self.registry, self.settings.cluster, node, self.settings.token,
                          timeout_s=timeout_s)

    def rolling_restart(self, nodes=None, restart=None, timeout_s: float = 300.0, on_step=None) -> list[dict]:
        """What :meth:`raylog.Client.rolling_restart` does (documented there)."""
        from raylog.actors.rolling import rolling_restart

        self._check_open()
        check(self.settings.cluster, self.settings.token, "restarting the disk nodes")
        return rolling_restart(self._zk, self.registry, self.settings.cluster, self.settings.token, nodes=nodes,
                               restart=restart, timeout_s=timeout_s, on_step=on_step)

    def balance_leaders(self, topics=None, timeout_s: float = 10.0) -> dict:
        """What :meth:`raylog.Client.balance_leaders` does (documented there)."""
        from raylog.replication.preferred import balance_leaders

        self._check_open()
        check(self.settings.cluster, self.settings.token, "balancing the leaders")
        return balance_leaders(self._zk, self.registry, self.settings.cluster, self.settings.token, topics,
                               timeout_s)

    def hand_off(self, topic: str, partition: int, target: str, timeout_s: float = 10.0) -> dict:
        """What :meth:`raylog.Client.hand_off` does (documented there)."""
        from raylog.replication.admin import request_handoff

        self._check_open()
        check(self.settings.cluster, self.settings.token, f"handing off {topic}-{partition}")
        return request_handoff(self._zk, self.registry, self.settings.cluster, topic, partition, str(target),
                               self.settings.token, timeout_s)

    def delete_records(self, topic: str, offsets: dict, timeout_s: float = 30.0) -> dict[int, int]:
        """What :meth:`raylog.Client.delete_records` does (documented there)."""
        import ray  # heavy (Ray): imported when used

        self._check_open()
        check(self.settings.cluster, self.settings.token, f"deleting records of {topic!r}")
        if not isinstance(offsets, dict):
            raise ArgumentTypeError(f"offsets must be a dict {{partition: offset}}, got {type(offsets).__name__}")
        for partition, offset in offsets.items():
            self.registry.calls.check_partition(topic, partition)  # UnknownTopicError / UnknownPartitionError
            if not isinstance(offset, int) or isinstance(offset, bool):
                raise ArgumentTypeError(f"the offset of {topic}-{partition} must be an int, got {offset!r}")
        actors = {p: self.leader_actor(topic, p) for p in offsets}

        def call(method):
            try:
                return ray.get(method, timeout=timeout_s)
            except ray.exceptions.RayTaskError as err:
                cause = getattr(err, "cause", None)
                if isinstance(cause, RaylogError):
                    raise cause from None
                raise
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as err:
                raise BrokerUnavailableError(f"the partition actor of {topic} did not answer: {err}") from None

        # every offset checked against its partition's high watermark (a replicated leader's committed
        # offset) before any start moves: a bad one changes nothing
        for p, offset in offsets.items():
            call(actors[p].delete_records.remote(offset, token=self.settings.token, validate_only=True))
        return {p: call(actors[p].delete_records.remote(offset, token=self.settings.token))
                for p, offset in offsets.items()}

    def list_topics(self) -> list[str]:
        """The names of the cluster's topics, sorted (read from ZooKeeper)."""
        self._check_open()
        return self.registry.list_topics()

    def describe_topic(self, name: str) -> dict:
        """What :meth:`raylog.Client.describe_topic` does (documented there)."""
        self._check_open()
        config = self.registry.topic_config(name)
        placements = self.registry.placements(name)
        endpoints = self.registry.endpoints(name)
        partitions = []
        for p in range(config.partitions):
            endpoint = endpoints.get(p)
            row = {
                "partition": p,
                "node": placements.get(p, {}).get("node"),
                "log_dir": placements.get(p, {}).get("log_dir"),
                "served": endpoint is not None,
                "endpoint": None if endpoint is None else f"{endpoint['host']}:{endpoint['port']}",
                "epoch": None if endpoint is None else endpoint.get("epoch"),
                "log_start_offset": None,
                "high_watermark": None,
            }
            if endpoint is not None:
                try:
                    row["log_start_offset"], row["high_watermark"] = self.offsets(name, p)
                except BrokerUnavailableError:
                    pass
            if config.replication_factor > 1:
                row.update(describe_replicas(self._zk, self.registry, self.settings.cluster, name, p))
                row["node"] = row.get("leader") or row["node"]  # the node that serves it now
            partitions.append(row)
        if config.compacted:
            for row, state in zip(partitions, self._cleaner_states(name, config.partitions)):
                row["cleaner"] = state
        return {"topic": name, "config": config, "partitions": partitions}

    def _cleaner_states(self, name: str, partitions: int, timeout_s: float = 10.0) -> list[dict | None]:
        """Each partition's cleaner state (the leader's actor's
        :meth:`~raylog.actors.partition.PartitionActor.cleaner_state`); None
        for a partition whose actor did not answer, and for all of them
        outside Ray (a client that did not join it cannot ask actors)."""
        import ray  # heavy (Ray): imported when used

        if not ray.is_initialized():
            return [None] * partitions
        refs = {}
        for p in range(partitions):
            try:
                refs[p] = self.leader_actor(name, p).cleaner_state.remote()
            except BrokerUnavailableError:
                continue
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
        states = []
        for p in range(partitions):
            ref = refs.get(p)
            try:
                states.append(ray.get(ref) if ref in ready else None)
            except Exception:  # noqa: BLE001 - an actor that failed meanwhile is shown as not answering
                states.append(None)
        return states


def for_kafka_listener(metadata, *, data_dir: str, data_host: str | None) -> TopicAdmin:
    """The topic administration a Kafka listener's CreateTopics and
    DeleteTopics use (:mod:`raylog.kafka.admin`): the client's, on the
    listener's own ZooKeeper session (``metadata``, a
    :class:`raylog.metadata.Metadata`), with the starting client's
    ``data_dir`` and ``data_host``, so topics are placed and served as
    ``client.create_topic`` does."""
    return TopicAdmin(zk=metadata.zk, registry=metadata.registry, settings=metadata.settings, data_dir=data_dir,
                      data_host=data_host, check_open=lambda: None, offsets=None)
