"""The autoscaled benchmark's settings, constants and cluster config (see
:mod:`raylog.tools.bench`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from raylog.config import DISK_RESOURCE
from raylog.errors import BenchError, ConfigError


#: the bench's own cluster config (small, quick to scale down), package data
CONFIG = Path(__file__).resolve().parent.parent / "configs" / "bench-autoscale.yaml"


#: how often the autoscaler of the bench's own cluster looks at the load
AUTOSCALER_UPDATE_INTERVAL_S = 1


#: bounds on the waits between phases
CONSUMER_GRACE_S = 30.0


PRODUCER_CLOSE_S = 30.0
#: how long a producer actor that ran in a phase gets to report its count
PRODUCER_STATS_S = 60.0


#: driver-side batches sent to each producer actor, and how many in flight
SEND_BATCH = 500


IN_FLIGHT_PER_PRODUCER = 8


#: the benchmark topic's segments and retention, per partition
TOPIC_SEGMENT_BYTES = 64 << 20


TOPIC_RETENTION_BYTES = 256 << 20


@dataclasses.dataclass(frozen=True)
class BenchSettings:
    """What a run does; ``validate`` says what is out of range."""

    phases: tuple[int, ...] = (1, 2, 3)
    phase_seconds: float = 30.0
    partitions: int = 4
    disk_nodes: int = 2
    message_bytes: int = 100
    scale_down_timeout_s: float = 180.0
    start_timeout_s: float = 300.0
    zookeeper: str | None = None
    ray_address: str | None = None
    cluster: str = "bench"
    token: bytes | None = None

    @property
    def external(self) -> bool:
        return self.zookeeper is not None

    def validate(self) -> "BenchSettings":
        if not self.phases or any(n < 1 for n in self.phases):
            raise ConfigError("phases must be one or more positive worker counts, e.g. 1,2,3")
        if self.phase_seconds < 5:
            raise ConfigError(f"phase seconds must be at least 5, got {self.phase_seconds:g}")
        if self.partitions < 1:
            raise ConfigError(f"partitions must be a positive integer, got {self.partitions}")
        if self.disk_nodes < 1:
            raise ConfigError(f"disk nodes must be a positive integer, got {self.disk_nodes}")
        if not 1 <= self.message_bytes <= 64 * 1024:
            raise ConfigError(f"message bytes must be between 1 and 65536, got {self.message_bytes}")
        if self.scale_down_timeout_s < 0 or self.start_timeout_s <= 0:
            raise ConfigError("timeouts must be positive")
        if (self.zookeeper is None) != (self.ray_address is None):
            raise ConfigError(
                "the bench runs on a cluster of its own unless both --zookeeper and --ray-address "
                "name an existing autoscaling cluster; pass both or neither"
            )
        if not self.external:
            if not CONFIG.exists():
                raise BenchError(
                    f"the bench's cluster config {CONFIG} is missing from the installed package; "
                    f"reinstall raylog, or pass --zookeeper and --ray-address of an existing autoscaling cluster"
                )
            disk_types = disk_node_types(_load_config())
            if self.disk_nodes > disk_types:
                raise ConfigError(
                    f"the bench's local cluster has {disk_types} disk node types ({CONFIG}); "
                    f"ask for at most {disk_types} disk nodes"
                )
        return self


def parse_phases(text: str) -> tuple[int, ...]:
    """``"1,2,3"`` -> ``(1, 2, 3)``: the workers (producer actors and
    consumer tasks each) of every phase."""
    parts = [p.strip() for p in text.split(",")]
    try:
        phases = tuple(int(p) for p in parts)
    except ValueError:
        raise ConfigError(f"phases must be comma-separated positive integers, e.g. 1,2,3; got {text!r}") from None
    if not phases or any(n < 1 for n in phases):
        raise ConfigError(f"phases must be comma-separated positive integers, e.g. 1,2,3; got {text!r}")
    return phases


def _load_config() -> dict:
    import yaml  # only here: imported when used

    with open(CONFIG) as f:
        return yaml.safe_load(f)


def disk_node_types(config: dict) -> int:
    return sum(
        t.get("max_workers", 0)
        for name, t in config["available_node_types"].items()
        if name != config["head_node_type"] and t["resources"].get(DISK_RESOURCE, 0) > 0
    )
