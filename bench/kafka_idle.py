"""A producer's latency through a Kafka listener that holds thousands of idle
authenticated connections, beside the same producer with none (issue 49's
acceptance: 5,000 idle connections, 100 msg/s, p99 at most 50 ms, the
listener's RSS at most 500 MB).

One embedded cluster (``raylog.connect()``: a ZooKeeper and a local Ray of
its own, stopped at the end), its Kafka listener
(``client.start_kafka_listeners()``, one disk node) and a topic of one
partition. In the same run:

* **floor**: a confluent-kafka (librdkafka) producer with
  ``client.kafka_config()``, ``--acks`` (1), ``linger.ms`` 5 (librdkafka's
  default), one message of ``--size`` bytes every 10 ms for ``--seconds``;
  each message's latency is from its ``produce`` call to its delivery
  report (the loop polls the producer while it waits for the next tick, so
  reports are taken as they come);
* **idle**: ``-n`` connections (5,000) opened and authenticated the way a
  Kafka client does it (ApiVersions, SaslHandshake, SCRAM-SHA-256 in two
  SaslAuthenticate rounds), by ``--processes`` processes of this script
  (each in waves of 50 connections, each wave from a loopback address of its
  own so that the listener's per-address bound on strangers is not met;
  the salted password is derived once per process, so a handshake costs a
  few HMACs), then left idle; the same producer runs again while they stay
  open.

Each case reports the producer's p50/p99/max delivery latency and the
listener process's RSS (``VmRSS``), peak RSS (``VmHWM``) and thread count
(``/proc/<pid>/status``; the pid from the listener actor's ``stats()``),
with the listener's own connection counters. Prints one JSON line per case,
then a table with the acceptance bounds beside.

    python bench/kafka_idle.py                    # 5,000 idle connections, 20 s of 100 msg/s
    python bench/kafka_idle.py -n 1000 --seconds 10 --json-only
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import json
import os
import socket
import struct
import sys
import time

#: issue 49's acceptance bounds
P99_BOUND_MS = 50.0
RSS_BOUND_MB = 500.0
#: connections a holding process authenticates at once
WAVE = 50
#: a producer sends one message per this many seconds (100 msg/s)
PERIOD_S = 0.01

API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36


# -- a raw Kafka client: just enough to authenticate and then idle ------------------


def _request(api_key: int, version: int, correlation: int, body: bytes) -> bytes:
    client_id = b"idle"
    payload = struct.pack(">hhih", api_key, version, correlation, len(client_id)) + client_id + body
    return struct.pack(">i", len(payload)) + payload


def _read_frame(sock: socket.socket) -> bytes:
    def exactly(n: int) -> bytes:
        chunks = []
        while n:
            chunk = sock.recv(n)
            if not chunk:
                raise ConnectionError("the listener closed an idle connection being opened")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    (size,) = struct.unpack(">i", exactly(4))
    return exactly(size)


def _authenticate_response(frame: bytes) -> bytes:
    """The auth bytes of a SaslAuthenticate v1 response (after its correlation id)."""
    (error,) = struct.unpack_from(">h", frame, 4)
    (length,) = struct.unpack_from(">h", frame, 6)
    pos = 8 + max(length, 0)
    if error:
        raise PermissionError(frame[8:pos].decode(errors="replace"))
    (size,) = struct.unpack_from(">i", frame, pos)
    return frame[pos + 4:pos + 4 + size]


class _Scram:
    """SCRAM-SHA-256's client side (RFC 5802), the salted password cached per
    (salt, iterations): every connection after the first costs a few HMACs."""

    def __init__(self, user: str, password: str):
        self.user, self.password = user, password
        self._salted: dict = {}

    def first(self, nonce: str) -> str:
        return f"n={self.user},r={nonce}"

    def final(self, first_bare: str, server_first: str) -> tuple[str, bytes]:
        """The client-final message and the server signature to expect."""
        fields = dict(part.split("=", 1) for part in server_first.split(","))
        key = (fields["s"], int(fields["i"]))
        salted = self._salted.get(key)
        if salted is None:
            salted = self._salted[key] = hashlib.pbkdf2_hmac("sha256", self.password.encode(),
                                                             base64.b64decode(fields["s"]), key[1])
        client_key = hmac.digest(salted, b"Client Key", "sha256")
        stored_key = hashlib.sha256(client_key).digest()
        without_proof = f"c=biws,r={fields['r']}"
        auth_message = f"{first_bare},{server_first},{without_proof}".encode()
        signature = hmac.digest(stored_key, auth_message, "sha256")
        proof = bytes(a ^ b for a, b in zip(client_key, signature))
        server_signature = hmac.digest(hmac.digest(salted, b"Server Key", "sha256"), auth_message, "sha256")
        return f"{without_proof},p={base64.b64encode(proof).decode()}", server_signature


def _open_wave(host: str, port: int, source: str, count: int, scram: _Scram | None) -> list[socket.socket]:
    """``count`` connections from ``source``, authenticated (each step sent on
    every connection of the wave before any answer is read)."""
    socks = [socket.create_connection((host, port), timeout=60, source_address=(source, 0)) for _ in range(count)]
    for sock in socks:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(_request(API_VERSIONS, 0, 1, b"")
                     + (_request(SASL_HANDSHAKE, 1, 2, struct.pack(">h", 13) + b"SCRAM-SHA-256") if scram else b""))
    for sock in socks:
        _read_frame(sock)
        if scram:
            handshake = _read_frame(sock)
            assert struct.unpack_from(">h", handshake, 4)[0] == 0, "SaslHandshake refused"
    if scram is None:
        return socks
    firsts = []
    for sock in socks:
        first_bare = scram.first(base64.b64encode(os.urandom(18)).decode())
        firsts.append(first_bare)
        token = ("n,," + first_bare).encode()
        sock.sendall(_request(SASL_AUTHENTICATE, 1, 3, struct.pack(">i", len(token)) + token))
    expected = []
    for sock, first_bare in zip(socks, firsts):
        server_first = _authenticate_response(_read_frame(sock)).decode()
        final, server_signature = scram.final(first_bare, server_first)
        expected.append(server_signature)
        token = final.encode()
        sock.sendall(_request(SASL_AUTHENTICATE, 1, 4, struct.pack(">i", len(token)) + token))
    for sock, server_signature in zip(socks, expected):
        server_final = _authenticate_response(_read_frame(sock)).decode()
        assert server_final == "v=" + base64.b64encode(server_signature).decode(), "the listener's proof is wrong"
    return socks


def _hold(host: str, port: int, user: str | None, password: str | None, count: int, index: int, pipe) -> None:
    """A holding process: open and authenticate ``count`` connections, say
    so on ``pipe``, keep them idle until told to close them."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < count + 100:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count + 1000) if hard > 0 else count + 1000, hard))
    scram = _Scram(user, password) if user is not None else None
    socks: list = []
    try:
        for wave, start in enumerate(range(0, count, WAVE)):
            source = f"127.{10 + index}.{wave // 250}.{1 + wave % 250}"
            socks += _open_wave(host, port, source, min(WAVE, count - start), scram)
        pipe.send(len(socks))
    except Exception as err:  # noqa: BLE001 - said to the parent, which stops
        pipe.send(f"{type(err).__name__}: {err}")
    pipe.recv()  # told to close
    for sock in socks:
        sock.close()
    pipe.send("closed")


