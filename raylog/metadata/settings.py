"""How a client in any process reaches the cluster: :class:`ConnectionSettings`.

The settings are a frozen value (ZooKeeper address, cluster name, data
token), picklable, so they travel to Ray actors and Spark tasks; from them a
process opens its own ZooKeeper session (:meth:`raylog.metadata.Metadata.connect`)
and its connections to the partitions' data servers.

Thread-safety: immutable once made.
"""

from __future__ import annotations

import dataclasses

from raylog import auth
from raylog.transfer.connection import BrokerConnection
from raylog.transfer.protocol import FRAME_OVERHEAD_BYTES


@dataclasses.dataclass(frozen=True)
class ConnectionSettings:
    """Everything a producer or consumer in another process needs to reach
    the cluster (picklable, so it travels to Ray actors and Spark tasks)."""

    zookeeper: str
    cluster: str = "default"
    #: the cluster's data token; ``None`` derives it where this process can
    #: (inside the Ray cluster, or holding Ray's auth token: see raylog.auth)
    token: bytes | None = None

    def __post_init__(self):
        if self.token is None:
            token = auth.cluster_token(self.cluster)  # closed by default
            if token is not None:
                object.__setattr__(self, "token", token)

    def broker_connection(
        self, host: str, port: int, *, timeout_s: float = 30.0, max_message_bytes: int | None = None
    ) -> BrokerConnection:
        """A :class:`~raylog.transfer.connection.BrokerConnection` to a data
        server of this cluster, authenticated with its token; with
        ``max_message_bytes``, replies may hold messages up to that size."""
        options = {} if max_message_bytes is None else {"max_frame_bytes": max_message_bytes + FRAME_OVERHEAD_BYTES}
        return BrokerConnection(host, port, token=self.token, timeout_s=timeout_s, **options)
