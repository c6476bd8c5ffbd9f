"""Ray Data's info lines kept off the console while raylog is quiet.

Ray Data logs, at INFO on the console, the start and plan of every dataset
it executes and (when stdout is not a terminal) a block of progress lines
every few seconds: 11 lines and more for one ``read_raylog(...).count()``.
They are news to nobody reading a topic, so while raylog is quiet (its
loggers at WARNING, the default; see :mod:`raylog.quiet`) the console
handler of Ray Data's logger drops INFO and below. Its warnings and errors
still pass, and so does everything to Ray Data's log file
(``<session>/logs/ray-data``); other loggers (the application's own) are
not touched. ``RAYLOG_LOG_LEVEL=INFO`` or ``verbose=True`` lets the lines
through again (the filter reads raylog's level at each record).
"""

from __future__ import annotations

import logging

#: the logger Ray Data configures its handlers on
RAY_DATA_LOGGER = "ray.data"


class _DropInfoWhileQuiet(logging.Filter):
    """Drops records below WARNING while raylog logs at WARNING or above."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        return logging.getLogger("raylog").getEffectiveLevel() < logging.WARNING


_FILTER = _DropInfoWhileQuiet()


def quiet_ray_data_console() -> None:
    """Put the filter on the console handlers of Ray Data's logger (not on
    its file handler); idempotent. Ray Data sets its handlers up when
    ``ray.data`` is imported: call this after that import."""
    import ray.data  # heavy (Ray): imported when used; configures Ray Data's logging

    for handler in logging.getLogger(RAY_DATA_LOGGER).handlers:
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
            if _FILTER not in handler.filters:
                handler.addFilter(_FILTER)
