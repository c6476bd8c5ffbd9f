"""TopicConfig: validated on construction, JSON round trip."""

from __future__ import annotations

import pytest

from raylog.config import TopicConfig
from raylog.errors import ConfigError


@pytest.mark.parametrize(
    "bad",
    [
        {"partitions": 0},
        {"partitions": True},
        {"segment_bytes": -1},
        {"flush_messages": 0},
        {"flush_ms": -1},
        {"retention_ms": -5},
        {"retention_bytes": -2},
        {"max_message_bytes": 2048, "segment_bytes": 1024},
    ],
)
def test_bad_settings_are_config_errors(bad):
    with pytest.raises(ConfigError):
        TopicConfig(**bad)


def test_json_round_trip_and_unknown_settings():
    config = TopicConfig(partitions=3, retention_bytes=10 * 2**20, flush_ms=5)
    assert TopicConfig.from_json(config.to_json()) == config
    with pytest.raises(ConfigError, match="unknown topic settings: colour"):
        TopicConfig.from_json(b'{"partitions": 1, "colour": "red"}')


def test_replace_validates():
    with pytest.raises(ConfigError):
        TopicConfig().replace(partitions=-1)


@pytest.mark.parametrize(
    "bad, says",
    [
        ({"cleanup_policy": "shrink"}, "cleanup_policy must be one of"),
        ({"cleanup_policy": "compact,shrink"}, "cleanup_policy must be one of"),
        ({"cleanup_policy": None}, "cleanup_policy must be one of"),
        ({"delete_retention_ms": -1}, "delete_retention_ms"),
        ({"min_compaction_lag_ms": 1.5}, "min_compaction_lag_ms"),
        ({"max_compaction_lag_ms": 0}, "max_compaction_lag_ms"),
        ({"max_compaction_lag_ms": 1 << 63}, "max_compaction_lag_ms"),
        ({"min_compaction_lag_ms": 10, "max_compaction_lag_ms": 5}, "must not be below"),
        ({"min_cleanable_dirty_ratio": 0}, r"\(0, 1\]"),
        ({"min_cleanable_dirty_ratio": 1.01}, r"\(0, 1\]"),
        ({"min_cleanable_dirty_ratio": True}, r"\(0, 1\]"),
        ({"min_cleanable_dirty_ratio": "0.5"}, r"\(0, 1\]"),
    ],
)
def test_bad_compaction_settings_are_config_errors(bad, says):
    with pytest.raises(ConfigError, match=says):
        TopicConfig(**bad)


def test_cleanup_policies():
    assert TopicConfig().cleanup_policy == "delete" and not TopicConfig().compacted
    assert TopicConfig().deletes_old_segments
    compact = TopicConfig(cleanup_policy="compact", min_cleanable_dirty_ratio=1)
    assert compact.compacted and not compact.deletes_old_segments
    both = TopicConfig(cleanup_policy="delete, compact")  # Kafka's lists come either way round
    assert both.cleanup_policy == "compact,delete" and both.compacted and both.deletes_old_segments
    assert TopicConfig.from_json(both.to_json()) == both
    # a topic stored before these settings existed opens with the defaults
    assert TopicConfig.from_json(b'{"partitions": 2}').cleanup_policy == "delete"
