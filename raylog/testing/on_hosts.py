"""What the tests on the hosts kit (:mod:`raylog.testing.hosts`) wait for
and read through a client: bounded waits, a host whose processes were
killed running again, a partition's replication state, a topic read back.
(What they look at on one host's disk: :mod:`raylog.testing.host_checks`.)

::

    from raylog.testing import faults
    from raylog.testing.on_hosts import bring_back, partition_state, read_values, wait

    faults.kill_host(host)
    wait(lambda: host.name not in partition_state(client, topic).isr, "it leaves the ISR")
    bring_back(cluster, host)          # its Ray node again, on the same disk
    assert read_values(client, topic, 100) == expected

The functions keep no state; every wait has an explicit bound (the machine
is shared: generous).
"""

from __future__ import annotations

import time
import uuid

from raylog.testing.host_checks import ray_node_alive

#: the bound of every wait, unless told
WAIT_S = 180.0


def wait(check, what: str, timeout_s: float = WAIT_S):
    """``check()``'s first true answer, asked every 0.2 s; an
    ``AssertionError`` naming ``what`` if none came within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.2)


def replicated_topic(client, **settings) -> str:
    """A new topic of one partition over three replicas (``min_insync_replicas``
    2, ``flush_ms`` 5, plus ``settings``); returns its name."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    client.create_topic(name, partitions=1, replication_factor=3, min_insync_replicas=2, flush_ms=5, **settings)
    return name


def bring_back(cluster, host) -> None:
    """``host``, whose processes were killed (:func:`raylog.testing.faults.kill_host`),
    runs its Ray node again on the same disk: once Ray counts the lost node
    dead, it is started again and waited for until Ray counts it alive."""
    wait(lambda: not ray_node_alive(host), f"Ray counts {host.name}'s lost node dead")
    cluster.restart_ray(host)
    wait(lambda: ray_node_alive(host), f"{host.name}'s Ray node is alive again")


def partition_state(client, topic: str, partition: int = 0):
    """The partition's replication state as ZooKeeper holds it (leader, epoch, replicas, ISR)."""
    return client.replication_state(topic, partition)


def read_values(client, topic: str, count: int, timeout_s: float = WAIT_S) -> list[bytes]:
    """The values of ``topic`` from its start: polled until ``count`` came
    (or ``timeout_s``), then once more, so that a surplus shows."""
    consumer = client.consumer([topic], auto_offset_reset="earliest")
    try:
        values: list[bytes] = []
        deadline = time.monotonic() + timeout_s
        while len(values) < count and time.monotonic() < deadline:
            values += [m.value for m in consumer.poll(timeout_ms=500)]
        values += [m.value for m in consumer.poll(timeout_ms=1000)]
        return values
    finally:
        consumer.close()


class Sending:
    """An ``acks="all"`` producer sending numbered values (``v0``, ``v1``
    ...) from a thread of its own until :meth:`finish`; ``acked`` holds the
    acknowledged values in send order, ``failures`` the errors. Its retries
    are the producer's usual ones (8 tries within 30 s): a move of the lead
    that no producer should notice must fit in them. With ``partition``
    every value (``p<partition>-0`` ...) goes to that partition, one send
    at a time: a send that waits for a partition cut off holds up no other
    partition's sender; ``pause_s`` between sends."""

    def __init__(self, client, topic: str, partition: int | None = None, *, result_s: float = 60.0,
                 pause_s: float = 0.0):
        import threading

        from raylog.retry import RetryPolicy

        self.producer = client.producer(acks="all", retry=RetryPolicy(max_tries=8, delay_s=0.05, max_delay_s=1.0,
                                                                      deadline_s=30))
        self.topic, self.partition, self.acked, self.failures = topic, partition, [], []
        self._result_s, self._pause_s = result_s, pause_s
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        i = 0
        while not self.stop.is_set():
            value = b"v%d" % i if self.partition is None else b"p%d-%d" % (self.partition, i)
            try:
                self.producer.send(self.topic, value, partition=self.partition).result(self._result_s)
                self.acked.append(value)
            except Exception as err:  # noqa: BLE001 - the test reports it
                self.failures.append(repr(err))
            i += 1
            if self._pause_s:
                time.sleep(self._pause_s)

    def more_acked(self, count: int = 20, timeout_s: float = WAIT_S) -> None:
        """Wait until ``count`` more sends than now were acknowledged."""
        now = len(self.acked)
        wait(lambda: len(self.acked) >= now + count, "the producer goes on being acknowledged", timeout_s)

    def finish(self):
        self.stop.set()
        self.thread.join(90)
        self.producer.close()
