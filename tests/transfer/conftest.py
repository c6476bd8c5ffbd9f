"""Fixtures of the data channel tests: real partition logs in ``tmp_path``,
real servers and connections on 127.0.0.1, all closed after each test.

* ``make_log(name, **config)``: a :class:`PartitionLog` (flushes only when
  the test calls ``flush()`` unless the config says otherwise).
* ``plog``: the log of ``clicks``/0.
* ``make_server(logs, **kw)``: a started :class:`DataServer` serving the
  ``{(topic, partition): log}`` mapping.
* ``server``: serves ``plog`` as ``clicks``/0.
* ``make_conn(server, **kw)``: a :class:`BrokerConnection` to it.
"""

from __future__ import annotations

import pytest

from raylog.config import TopicConfig
from raylog.storage.log import PartitionLog
from raylog.transfer.connection import BrokerConnection
from raylog.transfer.server import DataServer

TOPIC = "clicks"

#: logs in tests flush when the test says so
MANUAL_FLUSH = {"flush_messages": 10**9, "flush_ms": 10**9}


@pytest.fixture
def make_log(tmp_path):
    logs = []

    def make(name: str = f"{TOPIC}-0", **config) -> PartitionLog:
        plog = PartitionLog(tmp_path / name, TopicConfig(**{**MANUAL_FLUSH, **config}))
        logs.append(plog)
        return plog

    try:
        yield make
    finally:
        for plog in reversed(logs):
            plog.close()


@pytest.fixture
def plog(make_log) -> PartitionLog:
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
