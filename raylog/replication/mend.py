"""Mending a replica's damaged bytes from an in-sync replica.

Replicas hold the same bytes at the same offsets (docs/design.md §7), so a range of
damaged stored messages that recovery found and kept (a
:class:`~raylog.storage.recovery.RecoveryReport` with ``kept``: offsets
``[start, end)``, ``end`` the next readable message) can be read from another
replica and written back in place. :func:`mend_from_isr` asks each other
member of the in-sync replicas that runs now (their ``replicas/<node>``
endpoints), over the data channel with the cluster token, for exactly that
range: a leader serves it below its high watermark, a follower below the
high watermark it learned. The bytes are taken only if they are whole
messages passing every check and fill the range exactly
(:meth:`PartitionLog.mend` checks, writes and syncs). A range no member can
give stays damaged, as recovery reported it (readers skip it with
``consumer.skip_corrupt()``).

Runs on a thread of the partition actor once its replication role is known;
stateless.
"""

from __future__ import annotations

import logging

from raylog.errors import RaylogError
from raylog.replication.state import read_state, running_replicas
from raylog.transfer.connection import BrokerConnection
from raylog.transfer.protocol import FRAME_OVERHEAD_BYTES

log = logging.getLogger(__name__)

#: how long one request to a peer replica may take
MEND_REQUEST_TIMEOUT_S = 30.0


def damaged_ranges(partition_log) -> list[tuple[int, int]]:
    """The damaged ranges recovery found and kept in ``partition_log``."""
    return [(r.start_offset, r.end_offset) for r in partition_log.recovery_reports
            if getattr(r, "kept", False) and r.end_offset > r.start_offset]


def mend_from_isr(zk, paths, topic: str, partition: int, node: str, partition_log, token: bytes,
                  ranges: list[tuple[int, int]]) -> list[dict]:
    """Mend each of ``ranges`` of ``partition_log`` (this replica, on
    ``node``) from another in-sync replica. Returns one row per range:
    ``{"start", "end", "from"}`` (``from``: the node it came from, or None
    when no in-sync replica could give it). Never raises for a peer's failure."""
    found = read_state(zk, paths, topic, partition)
    peers = [] if found is None else [n for n in found[0].isr if n != node]
    endpoints = running_replicas(zk, paths, topic, partition)
    rows = []
    for start, end in ranges:
        source = None
        for peer in peers:
            endpoint = endpoints.get(peer)
            if endpoint is None:
                continue
            try:
                with BrokerConnection(endpoint["host"], endpoint["port"], token=token,
                                      timeout_s=MEND_REQUEST_TIMEOUT_S,
                                      max_frame_bytes=end - start + FRAME_OVERHEAD_BYTES) as conn:
                    data = bytes(conn.fetch(topic, partition, start, end - start).data)
                partition_log.mend(start, data[: end - start])
            except (RaylogError, OSError) as err:
                log.warning("%s-%d: replica %s could not mend [%d, %d) from %s: %s", topic, partition, node, start, end,
                            peer, err)
                continue
            source = peer
            break
        if source is None:
            log.warning("%s-%d: replica %s keeps the damaged bytes [%d, %d): no in-sync replica could give them "
                        "(readers skip them with consumer.skip_corrupt())", topic, partition, node, start, end)
        else:
            log.warning("%s-%d: replica %s mended the damaged bytes [%d, %d) from in-sync replica %s", topic,
                        partition, node, start, end, source)
        rows.append({"start": start, "end": end, "from": source})
    return rows
