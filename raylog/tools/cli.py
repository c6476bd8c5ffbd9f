"""The ``raylog`` command line, after Kafka's tools: topics, a console
producer and consumer, consumer groups, the audit check, the autoscaled
benchmark, and a local ZooKeeper.

::

    raylog zookeeper start --port 2181 --data-dir /var/tmp/raylog-zk
    raylog --zookeeper 127.0.0.1:2181 --ray-address auto topics create clicks --partitions 8
    raylog --zookeeper 127.0.0.1:2181 topics describe clicks
    printf 'user-1\\t/home\\n' | raylog --zookeeper 127.0.0.1:2181 produce clicks --key-separator $'\\t'
    raylog --zookeeper 127.0.0.1:2181 consume clicks --group stats --from-beginning --max-messages 10
    raylog --zookeeper 127.0.0.1:2181 groups describe stats
    raylog --zookeeper 127.0.0.1:2181 audit --topic clicks --group stats
    raylog bench --phases 1,2,3
    raylog zookeeper stop --data-dir /var/tmp/raylog-zk

Which cluster a command talks to: ``--zookeeper`` (the cluster's ZooKeeper)
is enough for every command but ``topics create``, ``topics delete``,
``topics repair``, ``supervisor start`` and ``audit``, which call partition actors and so also join the Ray cluster
(``--ray-address``, default ``auto``: the cluster of this node, or
``RAY_ADDRESS``). Without ``--zookeeper`` and ``--ray-address``, ``topics
create`` and ``topics list`` run on the embedded default of
:func:`raylog.connect` — a local Ray and a ZooKeeper that live only while
the command runs — ``bench`` starts a local autoscaling cluster of its own
for the run, and the other cluster commands refuse to run.

Exit codes: 0 done; 1 a raylog error, printed as one line ``error:
<message>`` on stderr (``audit``: also a window that fell short; ``topics
repair``: a partition still not served); 2 bad usage or a bad setting; 130
interrupted (Ctrl-C); ``consume``: 143 after SIGTERM (it commits first, as
after Ctrl-C).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import subprocess
import sys
import time

import click

from raylog.errors import ConfigError, RaylogError

#: where ``zookeeper start`` and ``zookeeper stop`` keep a local ZooKeeper's data
DEFAULT_ZOOKEEPER_DIR = "/tmp/raylog-zookeeper"
ZOOKEEPER_PID_FILE = "raylog-zookeeper.pid"
ZOOKEEPER_LOG_FILE = "raylog-zookeeper.log"
#: how long ``consume`` in a group waits for its first assignment before the
#: idle clock of ``--timeout-ms`` starts anyway
ASSIGNMENT_WAIT_S = 60.0
#: how often ``consume`` in a group commits what it has written out (its
#: ``--auto-commit-interval-ms``, as the consumer's ``auto_commit_interval_ms``)
COMMIT_INTERVAL_MS = 5000

_EMBEDDED_NOTE = (
    "note: no --zookeeper given: this runs on an embedded cluster (a local Ray and a "
    "ZooKeeper of its own) that is gone when the command ends"
)


class CommandError(click.ClickException):
    """A failure of a command that is not a raylog error (exit code 1)."""

    exit_code = 1

    def show(self, file=None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


def _fail(err: BaseException) -> None:
    click.echo(f"error: {err}", err=True)


# --------------------------------------------------------------------------
# which cluster


class Target:
    """The cluster the global options name; makes the command's client."""

    def __init__(self, zookeeper: str | None, ray_address: str | None, cluster: str, token: str | None):
        self.zookeeper = zookeeper or None
        self.ray_address = ray_address or None
        self.cluster = cluster
        self.token = token.encode() if token else None

    @property
    def embedded(self) -> bool:
        return self.zookeeper is None and self.ray_address is None

    @contextlib.contextmanager
    def client(self, command: str, *, ray: bool = False, embedded_ok: bool = False, data_dir: str | None = None):
        """A :class:`raylog.Client` for ``command``, closed afterwards.

        ``ray``: the command starts or stops partition actors, so it joins
        the Ray cluster; otherwise ZooKeeper and the data sockets suffice.
        ``embedded_ok``: without any address, run on the embedded default.
        """
        if self.embedded:
            if not embedded_ok:
                raise click.UsageError(
                    f"'{command}' needs an existing raylog cluster: pass --zookeeper HOST:PORT "
                    f"(or set RAYLOG_ZOOKEEPER) with the address of the cluster's ZooKeeper"
                )
            import raylog

            click.echo(_EMBEDDED_NOTE, err=True)
            client = raylog.connect(data_dir=data_dir, cluster=self.cluster, token=self.token)
        elif self.zookeeper is None:
            raise click.UsageError(
                "--ray-address needs --zookeeper HOST:PORT too (or RAYLOG_ZOOKEEPER): the address "
                "of the cluster's ZooKeeper, which holds its topics and consumer groups"
            )
        elif ray:
            client = self._join_ray(data_dir)
        else:
            from raylog.client import Client

            client = Client(zookeeper=self.zookeeper, cluster=self.cluster, token=self.token)
        try:
            yield client
        finally:
            client.close()

    def _join_ray(self, data_dir: str | None):
        import raylog

        address = self.ray_address or "auto"
        try:
            return raylog.connect(
                zookeeper=self.zookeeper,
                ray_address=address,
                data_dir=data_dir,
                cluster=self.cluster,
                token=self.token,
            )
        except RaylogError:
            raise
        except Exception as err:  # noqa: BLE001 - Ray's own errors on joining
            if _refused_token(err):
                raise CommandError(
                    f"the Ray cluster at {address!r} refused this process: it requires token "
                    f"authentication; export RAY_AUTH_MODE=token, with the cluster's token in "
                    f"~/.ray/auth_token (or RAY_AUTH_TOKEN_PATH, RAY_AUTH_TOKEN)"
                ) from None
            raise CommandError(
                f"could not join the Ray cluster at {address!r} ({type(err).__name__}: "
                f"{str(err).strip().splitlines()[0] if str(err).strip() else 'no details'}); "
                f"pass --ray-address HOST:PORT of the cluster's head (or set RAYLOG_RAY_ADDRESS), "
                f"or run this on a node of the cluster"
            ) from None


