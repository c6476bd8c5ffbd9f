"""SCRAM-SHA-256 of the Kafka listener (pure)."""

from __future__ import annotations

import pytest
from scramp import ScramClient

from raylog.kafka.sasl import SaslFailed, ScramVerifier

TOKEN = b"ab" * 32


def _run(verifier, user, password):
    client = ScramClient(["SCRAM-SHA-256"], user, password)
    exchange = verifier.exchange()
    first = client.get_client_first().encode()
    client.set_server_first(exchange.step(first).decode())
    final = client.get_client_final().encode()
    client.set_server_final(exchange.step(final).decode())  # the server proved the token too
    assert TOKEN.decode() not in (first + final).decode()  # the token never crosses the wire
    return exchange


def test_the_cluster_and_its_token_authenticate():
    assert _run(ScramVerifier("c1", TOKEN), "c1", TOKEN.decode()).done


@pytest.mark.parametrize("user, password", [("c1", "cd" * 32), ("other", TOKEN.decode())])
def test_a_wrong_token_or_user_fails(user, password):
    with pytest.raises(SaslFailed, match="SCRAM-SHA-256 authentication failed"):
        _run(ScramVerifier("c1", TOKEN), user, password)


def test_garbage_fails_and_a_finished_exchange_takes_nothing_more():
    with pytest.raises(SaslFailed):
        ScramVerifier("c1", TOKEN).exchange().step(b"\xff\xfe")
    exchange = _run(ScramVerifier("c1", TOKEN), "c1", TOKEN.decode())
    with pytest.raises(SaslFailed):
        exchange.step(b"n,,n=c1,r=abc")
