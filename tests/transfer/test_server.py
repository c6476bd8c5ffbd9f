"""DataServer and BrokerConnection over real sockets on 127.0.0.1 with real
partition logs: failures first, then round trips, long polls and counters."""

from __future__ import annotations

import os
import socket
import threading
import time
import tracemalloc

import pytest

from raylog.config import MiB
from raylog.errors import (
    AuthenticationError,
    BrokerUnavailableError,
    ClosedError,
    CorruptMessageError,
    FrameTooLargeError,
    InvalidOffsetError,
    MessageTooLargeError,
    NotOwnerError,
    OffsetOutOfRangeError,
    ProtocolError,
    RequestTimeoutError,
    TooManyConnectionsError,
)
from raylog.storage.decoding import decode_messages
from raylog.storage.message import encode_message_set
from raylog.transfer import protocol as p
from raylog.transfer import replies as rep
from raylog.transfer import requests as req
from raylog.transfer.connection import BrokerConnection

TOPIC = "clicks"  # the topic the fixtures serve (conftest.TOPIC)


def corrupt(message_set: bytes) -> bytes:
    """Flip one bit of the first message's CRC."""
    damaged = bytearray(message_set)
    damaged[5] ^= 0x01
    return bytes(damaged)


def raw_socket(server) -> socket.socket:
    sock = socket.create_connection(server.address, timeout=10)
    return sock


def read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError(f"connection closed after {len(data)} of {n} bytes")
        data += chunk
    return data


def read_reply(sock: socket.socket) -> tuple[int, int, bytes]:
    """``(correlation id, error code, body)`` of the next reply frame."""
    (size,) = p.SIZE.unpack(read_exactly(sock, 4))
    rest = read_exactly(sock, size)
    correlation_id, code = p.REPLY_HEADER.unpack(p.SIZE.pack(size) + rest[:6])[1:]
    return correlation_id, code, rest[6:]


def assert_closed(sock: socket.socket) -> None:
    try:
        assert sock.recv(1) == b""
    except ConnectionResetError:
        pass


def produced(conn: BrokerConnection, plog, sets: list[bytes]) -> list[int]:
    bases = [conn.produce(TOPIC, 0, s) for s in sets]
    plog.flush()
    return bases


# -- offsets out of range, not on a boundary ---------------------------------------


def test_fetch_past_the_high_watermark_raises_out_of_range_with_earliest_and_latest(conn, plog):
    produced(conn, plog, [encode_message_set([b"a", b"b"])])
    hw = plog.high_watermark
    with pytest.raises(OffsetOutOfRangeError) as info:
        conn.fetch(TOPIC, 0, hw + 1000, 4096)
    assert (info.value.offset, info.value.earliest, info.value.latest) == (hw + 1000, 0, hw)
    # the connection stays usable after a request's own error
    assert conn.fetch(TOPIC, 0, 0, 4096).high_watermark == hw


@pytest.mark.file_log_only  # retention: the in-memory log keeps everything
def test_fetch_before_the_log_start_raises_out_of_range(make_log, make_server, make_conn):
    plog = make_log(segment_bytes=4096, max_message_bytes=4096, retention_bytes=0)
    server = make_server({(TOPIC, 0): plog})
    conn = make_conn(server)
    for _ in range(12):
        conn.produce(TOPIC, 0, encode_message_set([b"v" * 1000]))
    plog.flush()
    assert plog.delete_old_segments()
    start = plog.log_start_offset
    assert start > 0
    with pytest.raises(OffsetOutOfRangeError) as info:
        conn.fetch(TOPIC, 0, 0, 4096)
    assert (info.value.earliest, info.value.latest) == (start, plog.high_watermark)
    assert conn.fetch(TOPIC, 0, start, 4096).data


def test_fetch_inside_a_message_raises_invalid_offset(conn, plog):
    produced(conn, plog, [encode_message_set([b"first", b"second"])])
    with pytest.raises(InvalidOffsetError) as info:
        conn.fetch(TOPIC, 0, 3, 4096)
    assert info.value.offset == 3


# -- refused produce -------------------------------------------------------------------


