"""What a partition stores, read from its data socket, not through the code
under test: the tests' one way to see a log as it is."""

from __future__ import annotations

from raylog.storage.decoding import decode_messages
from raylog.transfer.connection import BrokerConnection


def stored_records(client, topic: str, partition: int = 0) -> list[tuple]:
    """``(offset, timestamp_ms, key, value)`` of every record of ``topic``-
    ``partition`` from its log start to its high watermark, in log order."""
    start, end = client.offsets(topic, partition)
    host, port = client.metadata.endpoint(topic, partition, refresh=True)
    out = []
    with BrokerConnection(host, port, token=client.settings.token) as conn:
        offset = start
        while offset < end:
            records, consumed = decode_messages(conn.fetch(topic, partition, offset, 1 << 20).data, offset)
            out.extend(records)
            offset += consumed
    return out
