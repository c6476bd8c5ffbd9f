"""A partition actor's data port under 300 idle connections (real Ray, real
ZooKeeper): a new client still produces and fetches, and the actor keeps
its connection count bounded."""

from __future__ import annotations

import socket

from raylog.errors import RaylogError
from raylog.transfer.handshake import authenticate_socket
from raylog.errors import BrokerUnavailableError
from raylog.retry import RetryPolicy
from raylog.storage.decoding import decode_messages
from raylog.storage.message import encode_message_set
from raylog.transfer import requests as req
from raylog.transfer.connection import BrokerConnection

def _authenticated_or_refused(sock, token, correlation_id):
    """Authenticate a raw connection; one refused at the connection limit
    (TooManyConnectionsError, or closed) stays open on our side as a stranger would."""
    try:
        authenticate_socket(sock, token, correlation_id)
    except (RaylogError, OSError):
        pass



def test_300_idle_connections_do_not_lock_a_new_client_out_of_a_partition(raylog_client, make_topic):
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
