"""A transactional producer's side of a transaction (docs/design.md
sections 5 and 6): its identity from the cluster's transaction coordinator
and the state of its current transaction.

    producer = client.producer(transactional_id="t1")   # init_producer_id: fences an older one
    producer.begin_transaction()
    producer.send("out", b"v")                           # flagged transactional
    producer.send_offsets_to_transaction({("in", 0): 42}, "group")
    producer.commit_transaction()                        # or abort_transaction()

The coordinator is the detached actor named
:func:`raylog.config.coordinator_name` (started by the client's factory,
:meth:`raylog.Client.producer`); every call goes to it through Ray.

* **Identity.** ``init`` asks for ``(producer_id, epoch)``; an older
  producer of the same transactional id is fenced by it (its epoch is
  bumped past). Every end of a transaction answers the next identity
  (KIP-890: an epoch bump per transaction), which the next transaction
  takes; its batches restart their sequences at 0 under it.
* **States.** ``ready`` (no transaction), ``in transaction``, ``fenced``
  (for good: every call raises :class:`~raylog.errors.ProducerFencedError`),
  ``expired`` (the coordinator aborted the transaction at its timeout and
  bumped the epoch: every call raises
  :class:`~raylog.errors.InvalidProducerEpochError`; make a new producer).
  A batch that failed inside a transaction makes it **abortable**: its
  commit raises that error, and only ``abort`` ends it.
* **Partitions.** Before the first batch of a transaction goes to a
  partition, the sender calls :meth:`TransactionManager.add_partition`,
  which adds it with the coordinator once per transaction (KIP-890's
  partition check then lets the batch in when the partition verifies).

Thread-safety: the caller's threads (begin, offsets, commit, abort, the
checks of ``send``) and the sender's workers (``add_partition``,
``failed``) share the state under one lock; coordinator calls that add a
partition run under a per-manager lock of their own, so a partition is
added once.
"""

from __future__ import annotations

import threading

from raylog.config import NAMESPACE, coordinator_name
from raylog.errors import (
    BrokerUnavailableError,
    ConfigError,
    InvalidProducerEpochError,
    InvalidTxnStateError,
    ProducerFencedError,
    RaylogError,
)
from raylog.retry import RetryPolicy

#: a transaction's timeout when the producer names none (Kafka's default)
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000
#: how long one coordinator call may take (it may write markers meanwhile)
CALL_TIMEOUT_S = 60.0
#: retries of retriable coordinator answers (a previous transaction still
#: completing, a compare-and-set lost, the actor restarting)
COORDINATOR_RETRY = RetryPolicy(max_tries=50, delay_s=0.05, max_delay_s=1.0, deadline_s=60.0)

READY, IN_TRANSACTION, FENCED, EXPIRED = "ready", "in transaction", "fenced", "expired"


def find_coordinator(cluster: str):
    """The handle of ``cluster``'s transaction coordinator, or a retriable
    :class:`BrokerUnavailableError` saying how to start it."""
    import ray  # heavy (Ray): imported when used

    try:
        return ray.get_actor(coordinator_name(cluster), namespace=NAMESPACE)
    except ValueError:
        raise BrokerUnavailableError(
            f"cluster {cluster!r} has no transaction coordinator running; make transactional producers with "
            f"client.producer(transactional_id=...), which starts it") from None


