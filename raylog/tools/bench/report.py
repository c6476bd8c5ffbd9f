"""What the autoscaled benchmark reports: the nodes it sees come and go, a
phase's figures, and the table (pure; see :mod:`raylog.tools.bench`)."""

from __future__ import annotations

import dataclasses
from typing import Iterable

from raylog.config import DISK_RESOURCE, NODE_LABEL


@dataclasses.dataclass(frozen=True)
class NodeInfo:
    node_id: str
    kind: str  # "disk" (offers raylog_disk), "compute" (CPUs only) or "other"
    cpus: float
    label: str | None

    @property
    def name(self) -> str:
        return self.label or self.node_id[-8:]

    @classmethod
    def from_ray(cls, node: dict) -> "NodeInfo":

        resources = node.get("Resources") or {}
        cpus = float(resources.get("CPU", 0))
        kind = "disk" if resources.get(DISK_RESOURCE, 0) > 0 else "compute" if cpus > 0 else "other"
        return cls(node["NodeID"], kind, cpus, (node.get("Labels") or {}).get(NODE_LABEL))


class NodeTracker:
    """The alive nodes, from successive ``ray.nodes()`` lists; ``update``
    returns what changed since the last call."""

    def __init__(self):
        self.alive: dict[str, NodeInfo] = {}

    def update(self, nodes: Iterable[dict]) -> list[tuple[str, NodeInfo]]:
        now = {}
        for node in nodes:
            if node.get("Alive"):
                known = self.alive.get(node["NodeID"])
                now[node["NodeID"]] = known or NodeInfo.from_ray(node)
        events = [("node_added", info) for node_id, info in now.items() if node_id not in self.alive]
        events += [("node_removed", info) for node_id, info in self.alive.items() if node_id not in now]
        self.alive = now
        return events

    def count(self, kind: str | None = None) -> int:
        return sum(1 for n in self.alive.values() if kind is None or n.kind == kind)

    @property
    def cpus(self) -> float:
        return sum(n.cpus for n in self.alive.values())


def phase_report(
    *,
    phase: int,
    workers: int,
    seconds: float,
    produced: int,
    consumed: int,
    producers_running: int,
    consumers_running: int,
    nodes_alive: int,
    nodes_added: int,
    nodes_removed: int,
    cpus: float,
    message_bytes: int,
) -> dict:
    """One phase's JSON line."""
    seconds = max(seconds, 1e-9)
    return {
        "event": "phase",
        "phase": phase,
        "producers": workers,
        "consumers": workers,
        "cpus_asked": 2 * workers,
        "producers_running": producers_running,
        "consumers_running": consumers_running,
        "nodes_alive": nodes_alive,
        "nodes_added": nodes_added,
        "nodes_removed": nodes_removed,
        "cluster_cpus": cpus,
        "seconds": round(seconds, 1),
        "produced": produced,
        "consumed": consumed,
        "producer_msg_per_s": round(produced / seconds),
        "consumer_msg_per_s": round(consumed / seconds),
        "producer_mb_per_s": round(produced * message_bytes / seconds / 1e6, 2),
        "consumer_mb_per_s": round(consumed * message_bytes / seconds / 1e6, 2),
    }


def format_table(rows: list[dict]) -> str:
    """The phases as a table, then one line on the scale-down."""
    headers = ["PHASE", "PRODUCERS", "CONSUMERS", "NODES", "ADDED", "PRODUCE MSG/S", "CONSUME MSG/S"]
    lines = [headers]
    for r in rows:
        if r.get("event") != "phase":
            continue
        lines.append([
            str(r["phase"]),
            f"{r['producers_running']}/{r['producers']}",
            f"{r['consumers_running']}/{r['consumers']}",
            str(r["nodes_alive"]),
            f"+{r['nodes_added']}" if r["nodes_added"] else "0",
            f"{r['producer_msg_per_s']:,}",
            f"{r['consumer_msg_per_s']:,}",
        ])
    widths = [max(len(line[i]) for line in lines) for i in range(len(headers))]
    out = ["  ".join(c.ljust(w) if i < 5 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths)))
           for line in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    for r in rows:
        if r.get("event") == "scale_down":
            if r["complete"]:
                out.append(
                    f"scale down: {r['removed']} added node{'s' if r['removed'] != 1 else ''} removed "
                    f"{r['seconds']:g} s after the load stopped; {r['nodes_alive']} nodes alive"
                )
            else:
                out.append(
                    f"scale down: {r['removed']} of {r['removed'] + r['remaining']} added nodes removed "
                    f"within {r['seconds']:g} s; {r['nodes_alive']} nodes alive"
                )
    return "\n".join(out)
