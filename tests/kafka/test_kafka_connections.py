"""The Kafka listener's connection table (pure logic over real socket
pairs): strangers shed first at the limit, then the authenticated one idle
longest, else the new one refused; the per-address bound counts strangers
only."""

from __future__ import annotations

import socket
import time

import pytest

from raylog.kafka.connections import ClientTable


@pytest.fixture
def pairs():
    made = []

    def pair():
        a, b = socket.socketpair()
        made.extend((a, b))
        return a, b

    yield pair
    for sock in made:
        sock.close()


def _closed(sock: socket.socket) -> bool:
    """Whether the table shut ``sock`` down (its far end sees the end)."""
    sock.settimeout(0)
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False


def _admit(table, pairs, address: str, authenticated: bool = False):
    ours, theirs = pairs()
    return table.admit(ours, (address, 1000), authenticated), theirs


def test_at_the_limit_the_oldest_stranger_is_shed_first(pairs):
    table = ClientTable(max_connections=3, max_strangers_per_address=10)
    client, _ = _admit(table, pairs, "10.0.0.1", authenticated=True)
    client.waiting_since = time.monotonic() - 100  # idle for long, but authenticated: not first
    old_stranger, old_far = _admit(table, pairs, "10.0.0.2")
    new_stranger, new_far = _admit(table, pairs, "10.0.0.3")
    assert _admit(table, pairs, "10.0.0.4", authenticated=True)[0] is not None
    assert _closed(old_far) and old_stranger.shed
    assert not _closed(new_far)
    assert table.stats()["connections"] == 3 and table.stats()["connections_shed"] == 1


def test_without_strangers_the_connection_idle_longest_is_shed_else_the_new_one_refused(pairs):
    table = ClientTable(max_connections=2, shed_idle_after_s=0.5)
    busy, busy_far = _admit(table, pairs, "10.0.0.1", authenticated=True)
    idle, idle_far = _admit(table, pairs, "10.0.0.2", authenticated=True)
    busy.waiting_since = None  # inside a request
    idle.waiting_since = time.monotonic()  # idle, but not for long enough
    assert _admit(table, pairs, "10.0.0.3", authenticated=True)[0] is None
    assert table.stats()["connections_refused"] == 1
    idle.waiting_since = time.monotonic() - 5
    assert _admit(table, pairs, "10.0.0.3", authenticated=True)[0] is not None
    assert _closed(idle_far) and not _closed(busy_far)


def test_the_per_address_bound_counts_strangers_only(pairs):
    table = ClientTable(max_connections=100, max_strangers_per_address=2)
    first, first_far = _admit(table, pairs, "127.0.0.1")
    second, second_far = _admit(table, pairs, "127.0.0.1")
    table.authenticated(second)
    for _ in range(5):  # authenticated clients of the address are not counted
        assert _admit(table, pairs, "127.0.0.1", authenticated=True)[0] is not None
    third, third_far = _admit(table, pairs, "127.0.0.1")
    fourth, fourth_far = _admit(table, pairs, "127.0.0.1")  # a third stranger: the oldest of the address goes
    assert _closed(first_far)
    assert not any(_closed(far) for far in (second_far, third_far, fourth_far))
    assert _admit(table, pairs, "127.0.0.2")[0] is not None  # another address has a bound of its own
    assert table.stats()["strangers"] == 3
    table.release(third)
    table.release(fourth)
    assert table.stats()["strangers"] == 1
