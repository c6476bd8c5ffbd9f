"""raylog.quiet: the levels, and what quiet drops (and nothing else)."""

from __future__ import annotations

import logging
import os
import sys

import pytest

from raylog import quiet
from raylog.errors import ConfigError


@pytest.fixture(autouse=True)
def _restore_levels():
    names = ("raylog", "raylog_spark", "kazoo")
    saved = {name: logging.getLogger(name).level for name in names}
    yield
    for name, level in saved.items():
        logging.getLogger(name).setLevel(level)
    quiet.quiet_ray_start(False)


def test_a_bad_level_in_the_environment_is_a_config_error(monkeypatch):
    monkeypatch.setenv(quiet.LEVEL_ENV, "LOUD")
    with pytest.raises(ConfigError, match="RAYLOG_LOG_LEVEL"):
        quiet.level()


def test_quiet_by_default_and_loud_when_asked(monkeypatch):
    monkeypatch.delenv(quiet.LEVEL_ENV, raising=False)
    assert quiet.configure() is True
    assert logging.getLogger("raylog").getEffectiveLevel() == logging.WARNING
    assert logging.getLogger("kazoo.client").getEffectiveLevel() == logging.ERROR
    assert quiet.configure(verbose=True) is False
    assert logging.getLogger("raylog").getEffectiveLevel() == logging.INFO
    assert logging.getLogger("kazoo").level == logging.NOTSET
    monkeypatch.setenv(quiet.LEVEL_ENV, "debug")
    assert quiet.configure() is False
    assert logging.getLogger("raylog").getEffectiveLevel() == logging.DEBUG
    monkeypatch.setenv(quiet.LEVEL_ENV, "ERROR")
    assert quiet.configure() is True
    assert logging.getLogger("raylog").getEffectiveLevel() == logging.ERROR


def test_quiet_drops_rays_token_notice_and_nothing_else():
    logger = logging.getLogger(quiet.RAY_TOKEN_LOGGER)
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    handler = Keep()
    logger.addHandler(handler)
    try:
        quiet.quiet_ray_start(True)
        logger.warning(quiet.RAY_TOKEN_NOTICE + ". Set RAY_AUTH_MODE=disabled to opt out.")
        logger.warning("Token authentication is disabled for this Ray cluster.")
        quiet.quiet_ray_start(False)
        logger.warning(quiet.RAY_TOKEN_NOTICE + ".")
    finally:
        logger.removeHandler(handler)
    assert seen == ["Token authentication is disabled for this Ray cluster.", quiet.RAY_TOKEN_NOTICE + "."]


def test_forwarded_lines_lose_only_rays_core_startup_line():
    from ray._private.ray_logging import WorkerStandardStreamDispatcher

    import ray._private.ray_logging as ray_logging

    dispatcher = WorkerStandardStreamDispatcher()
    printed = []
    dispatcher.add_handler("ray_print_logs", lambda data: printed.append(list(data["lines"])))
    saved = ray_logging.global_worker_stdstream_dispatcher
    ray_logging.global_worker_stdstream_dispatcher = dispatcher
    try:
        quiet.quiet_forwarded_lines()
        quiet.quiet_forwarded_lines()  # idempotent: one filter
    finally:
        ray_logging.global_worker_stdstream_dispatcher = saved
    startup = "[2026-11-23 02:49:42,550 I 3265 3379] gcs_client.cc:96: GcsClient has no Cluster ID set, and won't fetch from GCS."
    dispatcher.emit({"lines": [startup]})
    dispatcher.emit({"lines": [startup, "an executor's own line"]})
    dispatcher.emit({"lines": ["[2026-11-23 02:49:42,550 W 1 2] gcs_client.cc:210: Failed to get cluster ID"]})
    assert printed == [["an executor's own line"], ["[2026-11-23 02:49:42,550 W 1 2] gcs_client.cc:210: Failed to get cluster ID"]]
    assert len(dispatcher.handlers) == 1


def test_filter_child_stderr_drops_the_core_line_and_passes_the_rest(capfd):
    """A child started in the block writes Ray's C++ start-up line among
    others: only that line is gone, the rest arrives in order; this
    process's own stderr is direct again after the block."""
    import subprocess
    import threading

    core = "[2026-11-23 06:50:52,010 I 1333 1426] gcs_client.cc:96: GcsClient has no Cluster ID set, and won't fetch."
    lines = ["first", core, "[2026-11-23 06:50:52,011 W 1 2] other.cc:1: kept", "last, no newline"]
    script = "import sys; sys.stderr.write(%r)" % "\n".join(lines)
    before = {t.ident for t in threading.enumerate()}
    with quiet.filter_child_stderr():
        child = subprocess.Popen([sys.executable, "-c", script])
    child.wait(timeout=60)
    for thread in threading.enumerate():
        if thread.ident not in before and thread.name == "raylog-stderr-filter":
            thread.join(timeout=30)  # ends at the child's end of file
            assert not thread.is_alive()
    os.write(2, b"|own\n")
    assert capfd.readouterr().err == "first\n" + lines[2] + "\nlast, no newline|own\n"
