"""Moved to :mod:`raylog.testing.faults` (the fault kit); this name stays
importable for a while and re-exports it."""

from raylog.testing.faults import FaultInjectionError, drop_connection, expire_session  # noqa: F401

__all__ = ["FaultInjectionError", "drop_connection", "expire_session"]
