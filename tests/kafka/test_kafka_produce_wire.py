"""The Produce request reader and response writer against kafka-python's
generic codec (built from Kafka's own message definitions), every version
served; malformed frames are BadFrame, never another error."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from raylog.kafka.frames import BadFrame, decode_request
from raylog.kafka.produce_wire import decode_produce, encode_produce_response

VERSIONS = range(3, 10)  # 9: flexible
names = st.text(min_size=0, max_size=12)
records = st.one_of(st.none(), st.binary(max_size=64))
topics = st.lists(st.tuples(names, st.lists(st.tuples(st.integers(-2**31, 2**31 - 1), records), max_size=4)),
                  max_size=4)


def _frame(version, correlation_id, client_id, transactional_id, acks, timeout_ms, data) -> bytes:
    Topic = ProduceRequest.TopicProduceData
    request = ProduceRequest[version](transactional_id=transactional_id, acks=acks, timeout_ms=timeout_ms,
                                      topic_data=[Topic(name=name, partition_data=[
                                          Topic.PartitionProduceData(index=i, records=r) for i, r in parts])
                                          for name, parts in data])
    request.with_header(correlation_id=correlation_id, client_id=client_id)
    return bytes(request.encode(header=True, framed=True))[4:]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(VERSIONS), st.integers(0, 2**31 - 1), st.one_of(st.none(), names),
       st.one_of(st.none(), names), st.integers(-2**15, 2**15 - 1), st.integers(-2**31, 2**31 - 1), topics)
def test_requests_read_as_kafkas_own_codec_reads_them(version, correlation_id, client_id, transactional_id, acks,
                                                      timeout_ms, data):
    frame = _frame(version, correlation_id, client_id, transactional_id, acks, timeout_ms, data)
    ours, theirs = decode_produce(frame), decode_request(frame)
    assert (ours.api_key, ours.version, ours.correlation_id, ours.client_id) == (
        theirs.api_key, theirs.version, theirs.correlation_id, theirs.client_id)
    body = theirs.body
    assert (ours.body.transactional_id, ours.body.acks, ours.body.timeout_ms) == (
        body.transactional_id, body.acks, body.timeout_ms)
    assert [(t.name, [(p.index, None if p.records is None else bytes(p.records)) for p in t.partition_data])
            for t in ours.body.topic_data] == [
        (t.name, [(p.index, None if p.records is None else bytes(p.records)) for p in t.partition_data])
        for t in body.topic_data]


answers = st.lists(st.tuples(names, st.lists(st.tuples(st.integers(-2**31, 2**31 - 1), st.integers(-2**15, 2**15 - 1),
                                                        st.integers(-2**63, 2**63 - 1), st.one_of(st.none(), names)),
                                              max_size=4)), max_size=4)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(VERSIONS), st.integers(0, 2**31 - 1), answers)
def test_responses_read_by_kafkas_own_codec_as_written(version, correlation_id, topics):
    frame = encode_produce_response(version, correlation_id, topics)
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4
    assert int.from_bytes(frame[4:8], "big") == correlation_id
    body = 9 if version >= 9 else 8  # version 9's header ends with (empty) tagged fields
    assert version < 9 or frame[8] == 0
    decoded = ProduceResponse[version].decode(frame[body:])
    assert decoded.throttle_time_ms == 0
    got = [(t.name, [(p.index, p.error_code, p.base_offset, getattr(p, "error_message", None) if version >= 8 else None)
                     for p in t.partition_responses]) for t in decoded.responses]
    assert got == [(name, [(i, c, b, m if version >= 8 else None) for i, c, b, m in parts]) for name, parts in topics]


@pytest.mark.parametrize("version", [8, 9])
def test_malformed_frames_are_bad_frames_and_nothing_else(version):
    rng = random.Random(7)
    good = _frame(version, 5, "c", None, 1, 100, [("t", [(0, b"r" * 30), (1, None)]), ("u", [(2, b"")])])
    assert decode_produce(good).body.acks == 1
    cases = [good[:n] for n in range(len(good))] + [good + b"\x00", good[:4] + b"\x00\x02" + good[6:]]
    for _ in range(2_000):
        damaged = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        cases.append(bytes(damaged))
    for frame in cases:
        try:
            decode_produce(frame)
        except BadFrame:
            pass


@pytest.mark.parametrize("claimed", [2**31 - 1, 1 << 20])
def test_a_count_larger_than_the_frame_is_refused_before_anything_is_allocated(claimed):
    head = _frame(8, 1, None, None, 1, 100, [])[:-4]  # up to the topic count
    with pytest.raises(BadFrame, match="claims"):
        decode_produce(head + claimed.to_bytes(4, "big"))
    flexible = _frame(9, 1, None, None, 1, 100, [])[:-2]  # up to the topic count (compact) and the tags
    varint = bytearray()
    value = claimed + 1
    while value >= 0x80:
        varint.append((value & 0x7F) | 0x80)
        value >>= 7
    varint.append(value)
    with pytest.raises(BadFrame, match="claims"):
        decode_produce(flexible + bytes(varint) + b"\x00")


def test_tagged_fields_a_newer_client_sends_are_read_past():
    """Version 9's header, structs and body may end with tagged fields
    raylog does not know: they are skipped, and the rest read as sent."""
    frame = bytearray(_frame(9, 3, "c", "tx", -1, 100, [("t", [(4, b"abc")])]))
    # the body's own tagged fields (the last byte, 0) become one unknown field: tag 7, 2 bytes
    assert frame[-1] == 0
    frame[-1:] = b"\x01\x07\x02hi"
    ours = decode_produce(bytes(frame))
    assert (ours.body.transactional_id, ours.body.acks) == ("tx", -1)
    assert [(t.name, [(p.index, bytes(p.records)) for p in t.partition_data]) for t in ours.body.topic_data] == [
        ("t", [(4, b"abc")])]
    with pytest.raises(BadFrame):
        decode_produce(bytes(frame[:-1]))  # a tagged field cut short
