"""A replica that takes the lead while ZooKeeper is away (a host cut off, a
network partition healing) still registers its endpoint: the epoch bump
and the registration are retried, and a leader that cannot register within
``REREGISTER_S`` ends its process (Ray starts it again) instead of holding
the lead where no client finds it. Pure logic: the actor's body runs
without Ray, ZooKeeper is an in-memory stand-in that fails when told, the
process exit a recorder."""

from __future__ import annotations

import threading
import types

import pytest
from kazoo.exceptions import ConnectionLoss

import raylog.actors.partition as partition
from raylog.errors import StaleEpochError


class _Exited(Exception):
    pass


class _ZooKeeper:
    """``get``/``set`` of one node; the next ``failures`` calls raise
    kazoo's ConnectionLoss (what a cut-off host's client raises)."""

    def __init__(self, failures: int):
        self.failures, self.version, self.hosts, self.chroot = failures, 3, [("10.0.0.1", 2181)], ""

    def _maybe_fail(self):
        if self.failures:
            self.failures -= 1
            raise ConnectionLoss()

    def get(self, path):
        self._maybe_fail()
        return b"{}", None

    def set(self, path, data):
        self._maybe_fail()
        self.version += 1
        return types.SimpleNamespace(version=self.version)


class _Registry:
    paths = types.SimpleNamespace(partition=lambda topic, p: f"/t/{topic}/{p}")

    def __init__(self, zk, stale=False):
        self.zk, self.stale, self.endpoints = zk, stale, []

    def register_endpoint(self, topic, partition, host, port, name, epoch):
        self.zk._maybe_fail()
        if self.stale:
            raise StaleEpochError(f"{topic}-{partition}: a newer epoch registered")
        self.endpoints.append((topic, partition, host, port, epoch))


@pytest.fixture
def exits(monkeypatch):
    seen = []

    def exit_process(status, message, *args, exc_info=False):
        seen.append(status)
        raise _Exited

    monkeypatch.setattr(partition, "exit_process", exit_process)
    return seen


def _actor(zk, stale=False):
    actor = object.__new__(partition.PartitionActor)
    actor.topic, actor.partition, actor.replica, actor.role = "clicks", 0, None, None
    actor.host, actor.port, actor.name, actor.epoch = "10.0.0.2", 9000, "p-clicks-0", 0
    actor._closed = threading.Event()
    actor.zk, actor.registry = zk, _Registry(zk, stale)
    return actor


def test_a_new_leader_registers_after_zookeeper_failed_while_it_took_the_lead(exits):
    zk = _ZooKeeper(failures=3)
    actor = _actor(zk)
    actor._take_lead()
    assert exits == []
    assert actor.registry.endpoints == [("clicks", 0, "10.0.0.2", 9000, actor.epoch)]
    assert actor.epoch == zk.version  # the epoch of the bump that succeeded


def test_a_leader_that_cannot_register_ends_its_process(exits, monkeypatch):
    monkeypatch.setattr(partition, "REREGISTER_S", 0.5)
    actor = _actor(_ZooKeeper(failures=10**6))
    with pytest.raises(_Exited):
        actor._take_lead()
    assert exits == [partition.EXIT_UNREGISTERED]


def test_a_leader_whose_epoch_is_stale_ends_its_process_at_once(exits):
    actor = _actor(_ZooKeeper(failures=0), stale=True)
    with pytest.raises(_Exited):
        actor._reregister()
    assert exits == [partition.EXIT_UNREGISTERED]


def test_a_closed_actor_does_not_exit_when_registering_fails(exits, monkeypatch):
    monkeypatch.setattr(partition, "REREGISTER_S", 0.3)
    actor = _actor(_ZooKeeper(failures=10**6))
    actor._closed.set()
    actor._reregister()
    assert exits == []
