"""The compiled keyless case of ``Producer.send`` (``raylog.producer._fastsend``)
against the reference, on in-memory partitions: the same calls store the
same sets and resolve the same futures, a send waits while another thread
holds the accumulator's lock, and every call it does not take gets the
reference's answer (errors included)."""

from __future__ import annotations

import gc
import threading
import time
import weakref

import pytest

from raylog.config import TopicConfig
from raylog.errors import ClosedError, DeliveryError, InvalidMessageError, RequestTimeoutError
from raylog.producer import producer as producer_module
from raylog.producer.batch import ProducerBatch
from raylog.producer.partitioner import StickyPartitioner
from raylog.producer.producer import Producer
from raylog.storage.decoding import decode_messages
from raylog.storage.message import HEADER_SIZE

_fastsend = pytest.importorskip("raylog.producer._fastsend")


class Metadata:
    class settings:
        token = None

    def __init__(self, partitions: int, max_message_bytes: int):
        self._partitions, self._max = partitions, max_message_bytes

    def partitions(self, topic):
        return self._partitions

    def config(self, topic):
        return TopicConfig(partitions=self._partitions, max_message_bytes=self._max)

    def endpoint(self, topic, partition, **kw):
        return ("127.0.0.1", 1)

    def forget(self, topic, partition):
        pass


class Partitions:
    """In-memory partitions: every set stored, decoded, in order, per
    topic-partition (two topics' partitions are sent to by different
    workers, in no fixed order between them); ``gate`` holds every request
    until it is set; ``refuse`` (an error) is raised by every request while set."""

    def __init__(self):
        self.sets: dict[tuple[str, int], list] = {}
        self.offsets: dict[tuple[str, int], int] = {}
        self.sizes: dict[tuple[str, int], list[int]] = {}  # each stored batch's length
        self.gate = threading.Event()
        self.gate.set()
        self.refuse = None

    def connection(self, tp):
        parts = self

        class Connection:
            def connect(self):  # the sender connects before it sends (a connect has its own deadline)
                pass

            def produce_sets(self, topic, partition, payloads, acks, *, producer_id=-1, sequences=None):
                parts.gate.wait()
                if parts.refuse is not None:
                    raise parts.refuse
                bases = []
                for payload in payloads:
                    records = decode_messages(payload, 0)[0]
                    parts.sets.setdefault((topic, partition), []).append([(k, v) for _, _, k, v in records])
                    bases.append(parts.offsets.get((topic, partition), 0))
                    parts.sizes.setdefault((topic, partition), []).append(len(payload))
                    parts.offsets[(topic, partition)] = bases[-1] + len(payload)
                return bases if acks else None

            def close(self):
                pass

        return Connection()


def _producer(compiled: bool, monkeypatch, partitions: int = 3, max_message_bytes: int = 600, **options):
    store = Partitions()
    options.setdefault("batch_size", 5)
    with monkeypatch.context() as patch:
        if not compiled:
            patch.setattr(producer_module, "_fastsend", None)
        producer = Producer(Metadata(partitions, max_message_bytes), linger_ms=60_000, acks=1, **options)
    producer._sender._connection = store.connection
    producer._sender.visibility = None  # the in-memory partitions make every set readable at once
    producer._acc._sticky = StickyPartitioner(seed=7)  # the same keyless partitions on both runs
    return producer, store


def _script(producer):
    """Keyless sends of many sizes (some seal a batch by size, some by
    count), mixed with keyed, timestamped and partitioned ones that share
    or break the open sticky batch, and calls that spell out the defaults."""
    send = producer.send
    futures = []
    for i in range(120):
        value = b"v%03d-" % i + b"x" * (i * 37 % 260)
        if i % 17 == 3:
            futures.append(send("t", value, b"key-%d" % (i % 4)))
        elif i % 23 == 5:
            futures.append(send("t", value, timestamp_ms=1_700_000_000_000 + i))
        elif i % 29 == 7:
            futures.append(send("t", value, partition=i % 3))
        elif i % 11 == 0:
            futures.append(send("t", value, None, partition=None, timestamp_ms=None))
        elif i % 13 == 0:
            futures.append(send("t", value, key=None))
        else:
            futures.append(send("t", value))
        if i % 40 == 39:
            futures.append(send("u", value))  # another topic's sticky batch
    producer.flush()
    return [f.result(timeout_s=10) for f in futures]


