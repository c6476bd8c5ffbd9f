"""raylog's ZooKeeper sessions: kazoo's retry warnings are dropped unless
raylog is verbose, every other kazoo record passes; a malformed address is
refused before any connection is tried."""

from __future__ import annotations

import logging

import pytest

from raylog.errors import ConfigError
from raylog.zk.session import SESSION_LOGGER, check_hosts, connect_kazoo


@pytest.fixture
def seen():
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    handler = Keep()
    saved = {name: logging.getLogger(name).level for name in ("raylog", "kazoo")}
    logging.getLogger("kazoo").setLevel(logging.NOTSET)  # as in an actor: nothing set
    SESSION_LOGGER.addHandler(handler)
    yield records
    SESSION_LOGGER.removeHandler(handler)
    for name, level in saved.items():
        logging.getLogger(name).setLevel(level)


def test_retry_warnings_are_dropped_unless_verbose(seen):
    logging.getLogger("raylog").setLevel(logging.WARNING)
    SESSION_LOGGER.warning("Connection dropped: %s", "socket connection broken")
    SESSION_LOGGER.warning("Transition to CONNECTING")
    SESSION_LOGGER.warning("Session has expired")
    SESSION_LOGGER.warning("AUTH_FAILED closing: %s", "bad digest")
    assert seen == ["AUTH_FAILED closing: bad digest"]
    logging.getLogger("raylog").setLevel(logging.INFO)
    SESSION_LOGGER.warning("Connection dropped: %s", "socket connection broken")
    assert seen[-1] == "Connection dropped: socket connection broken"


def test_the_sessions_raylog_makes_log_through_the_quiet_logger(zookeeper):
    client = connect_kazoo(zookeeper.connect_string)
    try:
        assert client.logger is SESSION_LOGGER
    finally:
        client.stop()
        client.close()


@pytest.mark.parametrize("hosts, fragment", [
    ("127.0.0.1:99999", "port '99999'"),
    ("127.0.0.1:0", "port '0'"),
    ("127.0.0.1:abc", "port 'abc'"),
    (":2181", "has no host"),
    ("", "must be 'host:port'"),
    (None, "must be 'host:port'"),
    ("a:2181,b:70000/chroot", "port '70000'"),
])
def test_a_malformed_address_is_a_config_error_naming_the_part(hosts, fragment):
    with pytest.raises(ConfigError, match=fragment):
        connect_kazoo(hosts, timeout_s=1.0)


def test_well_formed_addresses_pass():
    for hosts in ("127.0.0.1:2181", "zk1:2181,zk2:2182/raylog", "zk", "[::1]:2181"):
        assert check_hosts(hosts) == hosts


def test_the_outage_reporter_says_one_line_per_outage_and_one_per_recovery():
    from kazoo.protocol.states import KazooState

    from raylog.zk.session import OutageReporter

    lines = []

    class Keep(logging.Handler):
        def emit(self, record):
            if record.levelno >= logging.WARNING:
                lines.append(record.getMessage())

    logger = logging.getLogger("raylog.test-outage-reporter")
    logger.addHandler(Keep())
    reporter = OutageReporter("zk:2181", logger)
    for state in (KazooState.SUSPENDED, KazooState.SUSPENDED, KazooState.LOST, KazooState.CONNECTED,
                  KazooState.LOST, KazooState.CONNECTED,  # an expiry told on reconnecting: no outage
                  KazooState.SUSPENDED, KazooState.CONNECTED):
        reporter(state)
    assert len(lines) == 4, lines
    assert lines[0].startswith("ZooKeeper at zk:2181 is unreachable")
    assert lines[1].startswith("ZooKeeper at zk:2181 is reachable again after") and "expired" in lines[1]
    assert "unreachable" in lines[2] and "reachable again" in lines[3] and "expired" not in lines[3]
    reporter.close()
    reporter(KazooState.SUSPENDED)  # a stopping client's own disconnect
    assert len(lines) == 4
