"""The replication state of a partition as ZooKeeper records it, for
readers: the ``state`` node and the ``replicas/<node>`` endpoints
(docs/design.md section 4; the fields are explained in :mod:`raylog.replication.state`,
which also writes them). Readers below replication -- the read plans of
:mod:`raylog.read`, the registry's tombstones -- read them here.

Thread-safety: :class:`PartitionState` is immutable; the functions keep no
state (kazoo clients are thread-safe).
"""

from __future__ import annotations

import dataclasses
import json

from kazoo.exceptions import NoNodeError


@dataclasses.dataclass(frozen=True)
class PartitionState:
    leader: str
    leader_epoch: int
    isr: tuple[str, ...]
    replicas: tuple[str, ...]
    epochs: tuple[tuple[int, int], ...] = ()
    #: the first leader at create (None: ``replicas[0]``, as states written before it)
    origin: str | None = None
    #: replicas on their way out (a reassignment's old leader); not started again by a repair
    removing: tuple[str, ...] = ()

    def __post_init__(self):
        if self.origin is None:
            object.__setattr__(self, "origin", self.replicas[0])

    def to_json(self) -> bytes:
        return json.dumps(
            {"leader": self.leader, "leader_epoch": self.leader_epoch, "isr": list(self.isr),
             "replicas": list(self.replicas), "epochs": [list(e) for e in self.epochs], "origin": self.origin,
             "removing": list(self.removing)},
            sort_keys=True,
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> "PartitionState":
        raw = json.loads(data)
        return cls(raw["leader"], int(raw["leader_epoch"]), tuple(raw["isr"]), tuple(raw["replicas"]),
                   tuple((int(e), int(o)) for e, o in raw.get("epochs", ())), raw.get("origin"),
                   tuple(raw.get("removing", ())))

    def boundary_after(self, epoch: int) -> int | None:
        """Where the first leader epoch after ``epoch`` began (None: none did)."""
        return min((start for e, start in self.epochs if e > epoch), default=None)

    def with_isr(self, isr) -> "PartitionState":
        """The same state with ``isr`` (kept in the order of ``replicas``)."""
        members = set(isr)
        return dataclasses.replace(self, isr=tuple(r for r in self.replicas if r in members))


def state_path(paths, topic: str, partition: int) -> str:
    return paths.state(topic, partition)


def replicas_path(paths, topic: str, partition: int) -> str:
    return paths.replicas(topic, partition)


def replica_path(paths, topic: str, partition: int, node: str) -> str:
    return paths.replica(topic, partition, node)


def read_state(zk, paths, topic: str, partition: int) -> tuple[PartitionState, int] | None:
    """``(state, version)``, or None for a partition without replication."""
    try:
        data, stat = zk.get(paths.state(topic, partition))
    except NoNodeError:
        return None
    return PartitionState.from_json(data), stat.version


def running_replicas(zk, paths, topic: str, partition: int) -> dict[str, dict]:
    """``{node: endpoint}`` of the replica actors that run now."""
    root = paths.replicas(topic, partition)
    try:
        children = zk.get_children(root)
    except NoNodeError:
        return {}
    found = {}
    for node in children:
        try:
            found[node] = json.loads(zk.get(paths.replica(topic, partition, node))[0])
        except NoNodeError:
            continue
    return found