def _refused_token(err: BaseException | None) -> bool:
    """Whether Ray refused to join for want of its authentication token."""
    seen = 0
    while err is not None and seen < 10:
        if type(err).__name__ == "AuthenticationError" or "InvalidAuthToken" in str(err):
            return True
        err, seen = err.__cause__ or err.__context__, seen + 1
    return False


pass_target = click.make_pass_decorator(Target)


def _table(headers: list[str], rows: list[list]) -> str:
    """Plain columns aligned with two spaces; None shows as '-'."""
    cells = [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(headers)]
    lines = [headers] + cells
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)


# --------------------------------------------------------------------------
# the root


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--zookeeper",
    metavar="HOST:PORT",
    envvar="RAYLOG_ZOOKEEPER",
    show_envvar=True,
    help="The cluster's ZooKeeper (its topics, partition endpoints and consumer groups).",
)
@click.option(
    "--ray-address",
    metavar="ADDR",
    envvar="RAYLOG_RAY_ADDRESS",
    show_envvar=True,
    help="The Ray cluster, for 'topics create', 'topics delete', 'topics repair', 'supervisor "
    "start' and 'audit' (they call partition actors) and 'bench': HOST:PORT of its head, or 'auto' (the default: the "
    "cluster this node belongs to, or RAY_ADDRESS).",
)
@click.option(
    "--cluster",
    default="default",
    show_default=True,
    envvar="RAYLOG_CLUSTER",
    show_envvar=True,
    help="The raylog cluster name: its root in ZooKeeper is /raylog/<cluster>.",
)
@click.option(
    "--token",
    envvar="RAYLOG_TOKEN",
    show_envvar=True,
    help="The cluster's data token, if its partitions require one (prefer the environment "
    "variable: command lines are visible to other users).",
)
@click.version_option(package_name="raylog", prog_name="raylog")
@click.pass_context
def cli(ctx, zookeeper, ray_address, cluster, token):
    """Manage and use a raylog cluster: topics, console producer and consumer,
    consumer groups, the audit check, the autoscaled benchmark, and a local
    ZooKeeper.

    Point the commands at a cluster with --zookeeper HOST:PORT (and, for
    'topics create', 'topics delete', 'topics repair', 'supervisor start' and
    'audit', --ray-address). Without
    either, 'topics create' and 'topics list' run on the embedded default: a
    local Ray and a ZooKeeper of their own that exist only while the command
    runs (good for a first try, nothing is kept); 'bench' starts a local
    autoscaling cluster for the run; the other cluster commands then stop
    and say what to pass.

    Exit codes: 0 done, 1 error (one line 'error: ...' on stderr), 2 bad
    usage or setting, 130 interrupted (Ctrl-C), 143 'consume' after SIGTERM.
    """
    from raylog import _log

    _log.configure()  # warnings only, no ZooKeeper retry chatter (RAYLOG_LOG_LEVEL to change)
    ctx.obj = Target(zookeeper, ray_address, cluster, token)


# --------------------------------------------------------------------------
# topics


@cli.group()
def topics():
    """Create, list, describe and delete topics."""


