"""raylog for Spark: a Spark session on the Ray cluster, through RayDP.

::

    import ray, raylog_spark
    ray.init()
    spark = raylog_spark.init_spark(num_executors=1, executor_cores=1)
    spark.range(10).count()
    raylog_spark.stop_spark()

See :mod:`raylog_spark.session` for what :func:`init_spark` configures.
"""

from raylog_spark.session import init_spark, stop_spark

__all__ = ["init_spark", "stop_spark"]
