"""The machine's floor for the work of a message, measured in the same run
as the benchmarks that quote it (the machine may be shared and loaded).

Three loops in plain Python over 200-byte messages, each the least a
Python client must do per message:

* ``framing + CRC32C``: pack the 22-byte header of each message and its
  CRC32C (the ``crc32c`` package), appending to a list (what a producer
  must do per message without a compiled encoder);
* ``parsing + CRC``: unpack each header of a 200-byte message set, check its
  CRC32C and slice its value out (what a consumer must do per message);
* ``one send() per message``: one ``socket.send`` of a 222-byte message per
  call over a TCP connection on 127.0.0.1 with TCP_NODELAY (as the
  producer's), a thread reading the other end (what a
  client that writes each message on its own must pay in system calls);
* ``one round trip per message``: the same 222 bytes sent to a Python
  process on 127.0.0.1 that answers each with a 16-byte reply, the next
  sent only when the reply is in (what one acknowledged message at a time
  must pay at least: two wake-ups across processes, four system calls).

    python bench/floor.py            # prints one JSON line per measure
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time

from crc32c import crc32c

MESSAGE = b"x" * 200
_HEAD = struct.Struct(">IIBBqi")
_PARSE = struct.Struct(">IIHqi")


def framing(n: int) -> float:
    """Messages per second framed with their CRC32C, in Python."""
    parts: list[bytes] = []
    append = parts.append
    pack = _HEAD.pack
    t0 = time.perf_counter()
    for i in range(n):
        body = MESSAGE
        head = pack(18 + len(body), 0, 1, 0, i, -1)
        append(head[:4] + struct.pack(">I", crc32c(body, crc32c(head[8:]))) + head[8:])
        append(body)
    data = b"".join(parts)
    seconds = time.perf_counter() - t0
    assert len(data) == n * 222
    return n / seconds


def parsing(n: int) -> float:
    """Messages per second parsed (header, CRC32C, value slice), in Python."""
    head = struct.pack(">BBqi", 1, 0, 0, -1)
    one = struct.pack(">II", 18 + len(MESSAGE), crc32c(MESSAGE, crc32c(head))) + head + MESSAGE
    data = one * n
    unpack = _PARSE.unpack_from
    mv = memoryview(data)
    out = []
    append = out.append
    t0 = time.perf_counter()
    pos = 0
    end = len(data)
    while pos < end:
        size, crc, _magic, ts, klen = unpack(data, pos)
        stop = pos + 4 + size
        if crc32c(mv[pos + 8 : stop]) != crc:
            raise AssertionError("bad crc")
        append((pos, ts, None, data[pos + 22 : stop]))
        pos = stop
    seconds = time.perf_counter() - t0
    assert len(out) == n
    return n / seconds


def sends(n: int) -> float:
    """send() calls per second of one 222-byte message each."""
    server = socket.create_server(("127.0.0.1", 0))
    a = socket.create_connection(server.getsockname())
    a.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    b, _ = server.accept()
    server.close()
    got = [0]

    def drain():
        while got[0] < n * 222:
            chunk = b.recv(1 << 20)
            if not chunk:
                return
            got[0] += len(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    payload = b"y" * 222
    send = a.send
    t0 = time.perf_counter()
    for _ in range(n):
        sent = send(payload)
        if sent != 222:
            a.sendall(payload[sent:])
    reader.join(timeout=60)
    seconds = time.perf_counter() - t0
    a.close()
    b.close()
    return n / seconds


_ECHO = """
import socket, sys
server = socket.create_server(("127.0.0.1", 0))
print(server.getsockname()[1], flush=True)
conn, _ = server.accept()
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
buf = bytearray(1 << 16)
view = memoryview(buf)
reply = b"r" * 16
pending = 0
while True:
    n = conn.recv_into(view)
    if not n:
        break
    pending += n
    while pending >= 222:
        pending -= 222
        conn.sendall(reply)
"""


def round_trips(n: int) -> float:
    """Round trips per second: 222 bytes out, 16 back, from another Python
    process on 127.0.0.1, one at a time."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", _ECHO], stdout=subprocess.PIPE, text=True)
    try:
        port = int(child.stdout.readline())
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        payload = b"y" * 222
        buf = bytearray(64)
        for _ in range(min(n, 1000)):  # warm up
            sock.sendall(payload)
            sock.recv_into(buf, 16)
        send, recv_into = sock.sendall, sock.recv_into
        t0 = time.perf_counter()
        for _ in range(n):
            send(payload)
            got = recv_into(buf, 16)
            while got < 16:
                got += recv_into(memoryview(buf)[got:], 16 - got)
        seconds = time.perf_counter() - t0
        sock.close()
    finally:
        child.wait(timeout=30)
    return n / seconds


#: round trips measured for the round-trip floor (fewer: each is a wait)
ROUND_TRIPS = 20_000


def measure(n: int = 300_000) -> list[dict]:
    """One JSON-ready row per floor measure."""
    rows = []
    for case, fn, count in (("floor: framing + CRC32C", framing, n), ("floor: parsing + CRC", parsing, n),
                            ("floor: one send() per message", sends, n),
                            ("floor: one round trip per message", round_trips, ROUND_TRIPS)):
        rate = fn(count)
        rows.append({"case": case, "messages": count, "msg_per_s": round(rate),
                     "mb_per_s": round(rate * 200 / 1e6, 2)})
    return rows


if __name__ == "__main__":
    for row in measure():
        print(json.dumps(row), flush=True)
