"""The replication role of one partition actor: leader or follower, chosen
from the partition's ``state`` node when the actor starts.

Thread-safety: written in ``__init__`` only; the leader and follower it
holds are thread-safe (see their modules).
"""

from __future__ import annotations

import time

from raylog.errors import ConfigError
from raylog.replication import handoff
from raylog.replication.follower import Follower, write_epoch
from raylog.replication.follower_reads import FollowerView
from raylog.replication.leader import ClientView, Leader
from raylog.replication.state import read_state, register_replica

#: how often the leader reviews its ISR
MAINTAIN_INTERVAL_S = 0.1


class ReplicaRole:
    """``on_promoted()``: called (on the follower's thread) once this
    follower has become the leader; the actor registers its endpoint then.
    ``on_deposed()``: called (on the timer thread) once this leader finds
    that another replica leads; the actor ends its process then, and Ray
    starts it again as a follower."""

    def __init__(self, zk, registry, topic: str, partition: int, node: str, partition_log, token: bytes,
                 on_promoted=None, on_deposed=None):
        found = read_state(zk, registry.paths, topic, partition)
        if found is None:
            raise ConfigError(f"{topic}-{partition} has no replication state in ZooKeeper; it is not replicated")
        state, version = found
        if node not in state.replicas:
            raise ConfigError(f"{topic}-{partition} has no replica on {node} (replicas {', '.join(state.replicas)}: "
                              f"it was reassigned); not serving this log")
        self.zk, self.paths, self.topic, self.partition, self.node = zk, registry.paths, topic, partition, node
        self.registry, self._token = registry, token
        self.log = partition_log
        self.is_leader = state.leader == node
        self.leader = self.follower = None
        self._next_maintain = 0.0
        self._on_promoted = on_promoted
        self._on_deposed = on_deposed
        if self.is_leader:
            self._lead(state, version)
        else:
            self._follow()
        # each replica cleans its log on its own (a compacted topic), over committed records only,
        # and removes tombstones only below what every replica holds
        partition_log.clean_limit = self.committed_offset
        partition_log.tombstone_limit = self.tombstone_limit

    def _follow(self) -> None:
        self.follower = Follower(self.registry, self.topic, self.partition, self.node, self.log, self._token,
                                 self._promoted)
        self._follower_view = FollowerView(self.log, self.follower.watermark, self.node)
        self.follower.start()

    def _lead(self, state, version) -> None:
        leader = Leader(self.zk, self.paths, self.topic, self.partition, self.node, self.log, state, version,
                        on_deposed=self._on_deposed)
        self._client_view = ClientView(leader)
        self.leader = leader
        self.is_leader = True

    def _promoted(self, state, version) -> None:
        self._lead(state, version)
        if self._on_promoted is not None:
            self._on_promoted()

    def committed_offset(self) -> int:
        """The committed offset this replica knows: the leader's own, or the
        one a follower learnt from its leader's replies. The log cleaner
        never cleans past it (:attr:`PartitionLog.clean_limit
        <raylog.storage.log.PartitionLog.clean_limit>`): a record a leader
        change may still cut off never removes an older, committed one."""
        leader = self.leader
        if leader is not None:
            return leader.committed
        follower = self.follower
        return 0 if follower is None else follower.watermark.learned

    def tombstone_limit(self) -> int:
        """Below which offset this replica's cleaner may remove tombstones
        (:attr:`PartitionLog.tombstone_limit
        <raylog.storage.log.PartitionLog.tombstone_limit>`): on the leader,
        the lowest log end that every replica of the partition (in the ISR
        or not) is known to hold; on a follower, 0 (a follower keeps its
        tombstones: it does not know how far the other followers reach, and
        a follower that leads later bounds them as a leader). A replica
        behind when a tombstone went would never receive it, and would keep
        the value it deleted."""
        leader = self.leader
        return 0 if leader is None else leader.replicas_hold()

    def hand_off(self, target: str, timeout_s: float) -> dict:
        """Hand this leader's lead to ``target`` (steps 1-3 of
        :mod:`raylog.replication.handoff`); the caller then removes the
        endpoint and calls :meth:`follow_new_leader`. Raises
        :class:`~raylog.errors.HandoffError` with nothing changed."""
        if self.leader is None:
            raise handoff.HandoffError(f"replica {self.node} of {self.topic}-{self.partition} does not lead; "
                                       f"nothing to hand off")
        return handoff.hand_off(self.leader, target, timeout_s)

    def follow_new_leader(self) -> None:
        """After :meth:`hand_off`: this replica, which holds the whole log up
        to the new epoch's start, follows the new leader in this process."""
        leader = self.leader
        write_epoch(self.log.directory, leader.state.leader_epoch)
        self._follow()
        self.is_leader = False
        self.leader = None
        leader.stop()

    def resolve(self, topic: str):
        """What the data server serves under ``topic`` (None: not here): a
        leader serves clients its committed log; a follower serves readers
        up to the high watermark it learned
        (:mod:`raylog.replication.follower_reads`)."""
        if topic != self.topic:
            return None
        if self.leader is not None:
            return self._client_view
        return self._follower_view if self.follower is not None else None

    def resolve_replica(self, topic: str):
        """The leader that answers its followers' REPLICA_FETCH under
        ``topic`` (None: this replica does not lead it)."""
        leader = self.leader  # (a handoff may change it meanwhile)
        return leader if leader is not None and topic == self.topic else None

    def on_flush(self) -> None:
        """The log's flush hook: a leader's committed offset may move now."""
        leader = self.leader
        if leader is not None:
            leader.on_flush()

    def register(self, host: str, port: int, actor: str) -> None:
        register_replica(self.zk, self.paths, self.topic, self.partition, self.node,
                         {"host": host, "port": port, "actor": actor})

    def tick(self) -> None:
        """The actor's timer: the leader reviews its ISR now and then."""
        if self.leader is not None and time.monotonic() >= self._next_maintain:
            self.leader.maintain()
            self._next_maintain = time.monotonic() + MAINTAIN_INTERVAL_S

    def status(self) -> dict:
        row = {"node": self.node, "role": "leader" if self.is_leader else "follower",
               "log_end_offset": self.log.log_end_offset, "flushed_offset": self.log.high_watermark}
        if self.follower is not None and self.leader is None:
            row.update(served_high_watermark=self._follower_view.high_watermark)
        if self.leader is not None:
            row.update(committed=self.leader.committed, isr=list(self.leader.state.isr),
                       follower_ends=self.leader.follower_ends())
        return row

    def stop(self) -> None:
        if self.follower is not None:
            self.follower.stop()
        if self.leader is not None:
            self.leader.stop()
