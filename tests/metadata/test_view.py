"""raylog.metadata.view.Metadata against a real ZooKeeper: a cached topic
config follows the topic's partition count as it grows
(``client.add_partitions``), by its watch and by a second look before a
partition beyond the cached count is refused."""

from __future__ import annotations

import pytest

from raylog.config import TopicConfig
from raylog.errors import UnknownPartitionError
from raylog.metadata import ConnectionSettings, Metadata
from raylog.testing.clusters import wait_until


def _grow(registry, topic: str, total: int) -> None:
    config, version = registry.topic_config_version(topic)
    places = {p: {"node": "ip:127.0.0.1", "log_dir": f"/d/{topic}-{p}"} for p in range(config.partitions, total)}
    assert registry.add_partitions(topic, config.replace(partitions=total), version, places)


@pytest.fixture
def metadata(registry, zookeeper, cluster_name):
    view = Metadata(registry, ConnectionSettings(zookeeper.connect_string, cluster_name))
    yield view
    view.close()


def test_a_partition_added_a_moment_ago_is_found_before_the_watch_tells(registry, metadata):
    registry.create_topic("t", TopicConfig(partitions=1))
    metadata._watched.add("t")  # noqa: SLF001 - no watch armed: the second look alone
    assert metadata.partitions("t") == 1
    _grow(registry, "t", 3)
    registry.register_endpoint("t", 2, "127.0.0.1", 9999, "actor", epoch=1)
    assert metadata.endpoint("t", 2) == ("127.0.0.1", 9999)
    assert metadata.partitions("t") == 3
    with pytest.raises(UnknownPartitionError, match="partitions 0..2, not 3"):
        metadata.endpoint("t", 3)


def test_the_watch_keeps_the_count_current_and_tells_the_callbacks(registry, metadata):
    registry.create_topic("w", TopicConfig(partitions=2))
    heard = []
    metadata.on_partitions(lambda topic, count: heard.append((topic, count)))
    assert metadata.partitions("w") == 2
    _grow(registry, "w", 5)
    assert wait_until(lambda: heard == [("w", 5)], 10), heard
    assert metadata._configs["w"].partitions == 5  # noqa: SLF001 - the cache itself, no read
    callback = lambda topic, count: heard.append(("second", count))  # noqa: E731
    metadata.on_partitions(callback)
    metadata.off_partitions(callback)
    _grow(registry, "w", 6)
    assert wait_until(lambda: heard == [("w", 5), ("w", 6)], 10), heard


def test_a_topic_deleted_after_it_was_read_is_named_as_deleted_when_the_watch_saw_it_go(registry, metadata):
    """The watch drops a deleted topic's config from the cache; the next look
    says the topic was deleted (not "create it first"), and a topic made again
    under that name is found as it is now."""
    from raylog.errors import UnknownTopicError

    registry.create_topic("gone", TopicConfig(partitions=1))
    assert metadata.partitions("gone") == 1
    registry.delete_topic("gone")
    assert wait_until(lambda: "gone" not in metadata._configs, 10)  # noqa: SLF001 - the watch fired
    with pytest.raises(UnknownTopicError, match="'gone' no longer exists .*deleted"):
        metadata.partitions("gone")
    with pytest.raises(UnknownTopicError, match="does not exist"):
        metadata.partitions("never-made")  # one this view never read: "create it first"
    registry.create_topic("gone", TopicConfig(partitions=2))
    assert wait_until(lambda: _partitions_or_none(metadata, "gone") == 2, 10)


def _partitions_or_none(metadata, topic):
    from raylog.errors import UnknownTopicError

    try:
        return metadata.partitions(topic)
    except UnknownTopicError:
        return None
