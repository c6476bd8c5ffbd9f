"""CreateTopics, DeleteTopics, CreatePartitions, DescribeConfigs,
AlterConfigs, IncrementalAlterConfigs and DeleteRecords: Kafka's topic
administration on raylog's topics (what ``confluent_kafka.admin.AdminClient``,
``kafka-topics --alter``, ``kafka-configs``, ``kafka-delete-records`` and
``kcat -L`` need).

Topics are created and deleted through raylog's own administration, the
:class:`raylog.admin.topics.TopicAdmin` that ``client.create_topic`` uses
(same placement, same partition actors, same ZooKeeper records): the
listener is given one when it is started (``Backend.topics``, built by
:func:`raylog.admin.topics.for_kafka_listener`); a listener without one
answers CreateTopics and DeleteTopics with CLUSTER_AUTHORIZATION_FAILED and
a message saying so.

CreateTopics: ``num_partitions`` -1 is 1, ``replication_factor`` -1 the
cluster's default (raylog's, 1); manual replica assignments are refused
(INVALID_REPLICA_ASSIGNMENT: raylog places partitions itself). Configs are
taken by their Kafka names (:data:`TOPIC_CONFIGS`) and must be ones raylog
has; any other is refused by name with INVALID_CONFIG, and so is a value
raylog's :class:`raylog.config.TopicConfig` refuses (its message is the
error message). ``cleanup.policy`` is ``delete``, ``compact`` or both
(``compact,delete`` in either order; docs/design.md section 3), with the
compaction settings ``delete.retention.ms``, ``min.compaction.lag.ms``,
``max.compaction.lag.ms`` and ``min.cleanable.dirty.ratio``. ``validate_only`` checks all of it, the name, that the
topic does not exist and that the replication factor does not exceed the
listeners registered (one per disk node), and creates nothing.

CreatePartitions grows each named topic to its ``count`` as
``client.add_partitions`` does (:meth:`raylog.admin.topics.TopicAdmin.add_partitions`:
the same placement, the topic's replication factor and settings, one
ZooKeeper transaction with the new count), each topic on its own: a count
not larger than the topic's now (or above raylog's bound) is
INVALID_PARTITIONS with a message naming the count now, a topic that does
not exist UNKNOWN_TOPIC_OR_PARTITION, manual replica assignments
INVALID_REPLICA_ASSIGNMENT (raylog places partitions itself), a topic named
twice INVALID_REQUEST; nothing of a refused topic changes.
``validate_only`` checks all of it and changes nothing. ``timeout_ms`` is
how long the answer waits for the new partitions' actors (at most
:data:`CREATE_TIMEOUT_S`; 0 or less: not at all, as Kafka's broker); actors
still starting then answer REQUEST_TIMED_OUT, the partitions being recorded
all the same (the supervisor serves them). A request naming more than
:data:`MAX_TOPICS` topics closes the connection
(:class:`~raylog.kafka.frames.BadFrame`) before anything is read.

DescribeConfigs: a topic's raylog settings under the Kafka names of
:data:`TOPIC_CONFIGS` (source TOPIC_CONFIG where the topic set a value of
its own, DEFAULT_CONFIG where it kept raylog's default; read-only where the
setting cannot change on a live topic, :data:`raylog.zk.live_config.FIXED_SETTINGS`),
``cleanup.policy`` among them; a broker resource gets the small read-only set of
:func:`_broker_configs` (raylog's defaults for new topics). Only the keys
asked for are answered when the request names some.

AlterConfigs and IncrementalAlterConfigs change a live topic's config as
``client.alter_topic`` does (:mod:`raylog.zk.live_config`: one versioned
compare-and-set per resource, validated whole first; the topic's partition
actors take it within moments). Names are Kafka's (:data:`TOPIC_CONFIGS`);
one raylog does not have, a bad value, a name given twice or a setting
fixed at creation (``max.message.bytes``, ``min.insync.replicas``) given
another value is refused with INVALID_CONFIG (a name twice: INVALID_REQUEST)
and the message saying why, and nothing of that resource changes.
IncrementalAlterConfigs' operations are Kafka's: SET, DELETE (back to
raylog's default), APPEND and SUBTRACT (only on the list
``cleanup.policy``; elsewhere INVALID_CONFIG, as Kafka). AlterConfigs
replaces the topic's settings as Kafka does: a live setting it does not
name goes back to raylog's default (one fixed at creation keeps its value).
``validate_only`` checks everything and changes nothing. Only TOPIC
resources are changed; a broker's settings are read-only (INVALID_CONFIG).

DeleteRecords moves each named partition's log start as
``client.delete_records`` does (:meth:`raylog.admin.topics.TopicAdmin.delete_records`:
the partition's leader moves it, inside a segment too, and keeps it on
disk), each partition on its own, answering the new log start as its
``low_watermark``. Offset -1 is the high watermark. Per partition errors:
an offset past the high watermark (or below 0 but -1) OFFSET_OUT_OF_RANGE,
a topic or partition that does not exist (or a partition named twice:
INVALID_REQUEST) UNKNOWN_TOPIC_OR_PARTITION, a leader that moved or is
starting NOT_LEADER_OR_FOLLOWER (the client looks it up again), a listener
without topic administration CLUSTER_AUTHORIZATION_FAILED; nothing of such
a partition changes. ``timeout_ms`` bounds the wait for each partition's
leader (at most :data:`CREATE_TIMEOUT_S`). A request naming more than
:data:`MAX_PARTITIONS` partitions in all closes the connection
(:class:`~raylog.kafka.frames.BadFrame`) before anything changes.
Version 2 is flexible, with the same fields.

Thread-safety: the functions keep no state; the topic administration they
call is safe to call from the listener's connection threads (its state
lives in ZooKeeper and Ray).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable

from kafka.protocol.admin import (
    AlterConfigsResponse,
    CreatePartitionsResponse,
    CreateTopicsResponse,
    DeleteRecordsResponse,
    DeleteTopicsResponse,
    DescribeConfigsResponse,
    IncrementalAlterConfigsResponse,
)

from raylog.config import TopicConfig
from raylog.errors import (
    BrokerUnavailableError,
    ConfigError,
    InvalidPartitionsError,
    NotOwnerError,
    OffsetOutOfRangeError,
    RaylogError,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
)
from raylog.kafka import brokers
from raylog.kafka.frames import BadFrame
from raylog.zk.live_config import FIXED_SETTINGS, alter_topic_config
from raylog.zk.registry import validate_topic_name

log = logging.getLogger(__name__)

#: Kafka topic config name -> raylog TopicConfig field
TOPIC_CONFIGS = {
    "retention.ms": "retention_ms",
    "retention.bytes": "retention_bytes",
    "segment.bytes": "segment_bytes",
    "segment.ms": "segment_ms",
    "max.message.bytes": "max_message_bytes",
    "flush.messages": "flush_messages",
    "flush.ms": "flush_ms",
    "min.insync.replicas": "min_insync_replicas",
    "unclean.leader.election.enable": "unclean_leader_election",
    "cleanup.policy": "cleanup_policy",
    "delete.retention.ms": "delete_retention_ms",
    "min.compaction.lag.ms": "min_compaction_lag_ms",
    "max.compaction.lag.ms": "max_compaction_lag_ms",
    "min.cleanable.dirty.ratio": "min_cleanable_dirty_ratio",
}
#: the TopicConfig fields taken as they are written (not integers)
_TEXT_FIELDS = ("cleanup_policy",)
_FLOAT_FIELDS = ("min_cleanable_dirty_ratio",)
#: the cleanup policy of a broker's new topics
CLEANUP_POLICY = "delete"
#: the most a CreateTopics or CreatePartitions waits for a topic's partition actors
CREATE_TIMEOUT_S = 120.0
#: the most topics one CreatePartitions may name
MAX_TOPICS = 1000
#: the most partitions one DeleteRecords may name, over all its topics
MAX_PARTITIONS = 10_000

# Kafka error codes
NONE = 0
OFFSET_OUT_OF_RANGE = 1
UNKNOWN_TOPIC_OR_PARTITION = 3
REQUEST_TIMED_OUT = 7
INVALID_TOPIC_EXCEPTION = 17
CLUSTER_AUTHORIZATION_FAILED = 31
TOPIC_ALREADY_EXISTS = 36
INVALID_PARTITIONS = 37
INVALID_REPLICATION_FACTOR = 38
INVALID_REPLICA_ASSIGNMENT = 39
NOT_LEADER_OR_FOLLOWER = 6
INVALID_CONFIG = 40
INVALID_REQUEST = 42
UNKNOWN_SERVER_ERROR = -1

# DescribeConfigs resource types and config sources
TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4
TOPIC_CONFIG_SOURCE, STATIC_BROKER_CONFIG_SOURCE, DEFAULT_CONFIG_SOURCE = 1, 4, 5
# IncrementalAlterConfigs operations
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3

_NO_ADMIN = ("this Kafka listener was started without topic administration; create and delete topics "
             "with client.create_topic / client.delete_topic, or start the listeners with "
             "client.start_kafka_listeners()")


class Refused(Exception):
    """A topic request refused: ``code`` (Kafka's) and ``message``."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def topic_settings(configs) -> dict:
    """raylog TopicConfig fields of CreateTopics ``configs`` (name, value);
    raises :class:`Refused` (INVALID_CONFIG) naming what raylog does not have."""
    settings = {}
    for entry in configs or ():
        field, value = _setting(entry.name, entry.value)
        settings[field] = value
    return settings


def _field(name: str) -> str:
    """The raylog TopicConfig field of Kafka config ``name``; :class:`Refused` if none."""
    field = TOPIC_CONFIGS.get(name)
    if field is None:
        raise Refused(INVALID_CONFIG, f"config {name!r} is not supported by raylog; supported: "
                                      f"{', '.join(sorted(TOPIC_CONFIGS))}")
    return field


def _setting(name: str, value) -> tuple[str, object]:
    """``(field, value)`` of Kafka config ``name`` set to the string ``value``;
    raises :class:`Refused` (INVALID_CONFIG)."""
    field = _field(name)
    if value is None:
        raise Refused(INVALID_CONFIG, f"config {name!r} has no value")
    if field in _TEXT_FIELDS:
        return field, value
    if field in _FLOAT_FIELDS:
        try:
            return field, float(value)
        except ValueError:
            raise Refused(INVALID_CONFIG, f"{name}={value!r}: a number is expected") from None
    if field == "unclean_leader_election":
        if value.lower() not in ("true", "false"):
            raise Refused(INVALID_CONFIG, f"{name}={value!r}: use true or false")
        return field, value.lower() == "true"
    try:
        return field, int(value)
    except ValueError:
        raise Refused(INVALID_CONFIG, f"{name}={value!r}: an integer is expected") from None


def _kafka_message(message: str) -> str:
    """TopicConfig's message with its field names as the Kafka names they
    were given by (``cleanup_policy`` -> ``cleanup.policy``)."""
    for name, field in sorted(TOPIC_CONFIGS.items(), key=lambda item: -len(item[1])):
        message = message.replace(field, name)
    return message


def _check_create(backend, topic) -> tuple[str, int, dict]:
    """``(name, partitions, settings)`` of a CreateTopics entry, checked
    without creating anything; raises :class:`Refused`."""
    name = topic.name
    try:
        validate_topic_name(name)
    except ConfigError as err:
        raise Refused(INVALID_TOPIC_EXCEPTION, str(err).splitlines()[0]) from None
    if topic.assignments:
        raise Refused(INVALID_REPLICA_ASSIGNMENT, "raylog places partitions itself; give num_partitions and "
                                                  "replication_factor instead of replica assignments")
    partitions = 1 if topic.num_partitions == -1 else topic.num_partitions
    if partitions < 1:
        raise Refused(INVALID_PARTITIONS, f"num_partitions must be at least 1 (or -1), got {topic.num_partitions}")
    settings = topic_settings(topic.configs)
    if topic.replication_factor != -1:
        if topic.replication_factor < 1:
            raise Refused(INVALID_REPLICATION_FACTOR,
                          f"replication_factor must be at least 1 (or -1), got {topic.replication_factor}")
        settings["replication_factor"] = topic.replication_factor
    try:
        config = TopicConfig(partitions=partitions, **settings)
    except ConfigError as err:
        raise Refused(INVALID_CONFIG, _kafka_message(str(err).splitlines()[0])) from None
    nodes = len(brokers.listeners(backend.zk, backend.paths)) or 1
    if config.replication_factor > nodes:
        raise Refused(INVALID_REPLICATION_FACTOR, f"replication_factor {config.replication_factor} exceeds the "
                                                  f"{nodes} disk node(s) with a Kafka listener")
    if name in backend.metadata.registry.list_topics():
        raise Refused(TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
    return name, partitions, settings


def create_topics(backend, body, version):
    Result = CreateTopicsResponse.CreatableTopicResult
    results = []
    for topic in body.topics:
        code, message = NONE, None
        try:
            name, partitions, settings = _check_create(backend, topic)
            if not body.validate_only:
                if backend.topics is None:
                    raise Refused(CLUSTER_AUTHORIZATION_FAILED, _NO_ADMIN)
                backend.topics.create_topic(name, partitions, timeout_s=CREATE_TIMEOUT_S, **settings)
                log.info("Kafka CreateTopics: created %s (%d partitions, %s)", name, partitions, settings)
        except Refused as err:
            code, message = err.code, err.message
        except TopicExistsError as err:
            code, message = TOPIC_ALREADY_EXISTS, str(err).splitlines()[0]
        except ConfigError as err:
            replication = "replica" in str(err) or "disk node" in str(err)
            code = INVALID_REPLICATION_FACTOR if replication else INVALID_CONFIG
            message = str(err).splitlines()[0]
        except RaylogError as err:
            code = REQUEST_TIMED_OUT if err.retriable else UNKNOWN_SERVER_ERROR
            message = str(err).splitlines()[0]
        results.append(Result(name=topic.name, error_code=code, error_message=message, num_partitions=-1,
                              replication_factor=-1, configs=None))
    return CreateTopicsResponse[version](throttle_time_ms=0, topics=results)


def delete_topics(backend, body, version):
    Result = DeleteTopicsResponse.DeletableTopicResult
    names = list(body.topic_names or ())
    results = []
    for name in names:
        code, message = NONE, None
        try:
            if backend.topics is None:
                raise Refused(CLUSTER_AUTHORIZATION_FAILED, _NO_ADMIN)
            count = backend.metadata.registry.topic_config(name).partitions
            backend.topics.delete_topic(name)
            for partition in range(count):
                backend.metadata.forget(name, partition)
            log.info("Kafka DeleteTopics: deleted %s", name)
        except Refused as err:
            code, message = err.code, err.message
        except UnknownTopicError as err:
            code, message = UNKNOWN_TOPIC_OR_PARTITION, str(err).splitlines()[0]
        except RaylogError as err:
            code = REQUEST_TIMED_OUT if err.retriable else UNKNOWN_SERVER_ERROR
            message = str(err).splitlines()[0]
        results.append(Result(name=name, error_code=code, error_message=message))
    return DeleteTopicsResponse[version](throttle_time_ms=0, responses=results)


def _check_partitions(backend, topic, named: int) -> None:
    """Refuse a CreatePartitions entry that cannot be done, before anything
    changes: raises :class:`Refused`, UnknownTopicError or InvalidPartitionsError."""
    if named > 1:
        raise Refused(INVALID_REQUEST, f"topic {topic.name!r} is named {named} times in one request")
    if topic.assignments:
        raise Refused(INVALID_REPLICA_ASSIGNMENT, "raylog places partitions itself; give the new count without "
                                                  "replica assignments")
    current = backend.metadata.registry.topic_config(topic.name).partitions
    if topic.count <= current:
        raise InvalidPartitionsError(
            f"topic {topic.name!r} has {current} partition{'s' if current != 1 else ''}; the new count must be "
            f"larger (partitions are only added), got {topic.count}", topic=topic.name, current=current)


def create_partitions(backend, body, version):
    Result = CreatePartitionsResponse.CreatePartitionsTopicResult
    topics = list(body.topics or ())
    if len(topics) > MAX_TOPICS:
        raise BadFrame(f"a CreatePartitions naming {len(topics)} topics (at most {MAX_TOPICS} are served in one "
                       f"request)")
    names = [topic.name for topic in topics]
    timeout_s = min(CREATE_TIMEOUT_S, max(0.0, (body.timeout_ms or 0) / 1000.0))
    results = []
    for topic in topics:
        code, message = NONE, None
        try:
            _check_partitions(backend, topic, names.count(topic.name))
            if backend.topics is not None:  # the whole check (raylog's bound included), or the change
                backend.topics.add_partitions(topic.name, topic.count, timeout_s=timeout_s,
                                              validate_only=body.validate_only)
            elif not body.validate_only:
                raise Refused(CLUSTER_AUTHORIZATION_FAILED, _NO_ADMIN)
            if not body.validate_only:
                backend.metadata.refresh(topic.name)  # this listener's Produce sees the new count at once
                log.info("Kafka CreatePartitions: topic %s now has %d partitions", topic.name, topic.count)
        except Refused as err:
            code, message = err.code, err.message
        except UnknownTopicError:
            code, message = UNKNOWN_TOPIC_OR_PARTITION, f"topic {topic.name!r} does not exist"
        except InvalidPartitionsError as err:
            code, message = INVALID_PARTITIONS, str(err).splitlines()[0]
        except ConfigError as err:
            code, message = INVALID_REQUEST, str(err).splitlines()[0]
        except BrokerUnavailableError as err:  # recorded; actors still starting after timeout_ms
            code, message = REQUEST_TIMED_OUT, str(err).splitlines()[0]
        except RaylogError as err:
            code = REQUEST_TIMED_OUT if err.retriable else UNKNOWN_SERVER_ERROR
            message = str(err).splitlines()[0]
        results.append(Result(name=topic.name, error_code=code, error_message=message))
    return CreatePartitionsResponse[version](throttle_time_ms=0, results=results)


def _kafka_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _topic_configs(config: TopicConfig) -> list[tuple[str, str, int, bool]]:
    """``(name, value, source, read only)`` of a topic's settings."""
    defaults = TopicConfig()
    rows = []
    for name, field in TOPIC_CONFIGS.items():
        value = getattr(config, field)
        source = DEFAULT_CONFIG_SOURCE if value == getattr(defaults, field) else TOPIC_CONFIG_SOURCE
        rows.append((name, _kafka_value(value), source, field in FIXED_SETTINGS))
    return rows


def _broker_configs() -> list[tuple[str, str, int, bool]]:
    """A broker's: raylog's defaults for new topics, read-only."""
    defaults = TopicConfig()
    rows = [
        ("num.partitions", "1"),
        ("default.replication.factor", _kafka_value(defaults.replication_factor)),
        ("auto.create.topics.enable", "false"),
        ("message.max.bytes", _kafka_value(defaults.max_message_bytes)),
        ("log.retention.ms", _kafka_value(defaults.retention_ms)),
        ("log.retention.bytes", _kafka_value(defaults.retention_bytes)),
        ("log.segment.bytes", _kafka_value(defaults.segment_bytes)),
        ("min.insync.replicas", _kafka_value(defaults.min_insync_replicas)),
        ("log.cleanup.policy", CLEANUP_POLICY),
    ]
    return [(name, value, STATIC_BROKER_CONFIG_SOURCE, True) for name, value in rows]


def describe_configs(backend, body, version):
    Result = DescribeConfigsResponse.DescribeConfigsResult
    Config = Result.DescribeConfigsResourceResult
    results = []
    for resource in body.resources:
        code, message, rows = NONE, None, []
        if resource.resource_type == TOPIC_RESOURCE:
            try:
                rows = _topic_configs(backend.metadata.registry.topic_config(resource.resource_name))
            except UnknownTopicError:
                code, message = UNKNOWN_TOPIC_OR_PARTITION, f"topic {resource.resource_name!r} does not exist"
            except RaylogError as err:
                code, message = UNKNOWN_SERVER_ERROR, str(err).splitlines()[0]
        elif resource.resource_type == BROKER_RESOURCE:
            rows = _broker_configs()
        else:
            code, message = INVALID_CONFIG, f"resource type {resource.resource_type} is not served (topics and brokers are)"
        wanted = resource.configuration_keys
        if wanted is not None:
            rows = [row for row in rows if row[0] in set(wanted)]
        configs = [Config(name=name, value=value, read_only=read_only, config_source=source, is_sensitive=False,
                          synonyms=[], config_type=0, documentation=None)
                   for name, value, source, read_only in rows]
        results.append(Result(error_code=code, error_message=message, resource_type=resource.resource_type,
                              resource_name=resource.resource_name, configs=configs))
    return DescribeConfigsResponse[version](throttle_time_ms=0, results=results)


def _unique(configs) -> list:
    """The entries of one resource; :class:`Refused` (INVALID_REQUEST) for a name given twice."""
    entries = list(configs or ())
    names = [entry.name for entry in entries]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise Refused(INVALID_REQUEST, f"config {twice[0]!r} is given more than once for one resource")
    return entries


def _incremental(entries) -> Callable[[TopicConfig], dict]:
    """The change (old config -> settings) of IncrementalAlterConfigs ``entries``."""
    ops = []
    for entry in _unique(entries):
        field = _field(entry.name)
        op = entry.config_operation
        if op == SET:
            ops.append((op, *_setting(entry.name, entry.value)))
        elif op == DELETE:
            ops.append((op, field, None))
        elif op in (APPEND, SUBTRACT):
            if field != "cleanup_policy":
                raise Refused(INVALID_CONFIG, f"config {entry.name!r} is not a list: APPEND and SUBTRACT apply "
                                              f"to cleanup.policy only; use SET")
            if entry.value is None:
                raise Refused(INVALID_CONFIG, f"config {entry.name!r} has no value")
            ops.append((op, field, {part.strip() for part in entry.value.split(",") if part.strip()}))
        else:
            raise Refused(INVALID_REQUEST, f"config operation {op} is not one of Kafka's (0 SET, 1 DELETE, "
                                           f"2 APPEND, 3 SUBTRACT)")

    def change(old: TopicConfig) -> dict:
        defaults = TopicConfig()
        settings = {}
        for op, field, value in ops:
            if op == SET:
                settings[field] = value
            elif op == DELETE:
                settings[field] = getattr(defaults, field)
            else:
                parts = set(old.cleanup_policy.split(","))
                parts = parts | value if op == APPEND else parts - value
                if not parts:
                    raise Refused(INVALID_CONFIG, "cleanup.policy cannot be empty: keep delete or compact")
                settings[field] = ",".join(sorted(parts))
        return settings

    return change


def _replacing(entries) -> Callable[[TopicConfig], dict]:
    """The change of AlterConfigs ``entries``: the named settings, every
    other live one back to raylog's default (Kafka's AlterConfigs replaces
    a topic's whole set); settings fixed at creation keep their values."""
    named = dict(_setting(entry.name, entry.value) for entry in _unique(entries))

    def change(old: TopicConfig) -> dict:
        defaults = TopicConfig()
        settings = {field: getattr(defaults, field) for field in TOPIC_CONFIGS.values()
                    if field not in FIXED_SETTINGS}
        settings.update(named)
        return settings

    return change


def _alter(backend, body, version, response, change_of, what: str):
    """AlterConfigs and IncrementalAlterConfigs alike: each TOPIC resource
    changed by ``change_of(configs)`` (module docstring)."""
    Result = response.AlterConfigsResourceResponse
    results = []
    for resource in body.resources:
        code, message = NONE, None
        try:
            if resource.resource_type != TOPIC_RESOURCE:
                raise Refused(INVALID_CONFIG, f"resource type {resource.resource_type} cannot be changed: raylog's "
                                              f"broker settings are read-only; change topics")
            config = alter_topic_config(backend.metadata.registry, resource.resource_name,
                                        change_of(resource.configs), validate_only=body.validate_only)
            if not body.validate_only:
                log.info("Kafka %s: topic %s now %s", what, resource.resource_name, config)
        except Refused as err:
            code, message = err.code, err.message
        except UnknownTopicError:
            code, message = UNKNOWN_TOPIC_OR_PARTITION, f"topic {resource.resource_name!r} does not exist"
        except ConfigError as err:  # ConfigNotLiveError among them
            code, message = INVALID_CONFIG, _kafka_message(str(err).splitlines()[0])
        except RaylogError as err:
            code = REQUEST_TIMED_OUT if err.retriable else UNKNOWN_SERVER_ERROR
            message = str(err).splitlines()[0]
        results.append(Result(error_code=code, error_message=message, resource_type=resource.resource_type,
                              resource_name=resource.resource_name))
    return response[version](throttle_time_ms=0, responses=results)


def alter_configs(backend, body, version):
    return _alter(backend, body, version, AlterConfigsResponse, _replacing, "AlterConfigs")


def incremental_alter_configs(backend, body, version):
    return _alter(backend, body, version, IncrementalAlterConfigsResponse, _incremental,
                  "IncrementalAlterConfigs")


def _delete_records_code(err: RaylogError) -> int:
    """Kafka's code for a partition's refused DeleteRecords."""
    for kind, code in ((OffsetOutOfRangeError, OFFSET_OUT_OF_RANGE), (UnknownTopicError, UNKNOWN_TOPIC_OR_PARTITION),
                       (UnknownPartitionError, UNKNOWN_TOPIC_OR_PARTITION), (NotOwnerError, NOT_LEADER_OR_FOLLOWER),
                       (BrokerUnavailableError, NOT_LEADER_OR_FOLLOWER)):
        if isinstance(err, kind):
            return code
    return REQUEST_TIMED_OUT if err.retriable else UNKNOWN_SERVER_ERROR


def delete_records(backend, body, version):
    """DeleteRecords (see the module docstring)."""
    Topic = DeleteRecordsResponse.DeleteRecordsTopicResult
    Partition = Topic.DeleteRecordsPartitionResult
    topics = list(body.topics or ())
    named = sum(len(topic.partitions or ()) for topic in topics)
    if named > MAX_PARTITIONS:
        raise BadFrame(f"a DeleteRecords naming {named} partitions (at most {MAX_PARTITIONS} are served in one "
                       f"request)")
    timeout_s = min(CREATE_TIMEOUT_S, max(1.0, (body.timeout_ms or 0) / 1000.0))
    seen = [(topic.name, p.partition_index) for topic in topics for p in topic.partitions or ()]
    results = []
    for topic in topics:
        partitions = []
        for p in topic.partitions or ():
            code, low = NONE, -1
            try:
                if seen.count((topic.name, p.partition_index)) > 1:
                    code = INVALID_REQUEST
                elif backend.topics is None:
                    code = CLUSTER_AUTHORIZATION_FAILED
                else:
                    low = backend.topics.delete_records(topic.name, {p.partition_index: p.offset},
                                                        timeout_s)[p.partition_index]
                    log.info("Kafka DeleteRecords: %s-%d starts at %d now", topic.name, p.partition_index, low)
            except RaylogError as err:
                code, low = _delete_records_code(err), -1
            partitions.append(Partition(partition_index=p.partition_index, low_watermark=low, error_code=code))
        results.append(Topic(name=topic.name, partitions=partitions))
    return DeleteRecordsResponse[version](throttle_time_ms=0, topics=results)