@topics.command("create")
@click.argument("name")
@click.option("--partitions", "-p", type=int, default=1, show_default=True, help="Number of partitions.")
@click.option("--retention-ms", type=int, help="Delete whole segments older than this (default 7 days).")
@click.option("--retention-bytes", type=int, help="Delete the oldest segments while the log is larger (-1: no limit).")
@click.option("--segment-bytes", type=int, help="Start a new segment file after this many bytes (default 256 MiB).")
@click.option("--flush-ms", type=int, help="Flush (fsync) and expose appended messages after this long (default 50).")
@click.option("--flush-messages", type=int, help="... or after this many messages (default 10000).")
@click.option("--max-message-bytes", type=int, help="The largest message set a partition accepts (default 1 MiB).")
@click.option(
    "--data-dir",
    envvar="RAYLOG_DATA_DIR",
    show_envvar=True,
    help="Directory for the partition logs on each node (default /tmp/raylog; a temporary "
    "directory for the embedded cluster).",
)
@pass_target
def topics_create(target: Target, name, partitions, data_dir, **settings):
    """Create topic NAME and start its partition actors, spread over the
    nodes that offer disk (joins the Ray cluster: see --ray-address)."""
    settings = {k: v for k, v in settings.items() if v is not None}
    from raylog.config import TopicConfig

    TopicConfig(partitions=partitions, **settings)  # bad settings fail before any connection
    with target.client("topics create", ray=True, embedded_ok=True, data_dir=data_dir) as client:
        client.create_topic(name, partitions=partitions, **settings)
        click.echo(f"Created topic {name} with {partitions} partition{'s' if partitions != 1 else ''}.")


@topics.command("list")
@pass_target
def topics_list(target: Target):
    """List the topics, one per line."""
    with target.client("topics list", embedded_ok=True) as client:
        for name in client.list_topics():
            click.echo(name)


@topics.command("describe")
@click.argument("name")
@pass_target
def topics_describe(target: Target, name):
    """Show topic NAME's settings and, per partition, its node, state
    ('serving' or 'NOT SERVED'), endpoint, log start offset and high
    watermark ('-' where a partition is not served right now). A partition
    not served is served again by the cluster's supervisor within seconds,
    or at once by 'raylog topics repair NAME'."""
    with target.client("topics describe") as client:
        info = client.describe_topic(name)
    config = info["config"]
    click.echo(
        f"Topic: {name}  partitions: {config.partitions}  retention_ms: {config.retention_ms}  "
        f"retention_bytes: {config.retention_bytes}  segment_bytes: {config.segment_bytes}  "
        f"flush_messages: {config.flush_messages}  flush_ms: {config.flush_ms}  "
        f"max_message_bytes: {config.max_message_bytes}"
    )
    rows = [
        [p["partition"], p["node"], "serving" if p["served"] else "NOT SERVED", p["endpoint"],
         p["log_start_offset"], p["high_watermark"]]
        for p in info["partitions"]
    ]
    click.echo(_table(["PARTITION", "NODE", "STATE", "ENDPOINT", "LOG START", "HIGH WATERMARK"], rows))
    unserved = sum(1 for p in info["partitions"] if not p["served"])
    if unserved:
        click.echo(
            f"{unserved} of {len(rows)} partitions not served: the cluster's supervisor serves them again "
            f"when their nodes are alive; to do it now: raylog topics repair {name}",
            err=True,
        )


@topics.command("repair")
@click.argument("name", required=False)
@click.option("--timeout-s", type=click.FloatRange(min=1), default=60, show_default=True,
              help="How long to wait for the partition actors it starts.")
@pass_target
def topics_repair(target: Target, name, timeout_s):
    """Serve again every partition of topic NAME (default: of every topic)
    that no partition actor serves, on its node, and remove the logs that
    deleted topics left on nodes that were down. Starts the cluster's
    supervisor if it does not run (which then does this every few seconds
    by itself). Prints one row per partition; exits with 1 when some
    partition is still not served (its node is down, say). Joins the Ray
    cluster (see --ray-address)."""
    with target.client("topics repair", ray=True) as client:
        rows = client.repair(name, timeout_s=timeout_s)
    click.echo(_table(["TOPIC", "PARTITION", "NODE", "STATE", "DETAIL"],
                      [[r["topic"], r["partition"], r["node"], r["state"], r["detail"] or None] for r in rows]))
    bad = [r for r in rows if r["state"] not in ("serving", "started", "removed")]
    if bad:
        named = ", ".join(f"{r['topic']}-{r['partition']} ({r['state']})" for r in bad[:5])
        raise CommandError(f"{len(bad)} partitions not repaired: {named}{' ...' if len(bad) > 5 else ''}")


