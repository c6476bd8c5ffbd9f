"""Fixtures of the data channel tests: real partition logs in ``tmp_path``,
real servers and connections on 127.0.0.1, all closed after each test.

* ``make_log(name, **config)``: a partition log (flushes only when the test
  calls ``flush()`` unless the config says otherwise). Every test runs twice,
  against the file log (:class:`PartitionLog`) and the in-memory log
  (:class:`MemoryLog`), both behind :class:`raylog.storage.base.Log`; a test
  about files alone is marked ``file_log_only``.
* ``plog``: the log of ``clicks``/0.
* ``make_server(logs, **kw)``: a started :class:`DataServer` serving the
  ``{(topic, partition): log}`` mapping.
* ``server``: serves ``plog`` as ``clicks``/0.
* ``make_conn(server, **kw)``: a :class:`BrokerConnection` to it.
"""

from __future__ import annotations

import pytest

from raylog.errors import RaylogError
from raylog.config import TopicConfig
from raylog.storage.base import Log
from raylog.storage.log import PartitionLog
from raylog.storage.memory import MemoryLog
from raylog.transfer.connection import BrokerConnection
from raylog.transfer.handshake import authenticate_socket
from raylog.transfer.server import DataServer

TOPIC = "clicks"

#: logs in tests flush when the test says so
MANUAL_FLUSH = {"flush_messages": 10**9, "flush_ms": 10**9}


@pytest.fixture(params=["file", "memory"])
def log_kind(request) -> str:
    if request.param == "memory" and request.node.get_closest_marker("file_log_only"):
        pytest.skip("about the file log alone")
    return request.param


@pytest.fixture
def make_log(tmp_path, log_kind):
    logs = []

    def make(name: str = f"{TOPIC}-0", **config) -> Log:
        settings = TopicConfig(**{**MANUAL_FLUSH, **config})
        plog = PartitionLog(tmp_path / name, settings) if log_kind == "file" else MemoryLog(settings)
        assert isinstance(plog, Log)
        logs.append(plog)
        return plog

    try:
        yield make
    finally:
        for plog in reversed(logs):
            plog.close()


@pytest.fixture
def plog(make_log) -> Log:
    return make_log()


@pytest.fixture
def make_server():
    servers = []

    def make(logs: dict, **kw) -> DataServer:
        server = DataServer(lambda topic, partition: logs.get((topic, partition)), **kw)
        servers.append(server)
        server.start()
        return server

    try:
        yield make
    finally:
        for server in reversed(servers):
            server.stop()


@pytest.fixture
def server(make_server, plog) -> DataServer:
    return make_server({(TOPIC, 0): plog})


@pytest.fixture
def make_conn():
    conns = []

    def make(server: DataServer, **kw) -> BrokerConnection:
        host, port = server.address
        conn = BrokerConnection(host, port, **kw)
        conns.append(conn)
        return conn

    try:
        yield make
    finally:
        for conn in conns:
            conn.close()


@pytest.fixture
def conn(make_conn, server) -> BrokerConnection:
    return make_conn(server)


def authenticated_or_refused(sock, token, correlation_id):
    """Authenticate a raw connection; one refused at the connection limit
    (TooManyConnectionsError, or closed) stays open on our side as a stranger would."""
    try:
        authenticate_socket(sock, token, correlation_id)
    except (RaylogError, OSError):
        pass
