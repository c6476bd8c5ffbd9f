"""What the pool tests share: a handler that records every message it
returned from in a file (one ``write`` per batch, so batches of members in
other processes never interleave), a producer of numbered messages, and
the checks of at-least-once and order per partition.

The handlers here are sent to the member actors by value
(:func:`send_by_value`): the members cannot import the tests."""

from __future__ import annotations

import collections
import os
import sys
import time


def send_by_value() -> None:
    """Let Ray pickle this module's handlers by value (members cannot import it)."""
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Recorder:
    """Appends ``partition offset value`` per message to ``path`` once the
    batch is done. ``sleep_s``: a cost per batch. ``fail_times``: the first
    that many calls on ``fail_partition`` raise (per member).
    ``always_fail``: every call on that partition raises."""

    def __init__(self, path: str, sleep_s: float = 0.0, fail_times: int = 0, fail_partition: int | None = None,
                 always_fail: int | None = None):
        self.path, self.sleep_s = path, sleep_s
        self.fail_times, self.fail_partition, self.always_fail = fail_times, fail_partition, always_fail
        self.failed = 0

    def __call__(self, batch) -> None:
        partition = batch[0].partition
        assert all(m.partition == partition for m in batch), "a batch mixes partitions"
        if partition == self.always_fail:
            raise RuntimeError(f"the handler always fails on partition {partition}")
        if self.failed < self.fail_times and partition == self.fail_partition:
            self.failed += 1
            raise ValueError(f"failure {self.failed} of {self.fail_times}")
        if self.sleep_s:
            time.sleep(self.sleep_s)
        data = "".join(f"{m.partition} {m.offset} {m.value.decode()}\n" for m in batch).encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)


class Gated(Recorder):
    """A :class:`Recorder` whose every batch, once begun, waits until the
    file ``gate`` exists (at most ``wait_s``) before it is recorded; the
    batch's start is marked by the file ``<path>.began-<partition>``."""

    def __init__(self, path: str, gate: str, wait_s: float = 120.0):
        super().__init__(path)
        self.gate, self.wait_s = gate, wait_s

    def __call__(self, batch) -> None:
        open(f"{self.path}.began-{batch[0].partition}", "a").close()
        deadline = time.monotonic() + self.wait_s
        while not os.path.exists(self.gate) and time.monotonic() < deadline:
            time.sleep(0.05)
        super().__call__(batch)


def handled(path: str) -> dict[int, list[str]]:
    """``{partition: [value, ...]}`` in the order handled, duplicates included."""
    out = collections.defaultdict(list)
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            partition, _offset, value = line.split()
            out[int(partition)].append(value)
    return out


def produce(client, topic: str, count: int, partitions: int, start: int = 0, pause_every: int = 0,
            pause_s: float = 0.0) -> dict[int, list[str]]:
    """``count`` messages ``m-<i>`` round-robin over the partitions; ``{partition: [value, ...]}`` in log order."""
    producer = client.producer(acks=1, linger_ms=2)
    futures = []
    try:
        for i in range(start, start + count):
            value = f"m-{i}"
            futures.append((value, producer.send(topic, value.encode(), partition=i % partitions)))
            if pause_every and (i + 1) % pause_every == 0:
                producer.flush()
                time.sleep(pause_s)
        producer.flush()
    finally:
        producer.close()
    by_partition = collections.defaultdict(list)
    for value, fut in futures:
        partition, offset = fut.result()
        by_partition[partition].append((offset, value))
    return {p: [v for _, v in sorted(rows)] for p, rows in by_partition.items()}


def check_at_least_once_in_order(seen: dict[int, list[str]], produced: dict[int, list[str]]) -> int:
    """Every produced message was handled, and per partition the handled
    sequence is runs of consecutive messages in log order, each run
    starting at or before where the previous one ended (a redelivery after
    a rebalance or a crash); returns the number handled twice."""
    twice = 0
    for partition, values in produced.items():
        got = seen.get(partition, [])
        index = {v: i for i, v in enumerate(values)}
        assert set(got) <= set(values), f"partition {partition}: handled messages never produced"
        first = list(dict.fromkeys(got))
        assert first == values, (f"partition {partition}: {len(values) - len(first)} messages lost or out of order "
                                 f"(first missing: {next((v for v in values if v not in set(first)), None)})")
        for a, b in zip(got, got[1:]):
            assert index[b] == index[a] + 1 or index[b] <= index[a], (
                f"partition {partition}: {b} handled right after {a}: a gap")
        twice += len(got) - len(first)
    return twice
