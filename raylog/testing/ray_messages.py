"""Ray's messages about the faults a run makes, kept out of its output.

A fault run kills actors and removes Ray nodes on purpose; Ray tells the
driver each time, on stdout ("(raylet) A worker died ...", "(raylet) Raylet
is terminated ... Last 20 lines of the Raylet logs:" with its state dump,
"... has been marked dead"): dozens of lines before the report, about
faults that the report counts anyway. :func:`divert_ray_messages` sends
the messages Ray labels as the raylet's to a file of the run instead (the
actors' own output still reaches the console).

Uses a name inside Ray (``ray._private.worker.print_to_stdstream``, which
the driver's error listener looks up at each message); where it is missing
nothing is diverted.
"""

from __future__ import annotations

import threading


class DivertedMessages:
    """The file the raylet's messages go to, and how many lines went there.
    ``close()`` gives the console back. Thread-safe (Ray's listener threads
    call it)."""

    def __init__(self, path: str):
        self.path = path
        self.lines = 0
        self._lock = threading.Lock()
        self._file = open(path, "a", encoding="utf-8")
        self._worker = None
        self._original = None
        try:
            import ray._private.worker as worker  # heavy (Ray): imported when used
        except ImportError:
            return
        original = getattr(worker, "print_to_stdstream", None)
        if original is None:
            return
        self._worker, self._original = worker, original
        worker.print_to_stdstream = self._print

    def _print(self, data, ignore_prefix):
        if data.get("pid") != "raylet":
            return self._original(data, ignore_prefix)
        with self._lock:
            if self._file.closed:
                return None
            for message in data.get("lines") or ():
                text = str(message).rstrip("\n")
                self._file.write(text + "\n")
                self.lines += text.count("\n") + 1
            self._file.flush()
        return None

    def close(self) -> None:
        if self._worker is not None and self._worker.print_to_stdstream == self._print:
            self._worker.print_to_stdstream = self._original
        with self._lock:
            self._file.close()


def divert_ray_messages(path: str) -> DivertedMessages:
    """From now until ``close()``, write the messages Ray labels as the
    raylet's (dead workers and nodes, a raylet's last log lines) to
    ``path`` instead of stdout; call after ``ray.init``."""
    return DivertedMessages(path)
