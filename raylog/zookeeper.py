"""A ZooKeeper of raylog's own, for whoever runs one: ``raylog zookeeper
start``, the local cluster, the bench cluster, the fault checker and
applications that want a throwaway server.

:class:`EmbeddedZooKeeper` is a real single-node ZooKeeper from the jars
inside the ``pyspark`` wheel, a child process on 127.0.0.1 stopped by PID
(:mod:`raylog.zk.server` has the details)::

    from raylog.zookeeper import EmbeddedZooKeeper

    with EmbeddedZooKeeper() as server:      # a free port, a temporary data directory
        client = raylog.connect(zookeeper=server.connect_string)

:data:`CONFIG_FILE_NAME` is the name of a server's configuration file in
its data directory; :func:`free_port` a free TCP port on 127.0.0.1.
"""

from __future__ import annotations

from raylog.zk.launcher import CFG_NAME as CONFIG_FILE_NAME
from raylog.zk.launcher import free_port
from raylog.zk.server import EmbeddedZooKeeper

__all__ = ["CONFIG_FILE_NAME", "EmbeddedZooKeeper", "free_port"]
