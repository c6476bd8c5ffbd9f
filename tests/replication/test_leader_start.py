"""A leader that starts over data it already holds (restarted on its node,
or a follower promoted) shows consumers only what the other in-sync
replicas confirm by fetching: a leader lost again right away must not have
served, or acknowledged to acks="all", bytes that no follower holds."""

from __future__ import annotations

from raylog.config import TopicConfig
from raylog.replication.leader import ClientView, Leader
from raylog.replication.state import PartitionState
from raylog.storage.log import PartitionLog
from raylog.storage.message import encode_message_set

REPLICAS = ("disk-a", "disk-b", "disk-c")


def started_leader(tmp_path, isr=REPLICAS):
    log = PartitionLog(tmp_path / "leader", TopicConfig(replication_factor=3, min_insync_replicas=2))
    log.append(encode_message_set([b"a", b"bb"]))
    log.flush()  # flushed before the restart: on this replica's disk only, as far as it knows
    state = PartitionState("disk-a", 0, isr, REPLICAS)
    leader = Leader(None, None, "t", 0, "disk-a", log, state, 0)  # no ZooKeeper call until maintain()
    return log, leader, ClientView(leader)


def test_a_started_leader_shows_nothing_the_isr_has_not_confirmed(tmp_path):
    log, leader, view = started_leader(tmp_path)
    end = log.high_watermark
    assert end > 0
    assert view.high_watermark == 0
    assert view.read(0, 1 << 20).length == 0
    # a consumer that read up to ``end`` before the restart gets nothing yet, not an out-of-range error
    assert view.read(end, 1 << 20).length == 0
    assert not view.wait_for_data(0, 0.01)
    leader.record_progress("disk-b", 0, end, end)
    assert view.high_watermark == 0  # disk-c has not said how far it reaches
    leader.record_progress("disk-c", 0, end, end)
    assert view.high_watermark == end and view.read(0, 1 << 20).length == end
    log.close()


def test_a_started_leader_alone_in_the_isr_shows_what_it_flushed(tmp_path):
    log, _leader, view = started_leader(tmp_path, isr=("disk-a",))
    assert view.high_watermark == log.high_watermark > 0
    log.close()


def test_acks_all_is_not_acknowledged_when_the_isr_shrank_below_min_insync_to_reach_it(tmp_path):
    """A batch appended while the ISR was whole, then the followers dropped
    out: the committed offset reaches it (the leader alone is the ISR), but
    only the leader holds it, so acks="all" answers NotEnoughReplicasError
    (Kafka's NOT_ENOUGH_REPLICAS_AFTER_APPEND), not success."""
    import threading

    from raylog.errors import NotEnoughReplicasError

    log, leader, _view = started_leader(tmp_path)
    end = log.high_watermark
    outcome = []

    def wait():
        try:
            leader.wait_committed(end, 10.0)
            outcome.append("acknowledged")
        except NotEnoughReplicasError as err:
            outcome.append(err)

    waiter = threading.Thread(target=wait)
    waiter.start()
    leader._adopt(PartitionState("disk-a", 0, ("disk-a",), REPLICAS), 1)  # noqa: SLF001 - the ISR shrinks
    waiter.join(15)
    assert len(outcome) == 1 and isinstance(outcome[0], NotEnoughReplicasError), outcome
    # the followers caught up and are in the ISR again: the producer's retry of the wait succeeds
    leader._adopt(PartitionState("disk-a", 0, REPLICAS, REPLICAS), 2)  # noqa: SLF001
    leader.record_progress("disk-b", 0, end, end)
    leader.record_progress("disk-c", 0, end, end)
    leader.wait_committed(end, 1.0)
    log.close()


def test_batches_appended_by_a_leader_carry_its_epoch(tmp_path):
    """partitionLeaderEpoch is *set at append* (docs/design.md §2): a batch
    appended through the leader, and a transaction marker it writes, carry
    the epoch of the leader that appended them; a later leader's batches
    carry the later epoch. The follower's copy keeps the leader's bytes."""
    from raylog.storage.record_batch import encode_batch, read_header

    log = PartitionLog(tmp_path / "leader", TopicConfig(replication_factor=3, min_insync_replicas=1))
    leader = Leader(None, None, "t", 0, "disk-a", log, PartitionState("disk-a", 4, ("disk-a",), REPLICAS), 0)
    view = ClientView(leader)
    first = view.append(encode_batch([b"a", b"b"]))
    leader._adopt(PartitionState("disk-a", 7, ("disk-a",), REPLICAS), 1)  # noqa: SLF001 - a later epoch
    second = view.append(encode_batch([b"c"]))
    marker = log.append_marker(9, 0, True, 0, leader_epoch=leader.state.leader_epoch)
    log.flush()
    epochs = {}
    for offset in (first, second, marker):
        epochs[offset] = read_header(log.read(offset, 1 << 16).tobytes()).partition_leader_epoch
    assert epochs == {first: 4, second: 7, marker: 7}
    log.close()