def test_the_compiled_send_and_the_reference_store_the_same_sets_and_offsets(monkeypatch):
    outcomes = []
    for compiled in (True, False):
        producer, store = _producer(compiled, monkeypatch)
        assert isinstance(producer.send, _fastsend.KeylessSend) is compiled
        results = _script(producer)
        producer.close()  # buffered counts down just after the futures resolve: read it once all is done
        stats = producer.stats()
        outcomes.append((results, store.sets, stats["sent_messages"], stats["sent_batches"], stats["buffered"]))
    compiled, reference = outcomes
    assert compiled == reference
    results, sets, sent, batches, buffered = compiled
    assert sent == len(results) == 123 and buffered == 0
    assert batches == sum(len(s) for s in sets.values()) and all(len(s) <= 5 for p in sets.values() for s in p)


def test_a_compiled_send_waits_while_another_thread_holds_the_accumulators_lock(monkeypatch):
    producer, _ = _producer(True, monkeypatch)
    producer.send("t", b"opens the sticky batch")  # the next keyless send would join it
    acc = producer._acc
    done = threading.Event()

    def send():
        producer.send("t", b"second")
        done.set()

    with acc.lock:
        thread = threading.Thread(target=send)
        thread.start()
        assert not done.wait(0.3), "a send went ahead while the lock was held"
        assert len(acc.keyless["t"].values) == 1
    thread.join(10)
    assert done.is_set() and len(acc.keyless["t"].values) == 2
    producer.close()


@pytest.mark.parametrize("compiled", [True, False], ids=["c", "python"])
def test_calls_the_compiled_path_does_not_take_get_the_references_answer(monkeypatch, compiled):
    producer, store = _producer(compiled, monkeypatch)
    producer.send("t", b"first")
    with pytest.raises(TypeError, match="value must be bytes"):
        producer.send("t", "text")
    with pytest.raises(TypeError, match="value must be bytes"):
        producer.send("t", bytearray(b"mutable"))
    with pytest.raises(TypeError):
        producer.send("t", b"v", None, key=None)  # key twice
    with pytest.raises(TypeError):
        producer.send("t", b"v", trace=b"x")  # no such argument
    with pytest.raises(TypeError, match="headers"):
        producer.send("t", b"v", headers=["x"])  # not a pair
    with pytest.raises(TypeError):
        producer.send("t")
    producer.send("t", b"last")
    producer.close()
    assert [v for p in store.sets.values() for s in p for _, v in s] == [b"first", b"last"]
    with pytest.raises(ClosedError):
        producer.send("t", b"after close")


@pytest.mark.parametrize("compiled", [True, False], ids=["c", "python"])
def test_a_keyed_send_batch_of_the_wrong_types_is_refused_whole(monkeypatch, compiled):
    """The compiled grouping checks the types of a keyed call itself (no
    pass of its own); a call it refuses gets the reference's TypeError, and
    none of its messages is queued."""
    producer, store = _producer(compiled, monkeypatch)
    producer.send_batch("t", [b"a", b"b"], [b"k1", b"k2"])
    bad_calls = [
        ([b"ok", "text"], [b"k1", b"k2"], "values must be bytes, got str"),
        ([b"ok", bytearray(b"x")], [b"k1", None], "values must be bytes, got bytearray"),
        ([b"ok", b"ok"], [b"k1", "k2"], "keys must be bytes or None, got str"),
        ([b"ok", b"ok"], [b"k1", memoryview(b"k2")], "keys must be bytes or None, got memoryview"),
        ((b"ok", 1), (b"k1", b"k2"), "values must be bytes, got int"),
    ]
    for values, keys, message in bad_calls:
        with pytest.raises(TypeError, match=message):
            producer.send_batch("t", values, keys)
        assert producer.stats()["buffered"] == 2
    producer.send_batch("t", (b"c",), (None,))
    producer.close()
    assert sorted(v for p in store.sets.values() for s in p for _, v in s) == [b"a", b"b", b"c"]