def test_corrupt_set_is_refused_with_acks_1_and_nothing_is_stored(conn, plog):
    good = encode_message_set([b"good"])
    produced(conn, plog, [good])
    end = plog.log_end_offset
    with pytest.raises(CorruptMessageError):
        conn.produce(TOPIC, 0, corrupt(encode_message_set([b"x", b"y"])))
    assert plog.log_end_offset == end
    # same connection, next set is fine
    assert conn.produce(TOPIC, 0, good) == end


def test_corrupt_set_with_acks_0_is_reported_by_the_next_call(conn, plog):
    good = encode_message_set([b"good"])
    conn.produce(TOPIC, 0, good, acks=0)
    conn.produce(TOPIC, 0, corrupt(good), acks=0)
    with pytest.raises(CorruptMessageError, match="earlier acks=0 produce"):
        conn.offsets(TOPIC, 0)
    # the server closed that connection; the next call connects again
    plog.flush()
    assert plog.log_end_offset == len(good)
    assert conn.produce(TOPIC, 0, good) == len(good)


def test_set_larger_than_the_topic_limit_is_refused(make_log, make_server, make_conn):
    plog = make_log(max_message_bytes=4096)
    conn = make_conn(make_server({(TOPIC, 0): plog}))
    with pytest.raises(MessageTooLargeError):
        conn.produce(TOPIC, 0, encode_message_set([b"z" * 5000]))
    assert plog.log_end_offset == 0


def test_client_refuses_a_set_larger_than_a_frame_before_sending(conn, plog):
    with pytest.raises(FrameTooLargeError):
        conn.produce(TOPIC, 0, b"\x00" * (p.DEFAULT_MAX_FRAME_BYTES + 1))
    assert not conn.connected or conn.offsets(TOPIC, 0) == (0, 0)


def test_refused_set_in_a_pipelined_run_leaves_the_others_stored(conn, plog):
    sets = [encode_message_set([b"one"]), corrupt(encode_message_set([b"two"])), encode_message_set([b"three"])]
    with pytest.raises(CorruptMessageError) as info:
        conn.produce_many(TOPIC, 0, sets)
    assert info.value.index == 1
    first, refused, third = info.value.base_offsets
    assert (first, refused, third) == (0, None, len(sets[0]))
    plog.flush()
    records, _ = decode_messages(conn.fetch(TOPIC, 0, 0, 1 * MiB).data, 0)
    assert [r[3] for r in records] == [b"one", b"three"]


# -- frames the server must refuse ---------------------------------------------------


def test_oversized_frame_is_refused_before_allocation_and_only_that_connection_closes(server, conn, plog):
    produced(conn, plog, [encode_message_set([b"before"])])
    tracemalloc.start()
    try:
        baseline = tracemalloc.get_traced_memory()[0]
        sock = raw_socket(server)
        try:
            sock.sendall(p.REQUEST_HEADER.pack(2**31, p.API_PRODUCE, p.VERSION, 77) + b"\x00" * 64)
            correlation_id, code, body = read_reply(sock)
            assert (correlation_id, code) == (77, FrameTooLargeError.code)
            assert "exceeds the maximum" in str(rep.decode_error(code, body))
            assert_closed(sock)
        finally:
            sock.close()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak - baseline < 16 * MiB
    # everybody else is still served
    assert conn.produce(TOPIC, 0, encode_message_set([b"after"])) > 0
    plog.flush()
    records, _ = decode_messages(conn.fetch(TOPIC, 0, 0, 1 * MiB).data, 0)
    assert [r[3] for r in records] == [b"before", b"after"]


def test_unknown_api_key_gets_a_protocol_error_then_close(server, conn, plog):
    sock = raw_socket(server)
    try:
        sock.sendall(p.REQUEST_HEADER.pack(8, 42, p.VERSION, 9))
        correlation_id, code, _ = read_reply(sock)
        assert (correlation_id, code) == (9, ProtocolError.code)
        assert_closed(sock)
    finally:
        sock.close()
    assert conn.offsets(TOPIC, 0) == (0, 0)


