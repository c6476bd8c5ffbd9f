"""SASL/SCRAM-SHA-512 and SCRAM-SHA-256 for the Kafka listener (RFC
5802/7677, through ``scramp``): the user is the cluster's name, the secret
its token. The client picks the mechanism in its SaslHandshake; both are
offered (:data:`MECHANISMS`). On a TLS listener PLAIN is offered too
(:data:`PLAIN`, RFC 4616: the token goes over the wire, inside TLS only),
checked against the same verifier: the password is salted and hashed as
SCRAM-SHA-512 does it and compared with the stored key.

The token never crosses the wire: the client proves it holds the token by a
salted HMAC over both sides' nonces, and the server's final message proves
the server holds it too. The listener keeps only the SCRAM verifier
(salt, stored key, server key) of each mechanism, made once per listener
process.

Thread-safety: :class:`ScramVerifier` is immutable after construction and
shared by every connection; :class:`ScramExchange` belongs to one connection.
"""

from __future__ import annotations

import functools
import hmac

from scramp import ScramException, ScramMechanism

#: the SASL mechanisms served, in the order a SaslHandshake lists them
MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256")
#: the mechanism a client that names none is given (what kafka_config() names)
MECHANISM = "SCRAM-SHA-256"
#: SASL PLAIN: served on TLS listeners only (the password crosses the wire)
PLAIN = "PLAIN"
ITERATIONS = 4096


class SaslFailed(Exception):
    """The client's SCRAM messages do not prove the token (or are malformed)."""


class ScramVerifier:
    """The server-side SCRAM credentials of one user (the cluster name),
    for each of :data:`MECHANISMS`."""

    def __init__(self, user: str, token: bytes):
        self.user = user
        password = token.decode("ascii")
        self._mechanisms = {name: ScramMechanism(name) for name in MECHANISMS}
        self._auth_info = {name: mechanism.make_auth_info(password, iteration_count=ITERATIONS)
                           for name, mechanism in self._mechanisms.items()}

    def exchange(self, mechanism: str = MECHANISM) -> "ScramExchange":
        """A new conversation in ``mechanism`` (one of :data:`MECHANISMS`;
        :class:`SaslFailed` for another)."""
        if mechanism not in self._mechanisms:
            raise SaslFailed(f"SASL mechanism {mechanism!r} is not served; one of {', '.join(MECHANISMS)}")
        return ScramExchange(self, mechanism)

    def plain_exchange(self) -> "PlainExchange":
        """A SASL PLAIN conversation (for TLS connections only: the caller
        decides where PLAIN is offered)."""
        return PlainExchange(self)

    def check_password(self, username: str, password: str) -> bool:
        """Whether ``username`` and ``password`` are the cluster's name and
        token (the password salted and hashed as SCRAM-SHA-512 does it, the
        stored key compared in constant time)."""
        salt, stored_key, _, iterations = self._auth_info[MECHANISMS[0]]
        try:
            _, derived, _, _ = self._mechanisms[MECHANISMS[0]].make_auth_info(password, iteration_count=iterations,
                                                                               salt=salt)
        except (ScramException, ValueError, UnicodeError):
            return False
        return hmac.compare_digest(derived, stored_key) and hmac.compare_digest(username.encode(), self.user.encode())

    def _lookup(self, mechanism: str, username: str):
        if username != self.user:
            raise ScramException(f"unknown user {username!r}; the user is the cluster's name")
        return self._auth_info[mechanism]


class ScramExchange:
    """One SCRAM conversation: :meth:`step` takes each client message and
    returns the server's answer; :attr:`done` once the client is proven."""

    def __init__(self, verifier: ScramVerifier, mechanism: str = MECHANISM):
        self.mechanism = mechanism
        self._server = verifier._mechanisms[mechanism].make_server(functools.partial(verifier._lookup, mechanism))
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
            raise SaslFailed(f"{self.mechanism} authentication failed: {err}") from None
        raise SaslFailed(f"{self.mechanism} authentication is already complete")


class PlainExchange:
    """One SASL PLAIN conversation: a single client message
    ``authzid NUL authcid NUL password`` (RFC 4616; the authorization id
    empty or the user itself), answered with no bytes once the password is
    the token."""

    mechanism = PLAIN

    def __init__(self, verifier: ScramVerifier):
        self._verifier = verifier
        self.done = False

    def step(self, message: bytes) -> bytes:
        if self.done:
            raise SaslFailed("PLAIN authentication is already complete")
        try:
            authzid, user, password = bytes(message).decode("utf-8").split("\0")
        except (UnicodeDecodeError, ValueError):
            raise SaslFailed("PLAIN authentication failed: the message is not authzid NUL user NUL password") \
                from None
        if authzid not in ("", user) or not self._verifier.check_password(user, password):
            raise SaslFailed("PLAIN authentication failed: wrong user or password")
        self.done = True
        return b""


def _attribute(message: str, name: str) -> str | None:
    """The value of SCRAM attribute ``name`` in ``message`` (``a=b,c=d``), or None."""
    for part in message.split(","):
        if part.startswith(name + "="):
            return part[len(name) + 1:]
    return None
