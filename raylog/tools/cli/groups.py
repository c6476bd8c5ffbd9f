"""``raylog groups ...``: list, describe, delete consumer groups, reset their
committed offsets and delete some of them."""

from __future__ import annotations

import datetime

import click

from raylog.tools.cli.base import echo_names, Target, echo_json, json_option, pass_target, format_table, cli


@cli.group()
def groups():
    """List, describe, delete consumer groups and reset their offsets."""


@groups.command("list")
@json_option
@pass_target
def groups_list(target: Target, as_json):
    """List the consumer groups (with live members or committed offsets),
    one per line (--json: a JSON list of names)."""
    with target.client("groups list") as client:
        names = client.list_groups()
    echo_names(names, as_json)


@groups.command("describe")
@click.argument("group")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.1), default=5.0, show_default=True,
              help="Seconds to wait, in all, for the partitions' ends (unanswered ones show '-').")
@json_option
@pass_target
def groups_describe(target: Target, group, timeout_s, as_json):
    """Show, per partition group GROUP reads: the owning member, the
    committed offset, the end offset (high watermark), the lag in bytes and
    the lag in messages, counted by the partition (where a count could not
    be made, an estimate marked '~': bytes divided by the mean size of the
    messages at the committed offset); then members that own nothing.
    --json: a JSON list with one object per row (unknown values null)."""
    with target.client("groups describe") as client:
        rows = client.describe_group(group, timeout_s=timeout_s)
    if as_json:
        echo_json(rows)
        return
    table = [
        [r["topic"] if r.get("topic_exists", True) is not False else f"{r['topic']} (deleted)", r["partition"],
         r["owner"], r.get("committed"), r.get("end_offset"), r.get("lag_bytes"), _lag_messages(r)]
        for r in rows
    ]
    click.echo(format_table(["TOPIC", "PARTITION", "OWNER", "COMMITTED", "END OFFSET", "LAG (BYTES)",
                       "LAG (MESSAGES)"], table))


def _lag_messages(row: dict):
    """The counted lag, else the estimate marked '~', else None."""
    if row.get("lag_messages") is not None:
        return row["lag_messages"]
    return None if row.get("lag_messages_estimate") is None else f"~{row['lag_messages_estimate']}"


@groups.command("delete")
@click.argument("group")
@pass_target
def groups_delete(target: Target, group):
    """Delete consumer group GROUP and its committed offsets (refused while
    it has live members)."""
    with target.client("groups delete") as client:
        client.delete_group(group)
    click.echo(f"Deleted consumer group {group}.")


@groups.command("delete-offsets")
@click.argument("group")
@click.option("--topic", "-t", required=True, help="The topic whose committed offsets go.")
@click.option("--partition", "-p", "partitions", type=click.IntRange(min=0), multiple=True,
              help="Only this partition (repeatable; default: every partition of the topic).")
@pass_target
def groups_delete_offsets(target: Target, group, topic, partitions):
    """Delete GROUP's committed offsets of a topic (Kafka's
    --delete-offsets): its consumers then start those partitions from their
    auto_offset_reset. Refused while a live member reads the topic."""
    with target.client("groups delete-offsets") as client:
        chosen = partitions or range(client.describe_topic(topic)["config"].partitions)
        deleted = client.delete_group_offsets(group, {(topic, p) for p in chosen})
    click.echo(format_table(["TOPIC", "PARTITION"], [[t, p] for t, p in deleted]))


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
    click.echo(format_table(["TOPIC", "PARTITION", "CURRENT", "NEW"],
                      [[r["topic"], r["partition"], r["current"], r["new"]] for r in rows]))
    if not execute:
        click.echo("dry run: nothing written; add --execute to apply", err=True)
