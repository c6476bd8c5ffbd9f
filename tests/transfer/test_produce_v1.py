"""PRODUCE version 1 over raw sockets: idempotent producers (producer id,
epoch, sequence) and acks=-1, against a real DataServer and PartitionLog.
Failures first: gaps, forgotten duplicates, malformed frames; then retries
stored once and acks=-1 read-your-writes."""

from __future__ import annotations

import socket

import pytest

from raylog.errors import (
    ConfigError,
    DuplicateSequenceError,
    OutOfOrderSequenceError,
    ProtocolError,
)
from raylog.storage.decoding import decode_messages
from raylog.storage.message import encode_message_set
from raylog.transfer import protocol as p
from raylog.transfer import replies as rep
from raylog.transfer import requests as req

TOPIC = "clicks"  # the topic the fixtures serve (conftest.TOPIC)
PID = 7_000_000_000_123


def read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError(f"connection closed after {len(data)} of {n} bytes")
        data += chunk
    return data


class Raw:
    """A bare protocol connection: frames out, replies decoded, errors raised."""

    def __init__(self, server):
        self.sock = socket.create_connection(server.address, timeout=10)
        self.correlation = 0

    def close(self):
        self.sock.close()

    def frame(self, message_set: bytes, sequence: int, *, acks: int = 1, producer_id: int = PID) -> tuple[int, bytes]:
        self.correlation += 1
        frame = req.encode_produce(
            self.correlation, TOPIC, 0, acks, message_set, producer_id=producer_id, sequence=sequence, version=1
        )
        return self.correlation, frame

    def reply(self) -> tuple[int, int, bytes]:
        (size,) = p.SIZE.unpack(read_exactly(self.sock, 4))
        rest = read_exactly(self.sock, size)
        correlation_id, code = p.REPLY_HEADER.unpack(p.SIZE.pack(size) + rest[:6])[1:]
        return correlation_id, code, rest[6:]

    def produce_many(self, sets_and_sequences, acks: int = 1, producer_id: int = PID) -> list:
        """Send all frames in one write; return each reply's base offset or error."""
        ids, frames = [], []
        for message_set, sequence in sets_and_sequences:
            cid, frame = self.frame(message_set, sequence, acks=acks, producer_id=producer_id)
            ids.append(cid)
            frames.append(frame)
        self.sock.sendall(b"".join(frames))
        results = []
        for cid in ids:
            got, code, body = self.reply()
            assert got == cid
            results.append(rep.decode_error(code, body) if code else p.PRODUCE_REPLY_FIELDS.unpack(body)[0])
        return results

    def produce(self, message_set: bytes, sequence: int, **kw):
        (result,) = self.produce_many([(message_set, sequence)], **kw)
        if isinstance(result, Exception):
            raise result
        return result

    def fetch(self, offset: int, max_bytes: int = 1 << 20) -> tuple[int, bytes]:
        self.correlation += 1
        self.sock.sendall(req.encode_fetch(self.correlation, TOPIC, 0, offset, max_bytes, 0))
        cid, code, body = self.reply()
        assert cid == self.correlation
        if code:
            raise rep.decode_error(code, body)
        high_watermark, _start, length = p.FETCH_REPLY_FIELDS.unpack_from(body)
        return high_watermark, body[p.FETCH_REPLY_FIELDS.size :][:length]


@pytest.fixture
def raw(server):
    conn = Raw(server)
    yield conn
    conn.close()


def values(plog) -> list[bytes]:
    plog.flush()
    chunk = plog.read(plog.log_start_offset, 1 << 24)
    records, _ = decode_messages(chunk.tobytes(), chunk.offset)
    return [value for _o, _t, _k, value in records]


def one(value: bytes) -> bytes:
    return encode_message_set([value], timestamp_ms=1)


# -- encoding ----------------------------------------------------------------------


def test_v1_frame_round_trips_through_the_decoder_fast_and_slow():
    frame = req.encode_produce(5, TOPIC, 3, p.ACKS_ALL, one(b"x"), producer_id=PID, producer_epoch=0, sequence=9)
    (size,) = p.SIZE.unpack_from(frame)
    assert p.REQUEST_HEADER.unpack_from(frame)[2] == p.PRODUCE_VERSION_IDEMPOTENT
    request = req.decode_request(bytearray(frame), 0, size)
    assert (request.correlation_id, request.topic, request.partition, request.acks) == (5, TOPIC, 3, -1)
    assert (request.producer_id, request.producer_epoch, request.sequence) == (PID, 0, 9)
    assert bytes(request.message_set) == one(b"x")
    # field by field as protocol.py defines it
    body = req.encode_string(TOPIC) + p.PRODUCE_V1_FIELDS.pack(3, -1, PID, 0, 9, len(one(b"x"))) + one(b"x")
    assert p.REQUEST_HEADER.pack(p.REQUEST_HEADER_BODY + len(body), p.API_PRODUCE, 1, 5) + body == frame
    # a plain set is written as version 0 and decodes with no producer id
    v0 = req.encode_produce(1, TOPIC, 0, 1, one(b"y"))
    assert p.REQUEST_HEADER.unpack_from(v0)[2] == p.VERSION
    request = req.decode_request(bytearray(v0), 0, p.SIZE.unpack_from(v0)[0])
    assert (request.producer_id, request.sequence) == (p.NO_PRODUCER_ID, p.NO_SEQUENCE)


