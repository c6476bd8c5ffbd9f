"""Bad mirror input: each a one-line typed error, nothing half-created."""

from __future__ import annotations

import uuid

import pytest
import ray

from raylog.errors import MirrorNoTopicsError, MirrorSourceError, MirrorTopicMismatchError
from raylog.mirror import spec as specs


def _nothing_made(target, name):
    assert target._zk.exists(specs.mirror_root(target.settings.cluster, name)) is None
    with pytest.raises(ValueError):
        ray.get_actor(specs.controller_name(target.settings.cluster, name), namespace=specs.NAMESPACE)


def _one_line(err) -> str:
    text = str(err.value)
    assert "\n" not in text and text
    return text


def test_bad_mirror_input_is_refused_before_anything_is_made(raylog_client, source):
    target = raylog_client
    tag = uuid.uuid4().hex[:6]
    a, b = f"bad-{tag}-a", f"bad-{tag}-b"
    source.create_topic(a, partitions=2)
    source.create_topic(b, partitions=1)
    producer = source.producer(acks="all")
    producer.send(a, b"kept")
    producer.flush()
    producer.close()
    target.create_topic(b, partitions=3)  # another partition count than its source
    src = dict(source_zookeeper=source.settings.zookeeper, source_cluster=source.settings.cluster)

    with pytest.raises(MirrorTopicMismatchError) as err:
        target.mirror(**src, topics=f"bad-{tag}-.*", name=f"x-{tag}")
    assert b in _one_line(err)
    assert not target.registry.topic_exists(a)  # the matching topic without a conflict was not made either
    _nothing_made(target, f"x-{tag}")

    with pytest.raises(MirrorNoTopicsError) as err:
        target.mirror(**src, topics=f"nothing-{tag}.*", name=f"y-{tag}")
    assert f"nothing-{tag}" in _one_line(err)
    _nothing_made(target, f"y-{tag}")

    with pytest.raises(MirrorSourceError) as err:
        target.mirror(**src, topics=a, source_token="not-the-token", name=f"z-{tag}")
    assert "token" in _one_line(err)
    _nothing_made(target, f"z-{tag}")
    assert not target.registry.topic_exists(a)

    with pytest.raises(MirrorSourceError) as err:
        target.mirror(source_zookeeper=source.settings.zookeeper, source_cluster=f"no-such-{tag}", topics=a,
                      name=f"w-{tag}")
    assert f"no-such-{tag}" in _one_line(err)
    _nothing_made(target, f"w-{tag}")

    with pytest.raises(MirrorSourceError) as err:
        target.mirror(source_zookeeper="127.0.0.1:9", source_cluster=source.settings.cluster, topics=a,
                      name=f"v-{tag}")
    assert "127.0.0.1:9" in _one_line(err)
    _nothing_made(target, f"v-{tag}")

    # the source is intact
    consumer = source.consumer(a, auto_offset_reset="earliest")
    got = []
    for _ in range(30):
        got.extend(m.value for m in consumer.poll(timeout_ms=300))
        if got:
            break
    consumer.close()
    assert got == [b"kept"]
    assert target.registry.topic_config(b).partitions == 3
