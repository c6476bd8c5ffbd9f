"""The Kafka listener's connections as a bounded set: admitting a new one,
making room by shedding strangers first, and the per-address bound on
strangers (the model is the data channel's
:class:`raylog.transfer.connections.ConnectionTable`).

A *stranger* is a connection that has not completed SASL on a listener
that requires it (on a listener without a token every connection is
authenticated from its accept). The bounds:

* at most ``max_connections`` connections in all; at the limit a new one
  makes room by closing the oldest stranger (by accept time), else the
  authenticated connection that has waited longest for its next request
  (at least ``shed_idle_after_s``), else the new one is closed;
* at most ``max_strangers_per_address`` strangers from one source address
  (loopback counts like any other address); one more from that address
  closes the oldest stranger of that address. Only strangers count: an
  authenticated client is never kept out by how many connections its
  address holds, and a client that connects while strangers of its own
  address fill the bound still gets in (it is the newest of them) and has
  the authentication deadline to prove itself.

The table holds no thread per connection: the listener
(:mod:`raylog.kafka.listener`) keeps idle connections in a selector, so
the bound is the process's open files, not its threads (the listener
lowers ``max_connections`` to what its ``RLIMIT_NOFILE`` allows, see
:func:`raylog.kafka.listener.connection_limit`). Shedding a connection
shuts its socket down: a parked one turns readable and the worker that
takes it finds it closed; one being served fails its next read or write.

Thread-safety: every method may be called from any thread (one lock); a
:class:`Client`'s ``waiting_since`` is written by whichever thread holds
its connection at the time (the worker serving it, or the listener's
network thread when it parks it; read under the lock, a stale value only
makes shedding less exact).
"""

from __future__ import annotations

import logging
import socket
import threading
import time

log = logging.getLogger(__name__)

#: the most connections one listener serves at once (idle ones wait in a
#: selector: a socket and a few hundred bytes each, no thread)
DEFAULT_MAX_CONNECTIONS = 10_000
#: the most connections not yet authenticated from one source address
DEFAULT_MAX_STRANGERS_PER_ADDRESS = 64
#: at the limit, an authenticated connection waiting this long for its next
#: request may be closed to make room (strangers are closed before it)
DEFAULT_SHED_IDLE_AFTER_S = 0.5


class Client:
    """One accepted connection: its socket, source address, accept time,
    whether it has authenticated, and since when it waits for its next
    request (None: busy with one)."""

    __slots__ = ("sock", "peer", "address", "accepted_at", "authenticated", "waiting_since", "shed")

    def __init__(self, sock: socket.socket, peer, authenticated: bool):
        self.sock = sock
        self.peer = peer
        self.address = peer[0] if isinstance(peer, tuple) else peer
        self.accepted_at = time.monotonic()
        self.authenticated = authenticated
        self.waiting_since: float | None = self.accepted_at
        #: closed by the table to make room (under its lock)
        self.shed = False


class ClientTable:
    """The open connections of one Kafka listener (see the module docstring)."""

    def __init__(self, *, max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 max_strangers_per_address: int = DEFAULT_MAX_STRANGERS_PER_ADDRESS,
                 shed_idle_after_s: float = DEFAULT_SHED_IDLE_AFTER_S):
        self.max_connections = max_connections
        self.max_strangers_per_address = max_strangers_per_address
        self.shed_idle_after_s = shed_idle_after_s
        self._lock = threading.Lock()
        self._clients: dict[Client, None] = {}  # in accept order
        self._strangers: dict[str, dict[Client, None]] = {}  # address -> its strangers, in accept order
        self._accepted = 0
        self._refused = 0
        self._shed = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._clients)

    def admit(self, sock: socket.socket, peer, authenticated: bool) -> Client | None:
        """The new connection's entry, or None when there was no room (the
        socket is then closed)."""
        client = Client(sock, peer, authenticated)
        with self._lock:
            if not authenticated:
                own = self._strangers.get(client.address)
                if own is not None and len(own) >= self.max_strangers_per_address:
                    self._shed_locked(next(iter(own)))
            if len(self._clients) >= self.max_connections and not self._shed_one_locked():
                self._refused += 1
                client = None
            else:
                self._accepted += 1
                self._clients[client] = None
                if not authenticated:
                    self._strangers.setdefault(client.address, {})[client] = None
        if client is None:
            log.warning("Kafka listener: %d connections, none of them a stranger or idle; closing a new one from %s",
                        self.max_connections, peer)
            sock.close()
        return client

    def authenticated(self, client: Client) -> None:
        """``client`` has completed SASL: it no longer counts as a stranger."""
        with self._lock:
            client.authenticated = True
            self._forget_stranger(client)

    def release(self, client: Client) -> None:
        """``client``'s connection has ended."""
        with self._lock:
            self._clients.pop(client, None)
            self._forget_stranger(client)

    def sockets(self) -> list[socket.socket]:
        with self._lock:
            return [c.sock for c in self._clients]

    def stats(self) -> dict:
        with self._lock:
            return {
                "connections": len(self._clients),
                "strangers": sum(len(s) for s in self._strangers.values()),
                "connections_accepted": self._accepted,
                "connections_refused": self._refused,
                "connections_shed": self._shed,
            }

    def _forget_stranger(self, client: Client) -> None:
        own = self._strangers.get(client.address)
        if own is not None and client in own:
            del own[client]
            if not own:
                del self._strangers[client.address]

    def _shed_one_locked(self) -> bool:
        """At the limit: close the oldest stranger, else the authenticated
        connection idle longest (at least ``shed_idle_after_s``)."""
        for client in self._clients:  # accept order: the first stranger is the oldest
            if not client.authenticated:
                self._shed_locked(client)
                return True
        now = time.monotonic()
        victim, oldest = None, None
        for client in self._clients:
            since = client.waiting_since
            if since is not None and now - since >= self.shed_idle_after_s and (oldest is None or since < oldest):
                victim, oldest = client, since
        if victim is None:
            return False
        self._shed_locked(victim)
        return True

    def _shed_locked(self, client: Client) -> None:
        """Close ``client`` to make room; it leaves the count at once, and its
        connection ends on its own (its socket, shut down, reads the end)."""
        self._clients.pop(client, None)
        self._forget_stranger(client)
        client.shed = True
        self._shed += 1
        try:
            client.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