def test_frame_cut_short_by_the_peer_gets_a_protocol_error(server):
    frame = req.encode_produce(5, TOPIC, 0, 1, encode_message_set([b"cut"]))
    sock = raw_socket(server)
    try:
        sock.sendall(frame[:-7])
        sock.shutdown(socket.SHUT_WR)
        correlation_id, code, body = read_reply(sock)
        assert code == ProtocolError.code and correlation_id == p.NO_CORRELATION
        assert "closed inside a frame" in str(rep.decode_error(code, body))
        assert_closed(sock)
    finally:
        sock.close()


def test_lengths_that_do_not_add_up_get_a_protocol_error(server):
    frame = bytearray(req.encode_produce(6, TOPIC, 0, 1, encode_message_set([b"x"])))
    frame[-30] ^= 0xFF  # inside the set: harmless, the log checks it
    bad_length = bytearray(frame)
    at = p.REQUEST_HEADER.size + 2 + len(TOPIC) + 4 + 1
    bad_length[at : at + 4] = (10**6).to_bytes(4, "big")
    sock = raw_socket(server)
    try:
        sock.sendall(bytes(bad_length))
        correlation_id, code, _ = read_reply(sock)
        assert (correlation_id, code) == (6, ProtocolError.code)
        assert_closed(sock)
    finally:
        sock.close()


# -- not the owner, authentication -------------------------------------------------


def test_unknown_partition_raises_not_owner(conn):
    with pytest.raises(NotOwnerError) as info:
        conn.produce(TOPIC, 1, encode_message_set([b"x"]))
    assert info.value.retriable and info.value.partition == 1
    with pytest.raises(NotOwnerError):
        conn.fetch("other", 0, 0, 100)
    with pytest.raises(NotOwnerError):
        conn.offsets(TOPIC, 7)
    assert conn.offsets(TOPIC, 0) == (0, 0)


def test_missing_token_raises_authentication_error(make_server, make_conn, plog):
    server = make_server({(TOPIC, 0): plog}, token=b"s3cret")
    conn = make_conn(server)
    with pytest.raises(AuthenticationError):
        conn.produce(TOPIC, 0, encode_message_set([b"x"]))
    assert plog.log_end_offset == 0


def test_wrong_token_raises_authentication_error(make_server, make_conn, plog):
    server = make_server({(TOPIC, 0): plog}, token=b"s3cret")
    conn = make_conn(server, token=b"guess")
    with pytest.raises(AuthenticationError):
        conn.fetch(TOPIC, 0, 0, 100)
    assert not conn.connected


def test_missing_token_with_acks_0_is_reported_by_the_next_call(make_server, make_conn, plog):
    server = make_server({(TOPIC, 0): plog}, token=b"s3cret")
    conn = make_conn(server)
    conn.produce(TOPIC, 0, encode_message_set([b"x"]), acks=0)
    with pytest.raises((AuthenticationError, BrokerUnavailableError)):
        conn.offsets(TOPIC, 0)
    assert plog.log_end_offset == 0


def test_right_token_is_accepted(make_server, make_conn, plog):
    server = make_server({(TOPIC, 0): plog}, token=b"s3cret")
    conn = make_conn(server, token=b"s3cret")
    assert conn.produce(TOPIC, 0, encode_message_set([b"x"])) == 0


# -- connection failures on the client ---------------------------------------------


def test_connection_refused_raises_broker_unavailable():
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    conn = BrokerConnection("127.0.0.1", port, timeout_s=5)
    with pytest.raises(BrokerUnavailableError) as info:
        conn.offsets(TOPIC, 0)
    assert info.value.retriable
    conn.close()


def test_no_reply_raises_request_timeout():
    silent = socket.create_server(("127.0.0.1", 0))  # accepts (backlog), never answers
    try:
        conn = BrokerConnection("127.0.0.1", silent.getsockname()[1], timeout_s=0.3)
        with pytest.raises(RequestTimeoutError) as info:
            conn.offsets(TOPIC, 0)
        assert info.value.retriable and not conn.connected
        conn.close()
    finally:
        silent.close()


def test_stopped_server_gives_broker_unavailable(server, conn):
    assert conn.offsets(TOPIC, 0) == (0, 0)
    server.stop()
    with pytest.raises(BrokerUnavailableError):
        conn.offsets(TOPIC, 0)
    assert server.stats()["connections"] == 0


