"""The follower's side of replication: fetch the leader's bytes over the
data channel and append them at the same byte offsets.

One thread per follower replica actor. It finds the leader's endpoint in the
registry, fetches from its own log end under the name
:func:`~raylog.replication.leader.replica_topic` (a long poll; the leader
sends with ``os.sendfile``), keeps the whole messages of the reply, appends
them with :meth:`PartitionLog.append_replica` at the offset they have on the
leader, and flushes before the next fetch, so that the offset it asks for
next (which tells the leader how far it reaches) is on its disk.

Errors (the leader moving or restarting, ZooKeeper away) close the
connection and retry under a :class:`RetryPolicy` until the follower stops.

Thread-safety: :class:`Follower` is used by its own thread; :meth:`stop`
may be called from any thread.
"""

from __future__ import annotations

import logging
import struct
import threading

from raylog.errors import RaylogError
from raylog.replication.leader import replica_topic
from raylog.retry import RetryPolicy

log = logging.getLogger(__name__)

#: how long one fetch waits at the leader for new bytes
FETCH_WAIT_MS = 500
_SIZE = struct.Struct(">I")


def whole_messages(data) -> int:
    """The length of the longest prefix of ``data`` made of whole messages
    (each a 4-byte big-endian size, then that many bytes)."""
    pos, end = 0, len(data)
    while pos + 4 <= end:
        size = _SIZE.unpack_from(data, pos)[0]
        if pos + 4 + size > end:
            break
        pos += 4 + size
    return pos


class Follower:
    """Replicates one partition from its leader (see the module docstring)."""

    def __init__(self, registry, topic: str, partition: int, node: str, partition_log, token: bytes):
        self.registry, self.topic, self.partition, self.node = registry, topic, partition, node
        self.log, self._token = partition_log, token
        self._stopped = threading.Event()
        self.fetched_bytes = 0
        self._thread = threading.Thread(target=self._run, name="raylog-follower", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stopped.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        backoff = RetryPolicy.forever(delay_s=0.05, max_delay_s=1.0).start()
        while not self._stopped.is_set():
            try:
                self._follow(backoff)
            except (RaylogError, OSError) as err:
                log.info("follower %s of %s-%d: %s; retrying", self.node, self.topic, self.partition, err)
            except Exception:  # noqa: BLE001 - the thread must go on following
                log.exception("follower %s of %s-%d failed; retrying", self.node, self.topic, self.partition)
            backoff.wait(self._stopped)

    def _follow(self, backoff) -> None:
        from raylog.transfer.connection import BrokerConnection
        from raylog.transfer.protocol import FRAME_OVERHEAD_BYTES

        endpoint = self.registry.endpoint(self.topic, self.partition)
        if endpoint is None:
            return
        max_bytes = self.log.config.max_message_bytes
        name = replica_topic(self.topic, self.node)
        with BrokerConnection(
            endpoint["host"], endpoint["port"], token=self._token, timeout_s=30.0,
            max_frame_bytes=max_bytes + FRAME_OVERHEAD_BYTES,
        ) as conn:
            while not self._stopped.is_set():
                offset = self.log.log_end_offset
                reply = conn.fetch(name, self.partition, offset, max_bytes, max_wait_ms=FETCH_WAIT_MS)
                length = whole_messages(reply.data)
                if length:
                    self.log.append_replica(bytes(reply.data[:length]), offset)
                    self.log.flush()
                    self.fetched_bytes += length
                backoff.reset()
