"""The mirror's copier and format 2 (docs/design.md §2): format-1 messages are
copied as before, and a set holding format-2 record batches (headers, null
values) is refused with MirrorFormatError before anything of it is sent or
recorded (written again as format 1 it would lose them): the target and the
progress record stay as they were. Real ZooKeeper, Ray and partition actors
(one cluster as source and target; the log: tests/format2_log.py)."""

from __future__ import annotations

import time
import uuid

import pytest

from format2_log import expected, mixed_log
from raylog.errors import MirrorFormatError
from raylog.mirror import progress, spec as specs
from raylog.mirror.copier import PartitionCopier

pytestmark = pytest.mark.timeout(240)


def _copier(client, name, topic, target_topic):
    cluster = client.settings.cluster
    return PartitionCopier(
        zk=client._zk, target_metadata=client.metadata,
        progress_path=specs.progress_path(cluster, name, topic, 0),
        checkpoints_path=specs.checkpoints_path(cluster, name, topic, 0),
        topic=topic, partition=0, target_topic=target_topic,
        producer_id=specs.producer_id(cluster, name, cluster, topic, 0),
    )


def _read(client, topic, n, start=None):
    consumer = client.consumer(topic, auto_offset_reset="earliest")
    try:
        if start is not None:
            consumer.assign([(topic, 0)])
            consumer.seek(topic, 0, start)
        got: list = []
        deadline = time.monotonic() + 60
        while len(got) < n:
            assert time.monotonic() < deadline, "messages never arrived"
            got += consumer.poll(timeout_ms=300, max_messages=n - len(got))
        return got
    finally:
        consumer.close()


def test_format_1_is_copied_and_a_format_2_set_is_refused_losing_nothing(raylog_client, make_topic):
    client = raylog_client
    source, target = make_topic(partitions=1), make_topic(partitions=1)
    name = f"f2-{uuid.uuid4().hex[:6]}"
    plain, positions = mixed_log(client, source)
    want = expected(plain, positions)
    read = _read(client, source, len(want))

    copier = _copier(client, name, source, target)
    try:
        assert copier.start() is None
        copier.sought(client.offsets(source, 0)[0])
        copier.offer(read[: len(plain)])  # the format-1 messages
        assert copier.pump(flush=True) == len(plain)
        assert copier.position == positions[0]
        record, _version = progress.read_progress(client._zk, specs.progress_path(client.settings.cluster, name,
                                                                                     source, 0))
        copier.offer(read[len(plain):])  # the format-2 records
        with pytest.raises(MirrorFormatError) as caught:
            copier.pump(flush=True)
        assert f"offset {positions[0]}" in str(caught.value) and "format 2" in str(caught.value)
    finally:
        copier.close()
    # nothing of the refused set was recorded or sent; what was copied is intact
    after, _version = progress.read_progress(client._zk, specs.progress_path(client.settings.cluster, name, source, 0))
    assert after == record and after["end"] == positions[0]
    copied = _read(client, target, len(plain))
    assert [m.value for m in copied] == [b"plain-0", b"plain-1"]
    assert client.offsets(target, 0)[1] == copied[-1].next_offset  # nothing after them
    # a copier that starts again resumes at the format-2 data, not past it
    again = _copier(client, name, source, target)
    try:
        assert again.start() == positions[0]
    finally:
        again.close()
