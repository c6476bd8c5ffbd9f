"""The Ray Data source: :func:`read_raylog`, a read plan as a bounded
``ray.data.Dataset``, its tasks placed on the nodes that hold the data (see
:mod:`raylog.read`): each range's read task is given one of its candidate
replicas (:func:`raylog.read.replicas.assigned_replica`, spread over the
ranges), prefers that replica's node and reads from that replica (falling
back to the leader, see :mod:`raylog.read.reader`)."""

from __future__ import annotations

import functools
import logging
from typing import Sequence

import pyarrow as pa

from raylog.errors import (
    ConfigError,
    ResourcesUnavailableError,
)
from raylog.metadata import ConnectionSettings
from raylog.read.plan import plan_read
from raylog.read.ray_data_logging import quiet_ray_data_console
from raylog.read.ranges import ARROW_SCHEMA, FETCH_BYTES, NODE_ID_LABEL, ReadPlan, ReadRange
from raylog.read.reader import read_range
from raylog.read.replicas import assigned_replica

log = logging.getLogger(__name__)


def _read_task_tables(rng: ReadRange, settings: ConnectionSettings, options: dict, replica: str | None):
    for batch in read_range(rng, settings, replica=replica, **options):
        yield pa.Table.from_batches([batch])


def _datasource_class():
    from ray.data.block import BlockMetadata  # heavy (Ray): imported when used
    from ray.data.datasource import Datasource, ReadTask  # heavy (Ray): imported when used

    class RaylogDatasource(Datasource):
        """Ranges of a :class:`ReadPlan` as a Ray Data source: one read task
        per range, each reading from the replica on the node it names (None:
        the leader)."""

        def __init__(self, plan: ReadPlan, ranges: Sequence[tuple[ReadRange, str | None]],
                     fetch_bytes: int = FETCH_BYTES, read_task=None):
            super().__init__()
            self._plan = plan
            self._read_task = read_task or _read_task_tables
            self._ranges = list(ranges)
            self._options = {
                "fail_on_data_loss": plan.fail_on_data_loss,
                "fetch_bytes": fetch_bytes,
                "max_message_bytes": plan.max_message_bytes,
                "isolation_level": plan.isolation_level,
            }

        def get_name(self) -> str:
            return f"Raylog({self._plan.topic})"

        def estimate_inmemory_data_size(self) -> int:
            return sum(r.size for r, _ in self._ranges)

        def get_read_tasks(self, parallelism: int, per_task_row_limit=None, data_context=None) -> list:
            tasks = []
            for rng, replica in self._ranges:
                meta = BlockMetadata(num_rows=None, size_bytes=rng.size, exec_stats=None, input_files=None)
                read_fn = functools.partial(self._read_task, rng, self._plan.settings, self._options, replica)
                tasks.append(ReadTask(read_fn, meta, schema=ARROW_SCHEMA, per_task_row_limit=per_task_row_limit))
            return tasks

    return RaylogDatasource


#: The keyword arguments of :func:`read_raylog` that go to :func:`plan_read`.
PLAN_OPTIONS = ("min_partitions", "fail_on_data_loss", "client", "settings", "isolation_level")


def read_raylog(topic: str, starting_offsets="earliest", ending_offsets="latest", *,
                plan: ReadPlan | None = None, locality: bool = True, fetch_bytes: int = FETCH_BYTES,
                read_task=None, **options):
    """A bounded ``ray.data.Dataset`` of ``topic`` with :data:`ARROW_SCHEMA`.

    ``topic``, the offsets and the keywords of :data:`PLAN_OPTIONS`
    (``min_partitions``, ``fail_on_data_loss``, ``client``, ``settings``,
    ``isolation_level``: ``"read_committed"`` reads up to each partition's
    last stable offset without the records of aborted transactions)
    are those of :func:`plan_read`; or pass a ``plan``. One
    read task per range; with ``locality`` each task is given one of its
    range's candidate replicas (the in-sync replicas of a replicated
    partition, spread over the ranges; else the leader), reads from it and
    prefers its node: a label selector on the node's id
    (``ray.io/node-id``) with a fallback to any node, so a read still runs
    when that node has no free CPU for it or is gone (see the module
    docstring). Without ``locality`` every range is read from its leader. The other
    ``options`` go to ``ray.data.read_datasource`` (``num_cpus``, ``memory``,
    ``concurrency`` ...).

    It never waits for good for CPUs that others hold: without
    ``num_cpus`` and with no CPU free (a Spark session's executors hold
    them all, say), the read tasks ask for none and the dataset is read at
    once; a ``num_cpus`` that is not free now raises
    :class:`~raylog.errors.ResourcesUnavailableError` naming what is
    needed and what is free (see :func:`_read_resources`).

    ``read_task``: what a read task does with its range, called as
    ``read_task(rng, settings, read_options, replica)`` and yielding Arrow
    tables of :data:`ARROW_SCHEMA` (default: every record of the range;
    :func:`raylog.read.table.read_range_latest` gives the table view).

    The dataset converts to Spark with RayDP: ``ds.to_spark(spark)``.
    """
    import ray  # heavy (Ray): imported when used

    quiet_ray_data_console()  # its INFO lines stay in its log file while raylog is quiet
    plan_options = {name: options.pop(name) for name in PLAN_OPTIONS if name in options}
    if plan is None:
        plan = plan_read(topic, starting_offsets, ending_offsets, **plan_options)
    if not plan.ranges:
        return ray.data.from_arrow(ARROW_SCHEMA.empty_table())
    read_options, materialize = _read_resources(options)
    datasource = _datasource_class()
    groups: dict[str | None, list[tuple[ReadRange, str | None]]] = {}
    for rng, replica in task_replicas(plan):
        if not locality:
            groups.setdefault(None, []).append((rng, None))
            continue
        node_id = rng.node_id if replica is None else replica.node_id
        groups.setdefault(node_id, []).append((rng, None if replica is None or replica.leader else replica.node))
    datasets = []
    for node_id, ranges in groups.items():
        options = dict(read_options)
        if node_id is not None and "label_selector" not in options:
            options.update(placement_options(node_id))
        datasets.append(
            ray.data.read_datasource(
                datasource(plan, ranges, fetch_bytes, read_task), override_num_blocks=len(ranges), **options
            )
        )
    dataset = datasets[0] if len(datasets) == 1 else datasets[0].union(*datasets[1:])
    if not materialize:
        return dataset
    # Ray Data warns once per process that with no CPU free "the Dataset job
    # will hang": not so for these read tasks, which ask for none (the
    # warning of _read_resources says what does wait). Its once-key is used
    # up here so that its warning does not contradict ours.
    from ray.util.debug import log_once

    log_once("cpu_warning")
    return dataset.materialize()


