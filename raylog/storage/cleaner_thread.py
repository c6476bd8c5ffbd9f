"""The background thread that runs the log cleaner of a compacted topic's
partition (docs/design.md §3; the passes are :mod:`raylog.storage.cleaner`'s).

Every :func:`backoff_s` (Kafka's ``log.cleaner.backoff.ms``: 15 s, or the
topic's ``retention_check_ms`` when shorter) it asks the log for a pass
(:meth:`~raylog.storage.log.PartitionLog.clean`), which does nothing unless
one is due (the dirty ratio, the compaction lags). A pass reads and writes at
most ``io_bytes_per_s`` (a :class:`~raylog.storage.cleaner.Throttler`) and
keeps a map of at most ``buffer_bytes``. A disk error ends the thread: the
log has failed and told its owner (the partition actor restarts). A closed
log ends it too. Any other error of a pass ends it as well, logged with its
traceback and kept in :attr:`CleanerThread.failure` (shown by
``raylog topics describe``); the log goes on serving, uncleaned.

Thread-safety: :meth:`CleanerThread.start` and :meth:`CleanerThread.stop`
from the owner's thread; the counters (passes, bytes cleaned and removed,
records removed, the last pass's time: :meth:`CleanerThread.state`) are
plain values written by the thread and read from any thread.
"""

from __future__ import annotations

import logging
import threading
import time

from raylog.errors import ClosedError, StorageError
from raylog.storage.cleaner import DEFAULT_IO_BYTES_PER_S, Throttler
from raylog.storage.offsetmap import DEFAULT_BUFFER_BYTES

log = logging.getLogger(__name__)

#: the longest pause between two checks (Kafka's ``log.cleaner.backoff.ms``)
MAX_BACKOFF_S = 15.0


def backoff_s(config) -> float:
    return min(MAX_BACKOFF_S, config.retention_check_ms / 1000.0)


class CleanerThread:
    """The cleaner of one partition log (see the module docstring)."""

    def __init__(self, partition_log, *, io_bytes_per_s: float = DEFAULT_IO_BYTES_PER_S,
                 buffer_bytes: int = DEFAULT_BUFFER_BYTES):
        self._log = partition_log
        self._io = io_bytes_per_s
        self._buffer = buffer_bytes
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="raylog-cleaner", daemon=True)
        #: passes that cleaned something, and the bytes they read
        self.passes = 0
        self.bytes_cleaned = 0
        #: what those passes removed: bytes (read less written) and records
        self.bytes_removed = 0
        self.records_removed = 0
        #: when the last of them ended (ms since the epoch), None before the first
        self.last_run_ms: int | None = None
        #: why the thread ended by itself (an error of a pass), None while it runs or was stopped
        self.failure: str | None = None

    @classmethod
    def for_log(cls, partition_log, **kwargs) -> "CleanerThread | None":
        """A started cleaner when the log's topic is compacted, else None."""
        if not partition_log.config.compacted:
            return None
        cleaner = cls(partition_log, **kwargs)
        cleaner.start()
        return cleaner

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop after the pass in progress (if any)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    @property
    def running(self) -> bool:
        """Whether the thread runs (not stopped, not ended by an error)."""
        return self._thread.is_alive() and not self._stop.is_set()

    def state(self) -> dict:
        """``{"running", "passes", "bytes_cleaned", "bytes_removed",
        "records_removed", "last_run_ms", "failure"}`` (what ``raylog topics
        describe`` shows of a compacted partition)."""
        return {"running": self.running, "passes": self.passes, "bytes_cleaned": self.bytes_cleaned,
                "bytes_removed": self.bytes_removed, "records_removed": self.records_removed,
                "last_run_ms": self.last_run_ms, "failure": self.failure}

    def _run(self) -> None:
        # the back-off is read again each time: the topic's config may change while it runs
        while not self._stop.wait(backoff_s(self._log.config)):
            try:
                result = self._log.clean(buffer_bytes=self._buffer, throttler=Throttler(self._io))
            except ClosedError:
                return
            except StorageError as err:  # the log failed and told its owner
                log.error("the cleaner of %s stops: %s", self._log.directory, err)
                self.failure = f"{type(err).__name__}: {err}"
                return
            except Exception as err:  # noqa: BLE001 - a pass that cannot go on: said, and shown in state()
                log.exception("the cleaner of %s stops: a pass failed; the log keeps serving, uncleaned",
                              self._log.directory)
                self.failure = f"{type(err).__name__}: {err}"
                return
            if result is not None:
                self.passes += 1
                self.bytes_cleaned += result.bytes_read
                self.bytes_removed += max(0, result.bytes_read - result.bytes_written)
                self.records_removed += result.records_removed
                self.last_run_ms = int(time.time() * 1000)
                log.info("cleaned %s: %d records removed, %d bytes read, %d written, clean up to %d",
                         self._log.directory, result.records_removed, result.bytes_read, result.bytes_written,
                         result.cleaned_to)
