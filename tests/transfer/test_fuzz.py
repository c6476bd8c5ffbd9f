"""Fuzzing the data server with seeded random, truncated, mutated and
oversized frames over real sockets: every frame is answered or its
connection closed, memory stays bounded, and afterwards a normal client
still produces and fetches, with what was accepted before intact."""

from __future__ import annotations

import gc
import random
import resource
import socket
import struct
import time
import tracemalloc

from raylog.config import MiB
from raylog.errors import (
    CorruptMessageError,
    FrameTooLargeError,
    InvalidMessageError,
    InvalidOffsetError,
    MessageTooLargeError,
    NotOwnerError,
    OffsetOutOfRangeError,
    ProtocolError,
    RaylogError,
)
from raylog.storage.decoding import decode_messages
from raylog.storage.message import encode_message_set
from raylog.transfer import protocol as p
from raylog.transfer import replies as rep
from raylog.transfer import requests as req

TOPIC = "clicks"  # the topic the fixtures serve (conftest.TOPIC)
SEED = 20110622
FRAMES = 10_000
#: the fuzz loops stop at FRAMES or after this long, whichever comes first
TIME_LIMIT_S = 120.0
#: a reply must come (or the connection close) within this long
READ_TIMEOUT_S = 30.0

#: what the server may answer to garbage; code 1 (an internal error) is a bug
EXPECTED_CODES = {
    cls.code
    for cls in (
        ProtocolError,
        FrameTooLargeError,
        InvalidMessageError,
        CorruptMessageError,
        MessageTooLargeError,
        NotOwnerError,
        OffsetOutOfRangeError,
        InvalidOffsetError,
    )
}


def _random_topic(rng: random.Random) -> str:
    return rng.choice([TOPIC, TOPIC, "other", "", "ü" * rng.randint(1, 5)])


class FrameMaker:
    """Seeded frames of many kinds; each knows whether it expects a reply."""

    def __init__(self, rng: random.Random, high_watermark: int, good_sets: list[bytes]):
        self.rng = rng
        self.hw = high_watermark
        self.good = good_sets
        # (kind, weight): frames that only fail their request are more common,
        # so that a connection sees several frames before one closes it
        self.kinds, self.weights = zip(
            (self.random_bytes, 1),
            (self.oversized, 1),
            (self.random_header, 1),
            (self.mismatched_lengths, 1),
            (self.truncated, 1),
            (self.mutated_produce, 2),
            (self.garbage_produce, 5),
            (self.corrupt_produce, 5),
            (self.fetch, 5),
            (self.offsets, 5),
        )

    def correlation(self) -> int:
        return self.rng.randint(0, 2**31 - 1)

    def make(self) -> bytes:
        return self.rng.choices(self.kinds, self.weights)[0]()

    def random_bytes(self) -> bytes:
        return self.rng.randbytes(self.rng.randint(0, 200))

    def oversized(self) -> bytes:
        size = self.rng.randint(p.DEFAULT_MAX_FRAME_BYTES + 1, 2**32 - 1)
        return struct.pack(">Ihhi", size, self.rng.randint(-5, 5), 0, self.correlation()) + self.rng.randbytes(
            self.rng.randint(0, 64)
        )

    def random_header(self) -> bytes:
        body = self.rng.randbytes(self.rng.randint(0, 100))
        api = self.rng.choice([self.rng.randint(-(2**15), 2**15 - 1), 0, 1, 2, 3, 4, 99])
        version = self.rng.choice([0, 0, 1, -1])
        return p.REQUEST_HEADER.pack(8 + len(body), api, version, self.correlation()) + body

    def garbage_produce(self) -> bytes:
        junk = self.rng.randbytes(self.rng.randint(0, 2000))
        return req.encode_produce(self.correlation(), _random_topic(self.rng), self.rng.randint(-1, 2), 1, junk)

    def corrupt_produce(self) -> bytes:
        damaged = bytearray(self.rng.choice(self.good))
        at = self.rng.randrange(4, len(damaged))
        damaged[at] ^= 1 << self.rng.randrange(8)
        acks = self.rng.choice([0, 1, 1, 1])
        return req.encode_produce(self.correlation(), TOPIC, 0, acks, bytes(damaged))

    def mismatched_lengths(self) -> bytes:
        frame = bytearray(req.encode_produce(self.correlation(), TOPIC, 0, 1, self.rng.choice(self.good)))
        at = p.REQUEST_HEADER.size + 2 + len(TOPIC) + 4 + 1
        frame[at : at + 4] = self.rng.randint(0, 2**31 - 1).to_bytes(4, "big")
        return bytes(frame)

    def fetch(self) -> bytes:
        offset = self.rng.choice([self.rng.randint(-(2**40), 2**40), self.rng.randint(-10, self.hw + 10), 0])
        return req.encode_fetch(
            self.correlation(),
            _random_topic(self.rng),
            self.rng.randint(-1, 2),
            offset,
            self.rng.choice([0, 1, 100, 4096, 2**31 - 1]),
            self.rng.randint(0, 20),  # long polls stay short
        )

    def offsets(self) -> bytes:
        return req.encode_offsets(self.correlation(), _random_topic(self.rng), self.rng.randint(-3, 3))

    def mutated_produce(self) -> bytes:
        frame = bytearray(req.encode_produce(self.correlation(), TOPIC, 0, 1, self.rng.choice(self.good)))
        for _ in range(self.rng.randint(1, 4)):
            frame[self.rng.randrange(len(frame))] = self.rng.randrange(256)
        return bytes(frame)

    def truncated(self) -> bytes:
        frame = self.rng.choice([self.fetch, self.garbage_produce, self.offsets])()
        return frame[: self.rng.randrange(len(frame))]


