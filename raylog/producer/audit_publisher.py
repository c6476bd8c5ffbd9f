"""A consumer's audit events into the audit topic, by a producer: the
implementation of :class:`raylog.audit.AuditPublisher` that
:meth:`raylog.Client.consumer` hands to an auditing consumer."""

from __future__ import annotations

from raylog.audit import AUDIT_TOPIC
from raylog.producer.producer import Producer


class ProducerAuditPublisher:
    """Publishes audit events with a small producer made at the first
    publish. Confined to the consumer's thread that publishes."""

    def __init__(self, metadata):
        self._metadata = metadata
        self._producer: Producer | None = None

    def publish(self, events: list[bytes]) -> None:
        if self._producer is None:
            self._producer = Producer(self._metadata, acks=1, batch_size=100, linger_ms=0)
        self._producer.send_batch(AUDIT_TOPIC, events)
        self._producer.flush()

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close()
