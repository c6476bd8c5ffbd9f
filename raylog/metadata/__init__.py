"""What clients know about the cluster (docs/design.md section 1): how to
reach it, the topics' layout and the partitions' endpoints, refreshed when
they move.

Modules: :mod:`~raylog.metadata.settings` (:class:`ConnectionSettings`, what
a client in any process needs to reach the cluster),
:mod:`~raylog.metadata.view` (:class:`Metadata`, the cached view of topics
and endpoints read from ZooKeeper), :mod:`~raylog.metadata.clients` (the
clients this process holds open: :func:`current_client`). The names below
are importable from :mod:`raylog.metadata`.

This layer sits above ``transfer/`` and ``zk/`` and below the clients
(producer, consumer, read, actors, kafka, admin).
"""

from raylog.metadata.clients import OPEN_CLIENTS, current_client
from raylog.metadata.settings import ConnectionSettings
from raylog.metadata.view import Metadata

__all__ = ["OPEN_CLIENTS", "ConnectionSettings", "Metadata", "current_client"]
