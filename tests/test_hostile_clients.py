"""Strangers at every door: one module, every listener and every server.

Each test is one row of the attack list below, tried as an attacker would
try it, against real sockets, a real ZooKeeper and a real Ray cluster (the
module's ``raylog_client``, an embedded cluster with a data directory of its
own). A door added later gets its rows here, so that every door is held to
the same locks.

The attack list (door: what a stranger tries → what it gets):

* data channel: no AUTH, plaintext AUTH, a 4 GiB frame before AUTH, replayed
  proofs, 300 idle strangers, a HELLO every few seconds to stay past the
  authentication deadline → refused, shed or closed; nothing allocated of a
  claimed size.
* Kafka listener: idle connections that never authenticate, large frames
  before SASL, a compressed Produce that inflates past the partition's bound
  → deadline from accept, small frames before SASL, strangers shed first at
  the limit, a per-address bound, decompression bounded as it runs.
* ZooKeeper: writes without the token anywhere (the root included), large
  znodes, many connections, four-letter words, a squatted cluster path, a
  killed server → refused or bounded; a squatted path reported as such; the
  client that launched it restarts it or says so once.
* At rest: data directories and files, the token and the Ray token file →
  readable by their owner only.
"""

from __future__ import annotations

import socket
import struct
import time

import pytest

from raylog.errors import AuthenticationError, BrokerUnavailableError, ProtocolError, RaylogError
from raylog.retry import RetryPolicy
from raylog.storage.decoding import decode_messages
from raylog.storage.message import encode_message_set
from raylog.transfer import handshake
from raylog.transfer import protocol as p
from raylog.transfer import requests as req
from raylog.transfer.connection import BrokerConnection
from raylog.transfer.handshake import authenticate_socket

# -- data channel -----------------------------------------------------------------


@pytest.fixture(scope="module")
def data_port(raylog_client):
    """A topic of one partition with one message, and its partition's data endpoint."""
    topic = "hostile-data"
    raylog_client.create_topic(topic, partitions=1)
    producer = raylog_client.producer(acks="all")
    producer.send(topic, b"accepted before")
    producer.flush()
    producer.close()
    host, port = raylog_client.metadata.endpoint(topic, 0, refresh=True)
    return topic, (host, port)


def _reply(sock: socket.socket) -> tuple[int, int]:
    """(correlation id, error code) of the next reply frame."""
    head = sock.recv(p.REPLY_HEADER.size, socket.MSG_WAITALL)
    assert len(head) == p.REPLY_HEADER.size, f"no reply header, got {head!r}"
    _, correlation_id, code = p.REPLY_HEADER.unpack(head)
    return correlation_id, code


def _closed(sock: socket.socket, timeout_s: float = 15.0) -> bool:
    """Whether the server closes ``sock`` within ``timeout_s`` (what it sends before is read and dropped)."""
    sock.settimeout(timeout_s)
    try:
        while sock.recv(4096):
            pass
        return True
    except OSError:
        return False


def _intact(raylog_client, topic) -> list[bytes]:
    consumer = raylog_client.consumer(topic, auto_offset_reset="earliest")
    try:
        got, deadline = [], time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            got = consumer.poll(timeout_ms=500)
        return [m.value for m in got]
    finally:
        consumer.close()


def test_data_channel_a_request_without_auth_is_refused_and_closed(raylog_client, data_port):
    topic, address = data_port
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(req.encode_offsets(7, topic, 0))
        assert _reply(sock)[1] == AuthenticationError.code
        assert _closed(sock)
    assert _intact(raylog_client, topic) == [b"accepted before"]


def test_data_channel_the_plain_token_of_auth_version_0_is_refused(raylog_client, data_port):
    topic, address = data_port
    token = raylog_client.settings.token
    body = struct.pack(">H", len(token)) + token
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(p.REQUEST_HEADER.pack(p.REQUEST_HEADER_BODY + len(body), p.API_AUTH, 0, 1) + body)
        # the version is not served at all: refused as a malformed AUTH, before the token is looked at
        assert _reply(sock)[1] in (AuthenticationError.code, ProtocolError.code)
        assert _closed(sock)