def read_replies(sock: socket.socket) -> tuple[list[tuple[int, int]], bool]:
    """Every reply until the server closes: ``[(correlation id, code)]`` and
    whether it ended with a clean close (False: reset)."""
    replies = []
    data = b""
    try:
        while True:
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            data += chunk
    except ConnectionResetError:
        return _parse(data, replies), False
    return _parse(data, replies), True


def _parse(data: bytes, replies: list) -> list[tuple[int, int]]:
    pos = 0
    while len(data) - pos >= p.REPLY_HEADER.size:
        size, correlation_id, code = p.REPLY_HEADER.unpack_from(data, pos)
        assert p.REPLY_HEADER_BODY <= size <= p.DEFAULT_MAX_FRAME_BYTES
        if len(data) - pos < 4 + size:
            break
        if code:
            error = rep.decode_error(code, data[pos + p.REPLY_HEADER.size : pos + 4 + size])
            assert isinstance(error, RaylogError)
            assert code in EXPECTED_CODES, f"unexpected error reply {code}: {error}"
        replies.append((correlation_id, code))
        pos += 4 + size
    assert pos == len(data), "the server sent a cut reply before closing"
    return replies


def _seed_log(conn, plog) -> tuple[list[bytes], bytes]:
    good = [encode_message_set([f"kept-{i}-{j}".encode() for j in range(i + 1)]) for i in range(6)]
    conn.produce_many(TOPIC, 0, good, acks=1)
    plog.flush()
    before = bytes(conn.fetch(TOPIC, 0, 0, 1 * MiB).data)
    conn.close()  # from here on only fuzzed connections are open
    return good, before


