"""What a consumer pool is: its topics, group, handler and bounds
(:class:`PoolSpec`), checked whole before anything starts, and the names
under which its actors are found.

Every option of :meth:`raylog.Client.consumer_pool` is a field of
:class:`PoolSpec`; an option that is not a field is refused by name
(:class:`raylog.ConfigError`), as is one that is known but not supported
yet (:data:`UNSUPPORTED`). Nothing is accepted and ignored.

**Finding a pool.** A pool is keyed by its consumer group: its controller
is the Ray actor named ``pool:<cluster>:<group>`` (:func:`controller_name`)
in the Ray namespace :data:`NAMESPACE`, so any driver of the same Ray
cluster (the CLI's ``raylog pool status GROUP`` among them) finds it with
``ray.get_actor(name, namespace=NAMESPACE)``. One pool per group and
cluster runs at a time.

A spec is immutable and picklable: the controller and every member get it.
"""

from __future__ import annotations

import dataclasses
import inspect
import math

from raylog.config import EARLIEST, LATEST
from raylog.errors import ConfigError
from raylog.zk.transaction_states import MAX_TIMEOUT_MS

#: the Ray namespace of every pool's controller
NAMESPACE = "raylog-pool"
#: the keys ``resources`` may hold (Ray's actor options of the same names)
RESOURCE_KEYS = ("num_cpus", "num_gpus", "memory", "resources")
#: options that are known and not supported yet, with what to do instead
UNSUPPORTED = {
    "enable_auto_commit": "a pool commits only what its handler returned from; there is no other commit mode",
}


