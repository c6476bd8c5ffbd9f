"""Ray for the Spark integration tests: one local Ray per module.

Each test module that needs Ray gets its own local instance (never a
cluster that happens to run on the machine: ``address="local"``), sized for
a 2-core machine, and shut down when the module ends, even after a failure.
Spark sessions are started by the modules themselves, one per module.
"""

from __future__ import annotations

import pytest

#: Ray's object store for the tests; Spark-to-Ray conversions stay small
OBJECT_STORE_BYTES = 256 * 1024 * 1024


@pytest.fixture(scope="module")
def ray_local():
    import ray

    if ray.is_initialized():
        pytest.fail("Ray is already initialized in this process; a previous module did not shut it down")
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        object_store_memory=OBJECT_STORE_BYTES,
    )
    try:
        yield ray
    finally:
        ray.shutdown()
