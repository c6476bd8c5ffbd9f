"""Data and secrets at rest are their owner's only.

raylog's data directories are ``0700`` and the files in them ``0600``, new
and kept ones alike; so are the token files it reads (Ray's
``~/.ray/auth_token``, from which the cluster token derives:
:mod:`raylog.auth`). Why: a segment holds the messages and the token opens
every data port; on a shared machine any other account could read a
``0755`` directory of ``0644`` files.

* :func:`make_dirs` creates the missing directories of a path with ``0700``
  (each created one, not only the last as ``os.makedirs(mode=...)`` does);
* :func:`tighten` takes group and other bits off a kept directory and the
  files in it (or off one file) and says so in the log, once per path and
  process, with what it changed;
* :data:`FILE_MODE` is the mode to pass to ``os.open`` when a file is made.

A file or directory of another owner is left alone (only its owner, or
root, may change its mode; raylog does not try).

Thread-safety: the functions may be called from any thread (the set of
paths already reported is guarded by a lock).
"""

from __future__ import annotations

import logging
import os
import stat
import threading

log = logging.getLogger(__name__)

#: the mode of every directory raylog makes for data
DIR_MODE = 0o700
#: the mode of every file raylog makes for data or secrets
FILE_MODE = 0o600
#: the bits that nobody but the owner may hold
OTHERS = stat.S_IRWXG | stat.S_IRWXO

_reported: set[str] = set()
_reported_lock = threading.Lock()


def make_dirs(path: str | os.PathLike) -> None:
    """``os.makedirs(path, exist_ok=True)`` with every created directory ``0700``."""
    path = os.path.abspath(os.fspath(path))
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, DIR_MODE)
        except FileExistsError:
            if not os.path.isdir(directory):
                raise
        else:
            # the umask may have taken bits off; never one of the owner's
            os.chmod(directory, DIR_MODE)


def _tighten_one(path: str, st: os.stat_result, changed: list[str]) -> None:
    if not st.st_mode & OTHERS or st.st_uid != os.geteuid():
        return
    mode = stat.S_IMODE(st.st_mode)
    want = DIR_MODE if stat.S_ISDIR(st.st_mode) else mode & ~OTHERS & 0o7777
    os.chmod(path, want, follow_symlinks=False)
    changed.append(f"{path} {mode:04o} -> {want:04o}")


def tighten(path: str | os.PathLike, what: str, *, recursive: bool = True) -> list[str]:
    """Take group and other bits off ``path`` (a directory, with the files and
    directories below it unless ``recursive=False``, or a file); symlinks
    are not followed. Returns what changed (``"<path> 0755 -> 0700"``) and
    logs it once per ``path`` (``what`` names it: "data directory", "Ray's
    token file"). A missing path changes nothing."""
    path = os.path.abspath(os.fspath(path))
    changed: list[str] = []
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return changed
    if stat.S_ISLNK(st.st_mode):
        return changed
    _tighten_one(path, st, changed)
    if recursive and stat.S_ISDIR(st.st_mode):
        for root, dirs, files in os.walk(path):
            for name in dirs + files:
                child = os.path.join(root, name)
                try:
                    child_st = os.lstat(child)
                except FileNotFoundError:
                    continue  # removed meanwhile (retention, compaction)
                if not stat.S_ISLNK(child_st.st_mode):
                    _tighten_one(child, child_st, changed)
    if changed:
        with _reported_lock:
            first = path not in _reported
            _reported.add(path)
        if first:
            shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
            log.warning("%s %s was readable by others; made it its owner's only: %s", what, path, shown)
    return changed


def private_opener(path: str, flags: int) -> int:
    """An ``opener`` for :func:`open` / :class:`io.FileIO` that makes a new
    file ``0600`` (an existing file keeps its mode)."""
    return os.open(path, flags, FILE_MODE)
