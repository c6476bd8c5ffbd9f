"""The stable identity of a Ray node, as the registry records it for each
partition (docs/design.md section 4: "the node the partition lives on (a stable
identity that survives a node restart)").

Ray's node id changes whenever a node restarts, so raylog names nodes by the
node label ``raylog-node`` (``ray start --labels raylog-node=disk-a``) when it
is set, else ``ip:<node address>``. The placement
(:mod:`raylog.actors.placement`) pins partition actors by it; the read plans
(:mod:`raylog.read.replicas`) find the Ray node of a replica by it.
"""

from __future__ import annotations

from raylog.config import NODE_LABEL


def node_identity(node: dict) -> str:
    """The stable identity of a node from ``ray.nodes()``."""
    label = (node.get("Labels") or {}).get(NODE_LABEL)
    if label:
        return label
    return f"ip:{node['NodeManagerAddress']}"
