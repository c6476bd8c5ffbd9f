"""raylog._log: the levels, and what quiet drops (and nothing else)."""

from __future__ import annotations

import logging

import pytest

from raylog import _log
from raylog.errors import ConfigError


@pytest.fixture(autouse=True)
def _restore_levels():
    names = ("raylog", "raylog_spark", "kazoo")
    saved = {name: logging.getLogger(name).level for name in names}
    yield
    for name, level in saved.items():
        logging.getLogger(name).setLevel(level)
    _log.quiet_ray_start(False)


def test_a_bad_level_in_the_environment_is_a_config_error(monkeypatch):
    monkeypatch.setenv(_log.LEVEL_ENV, "LOUD")
    with pytest.raises(ConfigError, match="RAYLOG_LOG_LEVEL"):
        _log.level()


def test_quiet_by_default_and_loud_when_asked(monkeypatch):
    monkeypatch.delenv(_log.LEVEL_ENV, raising=False)
    assert _log.configure() is True
    assert logging.getLogger("raylog").getEffectiveLevel() == logging.WARNING
    assert logging.getLogger("kazoo.client").getEffectiveLevel() == logging.ERROR
    assert _log.configure(verbose=True) is False
    assert logging.getLogger("raylog").getEffectiveLevel() == logging.INFO
    assert logging.getLogger("kazoo").level == logging.NOTSET
    monkeypatch.setenv(_log.LEVEL_ENV, "debug")
    assert _log.configure() is False
    assert logging.getLogger("raylog").getEffectiveLevel() == logging.DEBUG
    monkeypatch.setenv(_log.LEVEL_ENV, "ERROR")
    assert _log.configure() is True
    assert logging.getLogger("raylog").getEffectiveLevel() == logging.ERROR


def test_quiet_drops_rays_token_notice_and_nothing_else():
    logger = logging.getLogger(_log.RAY_TOKEN_LOGGER)
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    handler = Keep()
    logger.addHandler(handler)
    try:
        _log.quiet_ray_start(True)
        logger.warning(_log.RAY_TOKEN_NOTICE + ". Set RAY_AUTH_MODE=disabled to opt out.")
        logger.warning("Token authentication is disabled for this Ray cluster.")
        _log.quiet_ray_start(False)
        logger.warning(_log.RAY_TOKEN_NOTICE + ".")
    finally:
        logger.removeHandler(handler)
    assert seen == ["Token authentication is disabled for this Ray cluster.", _log.RAY_TOKEN_NOTICE + "."]
