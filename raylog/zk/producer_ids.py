"""Producer ids for transactional producers, in blocks taken from ZooKeeper
(docs/design.md section 4, ``producer-ids``).

The node ``/raylog/<cluster>/producer-ids`` holds one JSON record::

    {"next": 3000}      the first producer id not yet handed out (an int, 0 ... 2**63 - 1)

A coordinator takes a **block** ``[next, next + size)`` by writing
``next + size`` with a versioned compare-and-set on the version it read
(:func:`take_block`): of two coordinators that read the same version, one
write wins and the other reads again, so no id is ever handed out twice,
however many coordinators race. A coordinator then hands out the ids of its
block one by one (:class:`ProducerIdBlocks`) and takes another block when
it runs out; the ids left in a block when its coordinator stops are never
used (a gap, as in Kafka).

The node only grows. Ids of raylog's own idempotent producers are random
i63 (:mod:`raylog.producer.sender`); they come from the same space, and a
collision with a block's id is as unlikely as one between two random ids.

Thread-safety: :class:`ProducerIdBlocks` is thread-safe (one lock around
its block); :func:`take_block` keeps no state (kazoo clients are
thread-safe).
"""

from __future__ import annotations

import json
import threading

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from raylog.errors import ConfigError, ProducerIdsExhaustedError, TransactionStateConflictError
from raylog.retry import RetryPolicy
from raylog.zk.errors import ensure_connected, zookeeper_errors
from raylog.zk.paths import Paths

#: the largest producer id (a batch's producerId is an i64; -1 means none)
MAX_PRODUCER_ID = (1 << 63) - 1
#: how many ids a coordinator takes at once
DEFAULT_BLOCK_SIZE = 1000
#: how a block is taken again after losing a compare-and-set to another
#: coordinator (each loss means another coordinator took a block: progress)
TAKE_RETRY = RetryPolicy(max_tries=100, delay_s=0.005, max_delay_s=0.2, deadline_s=30.0)


def _parse(data: bytes, path: str) -> int:
    try:
        value = json.loads(data)["next"]
    except (ValueError, KeyError, TypeError):
        value = None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ProducerIdsExhaustedError(
            f"the producer-ids node {path} holds {data[:80]!r}, not a block record {{\"next\": id}}; "
            f"no id was taken: set it by hand to an id above every id handed out so far",
            path=path, found=data[:80].decode("utf-8", "replace"))
    return value


def _record(next_id: int) -> bytes:
    return json.dumps({"next": next_id}).encode()


def take_block(zk, paths: Paths, size: int = DEFAULT_BLOCK_SIZE, *, retry: RetryPolicy = TAKE_RETRY) -> range:
    """Take the next block of ``size`` producer ids: ``range(start, start + size)``.

    Raises :class:`ProducerIdsExhaustedError` when the block would pass
    :data:`MAX_PRODUCER_ID` (or the node holds no block record),
    :class:`TransactionStateConflictError` (retriable) when other
    coordinators won every compare-and-set within ``retry``, and
    ZooKeeper's failures as :mod:`raylog.zk.errors` maps them."""
    if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= 1 << 32:
        raise ConfigError(f"a producer id block holds 1 to 2**32 ids, got {size!r}")
    path = paths.producer_ids
    what = f"take a block of {size} producer ids at {path}"

    def once() -> range:
        ensure_connected(zk, what)
        with zookeeper_errors(zk, what):
            try:
                data, stat = zk.get(path)
            except NoNodeError:
                try:
                    zk.create(path, _record(size), makepath=True)
                except NodeExistsError:
                    raise TransactionStateConflictError(f"cannot {what}: another coordinator created it first",
                                                        path=path) from None
                return range(0, size)
            start = _parse(data, path)
            if start + size - 1 > MAX_PRODUCER_ID:
                raise ProducerIdsExhaustedError(
                    f"cannot {what}: the next id {start} leaves fewer than {size} ids below 2**63; "
                    f"no id was taken", path=path, found=str(start))
            try:
                zk.set(path, _record(start + size), version=stat.version)
            except BadVersionError:
                raise TransactionStateConflictError(
                    f"cannot {what}: another coordinator took a block since version {stat.version} was read",
                    path=path) from None
            return range(start, start + size)

    return retry.call(once, retry_on=(TransactionStateConflictError,))


class ProducerIdBlocks:
    """Hands out producer ids one by one from blocks taken with
    :func:`take_block`; a new block is taken when the current one is used up.

    Thread-safe: one lock guards the block (ids are handed out once each
    even to racing threads; a block is taken by one thread at a time).
    """

    def __init__(self, zk, paths: Paths, block_size: int = DEFAULT_BLOCK_SIZE):
        self.zk, self.paths, self.block_size = zk, paths, block_size
        self._lock = threading.Lock()
        self._block: range = range(0)
        self._next = 0  # index into _block

    def next_id(self) -> int:
        """A producer id never handed out before, by any coordinator of the cluster."""
        with self._lock:
            if self._next >= len(self._block):
                self._block = take_block(self.zk, self.paths, self.block_size)
                self._next = 0
            pid = self._block[self._next]
            self._next += 1
            return pid
