"""The partition actor's timer ends its process through
:func:`raylog.actors.process_exit.exit_process` (logged, flushed, with a
status that says why), never by a bare ``os._exit``. Pure logic: the actor's
body runs without Ray, its process exit replaced by a recorder."""

from __future__ import annotations

import threading
import types

import pytest

import raylog.actors.partition as partition
from raylog.actors.process_exit import EXIT_DISK_ERROR, EXIT_TIMER_FAILED
from raylog.config import TopicConfig


class _Exited(Exception):
    pass


class _Log:
    unflushed_messages = 1  # bytes wait for their flush: the timer ticks
    disk_full = False

    def __init__(self, error):
        self.error = error

    def maybe_flush(self):
        raise self.error


@pytest.fixture
def exits(monkeypatch):
    seen = []

    def exit_process(status, message, *args, exc_info=False):
        seen.append(("exit_process", status))
        raise _Exited

    def raw_exit(status):
        seen.append(("os._exit", status))
        raise _Exited

    monkeypatch.setattr(partition, "exit_process", exit_process)
    monkeypatch.setattr(partition, "os", types.SimpleNamespace(_exit=raw_exit))
    return seen


def _actor(error):
    actor = object.__new__(partition.PartitionActor)
    actor.topic, actor.partition, actor.role = "clicks", 0, None
    actor.config = TopicConfig(partitions=1, flush_ms=1)
    actor._closed = threading.Event()
    actor.log = _Log(error)
    return actor


@pytest.mark.parametrize(("error", "status"), [(OSError(5, "EIO"), EXIT_DISK_ERROR), (KeyError("bug"), EXIT_TIMER_FAILED)])
def test_a_timer_failure_ends_the_process_through_exit_process(exits, error, status):
    with pytest.raises(_Exited):
        _actor(error)._run_timers()
    assert exits == [("exit_process", status)]


class _IdleLog:
    """A log with nothing to flush: counts the timer's passes and records
    how long it was asked to sleep for appends."""

    unflushed_messages = 0
    disk_full = False

    def __init__(self, closed):
        self.closed, self.passes, self.sleeps = closed, 0, []

    def wait_for_appends(self, timeout_s):
        self.sleeps.append(timeout_s)
        return self.closed.wait(timeout_s)

    def maybe_flush(self):
        self.passes += 1
        return False

    def maybe_resume(self):
        return False

    def maybe_roll(self):
        return False


def test_an_idle_logs_timer_sleeps_until_an_append_instead_of_ticking():
    """Idle, the timer waits for an append up to IDLE_WAIT_S (not every
    flush_ms / 2: dozens of idle partitions would keep a node's cores busy);
    a leader of replicas wakes for its ISR review, a short segment_ms for
    its roll."""
    closed = threading.Event()
    actor = object.__new__(partition.PartitionActor)
    actor.topic, actor.partition, actor.role = "clicks", 0, None
    actor.config = TopicConfig(partitions=1, flush_ms=50)
    actor._closed = closed
    actor.log = _IdleLog(closed)
    actor._metrics = types.SimpleNamespace(interval_s=3600.0, sample=lambda log, stats: None)
    actor.server = types.SimpleNamespace(stats=lambda: {})
    timer = threading.Thread(target=actor._run_timers)
    timer.start()
    closed.wait(1.2)
    closed.set()
    timer.join(10)
    assert not timer.is_alive()
    # ticking every 25 ms would have made about 48 passes
    assert 1 <= actor.log.passes <= 6, actor.log.passes
    assert actor.log.sleeps and all(0.3 <= s <= partition.IDLE_WAIT_S for s in actor.log.sleeps[:-1]), actor.log.sleeps
    assert actor._idle_wait_s() == partition.IDLE_WAIT_S
    actor.config = TopicConfig(partitions=1, segment_ms=200)
    assert actor._idle_wait_s() == 0.1
    actor.role = types.SimpleNamespace(leader=object())
    assert actor._idle_wait_s() == partition.MAINTAIN_INTERVAL_S