@topics.command("delete")
@click.argument("name")
@pass_target
def topics_delete(target: Target, name):
    """Delete topic NAME: stop its partition actors and delete their logs
    (joins the Ray cluster: see --ray-address)."""
    with target.client("topics delete", ray=True) as client:
        client.delete_topic(name)
    click.echo(f"Deleted topic {name}.")


# --------------------------------------------------------------------------
# the supervisor


@cli.group()
def supervisor():
    """The cluster's supervisor: serves every registered partition again
    after a restart (started by the cluster's start-up)."""


@supervisor.command("start")
@pass_target
def supervisor_start(target: Target):
    """Start the cluster's supervisor unless it runs: a small detached Ray
    actor that, now and every few seconds, serves every registered
    partition that is not served on its node and removes the logs of
    deleted topics. A cluster's start commands run this (deploy/). Joins
    the Ray cluster (see --ray-address)."""
    with target.client("supervisor start", ray=True) as client:
        client.start_supervisor()
    click.echo(f"The supervisor of cluster {target.cluster} runs.")


# --------------------------------------------------------------------------
# produce and consume


def _progress(unit: str):
    from tqdm import tqdm

    return tqdm(unit=unit, file=sys.stderr, disable=not sys.stderr.isatty(), leave=False)


@cli.command()
@click.argument("topic")
@click.option(
    "--key-separator",
    metavar="SEP",
    help="Split each line at the first SEP into key and value (e.g. $'\\t'); "
    "a line without SEP is an error.",
)
@click.option("--acks", type=click.Choice(["0", "1"]), default="1", show_default=True,
              help="0: send and do not wait; 1: wait until each batch is in the partition log.")
@click.option("--compression", type=click.Choice(["none", "gzip", "zstd", "lz4"]), default="none",
              show_default=True, help="Compress each batch into one wrapper message.")
@click.option("--batch-size", type=click.IntRange(min=1), default=200, show_default=True,
              help="Messages per batch and partition.")
@click.option("--linger-ms", type=click.FloatRange(min=0), default=5, show_default=True,
              help="Send a batch at the latest this long after its first message.")
@pass_target
def produce(target: Target, topic, key_separator, acks, compression, batch_size, linger_ms):
    """Send the lines of stdin to TOPIC, one message per line (the line
    end is not part of it); print the count to stderr at the end. Keyed
    messages go to partitions by their key, others are spread in batches."""
    if key_separator == "":
        raise click.BadParameter("must not be empty", param_hint="--key-separator")
    separator = key_separator.encode() if key_separator is not None else None
    count = 0
    with target.client("produce") as client:
        client.metadata.partitions(topic)  # fail now for an unknown topic, before reading stdin
        producer = client.producer(
            batch_size=batch_size,
            linger_ms=linger_ms,
            compression=None if compression == "none" else compression,
            acks=int(acks),
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
                    producer.send(topic, line, key)
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
@pass_target
def consume(target: Target, topic, group, from_beginning, max_messages, timeout_ms, auto_commit_interval_ms,
            print_key, print_offset, key_separator):
    """Print TOPIC's messages to stdout, one value per line, until
    --max-messages or --timeout-ms says stop, or a signal. In a --group,
    what was printed is committed every --auto-commit-interval-ms (also
    while idle) and when it stops, Ctrl-C and SIGTERM included; the next
    consumer of the group goes on from there. Exit codes: 0 done, 130 after
    Ctrl-C (SIGINT), 143 after SIGTERM (both after the final commit); a
    second signal stops at once."""
    out = sys.stdout.buffer
    separator = key_separator.encode()
    count = 0
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
                batch = consumer.poll(
                    timeout_ms=200, max_messages=10_000 if max_messages is None else max_messages - count
                )
                now = time.monotonic()
                if batch:
                    out.write(b"".join(_format(m, print_key, print_offset, separator) for m in batch))
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
            click.echo(f"consumed {count} message{'s' if count != 1 else ''}", err=True)
    if stopped:
        return 128 + stopped[0]  # 130 for SIGINT, 143 for SIGTERM
    return 0


@contextlib.contextmanager
def _stop_signals():
    """While in the block, SIGINT and SIGTERM ask to stop: the list it
    yields gets the signal's number and the loop ends at its next check
    (so the last commit still runs); a second signal stops at once
    (KeyboardInterrupt). Outside the main thread signals are left alone."""
    import threading

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


def _format(message, print_key: bool, print_offset: bool, separator: bytes) -> bytes:
    parts = []
    if print_offset:
        parts.append(f"Partition:{message.partition}\tOffset:{message.offset}\t".encode())
    if print_key:
        parts.append(b"null" if message.key is None else message.key)
        parts.append(separator)
    parts.append(message.value)
    parts.append(b"\n")
    return b"".join(parts)


# --------------------------------------------------------------------------
# consumer groups


@cli.group()
def groups():
    """List, describe, delete consumer groups and reset their offsets."""


@groups.command("list")
@pass_target
def groups_list(target: Target):
    """List the consumer groups (with live members or committed offsets)."""
    with target.client("groups list") as client:
        for name in client.list_groups():
            click.echo(name)


@groups.command("describe")
@click.argument("group")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.1), default=5.0, show_default=True,
              help="Seconds to wait, in all, for the partitions' ends (unanswered ones show '-').")
