"""``raylog topics ...`` and ``raylog supervisor start``: create, alter, add
partitions to, list, describe, repair and delete topics."""

from __future__ import annotations

import dataclasses
import datetime

import click

from raylog.config import CLEANUP_POLICIES, TopicConfig
from raylog.errors import ConfigError
from raylog.tools.cli.base import echo_names, CommandError, Target, echo_json, json_option, pass_target, format_table, cli


@cli.group()
def topics():
    """Create, alter, grow, list, describe, reassign, repair and delete topics."""

@topics.command("create")
@click.argument("name")
@click.option("--partitions", "-p", type=int, default=1, show_default=True, help="Number of partitions.")
@click.option("--retention-ms", type=int, help="Delete whole segments older than this (default 7 days).")
@click.option("--retention-bytes", type=int, help="Delete the oldest segments while the log is larger (-1: no limit).")
@click.option("--segment-bytes", type=int, help="Start a new segment file after this many bytes (default 256 MiB).")
@click.option("--flush-ms", type=int, help="Flush (fsync) and expose appended messages after this long (default 50).")
@click.option("--flush-messages", type=int, help="... or after this many messages (default 10000).")
@click.option("--max-message-bytes", type=int, help="The largest message set a partition accepts (default 1 MiB).")
@click.option("--replication-factor", type=int, help="Replicas per partition, each on its own disk node (default 1).")
@click.option("--min-insync-replicas", type=int,
              help="The fewest in-sync replicas with which acks=all is accepted (default 1).")
@click.option("--replica-lag-ms", type=int, help="A follower behind for this long leaves the ISR (default 10000).")
@click.option("--replica-replace-after-s", type=int,
              help="Move a replica whose node is gone this long to a spare disk node (default 600; 0: never).")
@click.option("--unclean-leader-election/--no-unclean-leader-election", default=None,
              help="Let a replica outside the ISR lead when every in-sync replica is gone (loses data; off by default).")
@click.option("--cleanup-policy", type=click.Choice(CLEANUP_POLICIES + ("delete,compact",)),
              help="delete (default): retention drops old segments; compact: keep the latest record of each key "
                   "(records need a key); compact,delete: both.")
@click.option("--delete-retention-ms", type=int,
              help="On a compacted topic, how long a tombstone is kept after its segment was cleaned (default 1 day).")
@click.option("--min-compaction-lag-ms", type=int, help="The cleaner never touches records younger than this (default 0).")
@click.option("--max-compaction-lag-ms", type=int,
              help="A record older than this is cleaned whatever the dirty ratio (default: never forced).")
@click.option("--min-cleanable-dirty-ratio", type=float,
              help="Clean once this share of the cleanable log is dirty, in (0, 1] (default 0.5).")
@click.option(
    "--data-dir",
    envvar="RAYLOG_DATA_DIR",
    show_envvar=True,
    help="Directory for the partition logs on each node (default ~/.local/share/raylog, or "
    "$XDG_DATA_HOME/raylog; a temporary "
    "directory for the embedded cluster).",
)
@pass_target
def topics_create(target: Target, name, partitions, data_dir, **settings):
    """Create topic NAME and start its partition actors, spread over the
    nodes that offer disk (joins the Ray cluster: see --ray-address)."""
    settings = {k: v for k, v in settings.items() if v is not None}

    TopicConfig(partitions=partitions, **settings)  # bad settings fail before any connection
    with target.client("topics create", ray=True, embedded_ok=True, data_dir=data_dir) as client:
        client.create_topic(name, partitions=partitions, **settings)
        click.echo(f"Created topic {name} with {partitions} partition{'s' if partitions != 1 else ''}.")


def _setting_value(name: str, text: str):
    """The value of TopicConfig field ``name`` written as ``text`` (its
    type's); an unknown name's text as it is (``alter_topic`` refuses it,
    listing the settings it takes)."""
    field = {f.name: f for f in dataclasses.fields(TopicConfig)}.get(name)
    if field is None:
        return text
    kind = type(field.default)
    if kind is bool:
        if text.lower() not in ("true", "false"):
            raise ConfigError(f"{name}={text}: use true or false")
        return text.lower() == "true"
    if kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            raise ConfigError(f"{name}={text}: {'an integer' if kind is int else 'a number'} is expected") from None
    return text


@topics.command("alter")
@click.argument("name")
@click.option("--set", "assignments", multiple=True, metavar="SETTING=VALUE",
              help="A setting to change (repeatable), by its raylog name (cleanup_policy, retention_ms, "
                   "min_cleanable_dirty_ratio, ...; '-' may stand for '_').")