# -- the measurements ---------------------------------------------------------------------


def _status(pid: int) -> dict:
    got = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                got[key] = int(value.split()[0]) * 1024
            elif key == "Threads":
                got[key] = int(value)
    return {"listener_rss_mb": round(got["VmRSS"] / 2**20, 1), "listener_peak_rss_mb": round(got["VmHWM"] / 2**20, 1),
            "listener_threads": got["Threads"]}


def _percentile(sorted_values: list, q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def produce_latency(config: dict, topic: str, seconds: float, size: int, acks: str) -> dict:
    """One message every :data:`PERIOD_S` for ``seconds``: the latencies from
    ``produce`` to the delivery report."""
    import confluent_kafka

    producer = confluent_kafka.Producer({**config, "acks": acks, "linger.ms": 5, "message.timeout.ms": 30000})
    latencies, failed = [], []
    value = b"x" * size

    def delivered(err, _msg, sent):
        if err is not None:
            failed.append(err)
        else:
            latencies.append(time.perf_counter() - sent)

    producer.produce(topic, value=value)  # the connection and the metadata first
    producer.flush(30)
    count = int(seconds / PERIOD_S)
    start = time.perf_counter()
    for i in range(count):
        sent = time.perf_counter()
        producer.produce(topic, value=value, on_delivery=lambda err, msg, sent=sent: delivered(err, msg, sent))
        tick = start + (i + 1) * PERIOD_S
        while True:
            left = tick - time.perf_counter()
            if left <= 0:
                break
            producer.poll(left)
    left = producer.flush(30)
    if failed or left or len(latencies) != count:
        raise RuntimeError(f"{len(failed)} messages failed, {left} not delivered: {failed[:3]}")
    ms = sorted(x * 1000 for x in latencies)
    return {"messages": count, "msg_per_s": round(count / (time.perf_counter() - start)),
            "p50_ms": round(_percentile(ms, 0.5), 2), "p99_ms": round(_percentile(ms, 0.99), 2),
            "max_ms": round(ms[-1], 2)}


def _listener(client):
    import ray

    from raylog.config import NAMESPACE
    from raylog.kafka.service import listener_name

    entries = client.start_kafka_listeners()
    if len(entries) != 1:
        raise RuntimeError(f"{len(entries)} Kafka listeners; the benchmark measures one")
    return ray.get_actor(listener_name(client.settings.cluster, entries[0]["node"]), namespace=NAMESPACE)


def _open_idle(config: dict, n: int, processes: int) -> list:
    """``n`` idle authenticated connections held by ``processes`` processes;
    their pipes (to close them)."""
    import multiprocessing

    host, port = config["bootstrap.servers"].split(",")[0].rsplit(":", 1)
    user, password = config.get("sasl.username"), config.get("sasl.password")
    context = multiprocessing.get_context("spawn")
    pipes = []
    share = [n // processes + (1 if i < n % processes else 0) for i in range(processes)]
    for index, count in enumerate(share):
        ours, theirs = context.Pipe()
        context.Process(target=_hold, args=(host, int(port), user, password, count, index, theirs),
                        daemon=True).start()
        pipes.append(ours)
    for pipe in pipes:
        answer = pipe.recv()
        if not isinstance(answer, int):
            raise RuntimeError(f"opening the idle connections: {answer}")
    return pipes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--idle", type=int, default=5000, help="idle authenticated connections")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long each producer run sends")
    parser.add_argument("--size", type=int, default=100, help="value bytes")
    parser.add_argument("--acks", default="1", choices=["1", "all"])
    parser.add_argument("--processes", type=int, default=4, help="processes holding the idle connections")
    parser.add_argument("--json-only", action="store_true")
    args = parser.parse_args(argv)
    if args.idle < 1 or args.seconds <= 0 or args.processes < 1:
        parser.error("--idle and --processes must be at least 1, --seconds positive")

    import ray

    import raylog

    rows: list = []

    def emit(row: dict) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)

    load_before = os.getloadavg()[0]
    with raylog.connect(num_cpus=2) as client:
        actor = _listener(client)
        pid = ray.get(actor.stats.remote())["pid"]
        config = client.kafka_config()
        client.create_topic("bench-idle", partitions=1)
        emit({"case": "floor: no idle connections", **produce_latency(config, "bench-idle", args.seconds, args.size,
                                                                        args.acks), **_status(pid)})
        started = time.perf_counter()
        pipes = _open_idle(config, args.idle, args.processes)
        opened_s = time.perf_counter() - started
        stats = ray.get(actor.stats.remote())
        emit({"case": f"{args.idle:,} idle connections open", "seconds_to_open": round(opened_s, 1),
              "connections": stats["connections"], "strangers": stats["strangers"], "workers": stats["workers"],
              "max_connections": stats["max_connections"], **_status(pid)})
        try:
            row = produce_latency(config, "bench-idle", args.seconds, args.size, args.acks)
            stats = ray.get(actor.stats.remote())
            emit({"case": f"with {args.idle:,} idle connections", **row, **_status(pid),
                  "connections": stats["connections"], "workers": stats["workers"]})
        finally:
            for pipe in pipes:
                pipe.send("close")
            for pipe in pipes:
                pipe.recv()
    floor, idle = rows[0], rows[-1]
    summary = {"idle": args.idle, "acks": args.acks, "seconds": args.seconds, "size": args.size,
               "p99_ms": idle["p99_ms"], "p99_bound_ms": P99_BOUND_MS, "p99_floor_ms": floor["p99_ms"],
               "listener_rss_mb": idle["listener_rss_mb"], "listener_peak_rss_mb": idle["listener_peak_rss_mb"],
               "rss_bound_mb": RSS_BOUND_MB, "within_bounds": idle["p99_ms"] <= P99_BOUND_MS
               and idle["listener_peak_rss_mb"] <= RSS_BOUND_MB,
               "loadavg_before": round(load_before, 2), "loadavg_after": round(os.getloadavg()[0], 2),
               "cpus": os.cpu_count()}
    emit(summary)
    if not args.json_only:
        print()
        print(f"{'case':<34} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'RSS MB':>8} {'peak MB':>8} {'threads':>8}")
        for row in rows:
            if "p99_ms" in row and "case" in row:
                print(f"{row['case']:<34} {row['p50_ms']:>8} {row['p99_ms']:>8} {row['max_ms']:>8} "
                      f"{row['listener_rss_mb']:>8} {row['listener_peak_rss_mb']:>8} {row['listener_threads']:>8}")
        print(f"acceptance (issue 49): p99 <= {P99_BOUND_MS:g} ms (got {summary['p99_ms']}, floor "
              f"{summary['p99_floor_ms']}), listener RSS <= {RSS_BOUND_MB:g} MB (peak {summary['listener_peak_rss_mb']}):"
              f" {'met' if summary['within_bounds'] else 'NOT met'}; acks {args.acks}; load average "
              f"{summary['loadavg_before']} -> {summary['loadavg_after']}, {summary['cpus']} cpus")
    return 0


if __name__ == "__main__":
    sys.exit(main())
