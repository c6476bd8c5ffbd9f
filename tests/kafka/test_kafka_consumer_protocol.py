"""The consumer protocol's member bytes decoded for raylog's views
(raylog.kafka.consumer_protocol): Kafka's layouts, and nothing but empty
answers for bytes that are not them."""

from __future__ import annotations

import struct

from raylog.kafka.consumer_protocol import assigned_partitions, subscribed_topics


def _string(s: str) -> bytes:
    return struct.pack(">h", len(s)) + s.encode()


def test_a_subscription_gives_its_topics():
    # version 0: topics (array of strings), user data (null)
    raw = struct.pack(">hi", 0, 2) + _string("views") + _string("clicks") + struct.pack(">i", -1)
    assert subscribed_topics(raw) == ["clicks", "views"]


def test_an_assignment_gives_its_partitions():
    # version 0: (topic, [partition]) pairs, user data (null)
    raw = (struct.pack(">hi", 0, 2) + _string("clicks") + struct.pack(">iii", 2, 3, 0)
           + _string("views") + struct.pack(">ii", 1, 1) + struct.pack(">i", -1))
    assert assigned_partitions(raw) == [("clicks", 0), ("clicks", 3), ("views", 1)]


def test_bytes_of_another_layout_give_empty_answers():
    for raw in (b"", b"xx", b"\x00\x00\xff\xff\xff\xff", b"\x7f" * 40):
        assert subscribed_topics(raw) == []
        assert assigned_partitions(raw) == []