@pass_target
def groups_describe(target: Target, group, timeout_s):
    """Show, per partition group GROUP reads: the owning member, the
    committed offset, the end offset (high watermark), the lag in bytes and
    an estimated lag in messages (bytes divided by the mean size of the
    messages at the committed offset); then members that own nothing."""
    with target.client("groups describe") as client:
        rows = client.describe_group(group, timeout_s=timeout_s)
    table = [
        [r["topic"] if r.get("topic_exists", True) is not False else f"{r['topic']} (deleted)", r["partition"],
         r["owner"], r.get("committed"), r.get("end_offset"), r.get("lag_bytes"),
         None if r.get("lag_messages_estimate") is None else f"~{r['lag_messages_estimate']}"]
        for r in rows
    ]
    click.echo(_table(["TOPIC", "PARTITION", "OWNER", "COMMITTED", "END OFFSET", "LAG (BYTES)",
                       "LAG (MESSAGES, ESTIMATE)"], table))


@groups.command("delete")
@click.argument("group")
@pass_target
def groups_delete(target: Target, group):
    """Delete consumer group GROUP and its committed offsets (refused while
    it has live members)."""
    with target.client("groups delete") as client:
        client.delete_group(group)
    click.echo(f"deleted consumer group {group}", err=True)


@groups.command("reset-offsets")
@click.argument("group")
@click.option("--topic", "-t", required=True, help="The topic whose committed offsets move.")
@click.option("--partition", "-p", "partitions", type=click.IntRange(min=0), multiple=True,
              help="Only this partition (repeatable; default: all).")
@click.option("--to-earliest", "to", flag_value="earliest", help="To the oldest message kept.")
@click.option("--to-latest", "to", flag_value="latest", help="To the end (skip everything there now).")
@click.option("--to-offset", type=click.IntRange(min=0), help="To this byte offset (a message boundary).")
@click.option("--to-datetime", metavar="ISO-8601",
              help="To the first message at or after this time (e.g. 2026-01-31T12:00:00Z; no zone = UTC).")
@click.option("--execute", is_flag=True, help="Write the new offsets (without it: a dry run that only shows them).")
@pass_target
def groups_reset_offsets(target: Target, group, topic, partitions, to, to_offset, to_datetime, execute):
    """Move GROUP's committed offsets of a topic. A dry run unless
    --execute; refused while the group has live members."""
    chosen = [name for name, given in (("--to-earliest/--to-latest", to), ("--to-offset", to_offset is not None),
                                       ("--to-datetime", to_datetime)) if given]
    if len(chosen) != 1:
        raise click.UsageError("give exactly one of --to-earliest, --to-latest, --to-offset, --to-datetime")
    kwargs = {}
    if to_offset is not None:
        to, kwargs["offset"] = "offset", to_offset
    elif to_datetime:
        try:
            when = datetime.datetime.fromisoformat(to_datetime.replace("Z", "+00:00"))
        except ValueError:
            raise click.BadParameter(f"{to_datetime!r} is not an ISO-8601 time", param_hint="--to-datetime") from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.timezone.utc)
        to, kwargs["timestamp_ms"] = "timestamp", int(when.timestamp() * 1000)
    with target.client("groups reset-offsets") as client:
        rows = client.reset_offsets(group, topic, to, partitions=partitions or None, dry_run=not execute, **kwargs)
    click.echo(_table(["TOPIC", "PARTITION", "CURRENT", "NEW"],
                      [[r["topic"], r["partition"], r["current"], r["new"]] for r in rows]))
    if not execute:
        click.echo("dry run: nothing written; add --execute to apply", err=True)


# --------------------------------------------------------------------------
# audit


