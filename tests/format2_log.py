"""A partition log of format-1 messages followed by format-2 batches, put
into a real server's log for the readers' tests (consumer batches, Ray Data,
the CLI, the mirror, Spark): both through the data channel's PRODUCE, format-1
message sets (one message each, as the producer before format 2 sent them)
and then format-2 batches (the partition stores a record batch as it is
sent, in a segment of its own: a segment holds one format, docs/design.md §2)."""

from __future__ import annotations

import glob
import os

from raylog.storage.message import encode_message_set
from raylog.storage.record_batch import encode_records

#: (key, value, headers, timestamp) of the two format-2 batches
BATCH_A = [
    (b"k0", b"v0", [("h", b"1"), ("h", b"2"), ("n", None)], 1000),
    (None, None, None, 1001),  # a tombstone
    (b"k2", b"", [("e", b"")], 1002),  # an empty value, not a tombstone
]
BATCH_B = [(b"k%d" % i, b"b%d" % i, [("i", str(i).encode())], 2000 + i) for i in range(4)]
PLAIN = 2


def mixed_log(client, topic: str, partition: int = 0, batches=(BATCH_A, BATCH_B)) -> tuple[list[int], list[int]]:
    """PLAIN format-1 messages, then ``batches`` as format-2 batches, all
    flushed; the format-1 offsets and the batches' positions."""
    import ray

    from raylog.transfer.connection import BrokerConnection

    host, port = client.metadata.endpoint(topic, partition, refresh=True, wait_s=10.0)
    with BrokerConnection(host, port, token=client.settings.token, timeout_s=10) as conn:
        plain = [conn.produce(topic, partition, encode_message_set([b"plain-%d" % i])) for i in range(PLAIN)]
        positions = [conn.produce(topic, partition, encode_records(b)) for b in batches]
    ray.get(client.partition_actor(topic, partition).flush.remote())
    return plain, positions


def expected(plain, positions, batches=(BATCH_A, BATCH_B)) -> list[tuple]:
    """(offset, key, value, headers as lists) of every record in order."""
    out = [(o, None, b"plain-%d" % i, []) for i, o in enumerate(plain)]
    for p, batch in zip(positions, batches):
        out += [(p + i, k, v, list(h or ())) for i, (k, v, h, _ts) in enumerate(batch)]
    return out


def flip_in_batch(client, topic: str, position: int, partition: int = 0) -> None:
    """Invert the last byte of the format-2 batch at ``position`` (inside its
    last record, covered by the batch's CRC) in its segment file, in place,
    as a failing disk would (the page cache then serves the damage)."""
    log_dir = client.registry.placement(topic, partition)["log_dir"]
    bases = sorted(int(os.path.basename(p)[:-4]) for p in glob.glob(os.path.join(log_dir, "*.log")))
    base = max(b for b in bases if b <= position)
    with open(os.path.join(log_dir, f"{base:020d}.log"), "r+b") as f:
        f.seek(position - base + 8)
        length = int.from_bytes(f.read(4), "big")
        where = position - base + 12 + length - 1
        f.seek(where)
        byte = f.read(1)
        f.seek(where)
        f.write(bytes([byte[0] ^ 0xFF]))


def format1_topic(client, topic: str, values, partitions: int = 1) -> dict[int, list[int]]:
    """A topic whose partitions hold format-1 messages only (one set per
    message through the data channel, as the producer before format 2 wrote
    them), flushed: where format 1's rule still holds (an offset inside a
    message is no offset). ``{partition: offsets}``."""
    import ray

    from raylog.transfer.connection import BrokerConnection

    client.create_topic(topic, partitions=partitions)
    offsets: dict[int, list[int]] = {}
    for p in range(partitions):
        host, port = client.metadata.endpoint(topic, p, refresh=True, wait_s=10.0)
        with BrokerConnection(host, port, token=client.settings.token, timeout_s=10) as conn:
            offsets[p] = [conn.produce(topic, p, encode_message_set([v])) for v in values]
        ray.get(client.partition_actor(topic, p).flush.remote())
    return offsets
