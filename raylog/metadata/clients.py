"""The clients this process holds open: where readers and writers that take
an optional ``client=`` find the one ``raylog.connect()`` returned.

Thread-safety: :data:`OPEN_CLIENTS` is appended to and removed from under
the GIL, safe from any thread.
"""

from __future__ import annotations


#: the clients (:class:`raylog.Client`) made in this process and not closed
#: yet, oldest first: :mod:`raylog.client` appends and removes them, the
#: readers and writers that take an optional ``client=`` (:mod:`raylog.read`)
#: find the last one here, below the client; appended and removed under the
#: GIL, safe from any thread
OPEN_CLIENTS: list = []


def current_client():
    """The client this process connected last and has not closed (what
    ``raylog.connect()`` returned), or None: anything with ``metadata`` and
    ``settings``."""
    return OPEN_CLIENTS[-1] if OPEN_CLIENTS else None