def _utc(ms: int) -> str:
    """A window start (ms since the epoch) as UTC time."""
    text = datetime.datetime.fromtimestamp(ms // 1000, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    return f"{text}.{ms % 1000:03d}" if ms % 1000 else text


def _width(ms: int) -> str:
    if ms % 60_000 == 0:
        return f"{ms // 60_000}m"
    if ms % 1000 == 0:
        return f"{ms // 1000}s"
    return f"{ms}ms"


@cli.command()
@click.option("--topic", "-t", required=True, help="The topic to audit.")
@click.option("--group", "-g",
              help="Only this consumer group (default: every group that read the topic with auditing on).")
@pass_target
def audit(target: Target, topic, group):
    """Compare, per time window, the messages producers sent to TOPIC with
    what each consumer group received, from the counts that producers and
    consumers with auditing on publish to the audit topic. Prints a table
    (window start in UTC, width, produced, consumed per group, status) and
    exits with 1 when any window fell short: a group received fewer
    messages than were produced in it (more is fine: delivery is
    at-least-once). Joins the Ray cluster (see --ray-address): it flushes
    the audit topic's partition first, so the latest counts are in."""
    from raylog.errors import UnknownTopicError

    with target.client("audit", ray=True) as client:
        rows = client.audit(topic=topic, group=group)
        if not rows:
            if topic not in client.list_topics():
                raise UnknownTopicError(f"no topic {topic!r} and no audit counts for it; check the name (topics list)")
            click.echo(
                f"no audit counts for {topic} yet: producers and consumers publish them only with "
                f"audit=True, every audit_interval_ms and when they close",
                err=True,
            )
            return
    groups = list(rows[0]["consumed"])
    if not groups:
        click.echo(f"note: no consumer group with auditing on has read {topic}; nothing to compare", err=True)
    several = len(groups) > 1
    table = [
        [_utc(r["window_start"]), _width(r["window_ms"]), r["produced"], *(r["consumed"][g] for g in groups),
         ("SHORT: " + ",".join(r["short"]) if several else "SHORT") if r["short"] else "ok"]
        for r in rows
    ]
    click.echo(_table(["WINDOW START (UTC)", "WIDTH", "PRODUCED", *(f"CONSUMED:{g}" for g in groups), "STATUS"],
                      table))
    short = [r for r in rows if r["short"]]
    if short:
        named = "; ".join(
            f"{_utc(r['window_start'])} ("
            + ", ".join(f"{g} consumed {r['consumed'][g]} of {r['produced']}" for g in r["short"]) + ")"
            for r in short[:3]
        )
        more = f"; and {len(short) - 3} more" if len(short) > 3 else ""
        raise CommandError(
            f"{len(short)} of {len(rows)} windows of {topic} fell short: {named}{more}"
        )


# --------------------------------------------------------------------------
# the autoscaled benchmark


def _phases(ctx, param, value):
    from raylog.tools.bench import parse_phases

    try:
        return parse_phases(value)
    except ConfigError as err:
        raise click.BadParameter(str(err)) from None


@cli.command()
@click.option("--phases", default="1,2,3", show_default=True, metavar="N[,N...]", callback=_phases,
              help="Producer actors (and as many consumer tasks) of each phase; each asks for one CPU.")
@click.option("--phase-seconds", type=click.FloatRange(min=5), default=30, show_default=True,
              help="How long each phase runs.")
@click.option("--partitions", type=click.IntRange(min=1), default=4, show_default=True,
              help="Partitions of the benchmark topic.")
@click.option("--disk-nodes", type=click.IntRange(min=1), default=2, show_default=True,
              help="Disk nodes to ask the autoscaler for; the topic is spread over them.")
@click.option("--message-bytes", type=click.IntRange(1, 65536), default=100, show_default=True,
              help="Size of each message's value.")
@click.option("--scale-down-timeout-s", type=click.FloatRange(min=0), default=180, show_default=True,
              help="How long to wait, after the load, for the added nodes to be removed.")
@click.option("--start-timeout-s", type=click.FloatRange(min=1), default=300, show_default=True,
              help="How long to wait for the cluster and its disk nodes.")
@click.option("--json-only", is_flag=True, help="Print only the JSON lines, no table.")
@pass_target
def bench(target: Target, phases, phase_seconds, partitions, disk_nodes, message_bytes, scale_down_timeout_s,
          start_timeout_s, json_only):
    """Benchmark throughput while the autoscaler adds nodes, then watch it
    remove them. In phases, asks for more producer actors and consumer
    tasks (one CPU each) than the cluster holds; each phase reports the
    nodes alive and producer and consumer messages per second; after the
    load, waits until the added nodes are gone. Prints JSON lines (phases
    and node events) and a table; a progress bar on stderr meanwhile.

    Without --zookeeper and --ray-address it starts a local autoscaling
    cluster for the run (deploy/local_cluster.py with bench/autoscale.yaml:
    Ray's fake multi-node provider, every node a set of processes of this
    machine) and stops it by PID at the end, also on error or Ctrl-C; with
    both, it runs on that cluster (which needs an autoscaler and disk node
    types). bench/autoscale.py takes the same options."""
    from raylog.tools import bench as benchmark

    if (target.zookeeper is None) != (target.ray_address is None):
        raise click.UsageError(
            "'bench' runs on a local cluster of its own, or on an existing one given by both "
            "--zookeeper HOST:PORT and --ray-address HOST:PORT; pass both or neither"
        )
    settings = benchmark.BenchSettings(
        phases=phases, phase_seconds=phase_seconds, partitions=partitions, disk_nodes=disk_nodes,
        message_bytes=message_bytes, scale_down_timeout_s=scale_down_timeout_s, start_timeout_s=start_timeout_s,
        zookeeper=target.zookeeper, ray_address=target.ray_address, cluster=target.cluster, token=target.token,
    )
    settings.validate()  # bad settings fail before any cluster starts
    try:
        rows = benchmark.run(settings)
    except (RaylogError, KeyboardInterrupt):
        raise
    except Exception as err:  # noqa: BLE001 - Ray's own errors, as one line
        if _refused_token(err):
            raise CommandError(
                f"the Ray cluster at {target.ray_address!r} refused this process: it requires token "
                f"authentication; export RAY_AUTH_MODE=token, with the cluster's token in ~/.ray/auth_token"
            ) from None
        detail = str(err).strip().splitlines()
        raise CommandError(
            f"the benchmark failed ({type(err).__name__}: {detail[-1] if detail else 'no details'})"
        ) from None
    if not json_only:
        click.echo(benchmark.format_table(rows))


# --------------------------------------------------------------------------
# a local ZooKeeper


@cli.group()
def zookeeper():
    """Start and stop a local ZooKeeper (on 127.0.0.1) that outlives the command."""


def _pid_path(data_dir: str) -> str:
    return os.path.join(data_dir, ZOOKEEPER_PID_FILE)


def _read_pid(data_dir: str) -> int | None:
    try:
        with open(_pid_path(data_dir)) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except OSError:
        return True


def _is_our_zookeeper(pid: int) -> bool:
    """Whether ``pid`` runs 'raylog ... zookeeper start' (not a stranger that reused the PID)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().decode(errors="replace").split("\0")
    except OSError:
        return True  # no /proc here: trust the pid file
    return any("raylog" in a for a in args) and "zookeeper" in args and "start" in args


def _client_port(data_dir: str) -> int | None:
    from raylog.zk.server import CFG_NAME

    try:
        with open(os.path.join(data_dir, CFG_NAME)) as f:
            for line in f:
                if line.startswith("clientPort="):
                    return int(line.split("=", 1)[1])
    except (OSError, ValueError):
        pass
    return None


@zookeeper.command("start")
@click.option("--port", type=click.IntRange(0, 65535), default=2181, show_default=True,
              help="Port on 127.0.0.1 (0: any free port).")
@click.option("--data-dir", type=click.Path(file_okay=False), default=DEFAULT_ZOOKEEPER_DIR, show_default=True,
              help="Snapshots, logs, the configuration and the pid file.")
@click.option("--foreground", is_flag=True, help="Run in this process until SIGTERM or Ctrl-C.")
@click.option("--timeout-s", type=click.FloatRange(min=1), default=120, show_default=True,
              help="How long to wait for the server to accept clients.")
def zookeeper_start(port, data_dir, foreground, timeout_s):
    """Start a ZooKeeper on 127.0.0.1 that keeps running after this command
    (in a process of its own, detached); print its connect string and PID
    and write the PID to DATA_DIR/raylog-zookeeper.pid. Stop it with
    'raylog zookeeper stop --data-dir DATA_DIR'.

    It listens on the loopback interface only: for a single machine. A
    cluster's ZooKeeper must be reachable from every node; see deploy/."""
    data_dir = os.path.abspath(data_dir)
    running = _read_pid(data_dir)
    if running is not None and _alive(running) and _is_our_zookeeper(running) and running != os.getpid():
        raise CommandError(
            f"a ZooKeeper started by raylog already runs from {data_dir} (pid {running}); "
            f"stop it first with: raylog zookeeper stop --data-dir {data_dir}"
        )
    os.makedirs(data_dir, exist_ok=True)
    if foreground:
        _run_zookeeper(port, data_dir, timeout_s)
        return
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_pid_path(data_dir))
    log_path = os.path.join(data_dir, ZOOKEEPER_LOG_FILE)
    cmd = [sys.executable, "-m", "raylog.tools.cli", "zookeeper", "start", "--foreground",
           "--port", str(port), "--data-dir", data_dir, "--timeout-s", str(timeout_s)]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            cwd=data_dir, start_new_session=True, close_fds=True,
        )
    deadline = time.monotonic() + timeout_s + 10
    while _read_pid(data_dir) != proc.pid:
        if proc.poll() is not None:
            raise CommandError(f"ZooKeeper did not start: {_last_error(log_path)} (see {log_path})")
        if time.monotonic() > deadline:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise CommandError(f"ZooKeeper did not start within {timeout_s:g} s (see {log_path})")
        time.sleep(0.1)
    click.echo(f"ZooKeeper running at 127.0.0.1:{_client_port(data_dir)} (pid {proc.pid}, data dir {data_dir})")
    click.echo(f"stop it with: raylog zookeeper stop --data-dir {data_dir}", err=True)


