"""The pure parts of a leader handoff (raylog.replication.handoff): the
state it writes, the replica it picks, and the leader's fence (new appends
refused, the target's catch-up awaited) without ZooKeeper."""

from __future__ import annotations

import threading
import time

import pytest

from raylog.config import TopicConfig
from raylog.errors import HandoffError, NotOwnerError
from raylog.replication.handoff import choose_target, handoff_state
from raylog.replication.leader import ClientView, Leader
from raylog.replication.state import PartitionState
from raylog.storage.log import PartitionLog
from raylog.storage.message import encode_message_set

REPLICAS = ("a", "b", "c")


def test_the_switch_names_the_target_with_the_next_epoch_beginning_at_the_log_end():
    state = PartitionState("a", 3, REPLICAS, REPLICAS, epochs=((3, 100),))
    new = handoff_state(state, "b", 250)
    assert (new.leader, new.leader_epoch, new.isr, new.replicas) == ("b", 4, REPLICAS, REPLICAS)
    assert new.epochs == ((3, 100), (4, 250))
    assert new.boundary_after(3) == 250  # the old leader, holding all of it, truncates nothing


@pytest.mark.parametrize("target", ["a", "c"])
def test_the_switch_refuses_the_leader_itself_or_a_replica_out_of_sync(target):
    state = PartitionState("a", 0, ("a", "b"), REPLICAS)
    with pytest.raises(HandoffError) as err:
        handoff_state(state, target, 10)
    assert err.value.retriable


def test_the_target_is_a_running_in_sync_replica_leading_fewest():
    state = PartitionState("a", 0, ("a", "b", "c"), REPLICAS)
    assert choose_target(state, {"a", "b", "c"}) == "b"  # a tie: the earlier replica
    assert choose_target(state, {"a", "b", "c"}, {"b": 2, "c": 1}) == "c"
    assert choose_target(state, {"a", "c"}) == "c"  # b does not run
    assert choose_target(state, {"a", "b", "c"}, avoid=("b", "c")) is None
    assert choose_target(PartitionState("a", 0, ("a", "b"), REPLICAS), {"a", "b", "c"}, {"b": 5}) == "b"


def _leader(tmp_path):
    log = PartitionLog(tmp_path / "leader", TopicConfig(replication_factor=3, min_insync_replicas=2))
    state = PartitionState("a", 0, REPLICAS, REPLICAS)
    leader = Leader(None, None, "t", 0, "a", log, state, 0)
    return log, leader, ClientView(leader)


def test_a_leader_handing_off_refuses_new_appends_retriably_and_accepts_again_when_it_resumes(tmp_path):
    log, leader, view = _leader(tmp_path)
    view.append(encode_message_set([b"before"]))
    end = log.log_end_offset
    assert leader.stop_accepting("b", time.monotonic() + 5)
    with pytest.raises(NotOwnerError) as err:
        view.append(encode_message_set([b"refused"]))
    assert err.value.retriable and err.value.refresh_metadata
    with pytest.raises(NotOwnerError):
        view.before_acks_all()
    assert log.log_end_offset == end  # nothing of the refused set was stored
    leader.resume_accepting()
    view.append(encode_message_set([b"after"]))
    assert log.log_end_offset > end
    log.close()


def test_stop_accepting_waits_for_the_append_under_way(tmp_path):
    log, leader, _view = _leader(tmp_path)
    leader.begin_append()  # an append under way
    assert not leader.stop_accepting("b", time.monotonic() + 0.05)
    threading.Timer(0.05, leader.end_append).start()
    assert leader.stop_accepting("b", time.monotonic() + 10)
    log.close()


def test_the_handoff_waits_until_the_target_fetched_from_the_log_end(tmp_path):
    log, leader, view = _leader(tmp_path)
    view.append(encode_message_set([b"x" * 100]))
    log.flush()
    end = log.log_end_offset
    assert not leader.wait_reached("b", end, time.monotonic() + 0.05)
    leader.record_progress("b", 0, end - 1, end - 1)
    assert not leader.wait_reached("b", end, time.monotonic() + 0.05)
    threading.Timer(0.05, leader.record_progress, args=("b", 0, end, end)).start()
    assert leader.wait_reached("b", end, time.monotonic() + 10)
    log.close()


def test_a_parked_follower_does_not_rejoin_the_isr_while_parked(tmp_path):
    log, leader, _view = _leader(tmp_path)
    leader.park("c", None, 600)
    assert "c" in leader._parked
    leader._unpark(time.monotonic() + 601)  # held long enough
    assert "c" not in leader._parked
    log.close()


def test_a_follower_another_writer_took_out_of_the_isr_stays_out_until_it_restarts(tmp_path):
    log, leader, _view = _leader(tmp_path)
    leader._adopt_written(PartitionState("a", 0, ("a", "b"), REPLICAS), 1)  # c left in order (SIGTERM)
    assert "c" in leader._parked and "b" not in leader._parked
    assert leader.state.isr == ("a", "b")
    leader._adopt_written(PartitionState("a", 0, ("a", "b"), ("a", "b")), 2)  # b went with a reassignment
    assert "b" not in leader._parked
    log.close()
