"""Transaction records: one transactional producer's current transaction, as
ZooKeeper holds it (docs/design.md section 4, ``transactions/<transactional id>``).

The record is JSON, one object, field by field:

=====================  =========================  ============================================================
field                  type                       meaning
=====================  =========================  ============================================================
``producer_id``        int (i63)                  the producer id of the transactional id
                                                  (:mod:`raylog.zk.producer_ids`)
``producer_epoch``     int (i16)                  the current epoch: the one calls must carry; in a
                                                  ``Prepare*`` state, the epoch the markers carry
``state``              str                        ``Empty``, ``Ongoing``, ``PrepareCommit``,
                                                  ``PrepareAbort``, ``CompleteCommit``, ``CompleteAbort``
                                                  (:mod:`raylog.zk.transaction_states`)
``partitions``         ``[[topic, p], ...]``      the partitions of the transaction, sorted (empty unless
                                                  ``Ongoing`` or ``Prepare*``)
``groups``             ``{group: [[topic, p,      the consumer groups of the transaction, each with the
                       offset], ...]}``           offsets the transaction commits for it (pending: written
                                                  to the group's offsets when the commit completes,
                                                  dropped by an abort)
``timeout_ms``         int                        the transaction timeout the producer asked for
``started_ms``         int                        when the current transaction began (ms since the epoch;
                                                  -1: none); ``Ongoing`` past ``started_ms + timeout_ms``
                                                  is aborted by the coordinator
``updated_ms``         int                        when the record was last written
``last_producer_id``,  int, int                   the producer id and epoch the producer held when its last
``last_epoch``                                    transaction ended (-1: none): a retried end of that
                                                  transaction is recognised by them (KIP-890: every end bumps
                                                  the epoch, so the retry carries the epoch before the bump)
``next_producer_id``   int                        in a ``Prepare*`` state, the producer id the producer moves
                                                  to when the transaction completes (-1: it keeps its id);
                                                  taken when the epoch is about to run out
``timed_out``          bool                       the last transaction was aborted by the coordinator on its
                                                  timeout (calls of ``last_epoch`` are told so, rather than
                                                  that a newer producer fenced them)
=====================  =========================  ============================================================

Fields not listed are kept as they are read (``extra``), so that a newer
coordinator's fields survive an older one's write.

Every write is a versioned compare-and-set against the version read
(:meth:`TransactionStore.write`): a writer whose record changed meanwhile gets
:class:`raylog.TransactionStateConflictError` and nothing is written. The
completion of a commit writes the group offsets of the record and the
``CompleteCommit`` record in **one** ZooKeeper transaction
(:meth:`TransactionStore.complete`), so that the offsets become visible with
the commit and never without it.

Thread-safety: :class:`TransactionRecord` is immutable; :class:`TransactionStore`
keeps no state of its own beyond the client (kazoo clients are thread-safe).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Iterator, Mapping

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, RolledBackError

from raylog.errors import ConfigError, TransactionStateConflictError
from raylog.zk.errors import ensure_connected, zookeeper_errors
from raylog.zk.paths import Paths, transactional_id_of_node

# the states (Kafka's TransactionState, without PrepareEpochFence and Dead:
# see raylog.zk.transaction_states)
EMPTY = "Empty"
ONGOING = "Ongoing"
PREPARE_COMMIT = "PrepareCommit"
PREPARE_ABORT = "PrepareAbort"
COMPLETE_COMMIT = "CompleteCommit"
COMPLETE_ABORT = "CompleteAbort"
STATES = (EMPTY, ONGOING, PREPARE_COMMIT, PREPARE_ABORT, COMPLETE_COMMIT, COMPLETE_ABORT)
PREPARED = (PREPARE_COMMIT, PREPARE_ABORT)
COMPLETED = (COMPLETE_COMMIT, COMPLETE_ABORT)

_FIELDS = ("producer_id", "producer_epoch", "state", "partitions", "groups", "timeout_ms", "started_ms",
           "updated_ms", "last_producer_id", "last_epoch", "next_producer_id", "timed_out")

#: pending offsets of one group: ``{(topic, partition): offset}``
Offsets = Mapping[tuple[str, int], int]


@dataclasses.dataclass(frozen=True)
class TransactionRecord:
    """One transactional id's record (the fields are the module's table)."""

    producer_id: int
    producer_epoch: int
    state: str
    timeout_ms: int
    partitions: tuple[tuple[str, int], ...] = ()
    #: ``((group, ((topic, partition, offset), ...)), ...)``, both levels sorted
    groups: tuple[tuple[str, tuple[tuple[str, int, int], ...]], ...] = ()
    started_ms: int = -1
    updated_ms: int = -1
    last_producer_id: int = -1
    last_epoch: int = -1
    next_producer_id: int = -1
    timed_out: bool = False
    #: fields of the JSON this version does not know, kept as read
    extra: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):
        if self.state not in STATES:
            raise ConfigError(f"a transaction state is one of {', '.join(STATES)}, got {self.state!r}")

    # -- the parts as mappings ----------------------------------------------

    @property
    def group_offsets(self) -> dict[str, dict[tuple[str, int], int]]:
        """``{group: {(topic, partition): offset}}``: the pending offsets."""
        return {group: {(t, p): o for t, p, o in offsets} for group, offsets in self.groups}

    def with_partitions(self, partitions) -> "TransactionRecord":
        return dataclasses.replace(self, partitions=tuple(sorted(set(self.partitions) | {
            (str(t), int(p)) for t, p in partitions})))

    def with_group(self, group: str, offsets: Offsets | None = None) -> "TransactionRecord":
        """The record with ``group`` in the transaction and ``offsets`` merged
        into its pending offsets (a later offset of a partition replaces an
        earlier one, as a later commit would)."""
        merged = self.group_offsets
        pending = merged.setdefault(group, {})
        for (topic, partition), offset in (offsets or {}).items():
            pending[(str(topic), int(partition))] = int(offset)
        return dataclasses.replace(self, groups=_groups(merged))

    # -- JSON ------------------------------------------------------------------

    def to_json(self) -> bytes:
        raw = {name: json.loads(value) for name, value in self.extra}
        raw.update({
            "producer_id": self.producer_id, "producer_epoch": self.producer_epoch, "state": self.state,
            "partitions": [[t, p] for t, p in self.partitions],
            "groups": {g: [[t, p, o] for t, p, o in offsets] for g, offsets in self.groups},
            "timeout_ms": self.timeout_ms, "started_ms": self.started_ms, "updated_ms": self.updated_ms,
            "last_producer_id": self.last_producer_id, "last_epoch": self.last_epoch,
            "next_producer_id": self.next_producer_id, "timed_out": self.timed_out,
        })
        return json.dumps(raw, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, path: str = "?") -> "TransactionRecord":
        try:
            raw = json.loads(data)
            groups = raw.get("groups") or {}
            if isinstance(groups, list):  # a plain list of group names: no pending offsets
                groups = {g: [] for g in groups}
            return cls(
                producer_id=int(raw["producer_id"]), producer_epoch=int(raw["producer_epoch"]),
                state=str(raw["state"]), timeout_ms=int(raw["timeout_ms"]),
                partitions=tuple(sorted((str(t), int(p)) for t, p in raw.get("partitions", ()))),
                groups=_groups({str(g): {(str(t), int(p)): int(o) for t, p, o in offsets}
                                for g, offsets in groups.items()}),
                started_ms=int(raw.get("started_ms", -1)), updated_ms=int(raw.get("updated_ms", -1)),
                last_producer_id=int(raw.get("last_producer_id", -1)), last_epoch=int(raw.get("last_epoch", -1)),
                next_producer_id=int(raw.get("next_producer_id", -1)), timed_out=bool(raw.get("timed_out", False)),
                extra=tuple(sorted((k, json.dumps(v)) for k, v in raw.items() if k not in _FIELDS)),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise ConfigError(f"the transaction record {path} holds {data[:120]!r}, not a record "
                              f"({type(err).__name__}: {err}); delete the node to forget the "
                              f"transactional id (its producer must then start again)") from None


def _groups(mapping: Mapping[str, Offsets]) -> tuple:
    return tuple(sorted((g, tuple(sorted((t, p, o) for (t, p), o in offsets.items())))
                        for g, offsets in mapping.items()))


class TransactionStore:
    """Reads and writes the transaction records of one cluster, each write a
    versioned compare-and-set. Stateless apart from the client and the path
    builder; safe to use from any thread."""

    def __init__(self, zk, cluster_or_paths: str | Paths):
        self.zk = zk
        self.paths = cluster_or_paths if isinstance(cluster_or_paths, Paths) else Paths(cluster_or_paths)

    def read(self, transactional_id: str) -> tuple[TransactionRecord, int] | None:
        """``(record, version)``, or None for a transactional id without one."""
        path = self.paths.transaction(transactional_id)
        what = f"read the transaction record of {transactional_id!r}"
        ensure_connected(self.zk, what)
        with zookeeper_errors(self.zk, what):
            try:
                data, stat = self.zk.get(path)
            except NoNodeError:
                return None
        return TransactionRecord.from_json(data, path), stat.version

    def transactional_ids(self) -> list[str]:
        """Every transactional id with a record, sorted."""
        what = "list the transaction records"
        ensure_connected(self.zk, what)
        with zookeeper_errors(self.zk, what):
            try:
                names = self.zk.get_children(self.paths.transactions)
            except NoNodeError:
                return []
        return sorted(transactional_id_of_node(name) for name in names)

    def records(self) -> Iterator[tuple[str, TransactionRecord, int]]:
        """``(transactional id, record, version)`` of every record (one
        removed meanwhile is left out)."""
        for tid in self.transactional_ids():
            found = self.read(tid)
            if found is not None:
                yield tid, found[0], found[1]

    def write(self, transactional_id: str, record: TransactionRecord, version: int | None) -> int:
        """Write ``record`` if the stored one is still at ``version`` (None:
        only if there is none yet); returns the new version. A stale writer
        gets :class:`TransactionStateConflictError` and nothing is written."""
        path = self.paths.transaction(transactional_id)
        what = f"write the transaction record of {transactional_id!r} ({record.state})"
        ensure_connected(self.zk, what)
        with zookeeper_errors(self.zk, what):
            try:
                if version is None:
                    self.zk.create(path, record.to_json(), makepath=True)
                    return 0
                return self.zk.set(path, record.to_json(), version=version).version
            except NodeExistsError:
                raise self._conflict(transactional_id, "it was created by another writer since it was read") from None
            except BadVersionError:
                raise self._conflict(transactional_id, f"it changed since version {version} was read") from None
            except NoNodeError:
                raise self._conflict(transactional_id, f"it was removed since version {version} was read") from None

    def complete(self, transactional_id: str, record: TransactionRecord, version: int,
                 offsets: Mapping[str, Offsets]) -> int:
        """Write ``record`` (a completed transaction) at ``version`` and the
        group ``offsets`` (``{group: {(topic, p): offset}}``) in one
        ZooKeeper transaction: all of it or nothing. Returns the new
        version; a stale writer gets :class:`TransactionStateConflictError`
        and nothing is written. The offsets are written as
        :mod:`raylog.groups.offsets` stores them (the offset in ASCII)."""
        if not offsets:
            return self.write(transactional_id, record, version)
        path = self.paths.transaction(transactional_id)
        what = f"complete the transaction of {transactional_id!r} with its offsets"
        ensure_connected(self.zk, what)
        with zookeeper_errors(self.zk, what):
            # parents first (outside the transaction: harmless if it fails after)
            nodes = {}
            for group, pending in offsets.items():
                for (topic, partition), offset in pending.items():
                    self.zk.ensure_path(self.paths.offsets(group, topic))
                    node = self.paths.offset(group, topic, partition)
                    nodes[node] = (str(int(offset)).encode("ascii"), self.zk.exists(node) is not None)
            txn = self.zk.transaction()
            txn.set_data(path, record.to_json(), version=version)
            for node, (data, exists) in sorted(nodes.items()):
                if exists:
                    txn.set_data(node, data)
                else:
                    txn.create(node, data)
            results = txn.commit()
        failures = [r for r in results if isinstance(r, Exception) and not isinstance(r, RolledBackError)]
        if not failures:
            return results[0].version
        first = failures[0]
        if isinstance(results[0], BadVersionError | NoNodeError):
            raise self._conflict(transactional_id, f"it changed since version {version} was read")
        # an offset node created or removed meanwhile by a consumer: try again, knowing it
        raise TransactionStateConflictError(
            f"cannot {what}: an offset node changed while it was written ({type(first).__name__}); "
            f"nothing was written, try again", transactional_id=transactional_id)

    def delete(self, transactional_id: str, version: int) -> None:
        """Remove the record if it is still at ``version`` (a transactional
        id forgotten); :class:`TransactionStateConflictError` if it changed."""
        path = self.paths.transaction(transactional_id)
        what = f"delete the transaction record of {transactional_id!r}"
        ensure_connected(self.zk, what)
        with zookeeper_errors(self.zk, what):
            try:
                self.zk.delete(path, version=version)
            except BadVersionError:
                raise self._conflict(transactional_id, f"it changed since version {version} was read") from None
            except NoNodeError:
                pass

    def _conflict(self, transactional_id: str, why: str) -> TransactionStateConflictError:
        return TransactionStateConflictError(
            f"the transaction record of {transactional_id!r} was not written: {why} (another coordinator "
            f"wrote it); nothing was changed: read it again and decide again",
            transactional_id=transactional_id)
