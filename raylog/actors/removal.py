"""Removing the logs of deleted partitions across the cluster: step 1 of the
supervisor's repair pass (:mod:`raylog.actors.supervisor`), also run by a
reassignment for the replicas it takes away (through
:class:`raylog.actors.replica_actors.PartitionActors`).

For each tombstone (:mod:`raylog.zk.tombstones`): a partition actor of the
deleted topic that still runs on that directory is shut down and its log
deleted; otherwise, when the log's node is alive, a small task on that node
empties the directory (:func:`raylog.zk.tombstones.remove_log_task`) and
removes the tombstone. A node that is down keeps its tombstone until it is
back. The functions keep no state.
"""

from __future__ import annotations

import time

from raylog.actors.partition import actor_name
from raylog.actors.placement import disk_nodes, scheduling_options
from raylog.config import NAMESPACE
from raylog.errors import LogInUseError
from raylog.zk.tombstones import remove_log_task

#: how long one pass waits for a log removal task on a node
REMOVE_WAIT_S = 30.0


def row(topic, partition, node, state, detail="") -> dict:
    """One line of a repair report."""
    return {"topic": topic, "partition": partition, "node": node, "state": state, "detail": detail}


def running_actor(cluster: str, topic: str, partition: int):
    import ray  # heavy (Ray): imported when used

    try:
        return ray.get_actor(actor_name(cluster, topic, partition), namespace=NAMESPACE)
    except ValueError:
        return None


def remove_deleted(registry, zookeeper: str, nodes: list[dict], *, topic: str | None = None,
                   token: bytes | None = None, wait_s: float = REMOVE_WAIT_S) -> list[dict]:
    """Step 1 of a repair pass: honour the tombstones (of ``topic``, or all).
    Returns one row per tombstone: ``removed``, ``pending`` (node down, or
    the log still open) or ``failed``. ``token``: the cluster's, which a
    partition actor's shutdown requires."""
    import ray  # heavy (Ray): imported when used


    alive = {n.identity for n in disk_nodes(nodes)}
    rows, pending = [], []
    for stone in registry.tombstones().values():
        if topic is not None and stone["topic"] != topic:
            continue
        name, p, node, log_dir = stone["topic"], stone["partition"], stone["node"], stone["log_dir"]
        actor = running_actor(registry.cluster, name, p)
        if actor is not None:
            try:
                stats = ray.get(actor.stats.remote(), timeout=wait_s)
                started_ms = (time.time() - stats["uptime_s"]) * 1000
                if stats["log_dir"] == log_dir and started_ms < stone["deleted_ms"]:
                    # an actor of the deleted topic, still serving: stop it and its log
                    ray.get(actor.shutdown.remote(delete_data=True, token=token), timeout=wait_s)
                    ray.kill(actor, no_restart=True)
                    registry.remove_tombstone(node, log_dir)
                    rows.append(row(name, p, node, "removed", "stopped the deleted topic's actor"))
                    continue
            except ray.exceptions.RayActorError:
                pass  # gone meanwhile (delete_topic stops it too): its log is removed below
            except Exception as err:  # noqa: BLE001 - one actor's failure stays its own
                rows.append(row(name, p, node, "failed", f"stopping its actor: {err}"))
                continue
        if node not in alive:
            rows.append(row(name, p, node, "pending", "its node is not alive; removed when it is back"))
            continue
        task = ray.remote(num_cpus=0, max_retries=0)(remove_log_task).options(**scheduling_options(node, nodes))
        pending.append((stone, task.remote(zookeeper, registry.cluster, node, log_dir)))
    if pending:
        ray.wait([ref for _, ref in pending], num_returns=len(pending), timeout=wait_s)
    for stone, ref in pending:
        name, p, node = stone["topic"], stone["partition"], stone["node"]
        try:
            rows.append(row(name, p, node, "removed", ray.get(ref, timeout=0)))
        except ray.exceptions.GetTimeoutError:
            rows.append(row(name, p, node, "pending", f"removal still running after {wait_s:g} s"))
        except Exception as err:  # noqa: BLE001
            cause = getattr(err, "cause", None) or err
            state = "pending" if isinstance(cause, LogInUseError) else "failed"
            rows.append(row(name, p, node, state, str(cause).strip().splitlines()[-1]))
    return rows
