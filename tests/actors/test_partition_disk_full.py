"""A full disk under a real partition actor (real Ray, ZooKeeper, sockets,
and a real 2 MiB tmpfs as the partition's disk): producers get the typed,
retriable DiskFullError over the wire (its own error code), the actor keeps
running and serving reads (no restart loop), accepted data stays intact,
and writes resume by themselves when the disk has room again."""

from __future__ import annotations

import os
import subprocess
import time
import uuid

import pytest

from raylog.errors import DeliveryError, DiskFullError, RaylogError
from raylog.retry import RetryPolicy
from raylog.storage.message import encode_message_set
from raylog.transfer.connection import BrokerConnection
from raylog.transfer.protocol import ERROR_DISK_FULL
from tests.stored import stored_records

VALUE_BYTES = 64 * 1024


def _value(i: int) -> bytes:
    return (b"%06d" % i) * (VALUE_BYTES // 6)


def _read_all(client, topic: str) -> list[bytes]:
    return [v for _, _, _, v in stored_records(client, topic)]


def _wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} within {timeout_s} s"
        time.sleep(0.1)


def test_disk_full_is_a_typed_retriable_error_reads_go_on_and_writes_resume(raylog_client):
    import ray

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    assert ERROR_DISK_FULL == DiskFullError.code == 28
    topic = f"t-{uuid.uuid4().hex[:12]}"
    log_dir = raylog_client.log_dir(topic, 0)
    os.makedirs(log_dir)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", log_dir], check=True)
    try:
        raylog_client.create_topic(topic, partitions=1, flush_ms=20)
        actor = raylog_client.partition_actor(topic, 0)
        pid = ray.get(actor.stats.remote())["pid"]
        host, port = raylog_client.metadata.endpoint(topic, 0, refresh=True)
        accepted = []
        with BrokerConnection(host, port, token=raylog_client.settings.token) as conn:
            for i in range(200):
                try:
                    conn.produce(topic, 0, encode_message_set([_value(i)]), acks=1)
                except DiskFullError as err:
                    full = err
                    break
                accepted.append(_value(i))
            else:
                pytest.fail("a 2 MiB disk took 200 sets of 64 KiB")
            assert accepted, "nothing fitted on the disk"
            # the typed error, across the wire, naming node and path; the connection stays open
            assert full.retriable and full.path.startswith(log_dir) and full.node
            assert "disk full on node" in str(full) and log_dir in str(full)
            with pytest.raises(DiskFullError):
                conn.produce(topic, 0, encode_message_set([b"small"]), acks=1)
            assert conn.offsets(topic, 0)  # the same connection still serves
        # A producer sees DiskFullError (not BrokerUnavailableError) when its retries run out.
        producer = raylog_client.producer(acks=1, batch_size=1, linger_ms=0,
                                          retry=RetryPolicy(max_tries=3, delay_s=0.1, deadline_s=3.0))
        try:
            with pytest.raises(RaylogError) as failed:
                producer.send(topic, _value(999), partition=0).result(timeout_s=60)
            err = failed.value
            if isinstance(err, DeliveryError):
                (_n, err), = err.failures.values()
            assert isinstance(err, DiskFullError), repr(failed.value)
        finally:
            try:
                producer.close()
            except DeliveryError:
                pass
        # No restart loop: the same process, marked full, serving every accepted message.
        stats = ray.get(actor.stats.remote())
        assert stats["pid"] == pid and stats["disk_full"]
        ray.get(actor.flush.remote())
        assert _read_all(raylog_client, topic) == accepted
        # Space returns (the disk grows): writes resume by themselves.
        subprocess.run(["mount", "-o", "remount,size=8m", log_dir], check=True)
        _wait_for(lambda: not ray.get(actor.stats.remote())["disk_full"], 30, "the actor to take writes again")
        producer = raylog_client.producer(acks=1, batch_size=1, linger_ms=0)
        try:
            for i in range(3):
                producer.send(topic, _value(1000 + i), partition=0).result(timeout_s=60)
        finally:
            producer.close()
        ray.get(actor.flush.remote())
        assert _read_all(raylog_client, topic) == accepted + [_value(1000 + i) for i in range(3)]
        assert ray.get(actor.stats.remote())["pid"] == pid
    finally:
        try:
            raylog_client.delete_topic(topic)
        finally:
            subprocess.run(["umount", "-l", log_dir], check=False)
