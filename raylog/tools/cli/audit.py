"""``raylog audit``: the paper's audit check (messages produced vs consumed per
time window) as a table; ``raylog audit compare``: a mirrored topic counted
per window in its source cluster and in this one, side by side."""

from __future__ import annotations

import datetime

import click

from raylog.errors import UnknownTopicError
from raylog.tools.cli.base import CommandError, Target, pass_target, format_table, cli


@cli.group(invoke_without_command=True)
@click.option("--topic", "-t", help="The topic to audit.")
@click.option("--group", "-g",
              help="Only this consumer group (default: every group that read the topic with auditing on).")
@click.pass_context
def audit(ctx, topic, group):
    """Compare, per time window, the messages producers sent to TOPIC with
    what each consumer group received, from the counts that producers and
    consumers with auditing on publish to the audit topic. Prints a table
    (window start in UTC, width, produced, consumed per group, status) and
    exits with 1 when any window fell short: a group received fewer
    messages than were produced in it (more is fine: delivery is
    at-least-once). Joins the Ray cluster (see --ray-address): it flushes
    the audit topic's partition first, so the latest counts are in.

    ``raylog audit compare``: a mirrored topic across two tiers (see its
    --help)."""
    if ctx.invoked_subcommand is not None:
        if topic or group:
            raise click.UsageError("--topic and --group belong after 'compare' (raylog audit compare --help)")
        return
    if not topic:
        raise click.UsageError("Missing option '--topic' / '-t'.")
    ctx.invoke(_audit_groups, topic=topic, group=group)


@pass_target
def _audit_groups(target: Target, topic, group):
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
    click.echo(format_table(["WINDOW START (UTC)", "WIDTH", "PRODUCED", *(f"CONSUMED:{g}" for g in groups), "STATUS"],
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



@audit.command("compare")
@click.option("--source-zookeeper", required=True, help="HOST:PORT of the source cluster's ZooKeeper.")
@click.option("--source-cluster", required=True, help="The source cluster's name.")
@click.option("--source-token-file", type=click.Path(exists=True, dir_okay=False),
              help="A file holding the source cluster's data token (default: derived, as inside its Ray cluster).")
@click.option("--topic", "-t", required=True, help="The topic in the source cluster.")
@click.option("--target-topic", help="Its name in this cluster (default: the same; a mirror's --rename may differ).")
@click.option("--window-ms", type=click.IntRange(min=1), default=60_000, show_default=True,
              help="The width of a window.")
@click.option("--until-ms", type=int, default=None,
              help="Compare windows that start before this time (ms since the epoch; default: the open window "
                   "is left out).")
@pass_target
def audit_compare(target: Target, source_zookeeper, source_cluster, source_token_file, topic, target_topic,
                  window_ms, until_ms):
    """Count TOPIC per time window (by the messages' timestamps) in the
    source cluster and its copy in this one, from their logs, and print
    them side by side: status ok, missing (this cluster holds fewer
    messages of the window) or extra (more: a duplicate). Exits with 1 when
    a window differs. Windows emptied by retention on either side and the
    window still open are left out; run it once the mirror has caught up
    (raylog mirror status: lag 0)."""
    from raylog.client import Client
    from raylog.mirror import compare_topic

    token = None
    if source_token_file:
        with open(source_token_file, "rb") as f:
            token = f.read().strip()
    with target.client("audit compare") as client:
        with Client(zookeeper=source_zookeeper, cluster=source_cluster, token=token) as source:
            for name, side in ((topic, source), (target_topic or topic, client)):
                if not side.registry.topic_exists(name):
                    raise UnknownTopicError(f"no topic {name!r} in cluster {side.settings.cluster!r}; check the "
                                            f"name (topics list)")
            rows = compare_topic(source, client, topic, target_topic, window_ms=window_ms, until_ms=until_ms)
    if not rows:
        click.echo(f"no closed window of {topic} to compare yet", err=True)
        return
    click.echo(format_table(["WINDOW START (UTC)", "WIDTH", "SOURCE", "TARGET", "STATUS"],
                      [[_utc(r["window_start"]), _width(r["window_ms"]), r["source"], r["target"], r["status"]]
                       for r in rows]))
    differ = [r for r in rows if r["status"] != "ok"]
    if differ:
        named = "; ".join(f"{_utc(r['window_start'])} ({r['status']}: source {r['source']}, target {r['target']})"
                          for r in differ[:3])
        more = f"; and {len(differ) - 3} more" if len(differ) > 3 else ""
        raise CommandError(f"{len(differ)} of {len(rows)} windows of {topic} differ between the tiers: {named}{more}")


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
