"""A read-only data directory: creating a topic whose partition log cannot
be written fails with one clear cause naming the directory (real Ray,
ZooKeeper, a read-only tmpfs mount as the partition's directory)."""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest

from raylog.errors import RaylogError


def test_a_read_only_data_dir_is_one_clear_error(raylog_client):
    if os.geteuid() != 0:
        pytest.skip("mounting a read-only tmpfs needs root")
    topic = f"t-{uuid.uuid4().hex[:12]}"
    log_dir = raylog_client.log_dir(topic, 0)
    os.makedirs(log_dir)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", log_dir], check=True)
    ro = log_dir
    try:
        with pytest.raises(Exception) as failed:  # noqa: B017 - Ray wraps the actor's error (topic_admin)
            raylog_client.create_topic(topic, partitions=1)
        text = str(failed.value)
        # one clear cause, naming the directory; not a disk error that restarts the actor
        assert f"the partition directory {log_dir} is not writable" in text and "read-only mount" in text
        assert text.count("is not writable") == 1
    finally:
        try:
            raylog_client.delete_topic(topic)
        except RaylogError:
            pass
        subprocess.run(["umount", "-l", ro], check=False)
