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

# -- data channel -----------------------------------------------------------------

import socket  # noqa: E402 - each section imports what it uses
import time  # noqa: E402


def _closed_by_peer_within(sock: socket.socket, timeout_s: float, poke=None, every_s: float = 2.0) -> float | None:
    """Seconds until the far end closes ``sock`` (reading and dropping what it
    sends), calling ``poke()`` every ``every_s`` meanwhile; None if it is
    still open after ``timeout_s``."""
    start = time.monotonic()
    next_poke = start
    while time.monotonic() - start < timeout_s:
        if poke is not None and time.monotonic() >= next_poke:
            try:
                poke()
            except OSError:
                return time.monotonic() - start
            next_poke += every_s
        sock.settimeout(0.2)
        try:
            if not sock.recv(65536):
                return time.monotonic() - start
        except socket.timeout:
            continue
        except OSError:
            return time.monotonic() - start
    return None


def test_data_channel_hello_every_few_seconds_does_not_outlive_the_auth_deadline(raylog_client, make_topic):
    from raylog.transfer.handshake import new_nonce
    from raylog.transfer.requests import encode_auth_hello
    from raylog.transfer.server import DEFAULT_AUTH_TIMEOUT_S

    topic = make_topic()
    host, port = raylog_client.metadata.endpoint(topic, 0, wait_s=30)
    sock = socket.create_connection((host, port), timeout=10)
    correlation = iter(range(1, 1000))
    try:
        took = _closed_by_peer_within(
            sock, DEFAULT_AUTH_TIMEOUT_S + 8,
            poke=lambda: sock.sendall(encode_auth_hello(next(correlation), new_nonce())), every_s=2.0)
    finally:
        sock.close()
    assert took is not None, "a HELLO every 2 s kept a stranger connected past the authentication deadline"
    # a client with the token is served as before
    with raylog_client.producer() as producer:
        producer.send(topic, b"after the stranger").result(timeout_s=30)
    with raylog_client.consumer(topic, auto_offset_reset="earliest") as consumer:
        got, deadline = [], time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            got += consumer.poll(timeout_ms=1000)
    assert [m.value for m in got] == [b"after the stranger"]


# -- Kafka listener ---------------------------------------------------------------


# -- ZooKeeper --------------------------------------------------------------------


# -- at rest and edges ------------------------------------------------------------
