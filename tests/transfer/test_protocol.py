"""The frame codec of raylog.transfer.protocol: failures first, then round trips."""

from __future__ import annotations

import pytest

from raylog.errors import (
    BrokerUnavailableError,
    ConfigError,
    CorruptMessageError,
    FrameTooLargeError,
    NotOwnerError,
    OffsetOutOfRangeError,
    ProtocolError,
    RaylogError,
)
from raylog.transfer import protocol as p
from raylog.transfer import replies as rep
from raylog.transfer import requests as req


def frame_at(buf: bytes, pos: int = 0):
    (size,) = p.SIZE.unpack_from(buf, pos)
    return req.decode_request(memoryview(buf), pos, size)


# -- malformed frames ----------------------------------------------------------


def test_frame_shorter_than_a_header_is_refused():
    buf = p.SIZE.pack(3) + b"abc"
    with pytest.raises(ProtocolError, match="shorter than a request header"):
        frame_at(buf)


def test_unknown_api_key_is_refused_with_its_correlation_id():
    buf = p.REQUEST_HEADER.pack(8, 99, p.VERSION, 1234)
    with pytest.raises(ProtocolError, match="unknown api key 99") as info:
        frame_at(buf)
    assert info.value.correlation_id == 1234


def test_unknown_version_is_refused():
    frame = bytearray(req.encode_offsets(7, "t", 0))
    p.REQUEST_HEADER.pack_into(frame, 0, len(frame) - 4, p.API_OFFSETS, 5, 7)
    with pytest.raises(ProtocolError, match="unsupported version 5"):
        frame_at(bytes(frame))


def test_produce_whose_set_length_does_not_match_the_frame_is_refused():
    frame = bytearray(req.encode_produce(3, "clicks", 0, 1, b"x" * 40))
    # claim one byte more than the frame holds
    at = p.REQUEST_HEADER.size + 2 + len("clicks") + 4 + 1
    frame[at : at + 4] = (41).to_bytes(4, "big")
    with pytest.raises(ProtocolError, match="set length 41 but 40 bytes left") as info:
        frame_at(bytes(frame))
    assert info.value.correlation_id == 3


def test_topic_running_past_the_frame_is_refused():
    frame = bytearray(req.encode_fetch(4, "clicks", 0, 0, 100))
    frame[p.REQUEST_HEADER.size : p.REQUEST_HEADER.size + 2] = (5000).to_bytes(2, "big")
    with pytest.raises(ProtocolError, match="topic length 5000 runs past the frame"):
        frame_at(bytes(frame))


def test_topic_that_is_not_utf8_is_refused():
    body = p.STRING_LENGTH.pack(2) + b"\xff\xfe" + p.OFFSETS_FIELDS.pack(0)
    frame = p.REQUEST_HEADER.pack(8 + len(body), p.API_OFFSETS, p.VERSION, 9) + body
    with pytest.raises(ProtocolError, match="not UTF-8"):
        frame_at(frame)


def test_fetch_with_trailing_bytes_or_negative_bounds_is_refused():
    frame = req.encode_fetch(5, "t", 0, 0, 100)
    longer = p.SIZE.pack(len(frame) - 4 + 1) + frame[4:] + b"!"
    with pytest.raises(ProtocolError, match="bytes after the topic"):
        frame_at(longer)
    with pytest.raises(ProtocolError, match="negative"):
        frame_at(req.encode_fetch(5, "t", 0, 0, -1))
    with pytest.raises(ProtocolError, match="negative"):
        frame_at(req.encode_fetch(5, "t", 0, 0, 10, -5))


def test_produce_with_acks_other_than_0_or_1_is_refused():
    body = req.encode_string("t") + p.PRODUCE_FIELDS.pack(0, -1, 0)
    frame = p.REQUEST_HEADER.pack(p.REQUEST_HEADER_BODY + len(body), p.API_PRODUCE, p.VERSION, 1) + body
    with pytest.raises(ProtocolError, match="acks must be 0 or 1"):
        frame_at(frame)
    # the encoder does not write such a frame
    with pytest.raises(ConfigError, match="version 0"):
        req.encode_produce(1, "t", 0, -1, b"", version=p.VERSION)