def test_connections_over_the_limit_are_refused(make_server, make_conn, plog):
    # the first connection waits for less than shed_idle_after_s: not shed
    server = make_server({(TOPIC, 0): plog}, max_connections=1, shed_idle_after_s=600)
    first = make_conn(server)
    assert first.offsets(TOPIC, 0) == (0, 0)
    second = make_conn(server)
    with pytest.raises(TooManyConnectionsError, match="connections already") as info:
        second.offsets(TOPIC, 0)
    assert info.value.retriable and isinstance(info.value, BrokerUnavailableError)
    assert server.stats()["connections_refused"] == 1
    assert first.offsets(TOPIC, 0) == (0, 0)


def test_long_poll_longer_than_the_request_timeout_does_not_time_out(make_conn, server):
    conn = make_conn(server, timeout_s=0.5)
    result = conn.fetch(TOPIC, 0, 0, 4096, max_wait_ms=1000)
    assert len(result.data) == 0
    assert conn.offsets(TOPIC, 0) == (0, 0)  # and the short timeout is back in force


def test_correlation_ids_wrap_around(conn, plog):
    conn._correlation = 2**31 - 3
    one = encode_message_set([b"w"])
    assert conn.produce_many(TOPIC, 0, [one] * 5) == [i * len(one) for i in range(5)]
    assert conn.produce(TOPIC, 0, one) == 5 * len(one)


def test_closed_connection_raises_closed_error(server):
    with BrokerConnection(*server.address) as conn:
        conn.offsets(TOPIC, 0)
    with pytest.raises(ClosedError):
        conn.offsets(TOPIC, 0)


# -- round trips ---------------------------------------------------------------------


def test_produce_acks_1_and_0_then_fetch_gives_back_exactly_what_was_sent(conn, plog):
    first = encode_message_set([b"v0", b"v1" * 50], keys=[b"k0", None], timestamp_ms=1_700_000_000_000)
    second = encode_message_set([b"v2"], keys=[b"k2"], timestamp_ms=1_700_000_000_001)
    third = encode_message_set([b""], timestamp_ms=1_700_000_000_002)
    assert conn.produce(TOPIC, 0, first, acks=1) == 0
    assert conn.produce(TOPIC, 0, second, acks=0) is None
    assert conn.produce(TOPIC, 0, third, acks=1) == len(first) + len(second)
    plog.flush()

    result = conn.fetch(TOPIC, 0, 0, 1 * MiB)
    assert result.offset == 0 and result.log_start_offset == 0
    assert result.high_watermark == len(first) + len(second) + len(third)
    assert bytes(result.data) == first + second + third
    records, consumed = decode_messages(result.data, result.offset)
    assert consumed == len(result.data)
    assert [(r[1], r[2], r[3]) for r in records] == [
        (1_700_000_000_000, b"k0", b"v0"),
        (1_700_000_000_000, None, b"v1" * 50),
        (1_700_000_000_001, b"k2", b"v2"),
        (1_700_000_000_002, None, b""),
    ]
    # offsets are byte positions: the next message starts at offset + 4 + size
    data = bytes(result.data)
    for (offset, *_), (next_offset, *_) in zip(records, records[1:]):
        size = int.from_bytes(data[offset : offset + 4], "big")
        assert next_offset == offset + 4 + size
    # and each one is a valid place to start a fetch
    for offset, _ts, _key, value in records:
        again, _ = decode_messages(conn.fetch(TOPIC, 0, offset, 1).data, offset)
        assert again[0][0] == offset and again[0][3] == value


def test_produce_many_pipelines_frames_and_returns_each_base_offset(conn, plog):
    sets = [encode_message_set([f"m{i}".encode()] * (i % 3 + 1)) for i in range(200)]
    bases = conn.produce_many(TOPIC, 0, sets, acks=1)
    expected, offset = [], 0
    for s in sets:
        expected.append(offset)
        offset += len(s)
    assert bases == expected
    assert conn.produce_many(TOPIC, 0, sets[:10], acks=0) is None
    assert conn.offsets(TOPIC, 0) == (0, 0)  # nothing flushed yet
    plog.flush()
    data = bytes(conn.fetch(TOPIC, 0, 0, 1 * MiB).data)
    assert data == b"".join(sets) + b"".join(sets[:10])


