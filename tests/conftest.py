"""Fixtures shared by every test suite.

* ``zookeeper`` (session): one embedded ZooKeeper for the whole run.
* ``zk`` (function): a connected :class:`kazoo.client.KazooClient` on it.
* ``make_zk`` (function): a factory for more clients (several consumers,
  a second session ...); all of them are closed after the test.
* ``cluster_name`` (function): a fresh cluster name, so that tests never see
  each other's znodes under ``/raylog/<cluster>``.
* ``registry`` (function): a :class:`raylog.groups.registry.Registry` on
  ``zk`` and ``cluster_name``.
* ``private_zookeeper`` (function): a ZooKeeper of the test's own, for tests
  that stop, restart or otherwise hurt the server.

Ray stays out of this file; suites that need Ray add their fixtures in their
own ``conftest.py``.
"""

from __future__ import annotations

import uuid

import pytest

from raylog.groups.zookeeper import EmbeddedZooKeeper, connect_kazoo

#: session timeout of test clients, in seconds
ZK_SESSION_TIMEOUT_S = 10.0


def _close(client) -> None:
    try:
        client.stop()
    finally:
        client.close()


@pytest.fixture(scope="session")
def zookeeper():
    server = EmbeddedZooKeeper()
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def make_zk(zookeeper):
    clients = []

    def make(hosts: str | None = None, **kw):
        if not zookeeper.running and hosts is None:
            zookeeper.start()  # a test stopped the shared server; bring it back
        kw.setdefault("timeout", ZK_SESSION_TIMEOUT_S)
        client = connect_kazoo(hosts or zookeeper.connect_string, **kw)
        clients.append(client)
        return client

    try:
        yield make
    finally:
        for client in reversed(clients):
            _close(client)


@pytest.fixture
def zk(make_zk):
    return make_zk()


@pytest.fixture
def cluster_name() -> str:
    return f"test-{uuid.uuid4().hex[:16]}"


@pytest.fixture
def registry(zk, cluster_name):
    from raylog.groups.registry import Registry

    return Registry(zk, cluster_name)


@pytest.fixture
def private_zookeeper(tmp_path):
    server = EmbeddedZooKeeper(data_dir=str(tmp_path / "zookeeper"))
    try:
        server.start()
        yield server
    finally:
        server.stop()