def test_auth_frames_have_a_fixed_size_and_a_known_step():
    frame = req.encode_auth_hello(1, b"n" * p.NONCE_BYTES)
    assert p.SIZE.unpack_from(frame)[0] == 41 <= p.PRE_AUTH_MAX_FRAME_BYTES
    longer = frame + b"x"
    longer = p.SIZE.pack(len(longer) - 4) + longer[4:]
    with pytest.raises(ProtocolError, match="expected 33"):
        frame_at(longer)
    wrong_step = bytearray(frame)
    wrong_step[p.REQUEST_HEADER.size] = 7
    with pytest.raises(ProtocolError, match="unknown AUTH step 7"):
        frame_at(bytes(wrong_step))


def test_auth_version_0_with_a_plain_token_is_refused():
    body = req.encode_string("secret")
    frame = p.REQUEST_HEADER.pack(p.REQUEST_HEADER_BODY + len(body), p.API_AUTH, 0, 1) + body
    with pytest.raises(ProtocolError, match="AUTH version 0 is not accepted"):
        frame_at(frame)


def test_frame_size_check_refuses_before_allocating():
    req.check_frame_size(p.DEFAULT_MAX_FRAME_BYTES, p.DEFAULT_MAX_FRAME_BYTES)
    with pytest.raises(FrameTooLargeError) as info:
        req.check_frame_size(2**31, p.DEFAULT_MAX_FRAME_BYTES)
    assert info.value.size == 2**31
    assert isinstance(info.value, ProtocolError)


def test_topic_longer_than_a_u16_cannot_be_encoded():
    with pytest.raises(ProtocolError, match="does not fit a u16"):
        req.encode_string("x" * 70_000)


def test_default_max_frame_leaves_header_room_over_the_largest_message():
    assert p.DEFAULT_MAX_FRAME_BYTES == (1 << 20) + 64 * 1024


# -- requests round trip -------------------------------------------------------


def test_requests_round_trip_field_by_field():
    produce = frame_at(req.encode_produce(11, "clicks-ü", 3, 1, b"abc"))
    assert isinstance(produce, req.ProduceRequest)
    assert (produce.correlation_id, produce.topic, produce.partition, produce.acks) == (11, "clicks-ü", 3, 1)
    assert bytes(produce.message_set) == b"abc"

    fetch = frame_at(req.encode_fetch(12, "clicks", 2, 2**40, 65536, 1500))
    assert fetch == req.FetchRequest(12, "clicks", 2, 2**40, 65536, 1500)

    offsets = frame_at(req.encode_offsets(13, "clicks", 7))
    assert offsets == req.OffsetsRequest(13, "clicks", 7)

    for_time = frame_at(req.encode_offsets_for_time(14, "clicks", 1, 1_700_000_000_123))
    assert for_time == req.OffsetsForTimeRequest(14, "clicks", 1, 1_700_000_000_123)
    reply = rep.encode_offsets_for_time_reply(14, 4096)
    assert p.OFFSETS_FOR_TIME_REPLY.unpack(reply) == (len(reply) - 4, 14, 0, 4096)

    count = frame_at(req.encode_count(15, "clicks", 3, 4096, 2**40, 1 << 20))
    assert count == req.CountRequest(15, "clicks", 3, 4096, 2**40, 1 << 20)
    reply = rep.encode_count_reply(15, 1234, 2**40)
    assert p.COUNT_REPLY.unpack(reply) == (len(reply) - 4, 15, 0, 1234, 2**40)

    nonce, proof = bytes(range(32)), bytes(range(32, 64))
    assert frame_at(req.encode_auth_hello(-5, nonce)) == req.AuthRequest(-5, p.AUTH_HELLO, nonce)
    assert frame_at(req.encode_auth_proof(6, proof)) == req.AuthRequest(6, p.AUTH_PROOF, proof)
    reply = rep.encode_auth_hello_reply(-5, nonce, proof)
    assert p.AUTH_HELLO_REPLY.unpack(reply) == (len(reply) - 4, -5, 0, nonce, proof)


