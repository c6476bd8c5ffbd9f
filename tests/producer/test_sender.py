"""The sender's logic against an in-memory partition that follows the
idempotence rules of format 2 (docs/design.md §2: the producer's id and
sequences travel in each record batch, whose records are numbered
baseSequence, baseSequence + 1, ...): a refused set fails alone, a resent
set is stored once, a gap moves the partition to a fresh producer id."""

from __future__ import annotations

import pytest

from raylog.config import TopicConfig
from raylog.errors import (
    BrokerUnavailableError,
    DeliveryError,
    DuplicateSequenceError,
    InvalidMessageError,
    OutOfOrderSequenceError,
    RaylogError,
    StorageError,
)
from raylog.producer.producer import Producer
from raylog.retry import RetryPolicy
from raylog.storage.decoding import decode_messages
from raylog.storage.record_batch import read_header

#: every test runs with the compiled send and with the reference (conftest.py)
BOTH_SEND_PATHS = True


class FakeMetadata:
    """Two partitions, a small max_message_bytes."""

    class settings:
        token = None

    def __init__(self, partitions: int = 2, max_message_bytes: int = 4096):
        self.max_message_bytes = max_message_bytes
        self._partitions = partitions
        self.forgotten = 0

    def partitions(self, topic):
        return self._partitions

    def config(self, topic):
        return TopicConfig(partitions=self._partitions, max_message_bytes=self.max_message_bytes)

    def endpoint(self, topic, partition, **kw):
        return ("127.0.0.1", 1)

    def forget(self, topic, partition):
        self.forgotten += 1


class FakePartition:
    """A partition log with the server's idempotence rules. A set whose
    first value starts with ``b"REFUSE"`` is refused (non-retriable);
    ``fail_after`` makes the next request store that many sets and then lose
    the connection before any reply."""

    def __init__(self):
        self.log: list[bytes] = []  # stored values, in order
        self.offset = 0
        self.producers: dict[int, dict] = {}
        self.fail_after: int | None = None
        self.storage_errors = 0
        self.requests = []
        self.earlier_refusal = None  # acks=0: an error the next request finds waiting

    def produce_sets(self, topic, partition, payloads, acks, *, producer_id=-1, sequences=None):
        assert producer_id == -1 and sequences is None  # (they travel in the batches)
        headers = [read_header(p) for p in payloads]
        producer_id = headers[0].producer_id
        sequences = [h.base_sequence for h in headers] if producer_id >= 0 else None
        self.requests.append((producer_id, list(sequences or [])))
        if self.earlier_refusal is not None:
            err, self.earlier_refusal = self.earlier_refusal, None
            raise err
        if not acks:
            for i, payload in enumerate(payloads):
                self._one(payload, producer_id, -1)
            return None
        results = []
        for i, payload in enumerate(payloads):
            if self.fail_after is not None and i == self.fail_after:
                self.fail_after = None
                raise BrokerUnavailableError("connection reset")
            results.append(self._one(payload, producer_id, sequences[i] if sequences else -1))
        return results

    def _one(self, payload, producer_id, sequence):
        values = [v for _, _, _, v in decode_messages(payload, 0)[0]]
        if self.storage_errors:
            self.storage_errors -= 1
            return StorageError("disk hiccup")
        if values[0].startswith(b"REFUSE"):
            return InvalidMessageError("refused")
        if producer_id >= 0:
            state = self.producers.get(producer_id)
            if state is not None:
                last = max(state)
                if sequence in state:
                    return state[sequence][0]  # duplicate: the first store's offset
                if sequence <= last:
                    return DuplicateSequenceError(f"{sequence} is too old")
                expected = last + state[last][1]
                if sequence > expected:
                    return OutOfOrderSequenceError(f"expected {expected}, got {sequence}")
            self.producers.setdefault(producer_id, {})[sequence] = (self.offset, len(values))
        base = self.offset
        self.log.extend(values)
        self.offset += len(payload)
        return base

    def connect(self):
        pass

    def close(self):
        pass


def _producer(partition: FakePartition, **options) -> Producer:
    options.setdefault("retry", RetryPolicy(max_tries=5, delay_s=0.001, max_delay_s=0.01, deadline_s=10))
    options.setdefault("acks", 1)
    producer = Producer(FakeMetadata(), linger_ms=1000, **options)
    producer._sender._connection = lambda tp: partition
    producer._sender.visibility = None  # the in-memory partition makes every set readable at once
    return producer