def _check_still_serving(make_conn, server, plog, before: bytes) -> None:
    deadline = time.monotonic() + 10
    while server.stats()["connections"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.stats()["connections"] == 0, "fuzzed connections were left open"
    conn = make_conn(server)
    end = plog.log_end_offset
    assert conn.produce(TOPIC, 0, encode_message_set([b"after the fuzz"])) == end
    plog.flush()
    data = bytearray()
    offset = 0
    while offset < plog.high_watermark:
        result = conn.fetch(TOPIC, 0, offset, 1 * MiB)
        data += result.data
        offset += len(result.data)
    assert bytes(data[: len(before)]) == before  # what was accepted before is intact
    records, consumed = decode_messages(data, 0, partial_tail_ok=False)  # all of it valid
    assert consumed == len(data) and records[-1][3] == b"after the fuzz"


def test_fuzzed_frames_are_refused_or_close_the_connection(server, conn, plog, make_conn):
    good, before = _seed_log(conn, plog)
    rng = random.Random(SEED)
    maker = FrameMaker(rng, plog.high_watermark, good)
    gc.collect()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    tracemalloc.start()
    sent = connections = resets = 0
    deadline = time.monotonic() + TIME_LIMIT_S
    try:
        baseline = tracemalloc.get_traced_memory()[0]
        while sent < FRAMES and time.monotonic() < deadline:
            burst = [maker.make() for _ in range(min(rng.randint(1, 40), FRAMES - sent))]
            sent += len(burst)
            connections += 1
            sock = socket.create_connection(server.address, timeout=READ_TIMEOUT_S)
            try:
                try:
                    sock.sendall(b"".join(burst))
                    sock.shutdown(socket.SHUT_WR)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the server refused an early frame and closed
                replies, clean = read_replies(sock)
            finally:
                sock.close()
            resets += not clean
            # at most one reply per frame, and the server always closed
            assert len(replies) <= len(burst)
        peak = tracemalloc.get_traced_memory()[1] - baseline
    finally:
        tracemalloc.stop()
    rss_growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before
    assert sent > 0 and connections > 0
    assert peak < 32 * MiB, f"fuzzing made the process allocate {peak} bytes at its peak"
    assert rss_growth < 128 * MiB
    stats = server.stats()
    assert FrameTooLargeError.code in stats["errors"] and ProtocolError.code in stats["errors"]
    assert RaylogError.code not in stats["errors"], "the server hit an internal error"
    _check_still_serving(make_conn, server, plog, before)


def test_request_errors_keep_one_connection_in_step(server, conn, plog, make_conn):
    """Thousands of refused-but-well-formed requests on one connection: each
    gets exactly its own reply, in order, and the connection stays open."""
    good, before = _seed_log(conn, plog)
    rng = random.Random(SEED + 1)
    sock = socket.create_connection(server.address, timeout=READ_TIMEOUT_S)
    deadline = time.monotonic() + TIME_LIMIT_S
    answered = 0
    try:
        while answered < 2000 and time.monotonic() < deadline:
            frames, expected = [], []
            for _ in range(50):
                correlation_id = rng.randint(0, 2**31 - 1)
                kind = rng.randrange(4)
                if kind == 0:
                    junk = rng.randbytes(rng.randint(1, 500))
                    frames.append(req.encode_produce(correlation_id, TOPIC, 0, 1, junk))
                elif kind == 1:
                    damaged = bytearray(rng.choice(good))
                    damaged[rng.randrange(4, len(damaged))] ^= 0x10
                    frames.append(req.encode_produce(correlation_id, TOPIC, 0, 1, bytes(damaged)))
                elif kind == 2:
                    offset = rng.choice([plog.high_watermark + rng.randint(1, 10**6), -rng.randint(1, 10**6), 1])
                    frames.append(req.encode_fetch(correlation_id, TOPIC, 0, offset, 4096))
                else:
                    frames.append(req.encode_offsets(correlation_id, "nobody", rng.randint(0, 5)))
                expected.append(correlation_id)
            sock.sendall(b"".join(frames))
            data = b""
            got = []
            while len(got) < len(expected):
                chunk = sock.recv(1 << 16)
                assert chunk, "the server closed a connection that only had request errors"
                data += chunk
                pos = 0
                got = []
                while len(data) - pos >= p.REPLY_HEADER.size:
                    size, correlation_id, code = p.REPLY_HEADER.unpack_from(data, pos)
                    if len(data) - pos < 4 + size:
                        break
                    assert code in EXPECTED_CODES - {ProtocolError.code, FrameTooLargeError.code}
                    got.append(correlation_id)
                    pos += 4 + size
            assert got == expected
            answered += len(got)
    finally:
        sock.close()
    assert answered > 0
    assert plog.log_end_offset == len(before)  # nothing of it was stored
    _check_still_serving(make_conn, server, plog, before)
