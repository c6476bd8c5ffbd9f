"""``raylog bench``: the autoscaled benchmark on a local cluster of its own."""

from __future__ import annotations

import click

from raylog.errors import ConfigError, RaylogError
from raylog.tools import bench as benchmark
from raylog.tools.bench import parse_phases
from raylog.tools.cli.base import Target, pass_target, cli, ray_error


def _phases(ctx, param, value):

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
    cluster for the run (raylog.tools.local_cluster with its bench-autoscale.yaml:
    Ray's fake multi-node provider, every node a set of processes of this
    machine) and stops it by PID at the end, also on error or Ctrl-C; with
    both, it runs on that cluster (which needs an autoscaler and disk node
    types). bench/autoscale.py takes the same options."""

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
        raise ray_error(err, target.ray_address, "the benchmark failed", last_line=True) from None
    if not json_only:
        click.echo(benchmark.format_table(rows))
