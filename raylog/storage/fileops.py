"""File-system helpers of the partition log: the flush threads, the
directory lock (``lock``, an exclusive ``flock``), directory syncs and what
counts as a full disk."""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from raylog.errors import LogDirectoryLockedError, LogInUseError, StorageError
from raylog.storage.owner_only import FILE_MODE


#: the file a log's owner holds an exclusive ``flock`` on while the log is open
LOCK_NAME = "lock"
#: errors of a write that mean "no space left" (a full disk, a full quota)
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
#: while the disk is full, writes are refused at once; every this many
#: seconds one write tries the disk again (and resumes the log if it succeeds)
DISK_FULL_RETRY_S = 1.0


def is_disk_full(err: BaseException) -> bool:
    """Whether ``err`` (an ``OSError``) says the disk or quota is full."""
    return isinstance(err, OSError) and err.errno in DISK_FULL_ERRNOS


#: threads per process that run the flushes triggered by flush_messages
FLUSH_THREADS = 2

_flush_pool: ThreadPoolExecutor | None = None
_flush_pool_lock = threading.Lock()


def _flusher() -> ThreadPoolExecutor:
    """The threads that run flushes triggered by ``flush_messages`` (shared by
    the logs of a process; a sync waits on the disk, not on the interpreter)."""
    global _flush_pool
    with _flush_pool_lock:
        if _flush_pool is None:
            _flush_pool = ThreadPoolExecutor(max_workers=FLUSH_THREADS, thread_name_prefix="raylog-flush")
        return _flush_pool


def submit_flush(flush) -> None:
    """Run ``flush`` on the flush threads; while the interpreter shuts down
    (the pool then refuses new work: a process stopped with SIGTERM that
    still hands its partitions off), on a thread of its own (never in the
    caller's, which may hold the log's locks)."""
    try:
        _flusher().submit(flush)
    except RuntimeError:
        threading.Thread(target=flush, name="raylog-flush-at-exit", daemon=True).start()


def _reset_flusher_after_fork() -> None:
    # A forked child has none of the parent's threads: start a new pool on demand.
    global _flush_pool, _flush_pool_lock
    _flush_pool = None
    _flush_pool_lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_flusher_after_fork)


def lock_directory(directory: str, wait_s: float = 0.0) -> int:
    """Take the exclusive lock of a partition directory (``fcntl.flock`` on
    its file ``lock``, held until :meth:`PartitionLog.close` or the process
    ends); :class:`LogDirectoryLockedError` if another owner still holds it
    after ``wait_s`` seconds (asked every 0.1 s; 0: asked once). A partition
    actor started again waits: Ray starts the new process as soon as the old
    one says it is leaving, and the old one may still be handing its lead
    off, holding the lock, for up to its SIGTERM drain bound."""
    fd = os.open(os.path.join(directory, LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    deadline = time.monotonic() + wait_s
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.1)
    except BlockingIOError:
        os.close(fd)
        waited = f" after waiting {wait_s:g} s" if wait_s > 0 else ""
        raise LogDirectoryLockedError(
            f"the partition directory {directory} is locked by another owner{waited} (a partition actor of "
            f"this or another cluster still runs on it); stop that owner, or give this cluster a "
            f"directory of its own",
            directory=directory,
        ) from None
    except BaseException:
        os.close(fd)
        raise


def sync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_log(log_dir: str, *, remove_directory: bool) -> bool:
    """Empty ``log_dir`` while holding its lock (so never under a running
    partition actor); with ``remove_directory`` also remove the lock file
    and the directory. False if there was no such directory. Raises
    :class:`LogInUseError` if an owner holds the lock, StorageError if
    there is no lock file (not a partition log: nothing is removed). Callers
    acting on a tombstone check the directory first
    (:func:`raylog.zk.tombstones.check_partition_directory`)."""
    if not os.path.isdir(log_dir):
        return False
    lock_path = os.path.join(log_dir, LOCK_NAME)
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        raise StorageError(f"refusing to remove {log_dir!r}: it holds no raylog lock file ({err.strerror}); "
                           f"it is not a partition log and was left untouched", directory=log_dir) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LogInUseError(
                f"the deleted partition log {log_dir} is still open by its owner; it is removed "
                f"once that partition actor stops",
                directory=log_dir,
            ) from None
        for entry in os.listdir(log_dir):
            if entry == LOCK_NAME:
                continue
            path = os.path.join(log_dir, entry)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        if remove_directory:
            os.unlink(lock_path)
            os.rmdir(log_dir)
        return True
    finally:
        os.close(fd)


def replica_log_dir(plain_dir: str, node: str, leader_at_create: str) -> str:
    """The log directory of the replica on ``node`` of a replicated partition
    whose first leader was ``leader_at_create``: the plain
    ``<data_dir>/<cluster>/<topic>-<partition>`` for that first leader,
    ``...@<node>`` for every other replica (:mod:`raylog.replication.assignment`)."""
    return plain_dir if node == leader_at_create else f"{plain_dir}@{node}"
