"""The boundary between the sender and the accumulator: the sender uses
only ``SENDER_INTERFACE`` (checked on its source, and by running it
against an accumulator that answers nothing else), and the compiled send
is built from ``compiled_send_view()`` alone."""

from __future__ import annotations

import ast
import inspect

import pytest

from raylog.config import TopicConfig
from raylog.producer import sender as sender_module
from raylog.producer.accumulator import SENDER_INTERFACE, RecordAccumulator
from raylog.producer.futures import BatchFuture, SendFuture
from raylog.producer.batch import ProducerBatch
from raylog.producer.sender import Sender
from raylog.retry import RetryPolicy


def _accumulator_uses(tree: ast.AST) -> list[tuple[str, bool, int]]:
    """(attribute, written, line) of every use of the accumulator in the
    sender: ``self._acc.X`` and ``acc.X`` where ``acc = self._acc``."""
    aliases = {"acc"}
    uses = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        target = node.value
        on_acc = (isinstance(target, ast.Attribute) and target.attr == "_acc") or (
            isinstance(target, ast.Name) and target.id in aliases
        )
        if on_acc:
            uses.append((node.attr, not isinstance(node.ctx, ast.Load), node.lineno))
    return uses


def test_the_sender_uses_only_the_accumulators_interface():
    tree = ast.parse(inspect.getsource(sender_module))
    uses = _accumulator_uses(tree)
    assert uses, "no use of the accumulator found: the check no longer sees the sender's code"
    outside = [(name, line) for name, _, line in uses if name not in SENDER_INTERFACE]
    assert outside == [], f"sender.py uses the accumulator beyond its interface: {outside}"
    written = [(name, line) for name, write, line in uses if write]
    assert written == [], f"sender.py writes to the accumulator: {written}"
    # and nothing else of the sender holds the accumulator's parts
    init = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "__init__"
                and "accumulator" in [a.arg for a in n.args.args])
    held = [n.attr for n in ast.walk(init) if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name) and n.value.id == "accumulator"]
    assert held == [], f"Sender.__init__ keeps parts of the accumulator: {held}"


def test_the_interface_names_exist_and_are_documented():
    for name in SENDER_INTERFACE - {"closed"}:
        method = getattr(RecordAccumulator, name)
        assert callable(method) and method.__doc__, name
    assert "closed" in inspect.getsource(RecordAccumulator.__init__)


class _Metadata:
    class settings:
        token = None

    def partitions(self, topic):
        return 2

    def config(self, topic):
        return TopicConfig(partitions=2, max_message_bytes=4096)

    def endpoint(self, topic, partition, **kw):
        return ("127.0.0.1", 1)

    def forget(self, topic, partition):
        pass


class _Partition:
    def __init__(self):
        self.sets = []

    def produce_sets(self, topic, partition, payloads, acks, *, producer_id=-1, sequences=None):
        bases = []
        for payload in payloads:
            bases.append(len(self.sets))
            self.sets.append((partition, payload))
        return bases

    def connect(self):
        pass

    def close(self):
        pass


class InterfaceOnly:
    """The accumulator as the sender may see it: any other name raises."""

    def __init__(self, acc: RecordAccumulator):
        object.__setattr__(self, "_inner", acc)

    def __getattr__(self, name):
        if name not in SENDER_INTERFACE:
            raise AssertionError(f"the sender used accumulator.{name}, outside its interface")
        return getattr(object.__getattribute__(self, "_inner"), name)

    def __setattr__(self, name, value):
        raise AssertionError(f"the sender set accumulator.{name}")


def test_a_sender_runs_on_the_interface_alone():
    acc = RecordAccumulator(_Metadata(), batch_size=3, linger_ms=5, compression=None, max_buffered_messages=100)
    partition = _Partition()
    resolved = []

    def on_resolved(batches):
        resolved.extend(batches)
        n = sum(len(b.values) for b in batches)
        with acc.lock:
            acc.buffered -= n
            acc.space.notify_all()

    sender = Sender(InterfaceOnly(acc), _Metadata(), acks=1, idempotent=True, compression=None,
                    retry=RetryPolicy(max_tries=3, delay_s=0.001, max_delay_s=0.01, deadline_s=10),
                    request_timeout_s=5, on_resolved=on_resolved)
    sender._connection = lambda tp: partition
    futures = [acc.append("t", b"v%d" % i, key=b"k%d" % i) for i in range(10)]  # full batches and lingering ones
    for future in futures:
        future.result(timeout_s=30)  # (a bound, not a timing assertion)
    with acc.lock:
        acc.closed = True
    sender.close(timeout_s=30)
    assert sum(len(b.values) for b in resolved) == 10
    assert acc.buffered == 0 and not acc.draining and not any(acc.ready.values())
    assert len(partition.sets) == len(resolved)


def test_the_compiled_send_is_built_from_the_view_alone():
    _fastsend = pytest.importorskip("raylog.producer._fastsend")
    acc = RecordAccumulator(_Metadata(), batch_size=4, linger_ms=1000, compression=None, max_buffered_messages=100)
    view = acc.compiled_send_view()
    assert set(view._fields) == {"locked", "fields", "keyless", "partition_counts", "limits", "ready", "draining",
                                 "compressed", "batch_size", "max_buffered"}

    class Reference:
        calls = 0

        def __call__(self, topic, value, key=None, *, partition=None, timestamp_ms=None):
            Reference.calls += 1
            return acc.append(topic, value, key, partition, timestamp_ms)

    send = _fastsend.KeylessSend(view, Reference(), SendFuture, ProducerBatch, BatchFuture)
    first = send("t", b"a")  # no open batch: the reference opens it
    second = send("t", b"b")  # the compiled path joins it
    assert Reference.calls == 1
    (batch,) = acc.open.values()
    assert batch.values == [b"a", b"b"] and acc.buffered == 2
    assert first._batch is second._batch is batch.future and second._index == 1
    with pytest.raises(AttributeError, match="fields"):
        _fastsend.KeylessSend(acc, Reference(), SendFuture, ProducerBatch, BatchFuture)  # not the accumulator
