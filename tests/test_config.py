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