def test_a_refused_set_fails_alone_and_later_sets_continue_under_a_fresh_producer_id():
    part = FakePartition()
    producer = _producer(part, batch_size=2)
    first_id = producer.producer_id
    # one call, so that the four batches of two are sealed together and leave in one round
    call = producer.send_batch("t", [b"a", b"b", b"REFUSE", b"c", b"d", b"e", b"f", b"g"], partition=0)
    with pytest.raises(DeliveryError) as caught:
        producer.flush()
    assert caught.value.failures[("t", 0)][0] == 2  # the refused batch: REFUSE and c
    assert call.exception().failures[("t", 0)][0] == 2
    assert part.log == [b"a", b"b", b"d", b"e", b"f", b"g"]
    # the first set under an id goes alone, then the rest; after the gap the
    # sets continue under a new id, from 0 (again the first alone)
    # (two records a batch: base sequences 0, 2, 4, ...)
    assert part.requests[:2] == [(first_id, [0]), (first_id, [2, 4, 6])]
    new_id = part.requests[2][0]
    assert new_id != first_id and part.requests[2:] == [(new_id, [0]), (new_id, [2])]
    producer.close()


def test_a_lost_connection_resends_with_the_same_sequences_and_stores_once():
    part = FakePartition()
    producer = _producer(part, batch_size=1)
    part.fail_after = None
    producer.send("t", b"m0", partition=0).result(timeout_s=5)
    part.fail_after = 2  # two sets stored, then the connection drops before any reply
    call = producer.send_batch("t", [b"m%d" % i for i in range(1, 5)], partition=0)
    producer.flush()
    assert part.log == [b"m%d" % i for i in range(5)]
    assert [seqs for _, seqs in part.requests] == [[0], [1, 2, 3, 4], [1, 2, 3, 4]]
    offsets = [offset for _, offset in call.result()]
    assert offsets == sorted(set(offsets)) and offsets[0] > 0
    producer.close()


def test_a_retriable_reply_resends_that_set_and_the_ones_after_it():
    part = FakePartition()
    producer = _producer(part, batch_size=1)
    part.storage_errors = 1
    call = producer.send_batch("t", [b"m0", b"m1", b"m2"], partition=0)
    producer.flush()
    assert part.log == [b"m0", b"m1", b"m2"]
    assert [offset >= 0 for _, offset in call.result()] == [True] * 3
    producer.close()


def test_retries_that_run_out_fail_those_sets_and_the_partition_moves_on():
    part = FakePartition()
    producer = _producer(part, batch_size=1, retry=RetryPolicy(max_tries=2, delay_s=0.001, deadline_s=5))
    part.storage_errors = 10
    doomed = producer.send("t", b"doomed", partition=0)
    with pytest.raises(DeliveryError):
        producer.flush()
    assert isinstance(doomed.exception(), StorageError)
    part.storage_errors = 0
    assert producer.send("t", b"next", partition=0).result(timeout_s=5).offset == 0
    assert part.log == [b"next"]
    producer.close()


def test_without_idempotence_no_producer_id_is_sent():
    part = FakePartition()
    producer = _producer(part, enable_idempotence=False)
    producer.send("t", b"x", partition=1)
    producer.flush()
    assert part.requests == [(-1, [])]
    producer.close()


def test_bad_input_is_refused_whole_and_what_was_accepted_is_delivered():
    part = FakePartition()
    producer = _producer(part)
    kept = producer.send("t", b"kept", partition=0)
    with pytest.raises(TypeError):
        producer.send_batch("t", [b"fine", "not bytes"], partition=0)
    with pytest.raises(TypeError):
        producer.send_batch("t", [b"fine"], keys=["not bytes"])
    with pytest.raises(TypeError):
        producer.send("t", "not bytes")
    producer.flush()
    assert part.log == [b"kept"] and kept.result().offset == 0
    producer.close()


def test_acks_0_an_earlier_refusal_does_not_fail_the_sets_not_yet_written():
    part = FakePartition()
    producer = _producer(part, acks=0)
    part.earlier_refusal = InvalidMessageError("an earlier acks=0 produce (correlation id 7) failed: refused")
    futures = [producer.send("t", b"m%d" % i, partition=0) for i in range(3)]
    producer.flush()
    assert part.log == [b"m0", b"m1", b"m2"]
    assert [f.result().offset for f in futures] == [-1, -1, -1]
    producer.close()


def test_batch_one_sends_each_keyless_message_as_its_own_set():
    part = FakePartition()
    # one partition (the fake keeps one sequence state per producer); linger_ms=1000: sealed at send
    producer = Producer(FakeMetadata(partitions=1), linger_ms=1000, batch_size=1, acks=1)
    producer._sender._connection = lambda tp: part
    producer._sender.visibility = None  # the in-memory partition makes every set readable at once
    futures = [producer.send("t", b"m%d" % i) for i in range(20)]
    results = [f.result(timeout_s=5) for f in futures]
    assert part.log == [b"m%d" % i for i in range(20)]
    assert sum(len(seqs) for _, seqs in part.requests) == 20  # one set (one sequence) per message
    offsets = [offset for _, offset in results]
    assert offsets == sorted(set(offsets)) and {p for p, _ in results} == {0}
    assert producer.stats()["sent_batches"] == 20
    producer.close()


