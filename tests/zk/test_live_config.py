"""Changing a live topic's config in ZooKeeper (raylog.zk.live_config)
against a real ZooKeeper: the versioned write, what is refused, the watch."""

from __future__ import annotations

import threading

import pytest

from raylog.config import TopicConfig
from raylog.errors import ConfigError, ConfigNotLiveError, RaylogError, UnknownTopicError
from raylog.testing.clusters import wait_until
from raylog.zk.live_config import FIXED_SETTINGS, LIVE_SETTINGS, alter_topic_config, watch_topic_config


@pytest.fixture
def topic(registry):
    registry.create_topic("clicks", TopicConfig(partitions=3, retention_ms=1000))
    return "clicks"


# -------------------------------------------------------------- failures first


@pytest.mark.parametrize("change, error, named", [
    ({"min_cleanable_dirty_ratio": 2.0}, ConfigError, "min_cleanable_dirty_ratio"),
    ({"cleanup_policy": "shred"}, ConfigError, "cleanup_policy"),
    ({"retention_ms": "soon"}, ConfigError, "retention_ms"),
    ({"max_compaction_lag_ms": 10, "min_compaction_lag_ms": 20}, ConfigError, "max_compaction_lag_ms"),
    ({"retention_hours": 5}, ConfigError, "retention_hours"),
    ({"partitions": 4}, ConfigNotLiveError, "partitions"),
    ({"replication_factor": 3}, ConfigNotLiveError, "replication_factor"),
    ({"max_message_bytes": 2 << 20}, ConfigNotLiveError, "max_message_bytes"),
], ids=["ratio", "policy", "type", "lags", "unknown", "partitions", "replication", "max_message_bytes"])
def test_a_refused_change_names_the_setting_and_leaves_the_config_as_it_was(registry, topic, change, error, named):
    before = registry.topic_config(topic)
    with pytest.raises(error, match=named) as caught:
        alter_topic_config(registry, topic, lambda old: change)
    assert caught.value.setting == named
    assert type(caught.value) is error  # a bad value is not called "not live"
    assert registry.topic_config(topic) == before


def test_a_fixed_setting_refusal_says_why(registry, topic):
    with pytest.raises(ConfigNotLiveError, match="only grows, with client.add_partitions") as caught:
        alter_topic_config(registry, topic, lambda old: {"partitions": 9, "retention_ms": 5})
    assert caught.value.setting == "partitions"
    assert registry.topic_config(topic).retention_ms == 1000  # nothing of the change was written


def test_an_unknown_topic_is_unknown(registry):
    with pytest.raises(UnknownTopicError):
        alter_topic_config(registry, "nope", lambda old: {"retention_ms": 5})


# -------------------------------------------------------------- what works


def test_a_change_is_written_and_returned(registry, topic):
    new = alter_topic_config(registry, topic, lambda old: {"cleanup_policy": "delete,compact",
                                                           "min_cleanable_dirty_ratio": 0.1})
    assert new.cleanup_policy == "compact,delete"  # Kafka's either order, one spelling
    assert registry.topic_config(topic) == new
    assert new.partitions == 3 and new.retention_ms == 1000  # the rest as it was


def test_a_fixed_setting_named_with_its_value_is_accepted(registry, topic):
    new = alter_topic_config(registry, topic, lambda old: {"partitions": 3, "retention_ms": 7})
    assert new.retention_ms == 7


def test_validate_only_writes_nothing(registry, topic):
    new = alter_topic_config(registry, topic, lambda old: {"retention_ms": 7}, validate_only=True)
    assert new.retention_ms == 7
    assert registry.topic_config(topic).retention_ms == 1000


def test_concurrent_changes_are_never_lost(registry, topic):
    """Each writer adds one to retention_ms: the compare-and-set makes the
    losers of a race compute again from the winner's config. A writer that
    lost every try got a retriable error and changed nothing (on a loaded
    machine that may happen): every change that returned is counted."""
    writers, each = 4, 10
    done, refused = [], []

    def add():
        for _ in range(each):
            try:
                alter_topic_config(registry, topic, lambda old: {"retention_ms": old.retention_ms + 1})
                done.append(1)
            except RaylogError as err:
                assert err.retriable and "kept changing" in str(err)
                refused.append(1)

    threads = [threading.Thread(target=add) for _ in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(done) + len(refused) == writers * each
    assert len(done) >= each  # the race is won often
    assert registry.topic_config(topic).retention_ms == 1000 + len(done)


def test_the_watch_sees_the_config_now_and_each_change(registry, topic):
    seen = []
    watch = watch_topic_config(registry, topic, seen.append)
    assert seen == [registry.topic_config(topic)]  # at once, in the caller's thread
    alter_topic_config(registry, topic, lambda old: {"cleanup_policy": "compact"})
    assert wait_until(lambda: len(seen) == 2 and seen[-1].compacted, 10, interval_s=0.02)
    watch.stop()
    alter_topic_config(registry, topic, lambda old: {"retention_ms": 5})
    alter_topic_config(registry, topic, lambda old: {"retention_ms": 6})
    assert not wait_until(lambda: len(seen) > 2, 1, interval_s=0.05)


def test_every_setting_is_live_or_fixed():
    assert set(LIVE_SETTINGS) | set(FIXED_SETTINGS) == {f for f in TopicConfig.__dataclass_fields__}
    assert not set(LIVE_SETTINGS) & set(FIXED_SETTINGS)