def test_many_small_frames_are_appended_as_joined_sets(conn, plog, monkeypatch):
    appends = []
    append = plog.append

    def counting_append(message_set):
        appends.append(len(message_set))
        return append(message_set)

    monkeypatch.setattr(plog, "append", counting_append)
    one = encode_message_set([b"x" * 200])
    conn.produce_many(TOPIC, 0, [one] * 1000, acks=0)
    assert conn.produce(TOPIC, 0, one) == 1000 * len(one)
    assert sum(appends) == 1001 * len(one)
    assert len(appends) < 1001
    plog.flush()
    records, _ = decode_messages(conn.fetch(TOPIC, 0, 0, 1 * MiB).data, 0)
    assert len(records) == 1001 and records[-1][0] == 1000 * len(one)


def test_fetch_is_bounded_by_max_bytes_but_gives_at_least_one_message(conn, plog):
    produced(conn, plog, [encode_message_set([b"%03d" % i + b"." * 97 for i in range(10)])])
    size = 4 + 18 + 100
    one = conn.fetch(TOPIC, 0, 0, 1)
    assert len(one.data) == size
    part = conn.fetch(TOPIC, 0, 0, 300)
    assert len(part.data) == 300
    records, consumed = decode_messages(part.data, 0)
    assert len(records) == 2 and consumed == 2 * size
    rest = conn.fetch(TOPIC, 0, consumed, 1 * MiB)
    records, _ = decode_messages(rest.data, rest.offset)
    assert [r[3][:3] for r in records] == [b"%03d" % i for i in range(2, 10)]


def test_fetch_at_the_high_watermark_is_empty(conn, plog):
    produced(conn, plog, [encode_message_set([b"x"])])
    result = conn.fetch(TOPIC, 0, plog.high_watermark, 4096)
    assert len(result.data) == 0 and result.high_watermark == plog.high_watermark
    conn.produce(TOPIC, 0, encode_message_set([b"unflushed"]))
    assert len(conn.fetch(TOPIC, 0, plog.high_watermark, 4096).data) == 0


@pytest.mark.file_log_only
def test_fetch_data_is_sent_with_sendfile(conn, plog, monkeypatch):
    calls = []
    sendfile = os.sendfile

    def counting_sendfile(out_fd, in_fd, offset, count):
        calls.append(count)
        return sendfile(out_fd, in_fd, offset, count)

    monkeypatch.setattr(os, "sendfile", counting_sendfile)
    produced(conn, plog, [encode_message_set([b"y" * 1000] * 100)])
    result = conn.fetch(TOPIC, 0, 0, 1 * MiB)
    assert len(result.data) == plog.high_watermark
    assert calls and calls[0] == plog.high_watermark


def test_large_fetch_arrives_whole(conn, plog):
    sets = [encode_message_set([bytes([i]) * 200] * 500) for i in range(20)]
    for s in sets:
        conn.produce(TOPIC, 0, s)
    plog.flush()
    offset, got = 0, []
    while offset < plog.high_watermark:
        result = conn.fetch(TOPIC, 0, offset, 1 * MiB)
        records, consumed = decode_messages(result.data, offset)
        got.extend(r[3] for r in records)
        offset += consumed
    assert got == [bytes([i]) * 200 for i in range(20) for _ in range(500)]


def test_offsets_request_gives_log_start_and_high_watermark(conn, plog):
    assert conn.offsets(TOPIC, 0) == (0, 0)
    produced(conn, plog, [encode_message_set([b"x"])])
    assert conn.offsets(TOPIC, 0) == (0, plog.high_watermark)


def test_connections_in_parallel_threads_each_get_their_own_replies(server, make_conn, plog):
    errors = []

    def work(n):
        try:
            conn = make_conn(server)
            for i in range(50):
                base = conn.produce(TOPIC, 0, encode_message_set([f"{n}-{i}".encode()]))
                assert base >= 0
                conn.offsets(TOPIC, 0)
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    plog.flush()
    records, _ = decode_messages(make_conn(server).fetch(TOPIC, 0, 0, 1 * MiB).data, 0)
    assert sorted(r[3] for r in records) == sorted(f"{n}-{i}".encode() for n in range(4) for i in range(50))


