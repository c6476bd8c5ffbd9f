"""What a pool member produces from a batch: the handler's outputs, written
to the pool's ``output_topic`` at least once or exactly once.

**What a handler returns** (with ``output_topic``; without one it is
ignored): ``None`` or a list (or tuple) of outputs, each one of

* ``bytes``: a value without a key;
* ``(key, value)``: a pair of ``bytes`` or ``None`` (a ``None`` value is a
  tombstone, for a compacted output topic);
* a :class:`raylog.Message`: its key, value, headers and timestamp (its
  topic, partition and offset are not used: it goes to the output topic).

Keyed outputs go to their key's partition (the producer's partitioner),
keyless ones to any. Anything else fails the batch with a
:class:`raylog.ArgumentTypeError` naming the output, as an error of the
handler would (retried, then the partition stops or the batch is
dead-lettered). The outputs of one batch keep their order per output
partition.

**At least once** (:class:`AtLeastOnceOutput`, ``exactly_once=False``): the
outputs are sent with ``acks="all"`` and waited for before the handler
counts as returned; the input position then moves and is committed at the
next ``commit_interval_s``. A member that dies in between produces the
batch again when it is handled again: duplicates, never a loss.

**Exactly once** (:class:`ExactlyOnceOutput`, ``exactly_once=True``): one
transactional producer per input partition, as Kafka Streams' EOS v1
("exactly_once"): the transactional id is :func:`transactional_id`, made
of the group and the input partition only, so whichever member owns the
partition makes the same id. Making it (``init_producer_id``) fences every
older producer of the id (a member that lost the partition but still
runs: a zombie; its open transaction is aborted and its later sends and
commits are refused with :class:`raylog.ProducerFencedError`), and it
waits for a transaction of the id that is being committed to complete.
So the member makes it when the partition is assigned, *before* it reads
the partition's committed offset (:meth:`ExactlyOnceOutput.open`), and
then reads from that offset (the consumer's own start was resolved
before the fence and may be older). EOS v2 (KIP-447: one producer per
member, the zombie told by the group's generation in
``send_offsets_to_transaction``) is not used: raylog's transaction
coordinator keeps no group generation to check offsets against.

Per batch: the handler; ``begin_transaction``; its outputs sent; the
batch's end position sent with ``send_offsets_to_transaction`` for the
pool's group; ``commit_transaction``. Outputs and position become visible
together to ``read_committed`` readers, or not at all: any error fails the
batch, and one after the transaction began (a send or the commit failing)
aborts it. (The transaction begins once the handler returned, so that the
handler's time does not count against ``transaction_timeout_ms``; a handler
that raises, or returns a bad output, leaves nothing to abort: nothing of
the batch was sent and its offsets did not move.) A fence is not a failure of the batch:
:class:`PartitionFenced` is raised, and the member lets the partition go.

Thread-safety: both classes are confined to the member's loop thread.
"""

from __future__ import annotations

import logging

from raylog.consumer.record import Message
from raylog.errors import ArgumentTypeError, ProducerFencedError
from raylog.pool.handler import BatchAbandoned

log = logging.getLogger(__name__)

#: how long the outputs of one batch (and its transaction's end) may take to be stored
DELIVERY_TIMEOUT_S = 60.0


def transactional_id(group: str, topic: str, partition: int) -> str:
    """The transactional id of the producer of input ``topic``-``partition``
    in the pool of ``group`` (stable across members and restarts; the
    group has no ``:``, so ids of two pools never meet)."""
    return f"raylog-pool:{group}:{topic}:{partition}"


def outputs_of(returned) -> list[tuple[bytes | None, bytes | None, list | None, int | None]]:
    """``(key, value, headers, timestamp_ms)`` of each output the handler
    returned (see the module docstring); raises :class:`ArgumentTypeError`."""
    if returned is None:
        return []
    if not isinstance(returned, (list, tuple)):
        raise ArgumentTypeError(
            f"a pool handler with output_topic returns None or a list of outputs (bytes, (key, value) pairs or "
            f"raylog Messages), got {type(returned).__name__}")
    out = []
    for i, item in enumerate(returned):
        if isinstance(item, Message):
            out.append((item.key, item.value, item.headers or None, item.timestamp))
        elif type(item) is bytes:
            out.append((None, item, None, None))
        elif isinstance(item, tuple) and len(item) == 2 and all(type(x) is bytes or x is None for x in item):
            out.append((item[0], item[1], None, None))
        else:
            raise ArgumentTypeError(
                f"output {i} of the handler is {item!r:.80}: an output is bytes (a value), a (key, value) pair "
                f"of bytes or None, or a raylog Message")
    return out


