"""``raylog nodes ...``: drain a disk node before it stops, restart the disk
nodes one at a time (docs/howto/operating.md)."""

from __future__ import annotations

import click

from raylog.tools.cli.base import CommandError, Target, echo_json, format_table, cli, json_option, pass_target


@cli.group()
def nodes():
    """Drain disk nodes and restart them without downtime."""


@nodes.command("drain")
@click.argument("node")
@click.option("--timeout-s", type=click.FloatRange(min=1), default=60, show_default=True,
              help="How long to wait for the node's partitions to be in sync elsewhere first.")
@json_option
@pass_target
def nodes_drain(target: Target, node, timeout_s, as_json):
    """Prepare disk node NODE to stop (Kafka's controlled shutdown): every
    partition it leads is handed to an in-sync replica elsewhere (no
    failover: producers are redirected at once), then it leaves every ISR
    until it restarts. Prints what moved and whether NODE can stop; exits
    with 1 when it cannot (the reason per partition). Joins the Ray
    cluster (see --ray-address)."""
    with target.client("nodes drain", ray=True) as client:
        report = client.drain_node(node, timeout_s=timeout_s)
    if as_json:
        echo_json(report)
    else:
        click.echo(format_table(["TOPIC", "PARTITION", "NEW LEADER", "EPOCH", "LEADERLESS S"],
                          [[m["topic"], m["partition"], m["leader"], m["leader_epoch"],
                            None if m["leaderless_s"] is None else f"{m['leaderless_s']:.3f}"]
                           for m in report["leaders_moved"]]))
        click.echo(f"{node}: {len(report['leaders_moved'])} leads handed off, left "
                   f"{len(report['followers_shed'])} ISRs; {'can stop now' if report['can_stop'] else 'cannot stop'}")
    if not report["can_stop"]:
        named = "; ".join(f"{b['topic']}-{b['partition']}: {b['reason']}" for b in report["blocked"][:5])
        raise CommandError(f"{node} cannot stop yet: {named}")


@nodes.command("restart")
@click.option("--rolling", is_flag=True, required=True,
              help="One node at a time: drain, restart, wait until its replicas are in sync again.")
@click.option("--node", "names", multiple=True, help="Only these disk nodes (repeatable; default: every one).")
@click.option("--timeout-s", type=click.FloatRange(min=1), default=300, show_default=True,
              help="How long each node may take to drain and to come back in sync.")
@click.option("--balance/--no-balance", default=True, show_default=True,
              help="Hand the leads back to the preferred replicas at the end.")
@pass_target
def nodes_restart(target: Target, rolling, names, timeout_s, balance):
    """Restart the raylog processes of every disk node, one node at a time,
    with no producer noticing: each node is drained, its partition actors
    are shut down and started again in new processes, and the next node
    waits until the node's replicas are all in sync again. Prints one row
    per node. Joins the Ray cluster (see --ray-address)."""

    def step(node, what, detail):
        click.echo(f"{node}: {what}", err=True)

    with target.client("nodes restart", ray=True) as client:
        rows = client.rolling_restart(list(names) or None, timeout_s=timeout_s, on_step=step)
        balanced = client.balance_leaders() if balance else None
    click.echo(format_table(["NODE", "LEADS MOVED", "LONGEST LEADERLESS S", "RESTART S", "IN SYNC AFTER S"],
                      [[r["node"], r["leaders_moved"], r["longest_leaderless_s"], r["restart_s"],
                        r["whole_after_s"]] for r in rows]))
    if balanced is not None:
        click.echo("leaders per node: " + ", ".join(f"{n}={c}" for n, c in sorted(balanced["leaders_after"].items())))