def test_data_channel_a_4_gib_frame_before_auth_allocates_nothing(raylog_client, data_port):
    import psutil
    import ray

    topic, address = data_port
    actor = raylog_client.partition_actor(topic, 0)
    process = psutil.Process(ray.get(actor.pid.remote()))
    before = process.memory_info().rss
    socks = []
    try:
        for i in range(20):
            sock = socket.create_connection(address, timeout=10)
            sock.sendall(struct.pack(">I", 0xFFFFFFFF) + struct.pack(">hhi", p.API_PRODUCE, 1, i) + b"\0" * 1024)
            socks.append(sock)
        for sock in socks:
            assert _reply(sock)[1] == AuthenticationError.code
            assert _closed(sock)
    finally:
        for sock in socks:
            sock.close()
    assert process.memory_info().rss - before < 32 * 2**20
    assert _intact(raylog_client, topic) == [b"accepted before"]


def test_data_channel_a_replayed_proof_is_refused(raylog_client, data_port):
    topic, address = data_port
    token = raylog_client.settings.token
    nonce = handshake.new_nonce()
    with socket.create_connection(address, timeout=10) as first:
        first.sendall(req.encode_auth_hello(1, nonce))
        _, _, _, server_nonce, _ = p.AUTH_HELLO_REPLY.unpack(first.recv(p.AUTH_HELLO_REPLY.size, socket.MSG_WAITALL))
    recorded = handshake.client_proof(token, nonce, server_nonce)  # as a listener on the wire would have it
    with socket.create_connection(address, timeout=10) as second:
        second.sendall(req.encode_auth_hello(1, nonce))
        second.recv(p.AUTH_HELLO_REPLY.size, socket.MSG_WAITALL)
        second.sendall(req.encode_auth_proof(2, recorded))
        assert _reply(second)[1] == AuthenticationError.code
        assert _closed(second)


def _authenticated_or_refused(sock, token, correlation_id):
    """Authenticate a raw connection; one refused at the connection limit
    (TooManyConnectionsError, or closed) stays open on our side as a stranger would."""
    try:
        authenticate_socket(sock, token, correlation_id)
    except (RaylogError, OSError):
        pass


def test_data_channel_300_idle_connections_do_not_lock_a_new_client_out(raylog_client, make_topic):
    import ray

    topic = make_topic(partitions=1)
    actor = raylog_client.partition_actor(topic, 0)
    host, port = raylog_client.metadata.endpoint(topic, 0, refresh=True)
    token = raylog_client.settings.token
    idle = []
    try:
        for i in range(300):
            sock = socket.create_connection((host, port), timeout=10)
            if i % 2:  # half of them authenticated clients that went quiet, half strangers
                _authenticated_or_refused(sock, token, 2 * i)
            idle.append(sock)
        holder = {}

        def produce_and_fetch():
            conn = holder.get("conn") or holder.setdefault("conn", BrokerConnection(host, port, token=token, timeout_s=10))
            try:
                base = conn.produce(topic, 0, encode_message_set([b"still served"]), acks=1)
                ray.get(actor.flush.remote())
                return base, conn.fetch(topic, 0, base, 4096)
            except BrokerUnavailableError:
                holder.pop("conn").close()  # refused or shed: a fresh connection next try
                raise

        base, result = RetryPolicy(max_tries=100, delay_s=0.1, max_delay_s=0.5, deadline_s=60).call(produce_and_fetch)
        holder["conn"].close()
        assert [r[3] for r in decode_messages(result.data, base)[0]] == [b"still served"]
        server = ray.get(actor.stats.remote())["server"]
        assert server["connections"] <= 256
        assert server["connections_shed"] + server["connections_refused"] >= 300 - 256
    finally:
        for sock in idle:
            sock.close()


# -- Kafka listener ---------------------------------------------------------------


# -- ZooKeeper --------------------------------------------------------------------


# -- at rest and edges ------------------------------------------------------------