@click.option("--reset", "resets", multiple=True, metavar="SETTING",
              help="A setting to set back to raylog's default (repeatable).")
@json_option
@pass_target
def topics_alter(target: Target, name, assignments, resets, as_json):
    """Change settings of the live topic NAME (as client.alter_topic): its
    partition actors take them within moments, without a restart; turned
    to cleanup_policy=compact, each partition's cleaner starts. Settings
    fixed when a topic is made (partitions, replication_factor,
    max_message_bytes, ...) are refused saying why; a bad value is refused
    naming the setting (exit 2), and nothing changes. Prints the settings
    that changed (--json: the whole new config)."""
    if not assignments and not resets:
        raise click.UsageError("give at least one --set SETTING=VALUE or --reset SETTING")
    settings = {}
    for assignment in assignments:
        key, sep, text = assignment.partition("=")
        if not sep or not key.strip():
            raise click.UsageError(f"--set takes SETTING=VALUE, got {assignment!r}")
        key = key.strip().replace("-", "_")
        settings[key] = _setting_value(key, text.strip())
    defaults = TopicConfig()
    for key in resets:
        key = key.strip().replace("-", "_")
        settings[key] = getattr(defaults, key, None)  # an unknown name is refused by alter_topic
    with target.client("topics alter") as client:
        before = client.describe_topic(name)["config"]
        config = client.alter_topic(name, **settings)
    if as_json:
        echo_json(dataclasses.asdict(config))
        return
    changed = [f"{k}={getattr(config, k)}" for k in sorted(settings) if getattr(before, k) != getattr(config, k)]
    click.echo(f"Altered topic {name}: {', '.join(changed)}." if changed else f"Topic {name} already had these settings.")


@topics.command("add-partitions")
@click.argument("name")
@click.option("--partitions", "-p", type=int, required=True,
              help="The new partition count (the total, larger than now; as Kafka's kafka-topics --alter).")
@click.option("--timeout-s", type=float, default=120.0, show_default=True,
              help="How long to wait for the new partitions' actors to start.")
@pass_target
def topics_add_partitions(target: Target, name, partitions, timeout_s):
    """Grow the live topic NAME to --partitions partitions (as
    client.add_partitions): the new ones are placed, recorded and served
    with the topic's settings, and producers and consumer groups take the
    new count at once. Keys then map to other partitions than before (a
    key's older messages stay where they are). A count not larger than
    now is refused naming the count (exit 2), and nothing changes."""
    with target.client("topics add-partitions", ray=True) as client:
        before = client.metadata.partitions(name)
        client.add_partitions(name, partitions, timeout_s=timeout_s)
    click.echo(f"Topic {name} now has {partitions} partitions (partitions {before}..{partitions - 1} added).")


@topics.command("delete-records")
@click.argument("name")
@click.option("--partition", "-p", type=int, required=True, help="The partition whose records go.")
@click.option("--offset", "-o", type=int, required=True,
              help="Delete the records before this offset (-1: the high watermark, everything readable).")
@click.option("--timeout-s", type=float, default=30.0, show_default=True,
              help="How long to wait for the partition's leader.")
@pass_target
def topics_delete_records(target: Target, name, partition, offset, timeout_s):
    """Delete the records of partition --partition of topic NAME before
    --offset (as client.delete_records; Kafka's kafka-delete-records): the
    partition's log start moves there, inside a segment too, and is kept
    on disk; consumers from earliest start there. The start never moves
    back. An offset past the high watermark is refused naming the bounds
    (exit 1) and nothing is deleted."""
    with target.client("topics delete-records", ray=True) as client:
        start = client.delete_records(name, {partition: offset}, timeout_s=timeout_s)[partition]
    click.echo(f"Partition {name}-{partition} now starts at offset {start} (the records before it are deleted).")


@topics.command("list")
@json_option
@pass_target
def topics_list(target: Target, as_json):
    """List the topics, one per line (--json: a JSON list of names)."""
    with target.client("topics list", embedded_ok=True) as client:
        names = client.list_topics()
    echo_names(names, as_json)