@pytest.mark.parametrize(
    "acks, producer_id, sequence",
    [(2, PID, 0), (-2, -1, -1), (1, -1, 4), (1, PID, -1), (1, -5, 0)],
)
def test_v1_encoder_and_decoder_refuse_fields_that_do_not_go_together(acks, producer_id, sequence):
    with pytest.raises(ConfigError):
        req.encode_produce(1, TOPIC, 0, acks, one(b"x"), producer_id=producer_id, sequence=sequence)
    fields = p.PRODUCE_V1_FIELDS.pack(0, acks, producer_id, 0, sequence, len(one(b"x")))
    body = req.encode_string(TOPIC) + fields + one(b"x")
    frame = p.REQUEST_HEADER.pack(p.REQUEST_HEADER_BODY + len(body), p.API_PRODUCE, 1, 3) + body
    with pytest.raises(ProtocolError, match="malformed PRODUCE"):
        req.decode_request(bytearray(frame), 0, p.SIZE.unpack_from(frame)[0])


# -- the server's rules ---------------------------------------------------------------


def test_a_gap_in_sequences_is_refused_alone_and_stores_nothing(raw, plog):
    assert raw.produce(one(b"a"), 0) == 0
    with pytest.raises(OutOfOrderSequenceError, match="clicks-0") as info:
        raw.produce(one(b"c"), 2)
    assert info.value.expected == 1 and not info.value.retriable
    second = raw.produce(one(b"b"), 1)  # the connection stays usable
    assert second == len(one(b"a"))
    assert values(plog) == [b"a", b"b"]


def test_a_duplicate_no_longer_remembered_is_refused_and_not_stored_again(raw, plog):
    sets = [(one(b"%d" % i), i) for i in range(40)]
    assert all(isinstance(r, int) for r in raw.produce_many(sets))
    with pytest.raises(DuplicateSequenceError) as info:
        raw.produce(one(b"0"), 0)
    assert not info.value.retriable
    assert len(values(plog)) == 40


def test_a_retried_set_is_stored_once_and_answered_with_its_first_offset(raw, plog, server):
    first = raw.produce(one(b"a"), 0)
    raw.produce(one(b"b"), 1)
    again = Raw(server)  # a retry usually comes on a new connection
    try:
        assert again.produce(one(b"a"), 0) == first
        assert again.produce(one(b"b"), 1) == len(one(b"a"))
    finally:
        again.close()
    assert values(plog) == [b"a", b"b"]


def test_a_pipelined_retry_overlapping_stored_sets_stores_only_the_new_ones(raw, plog):
    sets = [(one(b"%02d" % i), i) for i in range(20)]
    bases = raw.produce_many(sets[:10])
    retried = raw.produce_many(sets[5:20])  # 5..9 stored already: duplicates
    assert retried[:5] == bases[5:10]
    assert retried[5:] == [bases[9] + len(one(b"00")) * k for k in range(1, 11)]
    assert values(plog) == [b"%02d" % i for i in range(20)]


def test_a_new_producer_id_may_start_at_any_sequence_and_producers_do_not_mix(raw, plog):
    raw.produce(one(b"x"), 41, producer_id=1)
    raw.produce(one(b"y"), 0, producer_id=2)
    raw.produce(one(b"x2"), 42, producer_id=1)
    with pytest.raises(OutOfOrderSequenceError):
        raw.produce(one(b"y?"), 5, producer_id=2)
    assert values(plog) == [b"x", b"y", b"x2"]


def test_v1_without_producer_id_appends_every_time(raw, plog):
    raw.produce(one(b"a"), -1, producer_id=-1)
    raw.produce(one(b"a"), -1, producer_id=-1)
    assert values(plog) == [b"a", b"a"]


def test_acks_0_duplicates_are_dropped_silently(raw, plog):
    frames = [raw.frame(one(b"q"), 0, acks=0)[1], raw.frame(one(b"q"), 0, acks=0)[1]]
    raw.sock.sendall(b"".join(frames))
    assert raw.produce(one(b"r"), 1) > 0  # a reply after them: both handled
    assert values(plog) == [b"q", b"r"]


# -- acks=-1 -----------------------------------------------------------------------------


def test_acks_all_replies_once_the_set_is_below_the_high_watermark(raw, plog):
    # The fixture's log never flushes by itself: acks=1 data stays invisible...
    raw.produce(one(b"leader"), 0, acks=1)
    assert raw.fetch(0) == (0, b"")
    # ... while the reply to acks=-1 means a FETCH sees the data at once.
    base = raw.produce(one(b"all"), 1, acks=p.ACKS_ALL)
    high_watermark, data = raw.fetch(0)
    assert high_watermark == base + len(one(b"all"))
    records, _ = decode_messages(data, 0)
    assert [r[3] for r in records] == [b"leader", b"all"]


def test_acks_all_without_idempotence_also_waits_for_the_flush(raw, plog):
    base = raw.produce(one(b"z"), -1, acks=p.ACKS_ALL, producer_id=-1)
    assert plog.high_watermark == base + len(one(b"z"))