def _last_error(log_path: str) -> str:
    try:
        with open(log_path, errors="replace") as f:
            lines = [line.rstrip() for line in f if line.strip()]
    except OSError:
        return "no output"
    errors = [line for line in lines if line.startswith("error:")]
    if errors:
        return errors[-1][len("error:"):].strip()
    return lines[-1] if lines else "no output"


def _run_zookeeper(port: int, data_dir: str, timeout_s: float) -> None:
    """The detached process of 'zookeeper start': run the server until told to stop."""
    from raylog.zk.server import EmbeddedZooKeeper

    def stop_on_signal(signum, frame):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop_on_signal)
    server = EmbeddedZooKeeper(data_dir=data_dir, port=port or None, start_timeout_s=timeout_s)
    pid_path = _pid_path(data_dir)
    try:
        server.start()
        tmp = f"{pid_path}.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(f"{os.getpid()}\n")
        os.replace(tmp, pid_path)  # written last: the starter waits for it
        click.echo(f"ZooKeeper running at {server.connect_string} (pid {os.getpid()}, java pid {server.pid})")
        sys.stdout.flush()
        while server.running:
            time.sleep(0.5)
        raise CommandError(f"the ZooKeeper server process exited; see {server.log_path}")
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
        if _read_pid(data_dir) == os.getpid():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(pid_path)