class RoundsPartition(FakePartition):
    """Records how many sets each request carries; the first request waits
    for ``gate``."""

    def __init__(self):
        super().__init__()
        import threading

        self.gate = threading.Event()
        self.sizes: list[int] = []

    def produce_sets(self, topic, partition, payloads, acks, *, producer_id=-1, sequences=None):
        self.gate.wait(10)
        self.sizes.append(len(payloads))
        return super().produce_sets(topic, partition, payloads, acks, producer_id=producer_id, sequences=sequences)


def test_an_acks_0_round_takes_at_most_its_bound_of_sets():
    from raylog.producer.sender import MAX_UNACKED_ROUND_SETS

    part = RoundsPartition()
    producer = Producer(FakeMetadata(partitions=1), linger_ms=1000, batch_size=1, acks=0)
    producer._sender._connection = lambda tp: part
    producer._sender.visibility = None  # the in-memory partition makes every set readable at once
    n = 2 * MAX_UNACKED_ROUND_SETS + 100
    for i in range(n):  # the first set's round waits at the gate while the rest queue up
        producer.send("t", b"m%d" % i)
    part.gate.set()
    producer.flush()
    assert part.log == [b"m%d" % i for i in range(n)]
    assert sum(part.sizes) == n and max(part.sizes) == MAX_UNACKED_ROUND_SETS
    producer.close()


class AwayPartition(FakePartition):
    """A partition whose every request fails as if its actor were gone."""

    def produce_sets(self, topic, partition, payloads, acks, *, producer_id=-1, sequences=None):
        self.requests.append((read_header(payloads[0]).producer_id, [read_header(p).base_sequence for p in payloads]))
        raise BrokerUnavailableError("partition t-0 has no live endpoint")


def test_the_retry_deadline_counts_from_each_batchs_creation():
    import time
    from types import SimpleNamespace

    producer = _producer(FakePartition(), retry=RetryPolicy(max_tries=100, delay_s=0.01, deadline_s=30))
    try:
        sender = producer._sender

        def sets(*ages):
            return [SimpleNamespace(batch=SimpleNamespace(created=time.time() - age)) for age in ages]

        assert sender._retry_for(sets(100.0, 1.0)).deadline_s == 0.0  # due already: one try, no retry
        assert 0.0 < sender._retry_for(sets(10.0, 1.0)).deadline_s <= 20.0  # the oldest decides
        assert 25.0 < sender._retry_for(sets(0.0)).deadline_s <= 30.0
        assert sender._retry_for(sets(10.0)).max_tries == 100  # the rest of the policy is the producer's
    finally:
        producer.close()


@pytest.mark.timeout(120)
def test_close_abandons_sets_still_retried_and_fails_them_as_closed():
    """A partition that stays away: close(timeout_s) returns after its
    timeout instead of waiting out the retry deadline (an hour here), and
    every message fails with ClosedError, its outcome unknown."""
    from raylog.errors import ClosedError

    partition = AwayPartition()
    producer = _producer(partition, retry=RetryPolicy(max_tries=10**9, delay_s=0.01, max_delay_s=0.05,
                                                      deadline_s=3600), batch_size=1)
    futures = [producer.send("t", b"v%d" % i, partition=0) for i in range(40)]
    with pytest.raises(RaylogError):
        producer.close(timeout_s=0.5)
    assert all(f.done() for f in futures)
    assert all(isinstance(f.exception(), ClosedError) for f in futures), {type(f.exception()) for f in futures}
    assert partition.requests  # it was tried before the close


@pytest.mark.parametrize("idempotent", [False, True])
@pytest.mark.parametrize("keys", [None, [b"k", None, b""]])
def test_the_compiled_encode_of_a_plain_batch_is_the_reference_batch(monkeypatch, idempotent, keys):
    """The sender's straight call to the compiled encoder (no codec, no
    headers, one time) gives the batch encode_batch gives, byte for byte."""
    from raylog.producer.batch import ProducerBatch
    from raylog.producer.sender import PartitionSequences, encode
    from raylog.storage import record_batch

    if record_batch._speedups is None:
        pytest.skip("the compiled encoder is not built here")
    batch = ProducerBatch("t", 0, None, 1 << 20, False, values=[b"a", None, b"ccc"])
    batch.keys = keys
    state = PartitionSequences(42) if idempotent else None
    if state is not None:
        state.next = 7
    fast = encode(batch, None, state)
    monkeypatch.setattr(record_batch, "_speedups", None)
    assert fast == encode(batch, None, state)
    header = record_batch.read_header(fast)
    assert (header.producer_id, header.base_sequence) == ((42, 7) if idempotent else (-1, -1))
