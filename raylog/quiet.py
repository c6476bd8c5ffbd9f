"""How loud raylog and the systems it starts are: quiet unless asked.

By default raylog's own loggers (``raylog.*``) emit WARNING and above, and
only when something is wrong; the libraries and systems the embedded
default and ``raylog_spark.init_spark`` start are kept to what matters:

- kazoo (the ZooKeeper client) at ERROR: its "Connection dropped" and
  "Transition to CONNECTING" warnings repeat every retry, and raylog
  reports a lost or unreachable ZooKeeper itself, once, with what to do;
- Ray's notice that a local cluster it starts has token authentication
  turned on (its default) is dropped; every other Ray record passes;
- Spark's driver logs at ERROR through a log4j 2 configuration of ours
  (RayDP otherwise names a file that does not exist, and log4j says
  "Reconfiguration failed").

- the info line Ray's C++ core prints as each of RayDP's JVMs starts
  (``gcs_client.cc: GcsClient has no Cluster ID set``) is dropped from what
  Ray forwards to the driver (:func:`quiet_forwarded_lines`).

- that same line from Spark's driver JVM, which inherits this process's
  stderr, is dropped by :func:`filter_child_stderr`: the JVM is started
  with a pipe for its stderr, and a thread forwards every other line
  (``RAY_BACKEND_LOG_LEVEL`` would only replace the line with one saying the
  level was set).

``verbose=True`` (``raylog.connect``, ``init_spark``) or the environment
variable ``RAYLOG_LOG_LEVEL`` (a level name or number, e.g. ``INFO`` or
``DEBUG``) brings everything back: raylog's loggers at that level, the
others at their own defaults. ``RAYLOG_LOG_LEVEL=WARNING`` is the default;
``ERROR`` quiets raylog's warnings too.

Nothing here touches the root logger or adds handlers: an application's own
logging configuration still decides where the records go (without one,
Python's last-resort handler prints WARNING and above to stderr).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading

from raylog.errors import ConfigError

#: the environment variable that sets raylog's log level (and, below
#: WARNING, turns the quieting of other systems off)
LEVEL_ENV = "RAYLOG_LOG_LEVEL"

#: loggers of libraries raylog drives, and the level they get when quiet
QUIETED_LOGGERS = {"kazoo": logging.ERROR}


def level(verbose: bool | None = None) -> int:
    """raylog's log level: ``RAYLOG_LOG_LEVEL`` if set, else INFO when
    ``verbose``, else WARNING. A bad value is a :class:`ConfigError`."""
    value = os.environ.get(LEVEL_ENV, "").strip()
    if value:
        if value.lstrip("-").isdigit():
            return int(value)
        found = logging.getLevelName(value.upper())
        if not isinstance(found, int):
            raise ConfigError(
                f"{LEVEL_ENV}={value!r} is not a log level; use DEBUG, INFO, WARNING, ERROR or CRITICAL"
            )
        return found
    return logging.INFO if verbose else logging.WARNING


def is_quiet(verbose: bool | None = None) -> bool:
    """Whether other systems' start-up chatter is to be silenced."""
    return not verbose and level(verbose) >= logging.WARNING


def configure(verbose: bool | None = None) -> bool:
    """Set raylog's and the quieted libraries' logger levels; returns
    :func:`is_quiet`. Idempotent; later calls follow the latest setting."""
    quiet = is_quiet(verbose)
    logging.getLogger("raylog").setLevel(level(verbose))
    logging.getLogger("raylog_spark").setLevel(level(verbose))
    for name, quiet_level in QUIETED_LOGGERS.items():
        logging.getLogger(name).setLevel(quiet_level if quiet else logging.NOTSET)
    return quiet


