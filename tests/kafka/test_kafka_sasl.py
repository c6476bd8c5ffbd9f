"""SCRAM-SHA-512 and -256, and PLAIN, of the Kafka listener (pure)."""

from __future__ import annotations

import pytest
from scramp import ScramClient

from raylog.kafka.sasl import MECHANISMS, SaslFailed, ScramVerifier

TOKEN = b"ab" * 32


def _run(verifier, user, password, mechanism="SCRAM-SHA-256"):
    client = ScramClient([mechanism], user, password)
    exchange = verifier.exchange(mechanism)
    first = client.get_client_first().encode()
    client.set_server_first(exchange.step(first).decode())
    final = client.get_client_final().encode()
    client.set_server_final(exchange.step(final).decode())  # the server proved the token too
    assert TOKEN.decode() not in (first + final).decode()  # the token never crosses the wire
    return exchange


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_the_cluster_and_its_token_authenticate(mechanism):
    assert _run(ScramVerifier("c1", TOKEN), "c1", TOKEN.decode(), mechanism).done


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("user, password", [("c1", "cd" * 32), ("other", TOKEN.decode())])
def test_a_wrong_token_or_user_fails(user, password, mechanism):
    with pytest.raises(SaslFailed, match=f"{mechanism} authentication failed"):
        _run(ScramVerifier("c1", TOKEN), user, password, mechanism)


def test_both_mechanisms_are_offered_and_one_mechanism_does_not_prove_the_other():
    assert MECHANISMS == ("SCRAM-SHA-512", "SCRAM-SHA-256")
    client = ScramClient(["SCRAM-SHA-256"], "c1", TOKEN.decode())
    exchange = ScramVerifier("c1", TOKEN).exchange("SCRAM-SHA-512")  # the client speaks the other one
    client.set_server_first(exchange.step(client.get_client_first().encode()).decode())
    with pytest.raises(SaslFailed, match="SCRAM-SHA-512 authentication failed"):
        exchange.step(client.get_client_final().encode())
    with pytest.raises(SaslFailed, match="not served"):
        ScramVerifier("c1", TOKEN).exchange("SCRAM-SHA-1")


def test_plain_takes_the_cluster_and_its_token_and_nothing_else():
    verifier = ScramVerifier("c1", TOKEN)
    for message in (b"\0c1\0" + TOKEN, b"c1\0c1\0" + TOKEN):
        exchange = verifier.plain_exchange()
        assert exchange.step(message) == b"" and exchange.done
    for message in (b"\0c1\0" + b"cd" * 32, b"\0other\0" + TOKEN, b"x\0c1\0" + TOKEN, b"c1" + TOKEN,
                    b"\0c1\0" + TOKEN + b"\0", b"\xff\0c1\0" + TOKEN):
        exchange = verifier.plain_exchange()
        with pytest.raises(SaslFailed, match="PLAIN authentication failed"):
            exchange.step(message)
        assert not exchange.done


def test_garbage_fails_and_a_finished_exchange_takes_nothing_more():
    with pytest.raises(SaslFailed):
        ScramVerifier("c1", TOKEN).exchange().step(b"\xff\xfe")
    exchange = _run(ScramVerifier("c1", TOKEN), "c1", TOKEN.decode())
    with pytest.raises(SaslFailed):
        exchange.step(b"n,,n=c1,r=abc")


def _run_with_final_nonce(verifier, user, password, nonce_of):
    """An exchange whose client-final carries ``nonce_of(client nonce, server nonce)``."""
    client = ScramClient(["SCRAM-SHA-256"], user, password)
    exchange = verifier.exchange()
    client.set_server_first(exchange.step(client.get_client_first().encode()).decode())
    client.nonce = type(client.nonce)(nonce_of(str(client.c_nonce), str(client.nonce)))
    client.set_server_final(exchange.step(client.get_client_final().encode()).decode())
    return exchange


def test_the_final_nonce_of_librdkafka_before_2_1_is_taken_as_a_kafka_broker_takes_it():
    """librdkafka 2.0 (Debian's kcat) sends its own nonce again before the
    server's whole one: taken, and the proof still checked over it."""
    assert _run_with_final_nonce(ScramVerifier("c1", TOKEN), "c1", TOKEN.decode(), lambda c, s: c + s).done
    with pytest.raises(SaslFailed):  # the same form with a wrong token
        _run_with_final_nonce(ScramVerifier("c1", TOKEN), "c1", "cd" * 32, lambda c, s: c + s)


@pytest.mark.parametrize("nonce_of", [lambda c, s: c, lambda c, s: s[:-1], lambda c, s: "x" + s,
                                      lambda c, s: c + c + s])
def test_any_other_final_nonce_fails(nonce_of):
    with pytest.raises(SaslFailed):
        _run_with_final_nonce(ScramVerifier("c1", TOKEN), "c1", TOKEN.decode(), nonce_of)
