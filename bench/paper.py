"""The paper's comparison (Figures 4 and 5): raylog beside RabbitMQ and ActiveMQ.

The 2011 Kafka paper ran one producer publishing 200-byte messages (Kafka
in batches of 1 and of 50, the others one at a time) and one consumer
reading them all back, against Kafka, ActiveMQ and RabbitMQ. This runs the
same two tests, in one run, on this machine, against raylog and the peers
installed from Debian's packages (``bench/peers/setup.sh``), each started
on 127.0.0.1 by ``bench/peers/brokers.py`` and stopped afterwards; one
system at a time, so that they never compete for the cores.

Producer test (N messages of 200 bytes, one producer, one queue/partition):

- raylog: ``batch 1`` and ``batch 50`` with ``acks=0`` (the paper's
  producer: it does not wait for the broker), and ``ack 50``: ``acks=1``,
  batches of 50, and ``flush()`` (which waits for the acknowledgement)
  after every 50; the clock stops when the partition's high watermark
  covers every message (in the log and flushed).
- RabbitMQ (AMQP 0-9-1, pika's asynchronous adapter): persistent messages
  to a durable queue, no publisher confirms (the paper's setting; the clock
  stops when the queue holds all N), and publisher confirms awaited after
  every 50 messages.
- ActiveMQ (STOMP, stomp.py): persistent messages to a queue (KahaDB), no
  receipts but on the last message (the clock stops at its receipt), and a
  receipt awaited after every 50 messages.

AMQP and STOMP have no batch publish, so the peers have no ``batch 50``;
the paper, too, ran them one message at a time. ``ack 50`` is the closest
thing they offer, the same for all three: the producer sends 50 messages,
then waits until the broker acknowledges them before it sends more.

Every clock starts before the client connects and stops as said above.

Consumer test: one consumer reads the N messages of the batch-1 test back,
prefetching about 1000 messages per fetch (as in the paper), auto-ack.

Prints one JSON line per system and test, a table like the paper's, the
ratios raylog/peer, and writes a bar chart to ``OUT/paper.png`` (and the
JSON lines to ``OUT/paper.jsonl``)::

    python bench/paper.py                       # N = 200,000, all systems
    python bench/paper.py --messages 50000 --systems raylog,rabbitmq --skip-setup
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from peers.brokers import HOST, ActiveMQ, RabbitMQ, cpu_seconds  # noqa: E402
from throughput import _wait_until_stored  # noqa: E402

MESSAGE = b"x" * 200
PREFETCH = 1000  # messages per fetch, as in the paper
SYSTEMS = ("raylog", "rabbitmq", "activemq")
LABELS = {"raylog": "raylog", "rabbitmq": "RabbitMQ", "activemq": "ActiveMQ"}
PRODUCE_MODES = ("batch 1", "batch 50", "ack 50")
PAPER = {  # msg/s read off the paper's Figures 4 and 5 (approximate)
    "kafka": {"batch 1": 50_000, "batch 50": 400_000, "consume": 22_000},
}


class StallError(RuntimeError):
    pass


def progress(desc: str, total: int):
    from tqdm import tqdm

    return tqdm(
        total=total, desc=desc, unit="msg", unit_scale=True, leave=False, file=sys.stderr, dynamic_ncols=True,
        disable=None,
    )  # fmt: skip


class Meter:
    """Wall time and CPU seconds of one test: this process's (the client,
    all its threads) and the broker's processes' (``broker_cpu``: a callable
    returning their CPU seconds so far), so that a reader can tell which
    side a number is bound by."""

    def __init__(self, broker_cpu=None):
        self.broker_cpu = broker_cpu
        self.t0 = time.perf_counter()
        self.c0 = time.process_time()
        self.b0 = broker_cpu() if broker_cpu else None

    def stop(self) -> dict:
        out = {
            "seconds": time.perf_counter() - self.t0,
            "client_cpu_s": round(time.process_time() - self.c0, 2),
        }
        if self.broker_cpu is not None:
            out["broker_cpu_s"] = round(self.broker_cpu() - self.b0, 2)
        return out


def row(system: str, test: str, mode: str, n: int, measured: dict, **extra) -> dict:
    seconds = measured["seconds"]
    return {
        "system": system,
        "test": test,
        "mode": mode,
        "messages": n,
        "message_bytes": len(MESSAGE),
        "seconds": round(seconds, 3),
        "msg_per_s": round(n / seconds),
        "mb_per_s": round(n * len(MESSAGE) / seconds / 1e6, 2),
        **{k: v for k, v in measured.items() if k != "seconds"},
        **extra,
        "load_1m": round(os.getloadavg()[0], 1),  # the machine is shared: say how busy it was
    }


def deadline_for(n: int) -> float:
    """Give up on a test that runs slower than 200 msg/s (at least 120 s)."""
    return time.monotonic() + max(120.0, n / 200)


# -- raylog -------------------------------------------------------------------


def run_raylog(n: int) -> list[dict]:
    import ray

    import raylog
    from raylog.storage.message import HEADER_SIZE

    size = HEADER_SIZE + len(MESSAGE)  # about the bytes per message in the log (no key): the prefetch bound
    info = {"server": f"raylog {raylog.__version__}", "client": "raylog (Python)"}
    rows = []
    actor_pids = {}  # topic -> PID of its partition actor (the broker side)
    with raylog.connect() as client:
        cases = [("batch 1", 1, 0), ("batch 50", 50, 0), ("ack 50", 50, 1)]
        for mode, batch, acks in cases:
            topic = f"paper-{mode.replace(' ', '')}"
            client.create_topic(topic, partitions=1)
            actor_pids[topic] = ray.get(client.partition_actor(topic, 0).stats.remote())["pid"]
            broker_cpu = functools.partial(cpu_seconds, [actor_pids[topic]])
            bar = progress(f"raylog produce {mode}", n)
            meter = Meter(broker_cpu)
            producer = client.producer(batch_size=batch, linger_ms=5, acks=acks, max_buffered_messages=200_000)
            send = producer.send
            if acks:
                # Stop and wait, as the peers' confirms and receipts: 50
                # messages, then flush() waits for their base offset.
                for i in range(n):
                    send(topic, MESSAGE)
                    if i % batch == batch - 1:
                        producer.flush()
                    if i % 2000 == 1999:
                        bar.update(2000)
            else:
                for i in range(n):
                    send(topic, MESSAGE)
                    if i % 2000 == 1999:
                        bar.update(2000)
            producer.flush()
            try:  # every record visible (counted: a log's bytes depend on how batches were cut)
                _wait_until_stored(client, topic, {0: 0}, n, timeout_s=deadline_for(n) - time.monotonic())
            except RuntimeError as err:
                raise StallError(f"raylog: {err}") from None
            measured = meter.stop()
            bar.close()
            producer.close()
            rows.append(row("raylog", "produce", mode, n, measured, batch=batch, acks=acks, **info))
            emit(rows[-1])

        broker_cpu = functools.partial(cpu_seconds, [actor_pids["paper-batch1"]])
        bar = progress("raylog consume", n)
        received = 0
        meter = Meter(broker_cpu)  # the consumer starts fetching as it is made
        consumer = client.consumer("paper-batch1", auto_offset_reset="earliest", fetch_max_bytes=PREFETCH * size)
        while received < n:
            got = consumer.poll(timeout_ms=30_000, max_messages=100_000)
            if not got:
                raise StallError(f"raylog: the consumer stalled after {received} of {n} messages")
            received += len(got)
            bar.update(len(got))
        measured = meter.stop()
        bar.close()
        consumer.close()
        rows.append(row("raylog", "consume", "prefetch 1000", received, measured, **info))
        emit(rows[-1])
    return rows


# -- RabbitMQ -----------------------------------------------------------------


def _amqp_run(params, on_channel, timeout_s: float) -> None:
    """Open a pika SelectConnection and a channel, call ``on_channel(conn,
    ch, done)`` and run the I/O loop until ``done(error=None)`` is called."""
    import pika
    from pika.adapters.select_connection import SelectConnection

    outcome: dict = {}

    def done(error: BaseException | None = None):
        outcome.setdefault("error", error)
        if conn.is_open:
            conn.close()
        else:
            conn.ioloop.stop()

    def on_open(conn):
        conn.channel(on_open_callback=lambda ch: on_channel(conn, ch, done))

    def on_open_error(conn, err):
        outcome.setdefault("error", RuntimeError(f"AMQP connection failed: {err}"))
        conn.ioloop.stop()

    def on_closed(conn, reason):
        if not isinstance(reason, pika.exceptions.ConnectionClosedByClient):
            outcome.setdefault("error", RuntimeError(f"AMQP connection closed: {reason!r}"))
        conn.ioloop.stop()

    conn = SelectConnection(
        params, on_open_callback=on_open, on_open_error_callback=on_open_error, on_close_callback=on_closed
    )
    conn.ioloop.call_later(timeout_s, lambda: done(StallError(f"no result within {timeout_s:g} s")))
    conn.ioloop.start()
    if outcome.get("error") is not None:
        raise outcome["error"]


def _amqp_publish(params, queue: str, n: int, confirm_every: int | None, bar) -> None:
    """Publish ``n`` persistent messages to the durable ``queue``.

    Without confirms, messages go out in chunks of 500 per I/O-loop turn
    (pika buffers the frames and writes them as the socket takes them; a
    chunk waits while more than 4 MB are buffered). With ``confirm_every``,
    the channel is in confirm mode and each group of that many messages is
    published, then its confirms awaited, before the next."""
    import pika

    props = pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent)
    chunk = confirm_every or 500
    state = {"sent": 0}

    def on_channel(conn, ch, done):
        def start(_frame):
            if confirm_every:
                ch.confirm_delivery(on_ack)
            pump()

        def pump():
            if not confirm_every and getattr(conn, "_get_write_buffer_size", lambda: 0)() > 4 << 20:
                conn.ioloop.call_later(0.001, pump)
                return
            k = min(chunk, n - state["sent"])
            publish = ch.basic_publish
            for _ in range(k):
                publish("", queue, MESSAGE, props)
            state["sent"] += k
            bar.update(k)
            if not confirm_every:
                if state["sent"] < n:
                    conn.ioloop.call_later(0, pump)
                else:
                    done()  # Connection.Close follows the publishes in order

        def on_ack(frame):
            if isinstance(frame.method, pika.spec.Basic.Nack):
                done(RuntimeError(f"RabbitMQ refused message {frame.method.delivery_tag}"))
            elif frame.method.delivery_tag >= state["sent"]:
                if state["sent"] < n:
                    pump()
                else:
                    done()

        ch.queue_declare(queue, durable=True, callback=start)

    _amqp_run(params, on_channel, deadline_for(n) - time.monotonic())


def _amqp_wait_depth(params, queue: str, n: int) -> None:
    import pika

    deadline = deadline_for(n)
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        while ch.queue_declare(queue, durable=True, passive=True).method.message_count < n:
            if time.monotonic() > deadline:
                raise StallError(f"RabbitMQ: queue {queue} did not reach {n} messages")
            time.sleep(0.005)
    finally:
        conn.close()


def _amqp_consume(params, queue: str, n: int, bar) -> int:
    state = {"received": 0}

    def on_channel(conn, ch, done):
        def on_message(_ch, _method, _props, _body):
            state["received"] += 1
            if state["received"] % 1000 == 0:
                bar.update(1000)
            if state["received"] >= n:
                done()

        # The paper's consumers prefetched up to 1000 messages; RabbitMQ
        # applies the prefetch limit to acknowledging consumers only.
        ch.basic_qos(
            prefetch_count=PREFETCH,
            callback=lambda _f: ch.basic_consume(queue, on_message, auto_ack=True),
        )

    _amqp_run(params, on_channel, deadline_for(n) - time.monotonic())
    return state["received"]


def run_rabbitmq(n: int, base_dir: str | None) -> list[dict]:
    import pika

    info = {
        "server": f"RabbitMQ {deb_version('rabbitmq-server')}",
        "client": f"pika {dist_version('pika')} (SelectConnection)",
    }
    rows = []
    with RabbitMQ(base_dir) as broker:
        broker_cpu = broker.cpu_seconds
        params = pika.ConnectionParameters(host=HOST, port=broker.port, heartbeat=0)
        for mode, confirm_every in (("batch 1", None), ("ack 50", 50)):
            queue = f"paper-{mode.replace(' ', '')}"
            bar = progress(f"RabbitMQ produce {mode}", n)
            meter = Meter(broker_cpu)
            _amqp_publish(params, queue, n, confirm_every, bar)
            _amqp_wait_depth(params, queue, n)
            measured = meter.stop()
            bar.close()
            rows.append(
                row("rabbitmq", "produce", mode, n, measured, persistent=True, confirms=confirm_every, **info)
            )
            emit(rows[-1])
        bar = progress("RabbitMQ consume", n)
        meter = Meter(broker_cpu)
        received = _amqp_consume(params, "paper-batch1", n, bar)
        measured = meter.stop()
        bar.close()
        rows.append(row("rabbitmq", "consume", "prefetch 1000", received, measured, auto_ack=True, **info))
        emit(rows[-1])
    return rows


# -- ActiveMQ -----------------------------------------------------------------


class _StompListener:
    """Counts messages and collects receipts and errors (stomp.py calls it
    from its receiver thread)."""

    def __init__(self):
        self.cv = threading.Condition()
        self.receipts: set[str] = set()
        self.errors: list[str] = []
        self.received = 0

    def on_receipt(self, frame):
        with self.cv:
            self.receipts.add(frame.headers.get("receipt-id"))
            self.cv.notify_all()

    def on_message(self, frame):
        self.received += 1  # one writer: the receiver thread

    def on_error(self, frame):
        with self.cv:
            self.errors.append(f"{frame.headers.get('message', '')} {frame.body!r}"[:300])
            self.cv.notify_all()

    def on_disconnected(self):
        with self.cv:
            self.errors.append("disconnected by the broker")
            self.cv.notify_all()

    def wait_receipt(self, receipt: str, deadline: float) -> None:
        with self.cv:
            while receipt not in self.receipts:
                if self.errors:
                    raise RuntimeError(f"ActiveMQ: {self.errors[0]}")
                if time.monotonic() > deadline:
                    raise StallError(f"ActiveMQ: no receipt {receipt}")
                self.cv.wait(1.0)
            self.receipts.discard(receipt)


def _stomp_connect(port: int):
    import socket

    import stomp

    conn = stomp.Connection12([(HOST, port)], heartbeats=(0, 0), auto_content_length=True, auto_decode=False)
    listener = _StompListener()
    conn.set_listener("paper", listener)
    conn.connect(wait=True)
    # stomp.py leaves Nagle's algorithm on; a receipt request after a run of
    # small frames would then wait for a delayed ACK (40 ms on Linux).
    conn.transport.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn, listener


def run_activemq(n: int, base_dir: str | None) -> list[dict]:
    info = {
        "server": f"ActiveMQ {deb_version('activemq')}",
        "client": f"stomp.py {dist_version('stomp.py')} (STOMP 1.2)",
    }
    rows = []
    with ActiveMQ(base_dir) as broker:
        broker_cpu = broker.cpu_seconds
        for mode, every in (("batch 1", n), ("ack 50", 50)):
            destination = f"/queue/paper-{mode.replace(' ', '')}"
            bar = progress(f"ActiveMQ produce {mode}", n)
            deadline = deadline_for(n)
            meter = Meter(broker_cpu)
            conn, listener = _stomp_connect(broker.port)
            try:
                send = conn.send
                plain = {"persistent": "true"}
                for i in range(1, n + 1):
                    if i % every == 0 or i == n:
                        send(destination, MESSAGE, headers={"persistent": "true", "receipt": f"r{i}"})
                        listener.wait_receipt(f"r{i}", deadline)
                    else:
                        send(destination, MESSAGE, headers=plain)
                    if i % 1000 == 0:
                        bar.update(1000)
                measured = meter.stop()
                bar.close()
            finally:
                conn.disconnect()
            rows.append(
                row(
                    "activemq", "produce", mode, n, measured, persistent=True,
                    receipts=every if every < n else "last", **info,
                )
            )  # fmt: skip
            emit(rows[-1])

        bar = progress("ActiveMQ consume", n)
        deadline = deadline_for(n)
        meter = Meter(broker_cpu)
        conn, listener = _stomp_connect(broker.port)
        try:
            conn.subscribe(
                "/queue/paper-batch1", id="paper", ack="auto", headers={"activemq.prefetchSize": str(PREFETCH)}
            )
            seen = 0
            while listener.received < n:
                if listener.errors:
                    raise RuntimeError(f"ActiveMQ: {listener.errors[0]}")
                if time.monotonic() > deadline:
                    raise StallError(f"ActiveMQ: the consumer stalled after {listener.received} of {n}")
                time.sleep(0.002)
                now = listener.received
                bar.update(now - seen)
                seen = now
            measured = meter.stop()
            bar.close()
            received = listener.received
        finally:
            conn.disconnect()
        rows.append(row("activemq", "consume", "prefetch 1000", received, measured, auto_ack=True, **info))
        emit(rows[-1])
    return rows


# -- reporting ----------------------------------------------------------------

_jsonl = None


def emit(r: dict) -> None:
    line = json.dumps(r)
    print(line, flush=True)
    if _jsonl is not None:
        _jsonl.write(line + "\n")
        _jsonl.flush()


def deb_version(package: str) -> str:
    try:
        out = subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    return out.split("-")[0].split("+")[0] or "?"


def dist_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "?"


def rate(rows: list[dict], system: str, test: str, mode: str | None = None) -> int | None:
    for r in rows:
        if r.get("system") == system and r.get("test") == test and (mode is None or r.get("mode") == mode):
            return r["msg_per_s"]
    return None


def ratios(rows: list[dict], systems: list[str]) -> dict:
    out: dict = {"case": "ratios raylog/peer"}
    for peer in systems:
        if peer == "raylog":
            continue
        pairs = {
            "produce_batch1": (rate(rows, "raylog", "produce", "batch 1"), rate(rows, peer, "produce", "batch 1")),
            # the paper's headline: Kafka batched against the unbatched peers
            "produce_batch50_vs_peer_batch1": (
                rate(rows, "raylog", "produce", "batch 50"),
                rate(rows, peer, "produce", "batch 1"),
            ),
            "produce_ack50": (rate(rows, "raylog", "produce", "ack 50"), rate(rows, peer, "produce", "ack 50")),
            "consume": (rate(rows, "raylog", "consume"), rate(rows, peer, "consume")),
        }
        for name, (ours, theirs) in pairs.items():
            if ours and theirs:
                out[f"{peer}_{name}"] = round(ours / theirs, 2)
    return out


def fmt(value: int | None) -> str:
    return f"{value:,}" if value else "—"


def print_table(rows: list[dict], skipped: dict[str, str], systems: list[str], n: int) -> None:
    servers = {r["system"]: f"{r['server']}, {r['client']}" for r in rows if "server" in r}
    print()
    print(f"Producer test (Figure 4): msg/s, {n:,} messages of {len(MESSAGE)} bytes, one producer")
    print(f"  {'system':<10} {'batch 1':>10} {'batch 50':>10} {'ack 50':>10}   server, client")
    for s in systems:
        if s in skipped:
            print(f"  {LABELS[s]:<10} skipped: {skipped[s].splitlines()[0]}")
            continue
        cells = [fmt(rate(rows, s, "produce", m)) for m in PRODUCE_MODES]
        print(f"  {LABELS[s]:<10} {cells[0]:>10} {cells[1]:>10} {cells[2]:>10}   {servers.get(s, '')}")
    print(f"  {'paper':<10} {PAPER['kafka']['batch 1']:>10,} {PAPER['kafka']['batch 50']:>10,} {'—':>10}   Kafka (2011), two 8-core machines, 1 Gb/s")
    print()
    print("Consumer test (Figure 5): msg/s, one consumer reading them all back, ~1000 messages per fetch")
    for s in systems:
        if s in skipped:
            continue
        print(f"  {LABELS[s]:<10} {fmt(rate(rows, s, 'consume')):>10}")
    print(f"  {'paper':<10} {PAPER['kafka']['consume']:>10,}   Kafka (2011)")
    print()
    print("batch 1 / batch 50: messages per produce request (AMQP and STOMP publish one at a time);")
    print("ack 50: 50 messages, then wait for the broker's acknowledgement, then the next 50")
    print("(raylog acks=1 and flush(); RabbitMQ publisher confirms; ActiveMQ STOMP receipts).")
    print()
    print("Where the time went: wall seconds, CPU seconds of the client (this process) and the broker")
    print(f"  {'system':<10} {'test':<16} {'wall s':>7} {'client':>7} {'broker':>7}")
    for r in rows:
        if "seconds" in r:
            test = f"{r['test']} {r['mode']}" if r["test"] == "produce" else r["test"]
            print(
                f"  {LABELS[r['system']]:<10} {test:<16} {r['seconds']:>7.2f} {r.get('client_cpu_s', 0):>7.2f}"
                f" {r.get('broker_cpu_s', 0):>7.2f}"
            )


def short(value: float) -> str:
    if value >= 1e6:
        return f"{value / 1e6:.3g}M"
    return f"{value / 1e3:.3g}k"


def plot(rows: list[dict], systems: list[str], path: Path, n: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401 - used as matplotlib.ticker

    shown = [s for s in systems if any(r.get("system") == s for r in rows)]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5), gridspec_kw={"width_ratios": [3, 2]})
    colors = {"batch 1": "#4c72b0", "batch 50": "#55a868", "ack 50": "#c44e52"}
    width = 0.26
    for i, mode in enumerate(PRODUCE_MODES):
        xs, ys = [], []
        for j, s in enumerate(shown):
            value = rate(rows, s, "produce", mode)
            x = j + (i - 1) * width
            if value:
                xs.append(x)
                ys.append(value)
            else:  # AMQP and STOMP have no batch publish
                ax1.text(x, 0, "n/a", ha="center", va="bottom", fontsize=7, color="#555555")
        bars = ax1.bar(xs, ys, width, label=mode, color=colors[mode])
        ax1.bar_label(bars, labels=[short(y) for y in ys], fontsize=8, padding=2)
    ax1.set_xticks(range(len(shown)), [LABELS[s] for s in shown])
    ax1.set_ylabel("messages / s")
    ax1.set_title("Producer (200-byte messages)")
    ax1.legend(title="per request / ack", fontsize=8)
    ys = [rate(rows, s, "consume") or 0 for s in shown]
    bars = ax2.bar(range(len(shown)), ys, 0.5, color="#8172b2")
    ax2.bar_label(bars, labels=[short(y) if y else "" for y in ys], fontsize=8, padding=2)
    ax2.set_xticks(range(len(shown)), [LABELS[s] for s in shown])
    ax2.set_title("Consumer (~1000 messages per fetch)")
    ax2.set_ylabel("messages / s")
    for ax in (ax1, ax2):
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: short(v) if v else "0"))
        ax.spines[["top", "right"]].set_visible(False)
        ax.margins(y=0.12)
    fig.suptitle(
        f"The Kafka paper's Figures 4 and 5 on one {os.cpu_count()}-core machine, loopback, Python clients, N = {n:,}",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -- main ---------------------------------------------------------------------


def setup_peers() -> str | None:
    """Run bench/peers/setup.sh; None when it succeeded, else why not."""
    script = HERE / "peers" / "setup.sh"
    env = dict(os.environ, PYTHON=sys.executable)
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        return f"bench/peers/setup.sh failed: {(proc.stderr or proc.stdout).strip()[-500:]}"
    print(proc.stdout.strip().splitlines()[-1], file=sys.stderr)
    return None


def main(argv=None) -> int:
    global _jsonl

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--messages", type=int, default=200_000, help="messages per test (default 200,000)")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated, of: " + ", ".join(SYSTEMS))
    parser.add_argument("--skip-setup", action="store_true", help="do not run bench/peers/setup.sh first")
    parser.add_argument("--out", default=str(HERE / "results"), help="where paper.png and paper.jsonl go")
    parser.add_argument("--broker-dir", default=None, help="parent of the brokers' temporary directories")
    parser.add_argument(
        "--report-only", action="store_true", help="run nothing: print the table and redraw the chart from OUT/paper.jsonl"
    )
    args = parser.parse_args(argv)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown or not systems:
        parser.error(f"unknown system(s) {unknown}; choose from {', '.join(SYSTEMS)}")
    if args.messages < 50:
        parser.error("--messages must be at least 50")
    n = args.messages

    out = Path(args.out)
    if args.report_only:
        return report_only(out, systems)

    # SIGTERM unwinds like Ctrl-C, so that the brokers are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out.mkdir(parents=True, exist_ok=True)
    _jsonl = open(out / "paper.jsonl", "w")

    setup_error = None
    if not args.skip_setup and any(s != "raylog" for s in systems):
        setup_error = setup_peers()

    runners = {
        "raylog": lambda: run_raylog(n),
        "rabbitmq": lambda: run_rabbitmq(n, args.broker_dir),
        "activemq": lambda: run_activemq(n, args.broker_dir),
    }
    rows: list[dict] = []
    skipped: dict[str, str] = {}
    for system in systems:
        try:
            rows.extend(runners[system]())
        except Exception as err:  # noqa: BLE001 - one system's failure is reported, the run goes on
            reason = str(err)
            if setup_error and system != "raylog":
                reason = f"{reason} ({setup_error})"
            skipped[system] = f"{type(err).__name__}: {reason}"
            emit({"system": system, "skipped": True, "reason": skipped[system]})

    summary = ratios(rows, systems)
    summary["cpus"] = os.cpu_count()
    summary["messages"] = n
    emit(summary)
    _jsonl.close()

    report(rows, skipped, systems, n, summary, out)
    return 0


def report(rows, skipped, systems, n, summary, out: Path) -> None:
    print_table(rows, skipped, systems, n)
    if any(isinstance(v, float) for v in summary.values()):
        print("\nraylog / peer: " + ", ".join(f"{k} x{v}" for k, v in summary.items() if isinstance(v, float)))
    png = out / "paper.png"
    plot(rows, systems, png, n)
    print(f"\nchart: {png}\nJSON lines: {out / 'paper.jsonl'}")


def report_only(out: Path, systems: list[str]) -> int:
    path = out / "paper.jsonl"
    if not path.exists():
        print(f"{path} does not exist; run bench/paper.py first", file=sys.stderr)
        return 2
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [r for r in lines if "msg_per_s" in r and r["system"] in systems]
    skipped = {r["system"]: r["reason"] for r in lines if r.get("skipped") and r["system"] in systems}
    summary = next((r for r in lines if r.get("case") == "ratios raylog/peer"), {})
    n = summary.get("messages") or max((r["messages"] for r in rows), default=0)
    shown = [s for s in systems if s in skipped or any(r["system"] == s for r in rows)]
    report(rows, skipped, shown, n, summary, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