# -- long poll -----------------------------------------------------------------------


def test_long_poll_returns_once_data_is_flushed(server, conn, make_conn, plog):
    producer = make_conn(server)

    def produce_later():
        time.sleep(0.3)
        producer.produce(TOPIC, 0, encode_message_set([b"late"]))
        plog.flush()

    thread = threading.Thread(target=produce_later)
    started = time.monotonic()
    thread.start()
    try:
        result = conn.fetch(TOPIC, 0, 0, 4096, max_wait_ms=10_000)
    finally:
        thread.join(30)
    assert time.monotonic() - started < 10.0
    records, _ = decode_messages(result.data, 0)
    assert [r[3] for r in records] == [b"late"]


def test_long_poll_without_data_returns_empty_after_its_wait(conn):
    started = time.monotonic()
    result = conn.fetch(TOPIC, 0, 0, 4096, max_wait_ms=200)
    assert len(result.data) == 0 and result.high_watermark == 0
    assert time.monotonic() - started >= 0.2


def test_idle_long_poll_costs_almost_no_cpu(conn):
    conn.offsets(TOPIC, 0)  # connected and served before measuring
    wall, cpu = time.monotonic(), time.process_time()
    result = conn.fetch(TOPIC, 0, 0, 4096, max_wait_ms=2000)
    cpu_used = time.process_time() - cpu
    assert len(result.data) == 0 and time.monotonic() - wall >= 2.0
    assert cpu_used < 0.3


def test_closing_the_log_ends_a_long_poll_with_not_owner_without_spinning(conn, plog):
    outcome = []

    def close_later():
        time.sleep(0.3)
        plog.close()

    closer = threading.Thread(target=close_later)
    cpu = time.process_time()
    closer.start()
    try:
        conn.fetch(TOPIC, 0, 0, 4096, max_wait_ms=3000)
    except NotOwnerError as err:
        outcome.append(err)
    finally:
        closer.join(30)
    assert outcome and "closing" in str(outcome[0])
    assert time.process_time() - cpu < 1.0


def test_produce_to_a_closed_log_raises_not_owner(conn, plog):
    plog.close()
    with pytest.raises(NotOwnerError, match="closing"):
        conn.produce(TOPIC, 0, encode_message_set([b"late"]))


def test_close_from_another_thread_ends_a_blocked_long_poll(conn):
    outcome = []

    def poll():
        try:
            outcome.append(conn.fetch(TOPIC, 0, 0, 4096, max_wait_ms=60_000))
        except ClosedError as err:
            outcome.append(err)

    conn.offsets(TOPIC, 0)
    thread = threading.Thread(target=poll)
    thread.start()
    time.sleep(0.2)
    conn.close()
    thread.join(30)
    assert not thread.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], ClosedError)


def test_stop_ends_a_long_poll(server, conn):
    outcome = []

    def poll():
        try:
            outcome.append(conn.fetch(TOPIC, 0, 0, 4096, max_wait_ms=60_000))
        except BrokerUnavailableError as err:
            outcome.append(err)

    thread = threading.Thread(target=poll)
    thread.start()
    time.sleep(0.2)
    server.stop()
    thread.join(30)
    assert not thread.is_alive() and outcome


# -- counters ------------------------------------------------------------------------


def test_stats_count_connections_requests_bytes_and_errors(server, conn, plog):
    one = encode_message_set([b"x"] * 3)
    conn.produce(TOPIC, 0, one)
    conn.produce_many(TOPIC, 0, [one, one], acks=1)
    with pytest.raises(NotOwnerError):
        conn.produce(TOPIC, 5, one)
    plog.flush()
    conn.fetch(TOPIC, 0, 0, 1 * MiB)
    stats = server.stats()
    assert stats["connections"] == 1 and stats["connections_accepted"] == 1
    assert stats["requests"] == 5
    assert stats["message_sets_in"] == 3
    assert stats["bytes_in"] > 3 * len(one)
    assert stats["bytes_out"] >= 3 * len(one)
    assert stats["errors"] == {NotOwnerError.code: 1}
