"""A leader that may have lost the lead acknowledges nothing: while its
ZooKeeper connection is down (its session may expire and a follower take
over while it is away: the "zombie" leader, still reachable by clients) and
after a lost session until it has read the ``state`` node again, every write
is refused with the retriable NotOwnerError; once the ``state`` node names
another leader it is deposed for good (refuses everything, and its actor is
told to end, so that it comes back as a follower).

A real ZooKeeper of the test's own (stopped to cut the leader off), a real
partition log; the leader's logic without its actor."""

from __future__ import annotations

import dataclasses
import time

import pytest

from raylog.config import TopicConfig
from raylog.errors import NotOwnerError
from raylog.replication.leader import ClientView, Leader
from raylog.replication.state import compare_and_set, create_state, read_state
from raylog.storage.log import PartitionLog
from raylog.storage.message import encode_message_set
from raylog.zk.paths import Paths

REPLICAS = ("disk-a", "disk-b")
#: the test's own bound on a ZooKeeper state change (generous: a shared machine)
WAIT_S = 60.0


def _wait(check, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, f"not within {WAIT_S} s: {what}"
        time.sleep(0.05)


@pytest.fixture
def leader_on(private_zookeeper, make_zk, tmp_path):
    """A leader of ``t``/0 on ``disk-a`` (ISR: itself) with its own session."""
    zk = make_zk(private_zookeeper.connect_string, timeout=4.0)
    paths = Paths("zombie")
    create_state(zk, paths, "t", 0, list(REPLICAS))
    state, version = read_state(zk, paths, "t", 0)
    state = dataclasses.replace(state, isr=("disk-a",))
    version = compare_and_set(zk, paths, "t", 0, state, version)
    log = PartitionLog(tmp_path / "leader", TopicConfig(replication_factor=2, min_insync_replicas=1))
    deposed = []
    leader = Leader(zk, paths, "t", 0, "disk-a", log, state, version, on_deposed=lambda: deposed.append(1))
    try:
        yield zk, paths, leader, ClientView(leader), deposed
    finally:
        leader.stop()
        log.close()


def test_a_leader_cut_off_from_zookeeper_refuses_every_write_until_it_is_back(leader_on, private_zookeeper):
    zk, paths, leader, view, deposed = leader_on
    first = encode_message_set([b"before"])
    assert view.append(first) == 0
    view.flush()
    private_zookeeper.stop()  # the leader is cut off from ZooKeeper; clients still reach it
    _wait(lambda: not zk.connected, "the leader's client notices the cut")
    for write in (lambda: view.append(encode_message_set([b"acks1"])),
                  lambda: view.append_sequenced(encode_message_set([b"idem"]), 7, 0, 0, [len(encode_message_set([b"idem"]))], name="t-0"),
                  view.before_acks_all):
        with pytest.raises(NotOwnerError) as refused:
            write()
        assert refused.value.retriable and refused.value.refresh_metadata
        assert "ZooKeeper" in str(refused.value)
    leader.maintain()  # no ZooKeeper call while it is away (the timer thread never blocks on it)
    assert view.log_end_offset == len(first)  # nothing accepted meanwhile; what was accepted is intact
    private_zookeeper.start()
    _wait(lambda: zk.connected, "the leader's client reconnects")
    leader.maintain()
    assert view.append(encode_message_set([b"after"])) == len(first)
    assert not deposed and not leader.deposed


def test_after_a_lost_session_a_leader_writes_only_once_the_state_says_it_still_leads(leader_on, make_zk,
                                                                                      private_zookeeper):
    zk, paths, leader, view, deposed = leader_on
    leader._on_session_state("LOST")  # what kazoo tells the listener when the session expired
    with pytest.raises(NotOwnerError, match="not confirmed"):
        view.append(encode_message_set([b"x"]))
    leader.maintain()  # reads the state: still the leader
    assert view.append(encode_message_set([b"x"])) == 0
    assert not deposed


def test_a_leader_whose_state_names_another_leader_is_deposed_and_acknowledges_nothing(leader_on, make_zk,
                                                                                      private_zookeeper):
    zk, paths, leader, view, deposed = leader_on
    acked = view.append(encode_message_set([b"acked"]))
    view.flush()
    other = make_zk(private_zookeeper.connect_string)
    state, version = read_state(other, paths, "t", 0)
    taken = dataclasses.replace(state, leader="disk-b", leader_epoch=state.leader_epoch + 1, isr=("disk-b",),
                                epochs=state.epochs + ((state.leader_epoch + 1, view.log_end_offset),))
    assert compare_and_set(other, paths, "t", 0, taken, version) is not None
    leader._next_refresh = 0.0  # its next periodic read of the state
    leader.maintain()
    assert leader.deposed and deposed == [1]
    with pytest.raises(NotOwnerError, match="another replica leads"):
        view.append(encode_message_set([b"late"]))
    with pytest.raises(NotOwnerError):
        view.before_acks_all()
    leader.maintain()
    assert deposed == [1]  # told once
    assert acked == 0 and view.log_end_offset == len(encode_message_set([b"acked"]))  # intact, nothing after
