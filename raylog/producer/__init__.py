"""The producer, in the shape of aiokafka's: batching, sending, partitioning.

* :mod:`raylog.producer.producer` — :class:`Producer`, the public API;
* :mod:`raylog.producer.accumulator` — open batches per topic-partition,
  linger, the buffer bound;
* :mod:`raylog.producer.sender` — the dispatcher thread and the
  per-partition drain workers: in-flight requests, retries, idempotence;
* :mod:`raylog.producer.partitioner` — key → partition (CRC32C) and the
  sticky choice for keyless messages;
* :mod:`raylog.producer.futures` — the outcome of each send.
"""

from raylog.producer.futures import CallFuture, RecordMetadata, SendFuture
from raylog.producer.producer import Producer

__all__ = ["CallFuture", "Producer", "RecordMetadata", "SendFuture"]