@pytest.mark.parametrize("compiled", [True, False], ids=["c", "python"])
def test_a_full_buffer_blocks_the_compiled_send_as_it_does_the_reference(monkeypatch, compiled):
    producer, store = _producer(compiled, monkeypatch, max_buffered_messages=3, max_block_s=0.3, batch_size=50)
    store.gate.clear()  # nothing resolves: the buffer stays full
    futures = [producer.send("t", b"m%d" % i) for i in range(3)]
    start = time.monotonic()
    with pytest.raises(RequestTimeoutError, match="still buffered"):
        producer.send("t", b"one too many")
    assert time.monotonic() - start >= 0.25
    store.gate.set()
    producer.close()
    assert [f.result(timeout_s=5).partition for f in futures] == [futures[0].partition] * 3
    assert [v for p in store.sets.values() for s in p for _, v in s] == [b"m0", b"m1", b"m2"]


def _slots(obj) -> dict:
    return {name: getattr(obj, name) for name in type(obj).__slots__}


def test_a_batch_of_one_made_by_the_compiled_send_is_the_references_in_every_slot(monkeypatch):
    producer, store = _producer(True, monkeypatch, partitions=1, batch_size=1)
    store.gate.clear()  # the sender's worker takes the first set and waits: the partition is being drained
    first = producer.send("t", b"first")  # (the reference: no queue yet; it wakes the sender)
    acc = producer._acc
    deadline = time.monotonic() + 10
    while ("t", 0) not in acc.draining or acc.ready.get(("t", 0)):
        assert time.monotonic() < deadline
        time.sleep(0.001)
    before = time.time()
    second = producer.send("t", b"second")
    (batch,) = acc.ready[("t", 0)]
    assert second._batch is batch.future and second._index == 0
    reference = ProducerBatch("t", 0, None, acc._limits["t"], acc.compressed, [b"second"])
    reference.size = HEADER_SIZE + len(b"second")
    made, expected = _slots(batch), _slots(reference)
    assert before <= made.pop("created") <= time.time()
    expected.pop("created")
    made_future, expected_future = _slots(made.pop("future")), _slots(expected.pop("future"))
    assert made == expected
    assert made_future == expected_future and made_future["_values"] is batch.values
    # left out of the collector while queued (see _fastsend.c)
    assert not any(gc.is_tracked(o) for o in (batch, batch.future, batch.values))
    store.gate.set()
    producer.close()
    assert [f.result(timeout_s=5) for f in (first, second)] == [(0, 0), (0, store.sizes[("t", 0)][0])]


def test_a_failed_batch_of_one_is_collected_with_the_cycle_its_error_makes(monkeypatch):
    producer, store = _producer(True, monkeypatch, partitions=1, batch_size=1)
    store.gate.clear()
    first = producer.send("t", b"first")
    while ("t", 0) not in producer._acc.draining or producer._acc.ready.get(("t", 0)):
        time.sleep(0.001)
    futures = [producer.send("t", b"m%d" % i) for i in range(20)]
    assert not gc.is_tracked(futures[-1]._batch)  # made by the compiled path
    store.refuse = InvalidMessageError("refused")  # raised: its traceback holds the sender's frames
    store.gate.set()
    with pytest.raises(DeliveryError):
        producer.flush()
    errors = [weakref.ref(f.exception(timeout_s=5)) for f in [first] + futures]
    assert all(e() is not None for e in errors)
    assert gc.is_tracked(futures[-1]._batch)  # back under the collector once failed
    producer.close()
    del producer, store, first, futures
    gc.collect()
    assert [e() for e in errors if e() is not None] == []  # nothing kept alive by a cycle


def test_a_batch_type_without_the_expected_slots_is_refused():
    class Plain:
        pass

    with pytest.raises(TypeError, match="has no slot"):
        _fastsend.KeylessSend(object(), print, Plain, Plain, Plain)


def test_the_compiled_send_shows_the_references_signature(monkeypatch):
    import inspect

    compiled, _ = _producer(True, monkeypatch)
    reference, _ = _producer(False, monkeypatch)
    try:
        assert isinstance(compiled.send, _fastsend.KeylessSend)
        assert str(inspect.signature(compiled.send)) == str(inspect.signature(reference.send))
        assert str(inspect.signature(compiled.send)) == "(topic: 'str', value: 'bytes | None', key: 'bytes | None' = None, " \
            "*, partition: 'int | None' = None, timestamp_ms: 'int | None' = None, " \
            "headers: 'Sequence[tuple[str, bytes | None]] | None' = None) -> 'SendFuture'"
    finally:
        compiled.close()
        reference.close()