def task_replicas(plan: ReadPlan) -> list:
    """``(range, candidate or None)`` per range of ``plan``: the replica its
    read task prefers and reads from (:func:`assigned_replica`, the
    pieces of one partition spread over its candidates)."""
    if plan.isolation_level == "read_committed":  # the leaders alone serve such reads
        return [(rng, None) for rng in plan.ranges]
    pieces: dict[int, int] = {}
    out = []
    for rng in plan.ranges:
        piece = pieces.get(rng.partition, 0)
        pieces[rng.partition] = piece + 1
        out.append((rng, assigned_replica(rng.replicas, rng.topic, rng.partition, piece)))
    return out


def _free_cpus() -> tuple[float, float]:
    """``(CPUs free now, CPUs of the largest alive node)`` of the Ray cluster."""
    import ray  # heavy (Ray): imported when used

    largest = max((n.get("Resources", {}).get("CPU", 0.0) for n in ray.nodes() if n.get("Alive")), default=0.0)
    return ray.available_resources().get("CPU", 0.0), largest


def _read_resources(read_options: dict) -> tuple[dict, bool]:
    """The read tasks' resources, so that a read never waits for CPUs that
    others hold (a Spark session's executors, say) without saying so.

    - ``num_cpus`` given: it must fit on a node (else ConfigError) and be
      free now (else :class:`ResourcesUnavailableError` naming both);
    - not given, a CPU free: Ray Data's default (1 CPU per read task);
    - not given, no CPU free: the read tasks ask for no CPU (they mostly
      wait on sockets) and the dataset is read at once
      (``materialize``): later steps of Ray Data (``count``'s projection,
      say) would ask for a CPU each and wait for good. A warning says so.

    Returns the options and whether to materialize."""
    options = dict(read_options)
    free, largest = _free_cpus()
    asked = options.get("num_cpus")
    if asked is not None:
        if asked > largest:
            raise ConfigError(
                f"read tasks with num_cpus={asked:g} never fit: the largest Ray node has {largest:g} CPUs; "
                f"pass num_cpus={largest:g} or less (num_cpus=0 reads without holding a CPU)"
            )
        if asked > free:
            raise ResourcesUnavailableError(
                f"read_raylog needs {asked:g} free CPU per read task (num_cpus={asked:g}) and the Ray "
                f"cluster has {free:g} free now of {largest:g} on its largest node (others hold the rest, "
                f"e.g. Spark executors); pass num_cpus=0, or free CPUs (fewer executor_cores), then retry",
                needed_cpus=asked,
                free_cpus=free,
            )
        return options, False
    if free >= 1:
        return options, False
    log.warning(
        "read_raylog: no CPU of the Ray cluster is free (%g free; e.g. Spark executors hold them): the "
        "read tasks run without a CPU and the dataset is read now; later Ray Data steps that need a CPU "
        "(map_batches ...) wait until one is free",
        free,
    )
    options["num_cpus"] = 0
    return options, True


def placement_options(node_id: str) -> dict:
    """Remote options that prefer the Ray node ``node_id``: its id label, then
    (``fallback_strategy``) any node."""
    return {"label_selector": {NODE_ID_LABEL: node_id}, "fallback_strategy": [{"label_selector": {}}]}
