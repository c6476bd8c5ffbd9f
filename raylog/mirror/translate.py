"""A consumer group moved from the source to a mirror, at translated offsets.

For every partition the group committed on the source, the mirror's
checkpoints (:mod:`raylog.mirror.progress`, ``[source offset, target
offset]`` pairs, one every few seconds) give the target offset of the latest
checkpoint at or before the committed source offset. The group reads from
there on the target: the messages between that checkpoint and the committed
offset come again (at most one checkpoint interval of them), and nothing is
missed. A committed offset older than every checkpoint kept translates to
the target partition's start.

The source's committed offsets are read from its ZooKeeper without a token
(reads need none); the target group must have no live members.
"""

from __future__ import annotations

import json

from kazoo.exceptions import NoNodeError

from raylog.errors import MirrorNotFoundError
from raylog.groups.admin import refuse_if_active
from raylog.groups.offsets import OffsetStore
from raylog.mirror import progress, spec as specs
from raylog.zk.session import connect_kazoo


def mirror_spec(zk, target_cluster: str, name: str) -> dict:
    """The stored spec of mirror ``name`` (:meth:`MirrorSpec.public`)."""
    try:
        data, _ = zk.get(specs.mirror_root(target_cluster, name))
    except NoNodeError:
        raise MirrorNotFoundError(f"cluster {target_cluster!r} has no mirror named {name!r}; "
                                  f"list them with 'raylog mirror status'") from None
    return json.loads(data.decode())


def translate_group(target, group: str, mirror: str, *, dry_run: bool = False) -> list[dict]:
    """Set ``group``'s committed offsets on ``target`` (a Client) from its
    committed offsets on the source of ``mirror``. One row per partition:
    ``{"topic", "partition", "target_topic", "source_offset", "target_offset"}``."""
    cluster = target.settings.cluster
    spec = mirror_spec(target._zk, cluster, mirror)
    refuse_if_active(target._zk, cluster, group, "translate the offsets of")
    source_zk = connect_kazoo(spec["source_zookeeper"])
    try:
        committed = OffsetStore(source_zk, spec["source_cluster"]).committed_all(group)
    finally:
        source_zk.stop()
        source_zk.close()
    store = OffsetStore(target._zk, cluster)
    rows = []
    for (topic, partition), offset in sorted(committed.items()):
        target_topic = spec["rename"].format(source=spec["source_cluster"], topic=topic)
        if not target.registry.topic_exists(target_topic):
            continue
        points = progress.read_checkpoints(target._zk, specs.checkpoints_path(cluster, mirror, topic, partition))
        translated = progress.translate(points, offset)
        if translated is None:
            translated = target.offsets(target_topic, partition)[0]
        rows.append({"topic": topic, "partition": partition, "target_topic": target_topic,
                     "source_offset": offset, "target_offset": translated})
        if not dry_run:
            store.commit(group, target_topic, partition, translated)
    return rows
