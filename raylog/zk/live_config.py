"""Changing a live topic's config (issue 46 point 1, issue 49): which
settings may change while the topic serves, the versioned write of
``topics/<topic>`` (docs/design.md section 4) and the watch its partition
actors keep on it.

::

    config = alter_topic_config(registry, "clicks", lambda old: {"cleanup_policy": "compact"})
    watch = watch_topic_config(registry, "clicks", on_change)   # on_change(TopicConfig) on kazoo's thread

**Live settings** (:data:`LIVE_SETTINGS`) take effect on every running
partition of the topic within moments (its actor watches the node, see
:mod:`raylog.actors.partition`), and on any partition started later (it
reads the node before it serves): retention, segments, flushes, the
cleanup policy and the compaction settings, ``unclean_leader_election``
(read by followers when a leader is lost) and ``replica_replace_after_s``
(read by the supervisor on each pass).

**Fixed settings** (:data:`FIXED_SETTINGS`, each with the reason) are
refused with :class:`~raylog.errors.ConfigNotLiveError` when a change asks
for another value than the topic has; naming one with its present value is
accepted (so a tool may send a whole config back).

The write is a compare-and-set on the node's version: the change is
computed from the config read (``change(old) -> {setting: value}``), so
two writers never lose each other's changes; a writer that lost the race
reads again and computes again (:data:`CONTENDED`: at most
:data:`CONTENDED_TRIES` times, with jittered pauses), then raises a
retriable :class:`~raylog.errors.RaylogError` having changed nothing.
A change is validated whole by :class:`~raylog.config.TopicConfig` before
anything is written: a bad value is a :class:`~raylog.errors.ConfigError`
naming the setting, and the stored config is unchanged.

Thread-safety: the functions keep no state; the registry and its
KazooClient are thread-safe. A :class:`ConfigWatch`'s callback runs on
kazoo's event thread: it must not block for long.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Callable

from kazoo.exceptions import BadVersionError, NoNodeError

from raylog.config import TopicConfig
from raylog.errors import ConfigError, ConfigNotLiveError, RaylogError
from raylog.retry import RetryPolicy
from raylog.zk.errors import zookeeper_errors
from raylog.zk.registry_helpers import CONTENDED_TRIES

#: how a writer that lost the compare-and-set tries again: at once first, then
#: after short jittered pauses (writers racing in step would lose together again)
CONTENDED = RetryPolicy(max_tries=CONTENDED_TRIES, delay_s=0.002, max_delay_s=0.2, jitter=0.9, deadline_s=None)

log = logging.getLogger(__name__)

#: the settings that cannot change on a live topic, and why (the message of
#: :class:`~raylog.errors.ConfigNotLiveError`)
FIXED_SETTINGS = {
    "partitions": "a topic's partition count only grows, with client.add_partitions (keys map to partitions "
                  "by it; docs/design.md section 4)",
    "replication_factor": "a topic's replica count is fixed when it is made (move replicas with "
                          "reassign_partition instead; docs/design.md section 7)",
    "max_message_bytes": "producers, consumers, the data servers and log recovery bound messages by it when "
                         "they start, and messages already stored must stay readable",
    "max_inflated_bytes": "consumers and partition logs bound inflated sets by it when they start",
    "max_producer_ids": "a partition sizes its producer-state table by it when its log opens",
    "min_insync_replicas": "a replicated partition's leader reads it once, when it takes the lead",
    "replica_lag_ms": "a replicated partition's leader reads it once, when it takes the lead",
}
#: the settings a live topic's partitions pick up while they serve
LIVE_SETTINGS = tuple(f.name for f in dataclasses.fields(TopicConfig) if f.name not in FIXED_SETTINGS)


def check_change(old: TopicConfig, changes: dict) -> TopicConfig:
    """The config ``old`` becomes with ``changes`` (``{setting: value}``),
    validated whole; raises :class:`ConfigError` for a name TopicConfig does
    not have or a bad value (the message names the setting) and
    :class:`ConfigNotLiveError` for a fixed setting given another value."""
    known = {f.name for f in dataclasses.fields(TopicConfig)}
    unknown = sorted(set(changes) - known)
    if unknown:
        raise ConfigError(f"unknown topic setting{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; the "
                          f"settings a live topic takes: {', '.join(LIVE_SETTINGS)}", setting=unknown[0])
    for name, value in changes.items():
        if name in FIXED_SETTINGS and value != getattr(old, name):
            raise ConfigNotLiveError(
                f"{name} cannot change on a live topic ({getattr(old, name)!r} -> {value!r}): "
                f"{FIXED_SETTINGS[name]}; make a new topic with the {name} wanted instead", setting=name)
    try:
        return old.replace(**changes)
    except ConfigError as err:
        raise ConfigError(str(err), setting=_named(str(err), changes)) from None


def _named(message: str, changes: dict) -> str | None:
    """The setting of ``changes`` a TopicConfig message names first."""
    found = [(message.find(name), name) for name in changes if name in message]
    return min(found)[1] if found else None


def alter_topic_config(registry, topic: str, change: Callable[[TopicConfig], dict], *,
                       validate_only: bool = False) -> TopicConfig:
    """Apply ``change(old config) -> {setting: value}`` to ``topic``'s
    stored config by a versioned compare-and-set (module docstring); return
    the new config (``validate_only``: the config it would be, nothing
    written). Raises UnknownTopicError, ConfigError, ConfigNotLiveError, or
    the retriable ZooKeeper errors of :mod:`raylog.zk.registry`."""
    path = registry.paths.topic(topic)
    zk = registry.zk
    pauses = iter(CONTENDED.delays())
    with zookeeper_errors(zk, f"change the config of topic {topic!r}"):
        for pause in [0.0, *pauses]:
            time.sleep(pause)
            try:
                data, stat = registry.calls.call(zk.get_async, path)
            except NoNodeError:
                raise registry.calls.unknown_topic(topic) from None
            if not data:
                raise registry.calls.unknown_topic(topic)
            old = TopicConfig.from_json(data)
            new = check_change(old, dict(change(old)))
            if validate_only or new == old:
                return new
            try:
                registry.calls.call(zk.set_async, path, new.to_json(), version=stat.version)
            except BadVersionError:
                continue  # another writer came first: read its config and compute again
            except NoNodeError:
                raise registry.calls.unknown_topic(topic) from None
            log.info("topic %s: config changed: %s", topic,
                     {k: getattr(new, k) for k in LIVE_SETTINGS if getattr(new, k) != getattr(old, k)})
            return new
    raise RaylogError(f"could not change the config of topic {topic!r}: it kept changing under this writer "
                      f"({CONTENDED_TRIES} tries); retry", topic=topic, retriable=True)


class ConfigWatch:
    """A kazoo data watch on ``topics/<topic>``: calls ``on_change(config)``
    with the stored :class:`TopicConfig` now (in the constructor's thread)
    and after each change (on kazoo's event thread), also after a session
    was lost and a new one made. A node that vanished (the topic deleted)
    or holds a config this version cannot read is logged and skipped.
    :meth:`stop` ends it. Thread-safety: see the module docstring."""

    def __init__(self, zk, path: str, topic: str, on_change: Callable[[TopicConfig], None]):
        self._stopped = False
        self._topic = topic
        self._on_change = on_change
        self._watch = zk.DataWatch(path, self._fired)

    def _fired(self, data, _stat):
        if self._stopped:
            return False  # kazoo ends the watch
        if not data:
            return None
        try:
            config = TopicConfig.from_json(data)
        except (ConfigError, ValueError, TypeError) as err:
            log.error("topic %s: the stored config cannot be read (%s); the partition keeps its config",
                      self._topic, err)
            return None
        try:
            self._on_change(config)
        except Exception:  # noqa: BLE001 - kazoo's thread must go on; the next change is applied again
            log.exception("topic %s: applying a changed config failed", self._topic)
        return None

    def stop(self) -> None:
        self._stopped = True


def watch_topic_config(registry, topic: str, on_change: Callable[[TopicConfig], None]) -> ConfigWatch:
    """A :class:`ConfigWatch` of ``topic`` on the registry's session."""
    return ConfigWatch(registry.zk, registry.paths.topic(topic), topic, on_change)
