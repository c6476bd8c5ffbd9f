"""Committed offsets of consumer groups, stored in ZooKeeper (docs/design.md §4).

One persistent node per (group, topic, partition)::

    /raylog/<cluster>/consumers/<group>/offsets/<topic>/<p>   the next byte offset to consume (ASCII)

The value is the offset of the next message the group should read from the
partition, so a consumer that takes over the partition starts there. Offsets
are byte positions in the partition log (docs/design.md §2); inside a compressed
message set the i-th message's offset is the wrapper's plus i, so a commit may
point inside a wrapper (the next reader skips the wrapper's earlier messages).

:class:`OffsetStore` does no ownership checks: it is the storage layer.
:class:`raylog.groups.member.GroupMember.commit` is the checked entry
point a consumer uses (it refuses partitions the member does not own).

Every ZooKeeper failure comes out as a raylog error: a down or unreachable
server as :class:`raylog.ZooKeeperUnavailableError` (retriable), an expired
session as :class:`raylog.SessionExpiredError`. Calls fail fast while the
client is disconnected instead of queueing behind the reconnection.
"""

from __future__ import annotations

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from raylog.errors import ConfigError
from raylog.zk.errors import ensure_connected, zookeeper_errors
from raylog.zk.paths import Paths

#: the longest a single ZooKeeper request may take before it is reported as
#: unavailable (a request queued behind a reconnection waits at most this long)
REQUEST_TIMEOUT_S = 10.0


def parse_offset(data: bytes, path: str) -> int:
    try:
        return int(data.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise ConfigError(f"the offset node {path} holds {data!r}, not a decimal offset; fix or delete it") from None


class OffsetStore:
    """Reads and writes committed offsets of any group of one cluster.

    Stateless apart from the client and the path builder; safe to use from
    any thread (kazoo's client is thread-safe).
    """

    def __init__(self, zk: KazooClient, cluster: str, *, request_timeout_s: float = REQUEST_TIMEOUT_S):
        self.zk = zk
        self.paths = Paths(cluster)
        self.request_timeout_s = request_timeout_s

    def commit(self, group: str, topic: str, partition: int, offset: int) -> None:
        """Store ``offset`` as the next offset ``group`` reads from ``topic``/``partition``.

        Synchronous: when it returns, the offset is durable in ZooKeeper.
        """
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise ConfigError(f"an offset is a non-negative integer (a byte position), got {offset!r}")
        path = self.paths.offset(group, topic, partition)
        data = str(offset).encode("ascii")
        what = f"commit offset {offset} of {topic}/{partition} for group {group!r}"
        ensure_connected(self.zk, what)
        with zookeeper_errors(self.zk, what):
            try:
                self.zk.set_async(path, data).get(timeout=self.request_timeout_s)
            except NoNodeError:
                try:
                    self.zk.create_async(path, data, makepath=True).get(timeout=self.request_timeout_s)
                except NodeExistsError:
                    # Another committer created it first; ours is the later write.
                    self.zk.set_async(path, data).get(timeout=self.request_timeout_s)

    def committed(self, group: str, topic: str, partition: int) -> int | None:
        """The committed offset, or None if the group never committed one."""
        path = self.paths.offset(group, topic, partition)
        what = f"read the committed offset of {topic}/{partition} for group {group!r}"
        ensure_connected(self.zk, what)
        with zookeeper_errors(self.zk, what):
            try:
                data, _ = self.zk.get_async(path).get(timeout=self.request_timeout_s)
            except NoNodeError:
                return None
        return parse_offset(data, path)

    def committed_all(self, group: str) -> dict[tuple[str, int], int]:
        """Every committed offset of ``group``: ``{(topic, partition): offset}``."""
        what = f"read the committed offsets of group {group!r}"
        ensure_connected(self.zk, what)
        result: dict[tuple[str, int], int] = {}
        base = self.paths.all_offsets(group)
        timeout = self.request_timeout_s
        with zookeeper_errors(self.zk, what):
            try:
                topics = self.zk.get_children_async(base).get(timeout=timeout)
            except NoNodeError:
                return result
            for topic in topics:
                try:
                    partitions = self.zk.get_children_async(self.paths.offsets(group, topic)).get(timeout=timeout)
                except NoNodeError:
                    continue
                for name in partitions:
                    if not name.isdigit():
                        continue
                    path = self.paths.offset(group, topic, int(name))
                    try:
                        data, _ = self.zk.get_async(path).get(timeout=timeout)
                    except NoNodeError:
                        continue
                    result[(topic, int(name))] = parse_offset(data, path)
        return result
