"""SASL/SCRAM-SHA-256 for the Kafka listener (RFC 5802/7677, through
``scramp``): the user is the cluster's name, the secret its token.

The token never crosses the wire: the client proves it holds the token by a
salted HMAC over both sides' nonces, and the server's final message proves
the server holds it too. The listener keeps only the SCRAM verifier
(salt, stored key, server key), made once per listener process.

Thread-safety: :class:`ScramVerifier` is immutable after construction and
shared by every connection; :class:`ScramExchange` belongs to one connection.
"""

from __future__ import annotations

from scramp import ScramException, ScramMechanism

MECHANISM = "SCRAM-SHA-256"
ITERATIONS = 4096


class SaslFailed(Exception):
    """The client's SCRAM messages do not prove the token (or are malformed)."""


class ScramVerifier:
    """The server-side SCRAM credentials of one user (the cluster name)."""

    def __init__(self, user: str, token: bytes):
        self.user = user
        self._mechanism = ScramMechanism(MECHANISM)
        self._auth_info = self._mechanism.make_auth_info(token.decode("ascii"), iteration_count=ITERATIONS)

    def exchange(self) -> "ScramExchange":
        return ScramExchange(self)

    def _lookup(self, username: str):
        if username != self.user:
            raise ScramException(f"unknown user {username!r}; the user is the cluster's name")
        return self._auth_info


class ScramExchange:
    """One SCRAM conversation: :meth:`step` takes each client message and
    returns the server's answer; :attr:`done` once the client is proven."""

    def __init__(self, verifier: ScramVerifier):
        self._server = verifier._mechanism.make_server(verifier._lookup)
        self._round = 0
        self._client_nonce = ""
        self.done = False

    def step(self, message: bytes) -> bytes:
        try:
            text = message.decode("utf-8")
            if self._round == 0:
                self._server.set_client_first(text)
                self._client_nonce = _attribute(text, "r") or ""
                self._round = 1
                return self._server.get_server_first().encode("utf-8")
            if self._round == 1:
                nonce, expected = _attribute(text, "r"), str(self._server.nonce)
                if nonce is not None and nonce != expected and nonce == self._client_nonce + expected:
                    # librdkafka before 2.1 (Debian's kcat, among others) puts its own nonce
                    # again before the server's whole one; a Kafka broker takes a final nonce
                    # that ends with the server's, so this one form is taken too (the proof
                    # is still checked over the message as sent, the server's fresh nonce in it)
                    self._server.nonce = type(self._server.nonce)(nonce)
                self._server.set_client_final(text)
                self._round = 2
                self.done = True
                return self._server.get_server_final().encode("utf-8")
        except (ScramException, UnicodeDecodeError, ValueError, KeyError, IndexError) as err:
            raise SaslFailed(f"SCRAM-SHA-256 authentication failed: {err}") from None
        raise SaslFailed("SCRAM-SHA-256 authentication is already complete")


def _attribute(message: str, name: str) -> str | None:
    """The value of SCRAM attribute ``name`` in ``message`` (``a=b,c=d``), or None."""
    for part in message.split(","):
        if part.startswith(name + "="):
            return part[len(name) + 1:]
    return None
