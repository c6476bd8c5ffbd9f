"""``raylog pool status GROUP``: a consumer pool (``client.consumer_pool``)
seen from any machine of its Ray cluster.

How the pool is found: its controller is a named Ray actor,
``pool:<cluster>:<group>`` in the Ray namespace ``raylog-pool``
(:mod:`raylog.pool.spec`); the command joins the Ray cluster
(``--ray-address``, default ``auto``) and asks that actor, so it needs the
global options of the cluster (``--zookeeper``, ``--cluster``) and a pool
that runs (else exit code 1: no consumer pool of that group runs)."""

from __future__ import annotations

import click

from raylog.pool import PoolHandle
from raylog.tools.cli.base import Target, echo_json, format_table, cli, json_option, pass_target


@cli.group()
def pool():
    """Consumer pools: consumer groups whose members are Ray actors scaled by lag."""


def _seconds(value) -> str | None:
    return None if value is None else f"{value:.1f}"


@pool.command("status")
@click.argument("group")
@json_option
@pass_target
def pool_status(target: Target, group, as_json):
    """The pool of consumer group GROUP: its members and their partitions,
    and per partition the committed offset, the lag in bytes, messages and
    seconds, what was handled, and the handler's errors (a partition whose
    handler kept failing is shown as stopped, with its error)."""
    with target.client("pool status", ray=True) as client:
        status = PoolHandle(client.settings.cluster, group).status()
    if as_json:
        echo_json(status)
        return
    click.echo(f"pool {status['group']}: {status['member_count']} members (min {status['min_members']}, "
               f"max {status['max_members']}, autoscale {'on' if status['autoscale'] else 'off'}, target lag "
               f"{status['target_lag_s']} s); lag {_seconds(status['lag_s']) or '-'} s, "
               f"{status['processed_per_s']:.1f} messages/s")
    click.echo(format_table(["MEMBER", "STATE", "PARTITIONS", "HANDLED", "MSG/S", "REPLACED"],
                      [[m["index"], m["state"], ",".join(m["partitions"]) or None, m["handled"],
                        f"{m['processed_per_s']:.1f}", m["replaced"]] for m in status["members"]]))
    click.echo("")
    click.echo(format_table(["TOPIC", "PARTITION", "MEMBER", "COMMITTED", "END", "LAG (BYTES)", "LAG (MSGS)", "LAG (S)",
                       "HANDLED", "ERRORS", "STATE"],
                      [[r["topic"], r["partition"], r["member"], r["committed"], r["end"], r["lag_bytes"],
                        r["lag_messages"], _seconds(r["lag_s"]), r["handled"], r["errors"],
                        "stopped" if r["stopped"] else "consuming"] for r in status["partitions"]]))
    for r in status["partitions"]:
        if r["last_error"]:
            e = r["last_error"]
            state = "stopped at" if r["stopped"] else "last failure at"
            click.echo(f"{r['topic']}-{r['partition']}: {state} offset {e['offset']} after {e['failures']} "
                       f"failures: {e['error']}", err=True)
