"""A lost replica's reassignment runs beside the supervisor's pass: the
pass returns at once, one reassignment per partition, a bounded number at
once, and its outcome is a row of a later pass (a real ZooKeeper; the
reassignment itself, which needs Ray nodes, is held by a stand-in that
waits until the test lets it go, as one waiting for a replica to catch up
does; it runs across hosts in tests/replication/test_reassign_hosts.py)."""

from __future__ import annotations

import threading
import time

import pytest

from raylog.config import TopicConfig
from raylog.errors import ReassignmentTimeoutError
from raylog.replication import repair
from raylog.replication.background import BackgroundReassignments
from raylog.replication.repair import replace_lost
from raylog.replication.state import create_state

ALIVE = {"disk-a", "disk-b", "disk-d", "disk-e"}
#: the longest any wait of this test may take (a bound, not a timing assertion)
WAIT_S = 60.0


class HeldReassignments:
    """Stands in for reassign_partition: each call waits until released."""

    def __init__(self):
        self.calls: list[tuple[str, int, list[str]]] = []
        self.release: dict[tuple[str, int], threading.Event] = {}
        self.fail: set[tuple[str, int]] = set()
        self._lock = threading.Lock()

    def __call__(self, zk, registry, *, topic, partition, replicas, timeout_s, **_):
        assert timeout_s == repair.REPLACE_TIMEOUT_S
        with self._lock:
            self.calls.append((topic, partition, list(replicas)))
            event = self.release.setdefault((topic, partition), threading.Event())
        assert event.wait(WAIT_S), "never released"
        if (topic, partition) in self.fail:
            raise ReassignmentTimeoutError(f"{topic}-{partition}: the new replica did not join the ISR")


@pytest.fixture
def held(monkeypatch):
    stand_in = HeldReassignments()
    monkeypatch.setattr(repair, "reassign_partition", stand_in)
    yield stand_in
    for event in list(stand_in.release.values()):
        event.set()


def lost_topic(registry, zk, name: str, partitions: int) -> None:
    """``name``: every partition's replica on disk-c lost for an hour (replaced after 10 s)."""
    registry.create_topic(name, TopicConfig(partitions=partitions, replication_factor=3, replica_replace_after_s=10))
    for p in range(partitions):
        registry.set_placement(name, p, "disk-a", f"/d/{name}-{p}")
        create_state(zk, registry.paths, name, p, ["disk-a", "disk-b", "disk-c"])


def wait_for(check, what: str):
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, f"waited {WAIT_S} s for {what}"
        time.sleep(0.02)


def test_a_pass_starts_a_reassignment_and_goes_on_without_waiting_for_it(registry, zk, held):
    lost_topic(registry, zk, "bg", 1)
    background = BackgroundReassignments()
    lost_since = {("bg", 0, "disk-c"): 0.0}
    rows = replace_lost(registry, "unused", [], ALIVE, lost_since, actors=object(), now=3600.0,
                        background=background)
    # the pass returned while the reassignment still waits for its new replica
    assert [(r["topic"], r["partition"], r["state"]) for r in rows] == [("bg", 0, "reassigning")]
    wait_for(lambda: held.calls, "the reassignment to start")
    assert background.running("bg", 0)
    # later passes start no second reassignment of the partition while it runs
    for now in (3700.0, 3800.0):
        assert replace_lost(registry, "unused", [], ALIVE, lost_since, actors=object(), now=now,
                            background=background) == []
    assert len(held.calls) == 1 and lost_since == {("bg", 0, "disk-c"): 0.0}
    held.release["bg", 0].set()
    wait_for(lambda: not background.running("bg", 0), "the reassignment to end")
    rows = replace_lost(registry, "unused", [], ALIVE, lost_since, actors=object(), now=3900.0,
                        background=background)
    done = [r for r in rows if r["state"] != "reassigning"]
    assert [(r["topic"], r["partition"], r["state"]) for r in done] == [("bg", 0, "reassigned")]
    assert "disk-c->" in done[0]["detail"]


def test_at_most_max_running_at_once_and_a_failure_is_a_later_row(registry, zk, held):
    lost_topic(registry, zk, "many", 3)
    background = BackgroundReassignments(max_running=2)
    lost_since = {("many", p, "disk-c"): 0.0 for p in range(3)}
    rows = replace_lost(registry, "unused", [], ALIVE, lost_since, actors=object(), now=3600.0,
                        background=background)
    assert sorted((r["partition"], r["state"]) for r in rows) == [(0, "reassigning"), (1, "reassigning"),
                                                                   (2, "waiting")]
    wait_for(lambda: len(held.calls) == 2, "two reassignments to start")
    held.fail.add(("many", 0))
    held.release["many", 0].set()
    wait_for(lambda: not background.running("many", 0), "the first to end")
    held.fail.clear()
    held.release["many", 0] = threading.Event()  # its next try waits again
    rows = replace_lost(registry, "unused", [], ALIVE, lost_since, actors=object(), now=3700.0,
                        background=background)
    # the failure is reported; the replica still lost, it is started again; the third still waits
    assert sorted((r["partition"], r["state"]) for r in rows) == [(0, "failed"), (0, "reassigning"),
                                                                   (2, "waiting")]
    failed = next(r for r in rows if r["state"] == "failed")
    assert "did not join the ISR" in failed["detail"]
    wait_for(lambda: len(held.calls) == 3, "the second try to start")
    held.release["many", 1].set()
    wait_for(lambda: not background.running("many", 1), "the second to end")
    rows = replace_lost(registry, "unused", [], ALIVE, lost_since, actors=object(), now=3800.0,
                        background=background)
    states = {(r["partition"], r["state"]) for r in rows}
    assert (1, "reassigned") in states and (2, "reassigning") in states  # (the stand-in moved nothing:
    wait_for(lambda: ("many", 2) in {c[:2] for c in held.calls}, "the third to start")  # 1 is tried again)
    for key in [("many", p) for p in range(3)]:
        held.release.setdefault(key, threading.Event()).set()
    assert background.join(WAIT_S)


def test_the_bound_must_be_positive():
    with pytest.raises(ValueError):
        BackgroundReassignments(max_running=0)
