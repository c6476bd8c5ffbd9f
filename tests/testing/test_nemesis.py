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
