"""The pool's scaling decision by lag: pure logic, no Ray, no clock of its own.

:class:`Autoscaler` is fed one sample at a time (:meth:`Autoscaler.observe`:
the time, the group's lag in seconds, the members now) and answers with the
member count to go to, or None to stay. Its rules, each bound a parameter:

* **up**: the lag has stayed above ``target_lag_s`` for ``up_after_s``
  (every sample in that window above it) and members < ``max_members``:
  go to ``members + step``, or, when the backlog in messages and the
  members' rate are known, to as many members as drain the backlog within
  ``target_lag_s`` at that rate per member if that is more (a burst is met
  in one step, not one member per cool-down); at most ``max_members``;
* **down**: the lag has stayed at or below ``low_lag_s`` for
  ``down_after_s`` and members > ``min_members``: go to ``members - step``
  (at least ``min_members``);
* **cool-down**: no step within ``cooldown_s`` of the previous one (a
  step of :meth:`Autoscaler.stepped`, taken here or by hand through
  ``scale(n)``), and each step starts both windows over, so a step is
  judged on the lag it brings, not on the lag before it;
* a lag between ``low_lag_s`` and ``target_lag_s`` resets both windows;
  an unknown lag (None: no partition answered) decides nothing and keeps
  the windows as they are;
* members outside ``[min_members, max_members]`` (a member lost) are
  brought back inside at once, cool-down or not.

The lag of the group is the largest lag in seconds of its partitions that
are consumed; a partition stopped at a failing handler is left out by the
caller (its lag grows without bound, and more members would not help).

State: the start of the current high and low windows and the time of the
last step. Not thread-safe: one caller (the controller's loop) feeds it.
"""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class ScalingPolicy:
    """The bounds of :class:`Autoscaler` (see the module docstring)."""

    min_members: int
    max_members: int
    target_lag_s: float = 5.0
    low_lag_s: float = 1.0
    up_after_s: float = 10.0
    down_after_s: float = 30.0
    cooldown_s: float = 15.0
    step: int = 1

    @classmethod
    def of(cls, spec) -> "ScalingPolicy":
        """The policy of a :class:`raylog.pool.spec.PoolSpec`."""
        return cls(min_members=spec.min_members, max_members=spec.max_members, target_lag_s=spec.target_lag_s,
                   low_lag_s=spec.low_lag, up_after_s=spec.scale_up_after_s, down_after_s=spec.scale_down_after_s,
                   cooldown_s=spec.cooldown_s, step=spec.scale_step)


class Autoscaler:
    """The decision of :mod:`raylog.pool.scaling` over a stream of samples."""

    def __init__(self, policy: ScalingPolicy):
        self.policy = policy
        self.high_since: float | None = None  # start of the current run of samples above target
        self.low_since: float | None = None  # start of the current run of samples at or below low
        self.last_step: float | None = None

    def stepped(self, now: float) -> None:
        """A step was taken at ``now`` (here or by hand): cool down, judge afresh."""
        self.last_step = now
        self.high_since = self.low_since = None

    def observe(self, now: float, lag_s: float | None, members: int, *, backlog: int | None = None,
                rate_per_member: float | None = None) -> int | None:
        """The member count to go to after this sample, or None to stay.
        ``backlog``: the messages not yet handled (None: unknown);
        ``rate_per_member``: messages a second one member handles now (None
        or 0: unknown)."""
        p = self.policy
        if members < p.min_members or members > p.max_members:
            return min(max(members, p.min_members), p.max_members)
        if lag_s is None:
            return None
        if lag_s > p.target_lag_s:
            self.low_since = None
            if self.high_since is None:
                self.high_since = now
        elif lag_s <= p.low_lag_s:
            self.high_since = None
            if self.low_since is None:
                self.low_since = now
        else:
            self.high_since = self.low_since = None
        if self.last_step is not None and now - self.last_step < p.cooldown_s:
            return None
        if self.high_since is not None and now - self.high_since >= p.up_after_s and members < p.max_members:
            target = members + p.step
            if backlog and rate_per_member:
                target = max(target, math.ceil(backlog / (rate_per_member * p.target_lag_s)))
            return min(target, p.max_members)
        if self.low_since is not None and now - self.low_since >= p.down_after_s and members > p.min_members:
            return max(members - p.step, p.min_members)
        return None
