"""The supervisor's failed repair passes: an expected fault (ZooKeeper
away: retriable) logs no traceback and nothing above debug; another raylog
error is one warning line without a traceback, once while it repeats; an
unexpected exception keeps its traceback."""

from __future__ import annotations

import logging
import time

import pytest

import raylog.actors.supervisor as supervisor_module
from raylog.errors import ConfigError, ZooKeeperUnavailableError


def _passes(monkeypatch, zookeeper, cluster_name, errors, caplog):
    """Run the supervisor body (no actor) over ``errors``, one per pass."""
    pending = list(errors)

    def failing_repair(*args, **kwargs):
        if not pending:
            return []
        raise pending.pop(0)

    monkeypatch.setattr(supervisor_module, "repair", failing_repair)
    caplog.set_level(logging.DEBUG, logger="raylog.actors.supervisor")
    body = supervisor_module.Supervisor(zookeeper.connect_string, cluster_name, interval_s=0.05)
    try:
        deadline = time.monotonic() + 30
        while pending or body.passes < 1:
            assert time.monotonic() < deadline, "the passes did not run"
            time.sleep(0.05)
    finally:
        body.stop()
        body.zk.stop()
        body.zk.close()
    return [r for r in caplog.records if r.name == "raylog.actors.supervisor"]


def test_expected_faults_log_no_traceback_and_a_repeated_error_once(monkeypatch, zookeeper, cluster_name, caplog):
    records = _passes(monkeypatch, zookeeper, cluster_name, [
        ZooKeeperUnavailableError("not connected to ZooKeeper"),
        ZooKeeperUnavailableError("not connected to ZooKeeper"),
        ConfigError("a bad placement"),
        ConfigError("a bad placement"),
        ConfigError("a bad placement"),
    ], caplog)
    assert all(r.exc_info is None for r in records)  # no traceback
    assert all(r.levelno == logging.DEBUG for r in records if "ZooKeeperUnavailableError" in r.getMessage())
    warnings = [r.getMessage() for r in records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "ConfigError: a bad placement" in warnings[0], warnings


def test_an_unexpected_exception_keeps_its_traceback(monkeypatch, zookeeper, cluster_name, caplog):
    records = _passes(monkeypatch, zookeeper, cluster_name, [KeyError("surprise")], caplog)
    (failed,) = [r for r in records if r.levelno >= logging.WARNING]
    assert failed.exc_info is not None and "repair pass failed" in failed.getMessage()