def _send(producer, topic: str, outputs: list) -> list:
    return [producer.send(topic, value, key, timestamp_ms=ts, headers=headers) for key, value, headers, ts in outputs]


class AtLeastOnceOutput:
    """The outputs of every partition through one idempotent producer
    (``acks="all"``), each batch's waited for (see the module docstring)."""

    def __init__(self, client, topic: str):
        self.client = client
        self.topic = topic
        self._producer = None

    def run(self, tp, batch: list, call):
        """Call the handler (``call()``), then store its outputs."""
        outputs = outputs_of(call())
        if outputs:
            if self._producer is None:
                self._producer = self.client.producer(acks="all")
            futures = _send(self._producer, self.topic, outputs)
            self._producer.flush(timeout_s=DELIVERY_TIMEOUT_S)
            for f in futures:
                f.result(timeout_s=DELIVERY_TIMEOUT_S)

    def open(self, tp) -> None:
        """Nothing to do when a partition is assigned."""

    def release(self, tp) -> None:
        """Nothing to do when a partition goes."""

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close()
            self._producer = None


class PartitionFenced(BatchAbandoned):
    """A newer producer of the partition's transactional id started: the
    partition is another member's now (this member is the zombie)."""


class ExactlyOnceOutput:
    """One transactional producer per input partition owned (see the
    module docstring); ``group`` is the pool's consumer group, whose offsets
    the transactions commit."""

    def __init__(self, client, topic: str, group: str, timeout_ms: int):
        self.client = client
        self.topic = topic
        self.group = group
        self.timeout_ms = timeout_ms
        self._producers: dict = {}  # (topic, partition) -> its transactional producer

    def open(self, tp) -> None:
        """Make ``tp``'s producer (fencing any older one, and waiting for a
        transaction of it being completed); call before reading ``tp``'s
        committed offset."""
        self.release(tp)
        self._producers[tp] = self.client.producer(
            transactional_id=transactional_id(self.group, *tp), transaction_timeout_ms=self.timeout_ms,
            acks="all")

    def release(self, tp) -> None:
        """``tp`` goes: close its producer (no transaction of it is open between batches)."""
        producer = self._producers.pop(tp, None)
        if producer is not None:
            try:
                producer.close(timeout_s=DELIVERY_TIMEOUT_S)
            except Exception as err:  # noqa: BLE001 - a fenced producer's close may raise; it goes either way
                log.debug("closing the producer of %s: %s", tp, err)

    def run(self, tp, batch: list, call) -> None:
        """One transaction: the handler's outputs and the batch's end
        position, committed together or aborted together."""
        outputs = outputs_of(call())  # a failure here has nothing to abort: no transaction is open yet
        self._transact(tp, batch, self.topic, outputs)

    def dead_letter(self, tp, batch: list, topic: str) -> None:
        """Store ``batch`` as it was in dead-letter ``topic`` and move past it,
        in one transaction (as :meth:`run` does with outputs)."""
        self._transact(tp, batch, topic, [(m.key, m.value, m.headers or None, m.timestamp) for m in batch])

    def _transact(self, tp, batch: list, topic: str, outputs: list) -> None:
        producer = self._producers.get(tp)
        if producer is None:
            self.open(tp)  # a partition handled before open (not expected): the fence still comes first
            producer = self._producers[tp]
        try:
            producer.begin_transaction()
            _send(producer, topic, outputs)
            producer.send_offsets_to_transaction({tp: batch[-1].next_offset}, self.group)
            producer.commit_transaction(timeout_s=DELIVERY_TIMEOUT_S)
        except ProducerFencedError as err:
            self.release(tp)
            raise PartitionFenced(f"{tp[0]}-{tp[1]}: {err}") from None
        except BaseException:
            self._abort(tp, producer)
            raise

    def _abort(self, tp, producer) -> None:
        """Abort the open transaction; a producer that cannot (fenced, or its
        transaction expired) is replaced by a new one (which fences nobody
        but it)."""
        try:
            if producer.transaction.state != "ready":
                producer.abort_transaction(timeout_s=DELIVERY_TIMEOUT_S)
            return
        except ProducerFencedError as err:
            self.release(tp)
            raise PartitionFenced(f"{tp[0]}-{tp[1]}: {err}") from None
        except Exception as err:  # noqa: BLE001 - expired or unreachable: start the id again
            log.info("aborting the transaction of %s failed (%s); making its producer again", tp, err)
        self.open(tp)

    def close(self) -> None:
        for tp in list(self._producers):
            self.release(tp)