class _DropRayTokenNotice(logging.Filter):
    """Drops Ray's notice that a local cluster turned token auth on (Ray's
    own default for a cluster it starts); every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(RAY_TOKEN_NOTICE)


#: the start of Ray's notice, and the logger that emits it
RAY_TOKEN_NOTICE = "Token authentication is enabled for this Ray cluster"
RAY_TOKEN_LOGGER = "ray._private.authentication.authentication_token_setup"
_TOKEN_FILTER = _DropRayTokenNotice()


def quiet_ray_start(quiet: bool) -> None:
    """Before ``ray.init`` starts a local cluster: drop Ray's token notice
    when ``quiet`` (and let it through again when not)."""
    logger = logging.getLogger(RAY_TOKEN_LOGGER)
    if quiet:
        logger.addFilter(_TOKEN_FILTER)
    else:
        logger.removeFilter(_TOKEN_FILTER)


#: the start-up line of Ray's C++ core in each JVM RayDP starts (Spark's
#: master and executors); forwarded to the driver, it reads like news
_CORE_STARTUP_LINE = re.compile(r"^\[[\d\- :,.]+ I \d+ \d+\] gcs_client\.cc:\d+: GcsClient has no Cluster ID set")


def quiet_forwarded_lines() -> None:
    """Drop Ray's C++ start-up info line (:data:`_CORE_STARTUP_LINE`) from
    what Ray forwards from workers to this driver; every other line passes.
    Needs ``ray.init`` first; a no-op where Ray's dispatcher differs."""
    try:
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher  # heavy (Ray): imported when used
    except ImportError:
        return
    handlers = [pair for pair in getattr(dispatcher, "handlers", []) if pair[0] == "ray_print_logs"]
    for name, handler in handlers:
        if getattr(handler, "raylog_filtered", False):
            continue

        def filtered(data, _forward=handler):
            lines = data.get("lines")
            if lines:
                kept = [line for line in lines if not _CORE_STARTUP_LINE.match(line)]
                if not kept:
                    return
                if len(kept) != len(lines):
                    data = dict(data, lines=kept)
            _forward(data)

        filtered.raylog_filtered = True
        dispatcher.remove_handler(name)
        dispatcher.add_handler(name, filtered)


#: the same line as Spark's driver JVM writes it to its stderr
_CORE_STARTUP_STDERR = re.compile(rb"^\[[\d\- :,.]+ I \d+ \d+\] gcs_client\.cc:\d+: GcsClient has no Cluster ID set")


@contextlib.contextmanager
def filter_child_stderr(pattern=_CORE_STARTUP_STDERR):
    """Processes started inside the ``with`` block (Spark's driver JVM) get a
    pipe for their stderr; a daemon thread copies every line to the real
    stderr except those matching ``pattern``, for as long as any of them
    writes. This process's own stderr is restored when the block ends (what
    it wrote meanwhile went through the same filter). Bounded: one line at a
    time, up to 64 KiB per line."""
    try:
        target = os.dup(2)
        read_end, write_end = os.pipe()
    except OSError:  # no stderr to filter (closed): nothing to do
        yield
        return

    def forward() -> None:
        with os.fdopen(read_end, "rb", buffering=0) as source, os.fdopen(target, "wb", buffering=0) as sink:
            pending = b""
            while True:
                chunk = source.read(65536)
                if not chunk:
                    break
                pending += chunk
                *lines, pending = pending.split(b"\n")
                if len(pending) > 65536:  # a line without end: pass it on
                    lines.append(pending)
                    pending = b""
                kept = b"".join(line + b"\n" for line in lines if not pattern.match(line))
                if kept:
                    try:
                        sink.write(kept)
                    except OSError:
                        return
            if pending and not pattern.match(pending):
                with contextlib.suppress(OSError):
                    sink.write(pending)

    saved = os.dup(2)
    os.dup2(write_end, 2)
    os.close(write_end)
    threading.Thread(target=forward, name="raylog-stderr-filter", daemon=True).start()
    try:
        yield
    finally:
        os.dup2(saved, 2)  # ours again; the children keep the pipe
        os.close(saved)
