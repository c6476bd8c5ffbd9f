"""What a Kafka consumer group's opaque member bytes say, for raylog's views.

The classic group protocol hands the coordinator two opaque byte strings
per member of a ``consumer`` group: the subscription it joined with (the
metadata of the chosen assignor) and the assignment its leader computed.
Their layout is Kafka's ``ConsumerProtocolSubscription`` and
``ConsumerProtocolAssignment`` (versions 0-3), decoded here with
kafka-python's definitions so that ``raylog groups describe`` can show a
Kafka member's topics and partitions. The coordinator never needs them to
run the protocol: bytes that do not decode (another protocol type, a
client's own layout) give empty answers, never an error.

Thread-safety: pure functions.
"""

from __future__ import annotations

from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment, ConsumerProtocolSubscription

#: the protocol type of consumer groups (others carry layouts of their own)
CONSUMER = "consumer"


def subscribed_topics(metadata: bytes) -> list[str]:
    """The topics of a member's subscription; [] when it does not decode."""
    if not metadata:
        return []
    try:
        return sorted({str(t) for t in ConsumerProtocolSubscription.decode(bytes(metadata)).topics})
    except Exception:  # noqa: BLE001 - opaque bytes: nothing to show
        return []


def assigned_partitions(assignment: bytes) -> list[tuple[str, int]]:
    """The ``(topic, partition)`` pairs of a member's assignment; [] when it
    does not decode."""
    if not assignment:
        return []
    try:
        decoded = ConsumerProtocolAssignment.decode(bytes(assignment))
        return sorted((str(tp.topic), int(tp.partition)) for tp in decoded.partitions())
    except Exception:  # noqa: BLE001 - opaque bytes: nothing to show
        return []