@zookeeper.command("stop")
@click.option("--data-dir", type=click.Path(file_okay=False), default=DEFAULT_ZOOKEEPER_DIR, show_default=True,
              help="The data dir the ZooKeeper was started with.")
@click.option("--timeout-s", type=click.FloatRange(min=1), default=30, show_default=True,
              help="How long to wait for a clean stop before killing it.")
def zookeeper_stop(data_dir, timeout_s):
    """Stop the ZooKeeper that 'zookeeper start' runs from DATA_DIR, by the
    PID in its pid file."""
    data_dir = os.path.abspath(data_dir)
    pid = _read_pid(data_dir)
    if pid is None:
        raise CommandError(f"no ZooKeeper started by raylog runs from {data_dir} (no {_pid_path(data_dir)})")
    if not _alive(pid):
        os.unlink(_pid_path(data_dir))
        raise CommandError(f"the ZooKeeper of {data_dir} (pid {pid}) is not running; removed its stale pid file")
    if not _is_our_zookeeper(pid):
        raise CommandError(
            f"pid {pid} from {_pid_path(data_dir)} is not a ZooKeeper started by raylog; not stopping it "
            f"(remove the stale pid file if that ZooKeeper is gone)"
        )
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _alive(pid):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)  # its server process dies with it
            break
        time.sleep(0.1)
    with contextlib.suppress(FileNotFoundError):
        if _read_pid(data_dir) == pid:
            os.unlink(_pid_path(data_dir))
    click.echo(f"Stopped ZooKeeper (pid {pid}).")


# --------------------------------------------------------------------------
# entry point


# --------------------------------------------------------------------------
# the fault checker


@cli.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True}, add_help_option=False)
@click.pass_context
def faults(ctx):
    """Run the fault checker: producers and a consumer group under seeded
    faults, then Jepsen-style checks of the whole history (raylog faults
    --help for its options: --duration, --seed, --faults, --out ...).
    Starts its own ZooKeeper and Ray cluster; exit code 1 on an anomaly."""
    from raylog.testing.runner import main as run_faults

    ctx.exit(run_faults(ctx.args))


def run(argv: list[str] | None = None) -> int:
    """Run the command line with ``argv``; return the exit code."""
    try:
        result = cli.main(args=argv, prog_name="raylog", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except KeyboardInterrupt:
        return 130
    except click.ClickException as err:
        err.show()
        return err.exit_code
    except ConfigError as err:
        _fail(err)
        return 2
    except RaylogError as err:
        _fail(err)
        return 1
    return result if isinstance(result, int) else 0


def main() -> None:
    """The ``raylog`` console script."""
    sys.exit(run())


if __name__ == "__main__":
    main()
