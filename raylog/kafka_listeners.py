"""Starting a cluster's Kafka listeners (docs/design.md section 10): one
per disk node, pinned there, each given the client's topic administration
for CreateTopics / DeleteTopics (:func:`raylog.topic_admin.for_kafka_listener`).

:func:`start_all` starts them from the calling process (what
:meth:`raylog.Client.start_kafka_listeners` waits on); :func:`start_soon`
has a Ray task start them and returns at once, so that the embedded
default (``raylog.connect()``) starts its listeners without waiting for
them and without importing the Kafka protocol code in the caller's process
(kafka-python's message schemas take most of a second to load). A Kafka
client's :meth:`raylog.Client.kafka_config` waits for a listener to be
registered.

The functions keep no state; Ray and the protocol code are imported when used.
"""

from __future__ import annotations

import functools


def start_all(zookeeper: str, cluster: str, host: str | None, port: int, data_dir: str,
              data_host: str | None) -> list:
    """Start (or find) the listener actor of every disk node; their handles."""
    import ray  # heavy (Ray): imported when used

    from raylog.actors.placement import disk_nodes, scheduling_options
    from raylog.kafka.service import start_listener
    from raylog.metadata import ConnectionSettings
    from raylog.topic_admin import for_kafka_listener

    settings = ConnectionSettings(zookeeper=zookeeper, cluster=cluster)
    nodes = ray.nodes()
    topics = functools.partial(for_kafka_listener, data_dir=data_dir, data_host=data_host)
    return [start_listener(settings, disk.identity, host or data_host, port, scheduling_options(disk.identity, nodes),
                           topics) for disk in disk_nodes(nodes)]


def _start_all_task(*args) -> int:
    return len(start_all(*args))


def start_soon(zookeeper: str, cluster: str, data_dir: str, data_host: str | None):
    """Have a Ray task start the listeners (free ports, on ``data_host`` or
    each node's address); returns the task's reference at once."""
    import ray  # heavy (Ray): imported when used

    return ray.remote(num_cpus=0, max_retries=0)(_start_all_task).remote(
        zookeeper, cluster, None, 0, data_dir, data_host)