@topics.command("describe")
@click.argument("name")
@json_option
@pass_target
def topics_describe(target: Target, name, as_json):
    """Show topic NAME's settings and, per partition, its node, state
    ('serving' or 'NOT SERVED'), endpoint, log start offset and high
    watermark ('-' where a partition is not served right now). A partition
    not served is served again by the cluster's supervisor within seconds,
    or at once by 'raylog topics repair NAME'. For a replicated topic a
    second table shows each partition's leader, leader epoch, replicas,
    in-sync replicas (ISR), each replica's log end, and marks the
    partitions whose ISR is smaller than their replicas UNDER-REPLICATED.
    For a compacted topic a table shows each partition's cleaner: its
    dirty ratio (the dirty share of the cleanable log, compared with
    min_cleanable_dirty_ratio), its last pass (UTC), passes and bytes
    removed since the partition started ('-': the actor did not answer).
    --json: one object {"topic", "config", "partitions": [...]}, a
    partition not served with null endpoint and offsets, a compacted
    topic's partitions with "cleaner"."""
    with target.client("topics describe") as client:
        info = client.describe_topic(name)
    config = info["config"]
    if (config.replication_factor > 1 or config.compacted) and target.ray_address is not None:
        # Each replica's log end and each cleaner's state come from the actors: join Ray to ask
        # (else shown as '-').
        with target.client("topics describe", ray=True) as client:
            info = client.describe_topic(name)
    if as_json:
        echo_json({"topic": name, **info})
        return
    config = info["config"]
    click.echo(
        f"Topic: {name}  partitions: {config.partitions}  retention_ms: {config.retention_ms}  "
        f"retention_bytes: {config.retention_bytes}  segment_bytes: {config.segment_bytes}  "
        f"flush_messages: {config.flush_messages}  flush_ms: {config.flush_ms}  "
        f"max_message_bytes: {config.max_message_bytes}  cleanup_policy: {config.cleanup_policy}"
        + (f"  replication_factor: {config.replication_factor}  min_insync_replicas: "
           f"{config.min_insync_replicas}" if config.replication_factor > 1 else "")
    )
    rows = [
        [p["partition"], p["node"], "serving" if p["served"] else "NOT SERVED", p["endpoint"],
         p["log_start_offset"], p["high_watermark"]]
        for p in info["partitions"]
    ]
    click.echo(format_table(["PARTITION", "NODE", "STATE", "ENDPOINT", "LOG START", "HIGH WATERMARK"], rows))
    if config.replication_factor > 1:
        click.echo(_replicas_table(info["partitions"]))
    if config.compacted:
        click.echo(_cleaner_table(info["partitions"]))
    under = sum(1 for p in info["partitions"] if p.get("under_replicated"))
    if under:
        click.echo(
            f"{under} of {len(rows)} partitions under-replicated (fewer in-sync replicas than replicas): a "
            f"follower whose node is back catches up and rejoins; a node that is gone needs adding back",
            err=True,
        )
    unserved = sum(1 for p in info["partitions"] if not p["served"])
    if unserved:
        click.echo(
            f"{unserved} of {len(rows)} partitions not served: the cluster's supervisor serves them again "
            f"when their nodes are alive; to do it now: raylog topics repair {name}",
            err=True,
        )


def _cleaner_table(partitions: list[dict]) -> str:
    """Per partition of a compacted topic: the cleaner's dirty ratio, last
    pass (UTC), passes, bytes and records removed, whether it runs."""
    rows = []
    for p in partitions:
        state = p.get("cleaner") or {}
        last = state.get("last_run_ms")
        rows.append([
            p["partition"],
            None if state.get("dirty_ratio") is None else f"{state['dirty_ratio']:.3f}",
            None if last is None else datetime.datetime.fromtimestamp(last / 1000, datetime.timezone.utc)
            .strftime("%Y-%m-%dT%H:%M:%SZ"),
            state.get("passes"), state.get("bytes_removed"), state.get("records_removed"),
            None if not state else ("running" if state.get("running") else
                                     f"STOPPED ({state['failure']})" if state.get("failure") else "STOPPED"),
        ])
    return format_table(["PARTITION", "DIRTY_RATIO", "LAST_RUN", "PASSES", "BYTES_REMOVED", "RECORDS_REMOVED",
                         "CLEANER"], rows)


def _replicas_table(partitions: list[dict]) -> str:
    """Per partition of a replicated topic: leader, leader epoch, replicas,
    in-sync replicas, each replica's log end ('-': it did not answer) and
    'UNDER-REPLICATED' when the ISR is smaller than the replicas."""
    rows = []
    for p in partitions:
        ends = p.get("replica_log_end_offsets") or {}
        rows.append([
            p["partition"], p.get("leader"), p.get("leader_epoch"), ",".join(p.get("replicas") or []) or None,
            ",".join(p.get("isr") or []) or None,
            ",".join(f"{node}={'-' if end is None else end}" for node, end in ends.items()) or None,
            "UNDER-REPLICATED" if p.get("under_replicated") else "ok",
        ])
    return format_table(["PARTITION", "LEADER", "EPOCH", "REPLICAS", "ISR", "REPLICA_LOG_ENDS", "REPLICATION"], rows)


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
    click.echo(format_table(["TOPIC", "PARTITION", "NODE", "STATE", "DETAIL"],
                      [[r["topic"], r["partition"], r["node"], r["state"], r["detail"] or None] for r in rows]))
    bad = [r for r in rows if r["state"] not in ("serving", "started", "removed")]
    if bad:
        named = ", ".join(f"{r['topic']}-{r['partition']} ({r['state']})" for r in bad[:5])
        raise CommandError(f"{len(bad)} partitions not repaired: {named}{' ...' if len(bad) > 5 else ''}")


