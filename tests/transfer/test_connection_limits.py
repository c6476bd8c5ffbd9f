"""Long polls and the other connections have limits of their own, over real
sockets against a real data server: long-polling consumers never lock a
producer out, a long poll whose peer closed frees its slot at once, a FETCH
beyond the long-poll limit is answered after a short pause, and a producer refused by a
full endpoint tries again until its delivery deadline."""

from __future__ import annotations

import socket
import time

from raylog.config import TopicConfig
from raylog.producer.producer import Producer
from raylog.retry import RetryPolicy
from raylog.storage.decoding import decode_messages
from raylog.storage.message import encode_message_set
from raylog.transfer import protocol as p
from raylog.transfer import requests as req
from raylog.transfer.handlers import NO_SLOT_PAUSE_S

TOPIC = "clicks"
#: a long poll asks for this much wait (the server's cap is 30 s)
LONG_WAIT_MS = 30_000
#: how long a test waits for the server to reach a state (never a timing
#: assertion: well below the 30 s a long poll would otherwise hold on)
SETTLE_S = 10.0


def _until(predicate, timeout_s: float = SETTLE_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def _long_poll(server, correlation_id: int = 1, offset: int = 0) -> socket.socket:
    """A raw connection parked in a FETCH that waits for data (the servers
    here take no token)."""
    sock = socket.create_connection(server.address)
    sock.sendall(req.encode_fetch(correlation_id, TOPIC, 0, offset, 4096, max_wait_ms=LONG_WAIT_MS))
    return sock


def _read_fetch_reply(sock: socket.socket, timeout_s: float = SETTLE_S) -> bytes:
    """The log bytes of a FETCH reply (empty when it carried none)."""
    sock.settimeout(timeout_s)
    data = b""
    while len(data) < p.SIZE.size or len(data) < p.SIZE.size + p.SIZE.unpack_from(data)[0]:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection instead of answering"
        data += chunk
    return data[p.FETCH_REPLY.size:]


def test_long_polling_consumers_never_lock_producers_out(make_server, make_conn, plog):
    server = make_server({(TOPIC, 0): plog}, max_connections=8)
    polls = [_long_poll(server, i) for i in range(16)]  # twice the connection limit
    try:
        _until(lambda: server.stats().get("long_polls") == 16)
        conn = make_conn(server, timeout_s=10)
        base = conn.produce(TOPIC, 0, encode_message_set([b"from a producer"]), acks=1)  # one try
        assert base == 0
        # (all 16 were parked when it connected; some may be answered already, if a flush made the
        # message visible meanwhile)
        assert server.stats()["connections_refused"] == 0
        plog.flush()
        # every waiting consumer gets the message
        for sock in polls:
            records, _ = decode_messages(_read_fetch_reply(sock), 0)
            assert [r[3] for r in records] == [b"from a producer"]
    finally:
        for sock in polls:
            sock.close()


def test_a_closed_long_poll_ends_its_connection_at_once(make_server, plog):
    server = make_server({(TOPIC, 0): plog})
    polls = [_long_poll(server, i) for i in range(4)]
    try:
        assert _until(lambda: server.stats()["connections"] == 4)
        polls.pop(0).close()
        # its connection ends long before the 30 s wait it asked for
        assert _until(lambda: server.stats()["connections"] == 3)
    finally:
        for sock in polls:
            sock.close()


def test_a_closed_long_poll_gives_its_slot_to_the_next_one(make_server, plog):
    server = make_server({(TOPIC, 0): plog}, max_long_polls=4)
    polls = [_long_poll(server, i) for i in range(4)]
    try:
        assert _until(lambda: server.stats()["long_polls"] == 4)
        # one closed, and a new FETCH right after it takes its slot
        polls.pop(0).close()
        polls.append(_long_poll(server, 10))
        assert _until(lambda: server.stats()["long_polls"] == 4 and server.stats()["connections"] == 4)
        assert server.stats()["long_polls_refused"] == 0
    finally:
        for sock in polls:
            sock.close()


def test_beyond_the_long_poll_limit_a_fetch_is_answered_after_a_short_pause(make_server, make_conn, plog):
    """Without a slot a FETCH is answered well before its 30 s, but not at
    once: after NO_SLOT_PAUSE_S, so a consumer without a slot does not spin."""
    server = make_server({(TOPIC, 0): plog}, max_long_polls=2)
    polls = [_long_poll(server, i) for i in range(2)]
    try:
        assert _until(lambda: server.stats().get("long_polls") == 2)
        for i in range(3):
            started = time.monotonic()
            extra = _long_poll(server, 3 + i)
            try:
                assert _read_fetch_reply(extra) == b""
            finally:
                extra.close()
            assert time.monotonic() - started >= NO_SLOT_PAUSE_S
        assert server.stats()["long_polls_refused"] == 3
        # the parked ones are still served when data comes
        make_conn(server).produce(TOPIC, 0, encode_message_set([b"late"]), acks=1)
        plog.flush()
        for sock in polls:
            records, _ = decode_messages(_read_fetch_reply(sock), 0)
            assert [r[3] for r in records] == [b"late"]
    finally:
        for sock in polls:
            sock.close()


class _Metadata:
    """One partition served by ``server`` (what the producer reads of the
    cluster's metadata)."""

    class settings:
        token = None

    def __init__(self, server):
        self.server = server

    def partitions(self, topic):
        return 1

    def config(self, topic):
        return TopicConfig(partitions=1)

    def endpoint(self, topic, partition, **kw):
        return self.server.address

    def forget(self, topic, partition):
        pass


def test_a_producer_refused_by_a_full_endpoint_tries_again_until_its_delivery_deadline(make_server, plog):
    """The only connection slot is held by a fetch whose reader stops
    reading (busy, so never shed); the producer is refused with
    TooManyConnectionsError again and again. Its policy's 8 tries take
    about 5 s; the slot frees after 10 s, within the 60 s delivery
    deadline, and the message is delivered once."""
    plog.append(encode_message_set([b"x" * 900_000]))
    plog.flush()
    server = make_server({(TOPIC, 0): plog}, max_connections=1, socket_buffer_bytes=64 * 1024)
    blocker = socket.socket()
    blocker.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    blocker.connect(server.address)
    producer = None
    try:
        blocker.sendall(req.encode_fetch(1, TOPIC, 0, 0, 1 << 20))  # and never read the reply
        assert _until(lambda: server.stats()["bytes_out"] > 0 or server.stats()["requests"] > 0)
        policy = RetryPolicy(max_tries=8, delay_s=0.05, max_delay_s=1.0, deadline_s=60.0)
        producer = Producer(_Metadata(server), acks=1, retry=policy, request_timeout_s=10)
        future = producer.send(TOPIC, b"waited for a slot")
        assert _until(lambda: server.stats()["connections_refused"] >= 3, 30)
        time.sleep(10)  # longer than the policy's 8 tries
        assert not future.done(), future.exception(0)
        blocker.close()
        partition, offset = future.result(timeout_s=60)
        assert partition == 0
        plog.flush()
        records, _ = decode_messages(plog.read(offset, 1 << 20).tobytes(), offset)
        assert [r[3] for r in records] == [b"waited for a slot"]
    finally:
        blocker.close()
        if producer is not None:
            producer.close(timeout_s=10)
