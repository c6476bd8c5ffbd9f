"""The nemesis's plan: seeded, every kind at least once, within the run."""

from __future__ import annotations

import pytest

from raylog.testing.nemesis import FAULT_KINDS, plan


def test_plan_has_every_kind_in_the_run_and_is_seeded():
    schedule = plan(7, 35, FAULT_KINDS, mean_gap_s=3.5)
    assert {kind for _, kind in schedule} == set(FAULT_KINDS)
    first = [kind for _, kind in schedule[: len(FAULT_KINDS)]]
    assert sorted(first) == sorted(FAULT_KINDS)  # the first round holds each kind once
    times = [at for at, _ in schedule]
    assert times == sorted(times) and times[len(FAULT_KINDS) - 1] < 35
    assert plan(7, 35, FAULT_KINDS, mean_gap_s=3.5) == schedule
    assert plan(8, 35, FAULT_KINDS, mean_gap_s=3.5) != schedule


def test_plan_squeezes_gaps_so_a_short_run_still_has_every_kind():
    schedule = plan(1, 12, FAULT_KINDS, mean_gap_s=30)
    assert {kind for _, kind in schedule} == set(FAULT_KINDS)
    assert schedule[len(FAULT_KINDS) - 1][0] < 12


def test_plan_refuses_unknown_kinds():
    with pytest.raises(ValueError, match="unknown fault kinds"):
        plan(1, 10, ["kill-partition", "meteor"])
    assert plan(1, 10, []) == []


def test_read_backs_served_from_two_places_of_one_partition_are_no_poll_skip(monkeypatch):
    """A flipped byte's read-back is a point read. Replicated, a read-back
    can be served undamaged (the byte was flipped on a follower); two such
    read-backs of one partition were taken for one stream that skipped
    everything between them (a 10-minute RF 3 run flagged a poll-skip)."""
    from types import SimpleNamespace

    from raylog.testing import nemesis as nem
    from raylog.testing.checker import check
    from raylog.testing.history import MemoryRecorder

    class Consumer:
        """A consumer that serves each read-back its one message undamaged."""

        def __init__(self, *args, **kwargs):
            self.at = None

        def assign(self, partitions):
            pass

        def seek(self, topic, partition, offset):
            self.at = offset

        def poll(self, timeout_ms=1000):
            return [SimpleNamespace(offset=self.at, value=b"at-%d" % self.at)]

        def close(self):
            pass

    client = SimpleNamespace(consumer=Consumer)
    nemesis = nem.Nemesis.__new__(nem.Nemesis)
    nemesis.target = SimpleNamespace(topic="t", client=client)
    nemesis.reader = MemoryRecorder("nemesis-reader")
    assert nemesis._read_back(0, 100, 4096) == {"detected": False}
    assert nemesis._read_back(0, 90_000, 4096) == {"detected": False}
    assert [op["type"] for op in nemesis.reader.ops] == ["seek", "poll", "seek", "poll"]
    consumer = MemoryRecorder("consumer-0")  # a consumer read what lies between
    consumer.record("poll", reads=[["t", 0, 50_000, "between"]], error=None)
    assert check(nemesis.reader.ops + consumer.ops)["anomalies"].get("poll-skip", []) == []
