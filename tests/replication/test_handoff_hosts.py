"""Leaders moved on purpose, on the hosts kit (:mod:`raylog.testing.hosts`:
disk hosts ``h2``-``h4``): a handoff, a preferred-leader balance and a
drain, while an ``acks="all"`` producer sends. No send fails, every
acknowledged message is read exactly once and in order, each move takes a
new leader epoch, and the drained node leads nothing and is in no ISR.
Every wait is bounded (a shared machine: generous); no time is asserted."""

from __future__ import annotations

import threading
import uuid

import pytest

from raylog.errors import HandoffError
from raylog.retry import RetryPolicy
from raylog.testing.on_hosts import partition_state, read_values, replicated_topic, wait

pytestmark = [pytest.mark.hosts, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def client(hosts):
    return hosts.client(cluster=f"handoff-{uuid.uuid4().hex[:8]}")


class Sending:
    """An ``acks="all"`` producer sending numbered values on a thread until
    stopped; ``acked`` in send order, ``failures`` the errors."""

    def __init__(self, client, topic: str):
        # the producer's own default tries: a handoff must fit in them
        self.producer = client.producer(acks="all", retry=RetryPolicy(max_tries=8, delay_s=0.05, max_delay_s=1.0,
                                                                      deadline_s=30))
        self.topic, self.acked, self.failures = topic, [], []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        i = 0
        while not self.stop.is_set():
            value = b"v%d" % i
            try:
                self.producer.send(self.topic, value).result(60)
                self.acked.append(value)
            except Exception as err:  # noqa: BLE001 - the test reports it
                self.failures.append(repr(err))
            i += 1

    def finish(self):
        self.stop.set()
        self.thread.join(90)
        self.producer.close()


def _sent_more(sending, than: int):
    wait(lambda: len(sending.acked) >= than + 20, "the producer goes on being acknowledged")


def test_handoff_balance_and_drain_under_an_acks_all_producer(hosts, client):
    topic = replicated_topic(client)
    first = partition_state(client, topic)
    wait(lambda: set(partition_state(client, topic).isr) == set(first.replicas), "every replica in sync")
    sending = Sending(client, topic)
    try:
        _sent_more(sending, 0)
        # a replica out of sync (none here) or the leader itself: refused, nothing changed
        with pytest.raises(HandoffError):
            client.hand_off(topic, 0, first.leader)
        target = first.replicas[1]
        moved = client.hand_off(topic, 0, target, timeout_s=30)
        state = partition_state(client, topic)
        assert (state.leader, state.leader_epoch) == (target, first.leader_epoch + 1)
        assert moved["leaderless_s"] is not None
        _sent_more(sending, len(sending.acked))

        # back to the preferred replica (the first), on demand
        wait(lambda: first.replicas[0] in partition_state(client, topic).isr, "the old leader follows, in sync")
        balanced = client.balance_leaders([topic], timeout_s=30)
        assert [m["leader"] for m in balanced["moved"]] == [first.replicas[0]], balanced
        assert balanced["leaders_after"][first.replicas[0]] == 1
        assert partition_state(client, topic).leader == first.replicas[0]
        _sent_more(sending, len(sending.acked))

        # drain the leader's node: it leads nothing and is in no ISR, and sends go on
        node = first.replicas[0]
        wait(lambda: set(partition_state(client, topic).isr) == set(first.replicas), "every replica in sync")
        report = client.drain_node(node, timeout_s=60)
        assert report["can_stop"], report
        state = partition_state(client, topic)
        assert state.leader != node and node not in state.isr and len(state.isr) == 2
        _sent_more(sending, len(sending.acked))
    finally:
        sending.finish()
    assert sending.failures == []
    assert read_values(client, topic, len(sending.acked)) == sending.acked
