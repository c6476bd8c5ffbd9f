"""The Spark integration tests share the session's local Ray (``ray_local``
in the root conftest); Spark sessions are started by the modules
themselves, one per module, and stopped at its end."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def spark(ray_local, request):
    """One small Spark session for the module, stopped at its end; failing
    tasks fail the job at once. (test_session.py has its own, with options.)"""
    import raylog_spark

    name = request.module.__name__.rsplit(".", 1)[-1].replace("_", "-")
    try:
        yield raylog_spark.init_spark(
            app_name=f"raylog-{name}",
            num_executors=1,
            executor_cores=1,
            executor_memory="512M",
            configs={"spark.task.maxFailures": "1"},
        )
    finally:
        raylog_spark.stop_spark()
