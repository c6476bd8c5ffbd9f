"""``ray start`` for the hosts kit's nodes, with a registration wait that a
busy machine does not miss.

``ray start`` gives the raylet it spawned 30 seconds to register with the GCS
and then fails the start (a constant in Ray's ``Node``, not a setting: the
``RAY_raylet_start_wait_time_s`` variable is not read there). On a machine of
two cores running five hosts, a Spark session and the tests, a node started
again after a kill-host fault missed that deadline on every try. Here the
lookup that ``Node`` repeats (``ray._private.services.get_node``) waits up to
``RAYLOG_HOSTS_REGISTER_WAIT_S`` (default 120 s) before it reports the node
missing, so the start fails only when the raylet did not register in that
time. Everything else is Ray's own ``ray start``.

Run as ``python -m raylog.testing.ray_node start ARGS...``.
"""

from __future__ import annotations

import os
import time

#: how long a start waits for its raylet to register with the GCS
REGISTER_WAIT_S = float(os.environ.get("RAYLOG_HOSTS_REGISTER_WAIT_S", "120"))
#: Ray's own wait, which runs around the lookup
RAY_WAIT_S = 30.0


def _patient(get_node, wait_s: float):
    def get_node_registered(gcs_address, node_id):
        deadline = time.monotonic() + max(0.0, wait_s - RAY_WAIT_S)
        while True:
            try:
                return get_node(gcs_address, node_id)
            except RuntimeError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.5)

    return get_node_registered


def main() -> None:
    import ray._private.services as services  # heavy (Ray): this module is a Ray node's launcher
    from ray.scripts.scripts import main as ray_main  # heavy (Ray)

    services.get_node = _patient(services.get_node, REGISTER_WAIT_S)
    ray_main()


if __name__ == "__main__":
    main()
