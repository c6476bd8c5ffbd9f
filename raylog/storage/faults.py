"""Fault injection for tests of the disk-error paths (off unless switched on).

Switch: the environment variable ``RAYLOG_FAULT_INJECTION=1`` in the process
that opens the log (for a partition actor: set it before Ray starts its
workers, e.g. in the environment of ``ray start`` or ``ray.init``). Then, at
each injection point, the log looks for a file named ``.fault-<point>`` in
its partition directory; if it exists the file is removed (so the fault
fires once) and the operation raises ``OSError(EIO)`` as a failing disk
would. Points: ``fsync`` (a flush), ``roll`` (a segment roll),
``retention`` (deleting old segments), and the steps of the cleaner's
swap (``clean-written``, ``clean-index-swap``, ``clean-swapped``,
``clean-deleted``, ``clean-index``: :mod:`raylog.storage.cleaner`).
A trigger file holding ``kill`` (:func:`arm` with ``action="kill"``) makes
the process SIGKILL itself at that point instead: a crash there, as the
fault runner's cleaner faults make (:mod:`raylog.testing.nemesis`).

Without the switch :func:`check` does nothing (one call of an empty
function), so production logs pay no file lookups.

Thread-safety: :func:`check` may be called from any thread.
"""

from __future__ import annotations

import errno
import os
import signal

ENV = "RAYLOG_FAULT_INJECTION"
PREFIX = ".fault-"


KILL = "kill"


def arm(directory: str, point: str, action: str = "") -> str:
    """Make the next ``point`` operation of the log in ``directory`` fail
    (in a process with the switch on), or with ``action="kill"`` end its
    process by SIGKILL; returns the trigger file's path."""
    path = os.path.join(directory, PREFIX + point)
    with open(path, "w") as f:
        f.write(action)
    return path


def _check_files(point: str, directory: str) -> None:
    path = os.path.join(directory, PREFIX + point)
    try:
        with open(path) as f:
            action = f.read().strip()
        os.unlink(path)
    except FileNotFoundError:
        return
    if action == KILL:
        os.kill(os.getpid(), signal.SIGKILL)
    raise OSError(errno.EIO, f"injected {point} failure ({path})")


def _off(point: str, directory: str) -> None:
    return None


def enabled() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


#: called by the log at each injection point
check = _check_files if enabled() else _off