class TransactionManager:
    """The transaction state of one transactional producer (see the module
    docstring for its thread-safety)."""

    def __init__(self, coordinator, transactional_id: str, timeout_ms: int):
        if not isinstance(transactional_id, str) or not transactional_id:
            raise ConfigError(f"transactional_id must be a non-empty str, got {transactional_id!r}")
        self.coordinator = coordinator
        self.transactional_id = transactional_id
        self.timeout_ms = timeout_ms
        self.producer_id, self.epoch = -1, -1
        self.state = READY
        self._lock = threading.Lock()
        self._add_lock = threading.Lock()
        self._partitions: set[tuple[str, int]] = set()
        self._error: RaylogError | None = None  # what makes the open transaction abortable
        self._fenced: ProducerFencedError | None = None
        self._expired: InvalidProducerEpochError | None = None

    # -- coordinator calls -----------------------------------------------------------

    def _call(self, method: str, *args):
        """One coordinator call: its typed error as it is (not Ray's
        wrapper), retriable answers retried, a fence remembered for good."""
        import ray  # heavy (Ray): imported when used

        def once():
            try:
                return ray.get(getattr(self.coordinator, method).remote(*args), timeout=CALL_TIMEOUT_S)
            except ray.exceptions.RayTaskError as err:
                cause = getattr(err, "cause", None)
                if isinstance(cause, RaylogError):
                    raise cause from None
                raise
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as err:
                raise BrokerUnavailableError(
                    f"the transaction coordinator did not answer {method} of {self.transactional_id!r} "
                    f"({type(err).__name__}); retrying") from None

        try:
            return COORDINATOR_RETRY.call(once)
        except ProducerFencedError as err:
            self._fence(err)
            raise

    def _fence(self, err: ProducerFencedError) -> None:
        with self._lock:
            self.state = FENCED
            if self._fenced is None:
                self._fenced = err

    def init(self) -> None:
        """Take this producer's identity (fencing an older producer of the id)."""
        self.producer_id, self.epoch = self._call("init_producer_id", self.transactional_id, self.timeout_ms)

    # -- the caller's side -------------------------------------------------------------

    def check_not_fenced(self) -> None:
        """Raise :class:`ProducerFencedError` once fenced, or the
        :class:`InvalidProducerEpochError` of a transaction the coordinator
        aborted at its timeout: such a producer is done for good."""
        if self._fenced is not None:
            raise ProducerFencedError(
                f"this producer of transactional id {self.transactional_id!r} was fenced by a newer one "
                f"({self._fenced}); close it", transactional_id=self.transactional_id)
        if self._expired is not None:
            raise InvalidProducerEpochError(
                f"the coordinator aborted the transaction of {self.transactional_id!r} when it passed its timeout "
                f"of {self.timeout_ms} ms ({self._expired}); close this producer and make a new one",
                transactional_id=self.transactional_id)

    def begin(self) -> None:
        with self._lock:
            self.check_not_fenced()
            if self.state != READY:
                raise InvalidTxnStateError(
                    f"a transaction of {self.transactional_id!r} is open already; commit or abort it first",
                    state=self.state)
            self.state = IN_TRANSACTION
            self._partitions.clear()
            self._error = None

    def check_send(self) -> None:
        """Raise unless a send may go out now (inside an open transaction)."""
        self.check_not_fenced()
        if self.state != IN_TRANSACTION:
            raise InvalidTxnStateError(
                f"a transactional producer ({self.transactional_id!r}) sends only inside a transaction: call "
                f"begin_transaction() first", state=self.state)

    def add_offsets(self, offsets, group: str) -> None:
        self.check_send()
        if not isinstance(group, str) or not group:
            raise ConfigError(f"group must be a non-empty str, got {group!r}")
        clean = {}
        for tp, offset in dict(offsets).items():
            topic, partition = tp
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
                raise ConfigError(f"the offset of {topic}-{partition} must be a non-negative int, got {offset!r}")
            clean[(str(topic), int(partition))] = offset
        self._call("add_offsets", self.transactional_id, self.producer_id, self.epoch, group, clean)

    def end(self, commit: bool) -> tuple[int, int]:
        """End the open transaction (every batch of it has its outcome);
        take the identity of the next one."""
        with self._lock:
            self.check_not_fenced()
            if self.state != IN_TRANSACTION:
                raise InvalidTxnStateError(
                    f"no transaction of {self.transactional_id!r} is open to "
                    f"{'commit' if commit else 'abort'}; call begin_transaction() first", state=self.state)
            if commit and self._error is not None:
                raise InvalidTxnStateError(
                    f"the transaction of {self.transactional_id!r} cannot commit: a send of it failed "
                    f"({type(self._error).__name__}: {self._error}); abort it", state="abortable")
        identity = self._call("end_transaction", self.transactional_id, self.producer_id, self.epoch, bool(commit))
        with self._lock:
            self.producer_id, self.epoch = identity
            self.state = READY
            self._partitions.clear()
            self._error = None
        return identity

    def expired(self, error: InvalidProducerEpochError) -> None:
        """The coordinator ended the transaction without this producer
        (its timeout) and bumped the epoch: every later call raises; a new
        producer of the id is needed for the next transaction."""
        with self._lock:
            self.state = EXPIRED
            if self._expired is None:
                self._expired = error

    # -- the sender's side ---------------------------------------------------------------

    def add_partition(self, tp: tuple[str, int]) -> tuple[int, int]:
        """Before a batch goes to ``tp``: add it to the transaction (once);
        the identity its batches carry."""
        if tp in self._partitions:
            return self.producer_id, self.epoch
        with self._add_lock:
            if tp not in self._partitions:
                self.check_send()
                self._call("add_partitions", self.transactional_id, self.producer_id, self.epoch, [tp])
                self._partitions.add(tp)
        return self.producer_id, self.epoch

    def failed(self, error: BaseException) -> None:
        """A batch of the open transaction failed: it may only abort now."""
        with self._lock:
            if self._error is None and isinstance(error, RaylogError):
                self._error = error
            elif self._error is None:
                self._error = RaylogError(f"{type(error).__name__}: {error}")
            if isinstance(error, ProducerFencedError) and self._fenced is None:
                self.state, self._fenced = FENCED, error