@topics.command("reassign")
@click.argument("name")
@click.option("--partition", "-p", "partitions", type=int, multiple=True,
              help="The partition to reassign (repeatable; default with --replace: every partition).")
@click.option("--replicas", help="The target disk nodes, comma-separated, as many as the replication factor.")
@click.option("--replace", "replace", help="OLD=NEW: in every partition (or those of --partition) holding a "
              "replica on node OLD, move it to node NEW.")
@click.option("--timeout-s", type=click.FloatRange(min=1), default=120, show_default=True,
              help="How long each partition's new replicas may take to catch up.")
@pass_target
def topics_reassign(target: Target, name, partitions, replicas, replace, timeout_s):
    """Move the replicas of topic NAME's partitions to other disk nodes
    (as Kafka's kafka-reassign-partitions). Either --replicas a,b,c (with
    --partition P) or --replace old=new. New replicas start as followers
    and catch up; once they are in sync the partition's replicas become the
    target, the lead moves to a target replica when the leader is not one
    (a new leader epoch, as after a failover), and the replicas that go stop
    and their logs are removed (when their node is down: by the cluster's
    supervisor once it is back). Refused, with nothing changed, for a topic
    that is not replicated or target nodes that are not distinct alive disk
    nodes. Prints the new leader, epoch, replicas and ISR per partition.
    Joins the Ray cluster (see --ray-address)."""
    if (replicas is None) == (replace is None):
        raise click.UsageError("give either --replicas a,b,c (with --partition) or --replace old=new")
    if replicas is not None and len(partitions) != 1:
        raise click.UsageError("--replicas needs exactly one --partition")
    if replace is not None and replace.count("=") != 1:
        raise click.UsageError("--replace takes OLD=NEW (two node names)")
    with target.client("topics reassign", ray=True) as client:
        if replicas is not None:
            plan = {partitions[0]: [n.strip() for n in replicas.split(",") if n.strip()]}
        else:
            old, new = (n.strip() for n in replace.split("="))
            rows = client.describe_topic(name)["partitions"]
            plan = {row["partition"]: [new if n == old else n for n in row.get("replicas") or []]
                    for row in rows if (not partitions or row["partition"] in partitions)
                    and old in (row.get("replicas") or [])}
            if not plan:
                raise CommandError(f"no partition of {name} has a replica on {old}")
        done = []
        for p, nodes in sorted(plan.items()):
            state = client.reassign_partition(name, p, nodes, timeout_s=timeout_s)
            done.append([p, state["leader"], state["leader_epoch"], ",".join(state["replicas"]),
                         ",".join(state["isr"])])
    click.echo(format_table(["PARTITION", "LEADER", "EPOCH", "REPLICAS", "ISR"], done))


@topics.command("balance-leaders")
@click.argument("names", nargs=-1)
@click.option("--timeout-s", type=click.FloatRange(min=1), default=10, show_default=True,
              help="How long each handoff may take.")
@pass_target
def topics_balance_leaders(target: Target, names, timeout_s):
    """Hand each partition's lead back to its preferred replica (the first
    of its replicas) where that one runs and is in sync, so that every disk
    node leads its share again (after restarts, drains, failovers). Of the
    topics NAMES, default every topic. Prints the partitions moved and the
    leaders per node before and after; exits with 1 when a handoff failed.
    Joins the Ray cluster (see --ray-address)."""
    with target.client("topics balance-leaders", ray=True) as client:
        result = client.balance_leaders(list(names) or None, timeout_s=timeout_s)
    click.echo(format_table(["TOPIC", "PARTITION", "LEADER", "EPOCH"],
                      [[m["topic"], m["partition"], m["leader"], m["leader_epoch"]] for m in result["moved"]]))
    click.echo("leaders per node: " + ", ".join(f"{n}: {result['leaders_before'][n]} -> {c}"
                                                for n, c in sorted(result["leaders_after"].items())))
    if result["failed"]:
        named = "; ".join(f"{f['topic']}-{f['partition']}: {f['error']}" for f in result["failed"][:5])
        raise CommandError(f"{len(result['failed'])} leads not moved: {named}")


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
