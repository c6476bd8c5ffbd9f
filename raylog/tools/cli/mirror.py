"""``raylog mirror ...``: start, show and stop mirrors between clusters, and
``raylog groups translate``: move a group's offsets from a mirror's source.

The global options name the *target* cluster (where the mirror's actors run
and its progress is kept); ``--source-*`` name the source."""

from __future__ import annotations

import click

from raylog.mirror import MirrorHandle, list_mirrors, translate_group
from raylog.tools.cli.base import Target, echo_json, format_table, cli, json_option, pass_target
from raylog.tools.cli.groups import groups


@cli.group()
def mirror():
    """Mirror topics from another raylog cluster into this one."""


@mirror.command("start")
@click.option("--source-zookeeper", required=True, help="HOST:PORT of the source cluster's ZooKeeper.")
@click.option("--source-cluster", required=True, help="The source cluster's name.")
@click.option("--source-token-file", type=click.Path(exists=True, dir_okay=False),
              help="A file holding the source cluster's data token (default: derived, as inside its Ray cluster).")
@click.option("--topics", required=True, help="A regular expression over whole source topic names.")
@click.option("--rename", default="{topic}", show_default=True,
              help="The target topic's name: {source} (the source cluster) and {topic}.")
@click.option("--members", type=click.IntRange(min=1), default=1, show_default=True,
              help="Mirror actors (members of the mirror's consumer group on the source).")
@click.option("--name", default=None, help="The mirror's name (default: <source cluster>-mirror).")
@pass_target
def mirror_start(target: Target, source_zookeeper, source_cluster, source_token_file, topics, rename, members, name):
    """Start a mirror: actors in this cluster that copy the matching source
    topics (and those that match later) exactly once, in order per partition."""
    token = None
    if source_token_file:
        with open(source_token_file, "rb") as f:
            token = f.read().strip()
    with target.client("mirror start", ray=True) as client:
        handle = client.mirror(source_zookeeper=source_zookeeper, source_cluster=source_cluster,
                               source_token=token, topics=topics, rename=rename, members=members, name=name)
        rows = handle.status()["partitions"]
    click.echo(f"mirror {handle.name!r} started: {len({r['topic'] for r in rows})} topics, {len(rows)} partitions")


@mirror.command("status")
@click.argument("name", required=False)
@json_option
@pass_target
def mirror_status(target: Target, name, as_json):
    """Per partition of mirror NAME (of every mirror without NAME): source
    end offset, mirrored position, lag in bytes, messages and seconds."""
    with target.client("mirror status", ray=True) as client:
        names = [name] if name else list_mirrors(client._zk, client.settings.cluster)
        result = []
        for n in names:
            try:
                result.append(MirrorHandle(client.settings.cluster, n).status())
            except Exception:
                if name:
                    raise
                result.append({"name": n, "stopped": True, "partitions": []})
    if as_json:
        echo_json(result if not name else result[0])
        return
    for status in result:
        if status.get("stopped"):
            click.echo(f"mirror {status['name']}: stopped")
            continue
        spec = status["spec"]
        click.echo(f"mirror {status['name']}: {spec['source_cluster']}@{spec['source_zookeeper']} "
                   f"topics {spec['topics']!r} -> {spec['rename']!r}")
        click.echo(format_table(["TOPIC", "PARTITION", "TARGET TOPIC", "SOURCE END", "MIRRORED", "LAG (BYTES)",
                           "LAG (MSGS)", "LAG (S)"],
                          [[r["topic"], r["partition"], r["target_topic"], r["source_end"], r["mirrored"],
                            r["lag_bytes"], r["lag_messages"], None if r["lag_s"] is None else f"{r['lag_s']:.1f}"]
                           for r in status["partitions"]]))


@mirror.command("stop")
@click.argument("name")
@pass_target
def mirror_stop(target: Target, name):
    """Stop mirror NAME (its progress stays: started again, it resumes)."""
    with target.client("mirror stop", ray=True) as client:
        MirrorHandle(client.settings.cluster, name).stop()
    click.echo(f"mirror {name!r} stopped")


@groups.command("translate")
@click.option("--group", required=True, help="The consumer group to move.")
@click.option("--mirror", "mirror_name", required=True, help="The mirror (in this cluster) the group moves to.")
@click.option("--dry-run", is_flag=True, help="Show the translated offsets without writing them.")
@json_option
@pass_target
def groups_translate(target: Target, group, mirror_name, dry_run, as_json):
    """Set GROUP's committed offsets here from its committed offsets on the
    mirror's source, through the mirror's checkpoints: the group reads
    nothing twice beyond one checkpoint interval and misses nothing
    (refused while the group has live members here)."""
    with target.client("groups translate") as client:
        rows = translate_group(client, group, mirror_name, dry_run=dry_run)
    if as_json:
        echo_json(rows)
        return
    click.echo(format_table(["TOPIC", "PARTITION", "TARGET TOPIC", "SOURCE OFFSET", "TARGET OFFSET"],
                      [[r["topic"], r["partition"], r["target_topic"], r["source_offset"], r["target_offset"]]
                       for r in rows]))
    if dry_run:
        click.echo("dry run: nothing written", err=True)
