"""``raylog audit``: the paper's audit check (messages produced vs consumed per
time window) as a table."""

from __future__ import annotations

import datetime

import click

from raylog.errors import UnknownTopicError
from raylog.tools.cli.base import CommandError, Target, pass_target, _table, cli


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
