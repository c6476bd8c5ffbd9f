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