def test_frames_back_to_back_decode_in_place():
    frames = req.encode_produce(1, "a", 0, 0, b"12345") + req.encode_fetch(2, "a", 0, 5, 10) + req.encode_offsets(3, "b", 1)
    pos, seen = 0, []
    while pos < len(frames):
        (size,) = p.SIZE.unpack_from(frames, pos)
        seen.append(req.decode_request(memoryview(frames), pos, size).correlation_id)
        pos += 4 + size
    assert seen == [1, 2, 3] and pos == len(frames)


def test_header_layout_is_big_endian_size_api_version_correlation():
    frame = req.encode_offsets(0x01020304, "t", 0)
    assert frame[:4] == (len(frame) - 4).to_bytes(4, "big")
    assert frame[4:6] == p.API_OFFSETS.to_bytes(2, "big")
    assert frame[6:8] == b"\x00\x00"
    assert frame[8:12] == b"\x01\x02\x03\x04"
    assert frame[12:14] == b"\x00\x01" and frame[14:15] == b"t"


# -- replies -------------------------------------------------------------------


def _error_round_trip(err: RaylogError) -> tuple[int, RaylogError]:
    reply = rep.encode_error(77, err)
    size, corr, code = p.REPLY_HEADER.unpack_from(reply)
    assert size == len(reply) - 4 and corr == 77
    return code, rep.decode_error(code, reply[p.REPLY_HEADER.size :])


def test_offset_out_of_range_round_trips_with_earliest_and_latest():
    code, back = _error_round_trip(OffsetOutOfRangeError("past the end", offset=900, earliest=0, latest=880))
    assert code == OffsetOutOfRangeError.code
    assert type(back) is OffsetOutOfRangeError
    assert (back.offset, back.earliest, back.latest) == (900, 0, 880)
    assert str(back) == "past the end"


@pytest.mark.parametrize(
    "err",
    [
        CorruptMessageError("bad crc", offset=40),
        NotOwnerError("not here", topic="t", partition=2),
        BrokerUnavailableError("busy"),
        FrameTooLargeError("too big", size=2**31),
        RaylogError("plain"),
    ],
)
def test_errors_round_trip_into_the_same_class(err):
    _code, back = _error_round_trip(err)
    assert type(back) is type(err)
    assert back.details == err.details
    assert back.retriable == err.retriable


def test_non_raylog_exception_travels_as_the_base_error():
    code, back = _error_round_trip(ValueError("boom"))
    assert code == RaylogError.code and type(back) is RaylogError and "boom" in str(back)


def test_error_details_cannot_shadow_error_attributes():
    body = p.STRING_LENGTH.pack(1) + b"m"
    details = b'{"code":99,"retriable":true,"message":"x","earliest":3}'
    body += p.STRING_LENGTH.pack(len(details)) + details
    back = rep.decode_error(OffsetOutOfRangeError.code, body)
    assert back.code == OffsetOutOfRangeError.code and back.retriable is False and back.earliest == 3


def test_malformed_error_reply_gives_a_protocol_error():
    back = rep.decode_error(OffsetOutOfRangeError.code, b"\x00")
    assert isinstance(back, ProtocolError)


def test_long_error_messages_are_clipped_to_a_u16():
    _code, back = _error_round_trip(RaylogError("é" * 40_000))
    assert len(str(back).encode()) <= 0xFFFF


def test_success_replies_have_the_documented_sizes():
    assert p.SIZE.unpack_from(rep.encode_auth_reply(1))[0] == 6
    assert p.SIZE.unpack_from(rep.encode_produce_reply(1, 5))[0] == 14
    assert p.SIZE.unpack_from(rep.encode_offsets_reply(1, 0, 5))[0] == 22
    header = rep.encode_fetch_reply_header(1, 100, 0, 4096)
    assert len(header) == p.FETCH_REPLY.size and p.SIZE.unpack_from(header)[0] == 26 + 4096