@dataclasses.dataclass(frozen=True)
class PoolSpec:
    """A pool's settings (see :meth:`raylog.Client.consumer_pool` for each)."""

    topics: tuple
    group: str
    handler: object
    min_members: int = 1
    max_members: int | None = None
    target_lag_s: float = 5.0
    batch_max: int = 10_000
    resources: dict | None = None
    max_handler_failures: int = 5
    #: where a batch goes that the handler failed on ``max_handler_failures``
    #: times in a row (an existing topic; the partition then goes on past
    #: it); None: the partition stops there
    dead_letter_topic: str | None = None
    #: where what the handler returns is produced (an existing topic, not
    #: one of the pool's own; :mod:`raylog.pool.output` says what a handler
    #: may return); None: what the handler returns is ignored
    output_topic: str | None = None
    #: consume -> transform -> produce exactly once: each batch's outputs and
    #: its input positions in one transaction, inputs read ``read_committed``
    #: (needs ``output_topic``; :mod:`raylog.pool.output`)
    exactly_once: bool = False
    #: the timeout of each member's transactions (with ``exactly_once``): a
    #: transaction still open this long after it began is aborted by the coordinator
    transaction_timeout_ms: int = 60_000
    #: scale by lag (False: only ``scale(n)`` changes the member count)
    autoscale: bool = True
    #: members started at first (default: ``min_members``)
    initial_members: int | None = None
    #: the lag must stay above ``target_lag_s`` this long before a step up
    scale_up_after_s: float = 10.0
    #: the lag must stay at or below ``low_lag_s`` this long before a step down
    scale_down_after_s: float = 30.0
    #: what counts as low lag (default: a fifth of ``target_lag_s``)
    low_lag_s: float | None = None
    #: no step within this long of the previous one (either way)
    cooldown_s: float = 15.0
    #: members added or removed by one step
    scale_step: int = 1
    #: how often the controller samples the lag and checks the members
    sample_interval_s: float = 1.0
    #: how often a member commits what its handler returned from
    commit_interval_s: float = 1.0
    #: the first pause after a handler failure; it doubles up to ``retry_max_delay_s``
    retry_delay_s: float = 0.1
    retry_max_delay_s: float = 2.0
    #: where a partition starts when the group has committed nothing for it
    auto_offset_reset: str = EARLIEST
    #: the members' ZooKeeper session timeout: a dead member's partitions move after it
    session_timeout_ms: int = 6000
    #: how long one poll of a member waits for messages
    poll_timeout_ms: int = 500
    #: how long ``stop(drain=True)`` waits for the members to finish their batch and leave
    drain_timeout_s: float = 60.0
    #: the controller outlives the driver that started it (stop it with ``PoolHandle.stop``)
    detached: bool = False

    def __post_init__(self):
        _check_spec(self)

    @property
    def low_lag(self) -> float:
        return self.target_lag_s / 5.0 if self.low_lag_s is None else self.low_lag_s

    @property
    def first_members(self) -> int:
        return self.min_members if self.initial_members is None else self.initial_members

    def actor_options(self) -> dict:
        """The Ray options of a member actor: its resources (one CPU unless given)."""
        resources = {"num_cpus": 1} if self.resources is None else dict(self.resources)
        return resources

    def public(self) -> dict:
        """The settings as plain values (the handler by name), for ``status()``."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        fields["topics"] = list(self.topics)
        fields["handler"] = getattr(self.handler, "__qualname__", type(self.handler).__name__)
        return fields


OPTIONS = tuple(f.name for f in dataclasses.fields(PoolSpec) if f.name not in ("topics", "group", "handler"))


def make_spec(topics, group, handler, partition_count, options: dict) -> PoolSpec:
    """The spec of ``consumer_pool(topics, group, handler, **options)``;
    ``partition_count(topic)`` gives a topic's partitions (raises for an
    unknown topic). Refuses unknown and unsupported options by name."""
    unsupported = sorted(set(options) & set(UNSUPPORTED))
    if unsupported:
        raise ConfigError(f"consumer_pool does not support {unsupported[0]!r}: {UNSUPPORTED[unsupported[0]]}")
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ConfigError(f"consumer_pool got unknown option(s) {', '.join(map(repr, unknown))}; "
                          f"its options are {', '.join(OPTIONS)}")
    if isinstance(topics, str):
        topics = [topics]
    if not isinstance(topics, (list, tuple)) or not topics or not all(isinstance(t, str) and t for t in topics):
        raise ConfigError(f"topics must be a topic name or a non-empty list of names, got {topics!r}")
    if len(set(topics)) != len(topics):
        raise ConfigError(f"topics lists a topic twice: {list(topics)!r}")
    if not isinstance(group, str) or not group or "/" in group or ":" in group:
        raise ConfigError(f"group must be a non-empty name without '/' or ':', got {group!r}")
    partitions = sum(partition_count(t) for t in topics)
    dead_letter = options.get("dead_letter_topic")
    if dead_letter is not None:
        if not isinstance(dead_letter, str) or not dead_letter:
            raise ConfigError(f"dead_letter_topic must be a topic name, got {dead_letter!r}")
        if dead_letter in topics:
            raise ConfigError(f"dead_letter_topic {dead_letter!r} is one of the pool's topics; use another")
        partition_count(dead_letter)  # an unknown topic is refused here, before anything starts
    _check_output(topics, options, partition_count)
    if options.get("max_members") is None:
        options = {**options, "max_members": partitions}
    return PoolSpec(topics=tuple(topics), group=group, handler=handler, **options)


def _check_output(topics, options: dict, partition_count) -> None:
    """``output_topic`` and ``exactly_once``, before anything starts: an
    output topic must exist and not be one of the pool's own (the pool
    would read what it wrote, for ever); exactly once needs one."""
    output = options.get("output_topic")
    exactly_once = options.get("exactly_once", False)
    if not isinstance(exactly_once, bool):
        raise ConfigError(f"exactly_once must be True or False, got {exactly_once!r}")
    if output is None:
        if exactly_once:
            raise ConfigError("exactly_once=True needs output_topic='name': exactly once is a consume -> transform "
                              "-> produce guarantee, of what the handler returns, produced to that topic")
        if "transaction_timeout_ms" in options:
            raise ConfigError("transaction_timeout_ms is the timeout of exactly_once's transactions; give it "
                              "with exactly_once=True and output_topic='name', or leave it out")
        return
    if not isinstance(output, str) or not output:
        raise ConfigError(f"output_topic must be a topic name, got {output!r}")
    if output in topics:
        raise ConfigError(f"output_topic {output!r} is one of the pool's topics: the pool would read its own "
                          f"output for ever; use another topic")
    if output == options.get("dead_letter_topic"):
        raise ConfigError(f"output_topic and dead_letter_topic are both {output!r}: failed batches would mix "
                          f"with the outputs; use two topics")
    if "transaction_timeout_ms" in options and not exactly_once:
        raise ConfigError("transaction_timeout_ms is the timeout of exactly_once's transactions; give it with "
                          "exactly_once=True, or leave it out")
    partition_count(output)  # an unknown topic is refused here (UnknownTopicError), before anything starts


def _int(name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{name} must be an integer of at least {low}, got {value!r}")


def _seconds(name: str, value, *, zero_ok: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not zero_ok):
        raise ConfigError(f"{name} must be a {'non-negative' if zero_ok else 'positive'} number of seconds, "
                          f"got {value!r}")


def _check_spec(spec: PoolSpec) -> None:
    _check_handler(spec.handler)
    _int("min_members", spec.min_members, 1)
    _int("max_members", spec.max_members, 1)
    if spec.max_members < spec.min_members:
        raise ConfigError(f"max_members ({spec.max_members}) must be at least min_members ({spec.min_members})")
    if spec.initial_members is not None:
        _int("initial_members", spec.initial_members, 1)
        if not spec.min_members <= spec.initial_members <= spec.max_members:
            raise ConfigError(f"initial_members ({spec.initial_members}) must lie within min_members "
                              f"({spec.min_members}) and max_members ({spec.max_members})")
    _int("batch_max", spec.batch_max, 1)
    _int("max_handler_failures", spec.max_handler_failures, 1)
    _int("scale_step", spec.scale_step, 1)
    _int("session_timeout_ms", spec.session_timeout_ms, 1000)
    _int("poll_timeout_ms", spec.poll_timeout_ms, 1)
    for name in ("target_lag_s", "sample_interval_s", "commit_interval_s", "retry_delay_s", "retry_max_delay_s",
                 "drain_timeout_s"):
        _seconds(name, getattr(spec, name))
    for name in ("scale_up_after_s", "scale_down_after_s", "cooldown_s"):
        _seconds(name, getattr(spec, name), zero_ok=True)
    if spec.low_lag_s is not None:
        _seconds("low_lag_s", spec.low_lag_s, zero_ok=True)
        if spec.low_lag_s >= spec.target_lag_s:
            raise ConfigError(f"low_lag_s ({spec.low_lag_s}) must be below target_lag_s ({spec.target_lag_s})")
    if spec.retry_max_delay_s < spec.retry_delay_s:
        raise ConfigError(f"retry_max_delay_s ({spec.retry_max_delay_s}) must be at least retry_delay_s "
                          f"({spec.retry_delay_s})")
    _int("transaction_timeout_ms", spec.transaction_timeout_ms, 1000)
    if spec.transaction_timeout_ms > MAX_TIMEOUT_MS:
        raise ConfigError(f"transaction_timeout_ms must be at most {MAX_TIMEOUT_MS} (the coordinator's limit, "
                          f"15 minutes), got {spec.transaction_timeout_ms}")
    if spec.exactly_once and spec.output_topic is None:
        raise ConfigError("exactly_once=True needs output_topic='name'")
    for name in ("autoscale", "detached", "exactly_once"):
        if not isinstance(getattr(spec, name), bool):
            raise ConfigError(f"{name} must be True or False, got {getattr(spec, name)!r}")
    if spec.auto_offset_reset not in (EARLIEST, LATEST):
        raise ConfigError(f"auto_offset_reset must be {EARLIEST!r} or {LATEST!r}, got {spec.auto_offset_reset!r}")
    _check_resources(spec.resources)


def _check_resources(resources) -> None:
    if resources is None:
        return
    if not isinstance(resources, dict):
        raise ConfigError(f"resources must be a dict of {', '.join(RESOURCE_KEYS)}, got {resources!r}")
    unknown = sorted(set(resources) - set(RESOURCE_KEYS))
    if unknown:
        raise ConfigError(f"resources got unknown key(s) {', '.join(map(repr, unknown))}; "
                          f"its keys are {', '.join(RESOURCE_KEYS)} (Ray's actor options)")
    for key in ("num_cpus", "num_gpus", "memory"):
        value = resources.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
            raise ConfigError(f"resources[{key!r}] must be a non-negative number, got {value!r}")
    custom = resources.get("resources")
    if custom is not None and (not isinstance(custom, dict) or not all(
            isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
            for k, v in custom.items())):
        raise ConfigError(f"resources['resources'] must map resource names to non-negative numbers, got {custom!r}")


def _check_handler(handler) -> None:
    """A plain function (or any callable object), or a class whose instances
    are callable, made with no arguments."""
    if inspect.isclass(handler):
        if not callable(getattr(handler, "__call__", None)) or "__call__" not in dir(handler):
            raise ConfigError(f"handler class {handler.__qualname__} has no __call__(self, batch)")
        try:
            inspect.signature(handler).bind()
        except TypeError as err:
            raise ConfigError(f"handler class {handler.__qualname__} must be made with no arguments "
                              f"(each member makes one): {err}") from None
        except ValueError:
            pass  # no signature to read (a builtin): tried when the member makes it
        for name in ("setup", "teardown"):
            hook = getattr(handler, name, None)
            if hook is not None and not callable(hook):
                raise ConfigError(f"handler class {handler.__qualname__}: {name} must be a method")
    elif not callable(handler):
        raise ConfigError(f"handler must be a function of one batch or a class with __call__, got {handler!r}")
    from ray import cloudpickle  # Ray's pickler: how the members receive it (heavy, lazy on purpose)

    try:
        cloudpickle.dumps(handler)
    except Exception as err:  # noqa: BLE001 - anything the pickler refuses
        raise ConfigError(f"handler cannot be sent to the members (it does not pickle: {err}); "
                          f"define it at module level or close over picklable values only") from None


def controller_name(cluster: str, group: str) -> str:
    """The Ray name of the pool's controller (in :data:`NAMESPACE`)."""
    return f"pool:{cluster}:{group}"
