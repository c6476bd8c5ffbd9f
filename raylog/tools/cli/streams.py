"""``raylog produce`` and ``raylog consume``: the console producer and consumer
(lines on stdin to a topic, a topic or group to stdout).

What ``consume`` prints per record, one line each, in this order: with
``--print-offset`` ``Partition:P<TAB>Offset:O<TAB>``; with
``--print-headers`` ``Headers:K1=V1,K2=V2<TAB>`` (the record's headers in
order, duplicates kept, as kcat's ``%h``: a header with a null value is its
key alone, an empty value ``K=``; format-1 messages and records without
headers print ``Headers:<TAB>``); with ``--print-key`` the key (``null``
for none) and the key separator; then the value, or ``--null-literal``
(``NULL`` by default, as kcat's ``-Z``) for a null value (a tombstone),
while an empty value prints nothing before the line end.
``produce --header K=V`` (repeatable) sends the pairs with every message."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time

import click

from raylog.errors import CorruptMessageError
from raylog.tools.cli.base import ASSIGNMENT_WAIT_S, COMMIT_INTERVAL_MS, CommandError, Target, pass_target, cli


def _progress(unit: str):
    from tqdm import tqdm  # optional: imported when used

    return tqdm(unit=unit, file=sys.stderr, disable=not sys.stderr.isatty(), leave=False)


@cli.command()
@click.argument("topic")
@click.option(
    "--key-separator",
    metavar="SEP",
    help="Split each line at the first SEP into key and value (e.g. $'\\t'); "
    "a line without SEP is an error.",
)
@click.option("--acks", type=click.Choice(["0", "1", "all"]), default="1", show_default=True,
              help="0: send and do not wait; 1: wait until each batch is in the partition log; "
                   "all: wait until it is flushed (fsynced) and readable.")
@click.option("--compression", type=click.Choice(["none", "gzip", "zstd", "lz4"]), default="none",
              show_default=True, help="Compress each batch into one wrapper message.")
@click.option("--batch-size", type=click.IntRange(min=1), default=200, show_default=True,
              help="Messages per batch and partition.")
@click.option("--linger-ms", type=click.FloatRange(min=0), default=5, show_default=True,
              help="Send a batch at the latest this long after its first message.")
@click.option("--header", "headers", metavar="KEY=VALUE", multiple=True,
              help="Add this header to every message (repeat for more; kept in order, duplicates "
                   "allowed). KEY is text; VALUE is sent as its UTF-8 bytes (KEY= sends an empty value).")
@pass_target
def produce(target: Target, topic, key_separator, acks, compression, batch_size, linger_ms, headers):
    """Send the lines of stdin to TOPIC, one message per line (the line
    end is not part of it); print the count to stderr at the end. Keyed
    messages go to partitions by their key, others are spread in batches.
    Every message carries the --header pairs given, in their order."""
    if key_separator == "":
        raise click.BadParameter("must not be empty", param_hint="--key-separator")
    separator = key_separator.encode() if key_separator is not None else None
    pairs = [_header(h) for h in headers]
    extra = {"headers": pairs} if pairs else {}  # without --header: the producer's send as it always was
    count = 0
    with target.client("produce") as client:
        client.metadata.partitions(topic)  # fail now for an unknown topic, before reading stdin
        producer = client.producer(
            batch_size=batch_size,
            linger_ms=linger_ms,
            compression=None if compression == "none" else compression,
            acks=acks if acks == "all" else int(acks),
        )
        try:
            with _progress("msg") as bar:
                for number, line in enumerate(sys.stdin.buffer, 1):
                    if line.endswith(b"\n"):
                        line = line[:-2] if line.endswith(b"\r\n") else line[:-1]
                    key = None
                    if separator is not None:
                        key, found, value = line.partition(separator)
                        if not found:
                            raise CommandError(
                                f"line {number} has no key separator {key_separator!r}; with "
                                f"--key-separator every line is KEY{key_separator}VALUE"
                            )
                        line = value
                    producer.send(topic, line, key, **extra)
                    count += 1
                    bar.update(1)
        finally:
            try:
                producer.close()  # flushes; raises what a send ran into
            except BaseException:
                click.echo(f"read {count} lines; the last batches may not have been written", err=True)
                raise
            click.echo(f"produced {count} message{'s' if count != 1 else ''} to {topic}", err=True)


@cli.command()
@click.argument("topic")
@click.option("--group", "-g", help="Read as a member of this consumer group (offsets are committed).")
@click.option("--from-beginning", is_flag=True,
              help="Start at the oldest message where nothing is committed (default: only new messages).")
@click.option("--max-messages", type=click.IntRange(min=1), help="Exit after this many messages.")
@click.option("--timeout-ms", type=click.IntRange(min=0),
              help="Exit after this long without a message (default: wait forever).")
@click.option("--auto-commit-interval-ms", type=click.IntRange(min=1), default=COMMIT_INTERVAL_MS,
              show_default=True,
              help="In a --group, commit what was printed this often (also while no message comes).")
@click.option("--print-key", is_flag=True, help="Print KEY<separator>VALUE ('null' for no key).")
@click.option("--print-offset", is_flag=True, help="Prefix each line with 'Partition:P<TAB>Offset:O<TAB>'.")
@click.option("--key-separator", metavar="SEP", default="\t", show_default="tab",
              help="What separates the key from the value with --print-key.")
@click.option("--print-headers", is_flag=True,
              help="Prefix each value (after the offset) with 'Headers:K1=V1,K2=V2<TAB>', the record's "
                   "headers in order ('Headers:' alone for none; a header with a null value prints as "
                   "its key alone, an empty one as 'K=').")
@click.option("--null-literal", metavar="TEXT", default="NULL", show_default=True,
              help="What a null value (a tombstone) prints as; an empty value prints as an empty line.")
@click.option("--skip-corrupt", is_flag=True,
              help="Skip a damaged stored message (a CRC or size field that does not match) to the next "
                   "readable one, with a warning on stderr, instead of stopping with an error.")
@pass_target
def consume(target: Target, topic, group, from_beginning, max_messages, timeout_ms, auto_commit_interval_ms,
            print_key, print_offset, key_separator, print_headers, null_literal, skip_corrupt):
    """Print TOPIC's messages to stdout, one value per line, until
    --max-messages or --timeout-ms says stop, or a signal. In a --group,
    what was printed is committed every --auto-commit-interval-ms (also
    while idle) and when it stops, Ctrl-C and SIGTERM included; the next
    consumer of the group goes on from there. Exit codes: 0 done, 130 after
    Ctrl-C (SIGINT), 143 after SIGTERM (both after the final commit); a
    second signal stops at once. A damaged stored message stops it with
    the error (its offset and the next readable offset) unless
    --skip-corrupt, which skips the damaged bytes and goes on (one warning
    line each; counted in the final line). A null value (a tombstone)
    prints as --null-literal, an empty value as an empty line;
    --print-headers shows each record's headers as K1=V1,K2=V2 (kcat's
    form; a null header value as its key alone)."""
    out = sys.stdout.buffer
    separator = key_separator.encode()
    null = null_literal.encode()
    count = skipped = 0
    interval_s = auto_commit_interval_ms / 1000.0
    with _stop_signals() as stopped, target.client("consume") as client:
        consumer = client.consumer(
            topic,
            group=group,
            auto_offset_reset="earliest" if from_beginning else "latest",
            enable_auto_commit=False,  # commit only what reached stdout
        )
        started = last_commit = time.monotonic()
        idle_since = None if group is not None else started
        try:
            while not stopped and (max_messages is None or count < max_messages):
                try:
                    batch = consumer.poll(
                        timeout_ms=200, max_messages=10_000 if max_messages is None else max_messages - count
                    )
                except CorruptMessageError as err:
                    if not skip_corrupt:
                        raise CorruptMessageError(
                            f"{err} (rerun with --skip-corrupt to skip the damaged bytes)", **err.details
                        ) from None
                    for (t, p), (start, end) in consumer.skip_corrupt().items():
                        click.echo(f"warning: skipped {end - start} corrupt bytes of {t}-{p}, offsets "
                                   f"[{start}, {end})", err=True)
                        skipped += 1
                    continue
                now = time.monotonic()
                if batch:
                    out.write(b"".join(_format(m, print_key, print_offset, separator, print_headers, null) for m in batch))
                    out.flush()
                    count += len(batch)
                    idle_since = now
                if group is not None and now - last_commit >= interval_s:
                    consumer.commit()
                    last_commit = now
                if batch:
                    continue
                if idle_since is None and (consumer.assignment() or now - started >= ASSIGNMENT_WAIT_S):
                    idle_since = now  # a group member idles only once it holds partitions
                if timeout_ms is not None and idle_since is not None and (now - idle_since) * 1000 >= timeout_ms:
                    break
            if group is not None:
                consumer.commit()
        except BrokenPipeError:
            # The reader went away (e.g. `| head`): stop quietly, commit nothing
            # more than was committed (some of the last batch may be unread).
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        finally:
            consumer.close()
            note = f" (skipped {skipped} corrupt range{'s' if skipped != 1 else ''})" if skipped else ""
            click.echo(f"consumed {count} message{'s' if count != 1 else ''}{note}", err=True)
    if stopped:
        return 128 + stopped[0]  # 130 for SIGINT, 143 for SIGTERM
    return 0


@contextlib.contextmanager
def _stop_signals():
    """While in the block, SIGINT and SIGTERM ask to stop: the list it
    yields gets the signal's number and the loop ends at its next check
    (so the last commit still runs); a second signal stops at once
    (KeyboardInterrupt). Outside the main thread signals are left alone."""

    stopped: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield stopped
        return

    def on_signal(signum, frame):
        if stopped:
            raise KeyboardInterrupt
        stopped.append(signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stopped
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _header(text: str) -> tuple[str, bytes]:
    """``KEY=VALUE`` of ``--header`` as a header pair."""
    key, found, value = text.partition("=")
    if not found or not key:
        raise click.BadParameter(f"{text!r} is not KEY=VALUE (e.g. trace=abc; KEY= for an empty value)",
                                 param_hint="--header")
    return key, value.encode()


def format_headers(headers) -> bytes:
    """``K1=V1,K2=V2`` (kcat's ``%h``): in order, a null value as the key alone."""
    return b",".join(k.encode() if v is None else k.encode() + b"=" + v for k, v in headers)


def _format(message, print_key: bool, print_offset: bool, separator: bytes, print_headers: bool = False,
            null: bytes = b"NULL") -> bytes:
    parts = []
    if print_offset:
        parts.append(f"Partition:{message.partition}\tOffset:{message.offset}\t".encode())
    if print_headers:
        parts.append(b"Headers:" + format_headers(message.headers) + b"\t")
    if print_key:
        parts.append(b"null" if message.key is None else message.key)
        parts.append(separator)
    parts.append(null if message.value is None else message.value)
    parts.append(b"\n")
    return b"".join(parts)
