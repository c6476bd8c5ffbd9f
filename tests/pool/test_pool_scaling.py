"""The pool's scaling decision (raylog.pool.scaling), without Ray: fed
samples at chosen times, it steps up after a window of high lag, down
after a window of low lag, never within the cool-down, and always within
the bounds."""

from __future__ import annotations

import pytest

from raylog.pool.scaling import Autoscaler, ScalingPolicy

POLICY = ScalingPolicy(min_members=1, max_members=4, target_lag_s=5.0, low_lag_s=1.0, up_after_s=10.0,
                       down_after_s=30.0, cooldown_s=15.0, step=1)


def feed(scaler: Autoscaler, samples, members: int):
    """Feed ``[(t, lag)]``; apply every answer; return ``[(t, members)]`` after each step."""
    steps = []
    for t, lag in samples:
        target = scaler.observe(t, lag, members)
        if target is not None:
            members = target
            scaler.stepped(t)
            steps.append((t, members))
    return steps


def test_high_lag_for_the_window_steps_up_once_then_cools_down():
    scaler = Autoscaler(POLICY)
    steps = feed(scaler, [(t, 20.0) for t in range(0, 40)], members=1)
    # up at 10 (window), then the window starts over at the step: next at 10+15 (cool-down covers the window)
    assert steps == [(10, 2), (25, 3)]
    assert all(b[0] - a[0] >= POLICY.cooldown_s for a, b in zip(steps, steps[1:]))


def test_high_lag_shorter_than_the_window_does_nothing():
    scaler = Autoscaler(POLICY)
    samples = [(t, 20.0) for t in range(0, 9)] + [(9, 3.0)] + [(t, 20.0) for t in range(10, 19)]
    assert feed(scaler, samples, members=1) == []


def test_low_lag_for_the_window_steps_down_to_min_and_no_further():
    scaler = Autoscaler(POLICY)
    steps = feed(scaler, [(t, 0.2) for t in range(0, 200)], members=3)
    assert [m for _, m in steps] == [2, 1]
    assert steps[0][0] == 30


def test_lag_between_low_and_target_holds_steady():
    scaler = Autoscaler(POLICY)
    assert feed(scaler, [(t, 3.0) for t in range(0, 200)], members=2) == []


def test_never_beyond_max_members():
    scaler = Autoscaler(POLICY)
    steps = feed(scaler, [(t, 100.0) for t in range(0, 500)], members=1)
    assert [m for _, m in steps] == [2, 3, 4]


def test_unknown_lag_decides_nothing_and_keeps_the_window():
    scaler = Autoscaler(POLICY)
    samples = [(t, 20.0) for t in range(0, 5)] + [(t, None) for t in range(5, 8)] + [(t, 20.0) for t in range(8, 11)]
    assert feed(scaler, samples, members=1) == [(10, 2)]


def test_a_manual_step_cools_the_autoscaler_down():
    scaler = Autoscaler(POLICY)
    scaler.stepped(0.0)
    assert feed(scaler, [(t, 50.0) for t in range(0, 15)], members=2) == []
    assert scaler.observe(15.0, 50.0, 2) == 3


def test_members_outside_the_bounds_come_back_inside_at_once():
    scaler = Autoscaler(POLICY)
    scaler.stepped(0.0)
    assert scaler.observe(1.0, None, 0) == 1
    assert scaler.observe(1.0, 0.0, 6) == 4


@pytest.mark.parametrize("step,expected", [(2, [3, 4]), (5, [4])])
def test_a_step_of_several_members_stops_at_the_bound(step, expected):
    policy = ScalingPolicy(min_members=1, max_members=4, up_after_s=0.0, cooldown_s=0.0, step=step)
    scaler = Autoscaler(policy)
    assert [m for _, m in feed(scaler, [(t, 9.0) for t in range(0, 10)], members=1)] == expected


def test_a_known_backlog_and_rate_size_the_step_to_drain_within_the_target():
    policy = ScalingPolicy(min_members=1, max_members=16, target_lag_s=5.0, low_lag_s=1.0, up_after_s=10.0,
                           down_after_s=30.0, cooldown_s=15.0, step=1)
    scaler = Autoscaler(policy)
    for t in range(10):
        assert scaler.observe(t, 20.0, 1, backlog=30_000, rate_per_member=1_000.0) is None
    # 30,000 messages at 1,000/s a member within 5 s: 6 members, in one step
    assert scaler.observe(10, 20.0, 1, backlog=30_000, rate_per_member=1_000.0) == 6
    # never past the bound; never less than one step; unknown rate or backlog: one step
    for backlog, rate, members, expected in ((10**9, 1_000.0, 1, 16), (10, 1_000.0, 3, 4), (30_000, None, 1, 2),
                                             (None, 1_000.0, 1, 2), (30_000, 0.0, 1, 2)):
        scaler = Autoscaler(policy)
        scaler.observe(0, 20.0, members, backlog=backlog, rate_per_member=rate)
        assert scaler.observe(10, 20.0, members, backlog=backlog, rate_per_member=rate) == expected
