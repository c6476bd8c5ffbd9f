"""Starting a cluster's Kafka listeners (docs/design.md section 10): one
per disk node, pinned there, each given the client's topic administration
for CreateTopics / DeleteTopics.

What this layer may not import is passed in (docs/design.md section 1:
``kafka/`` imports all of the layers above it but ``actors/``, and
``admin/`` sits below it): ``placements``, a callable that returns each
disk node's ``(identity, Ray scheduling options)`` when called
(:func:`raylog.client.kafka_listener_placements`), and ``topics``, the
factory of a listener's topic administration
(:func:`raylog.admin.topics.for_kafka_listener`, partly applied). Both are
picklable (module-level functions), so a Ray task can take them.

:func:`start_all` starts the listeners from the calling process (what
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


def start_all(zookeeper: str, cluster: str, host: str | None, port: int, placements, topics,
              coordinator=None, tls=None, auto_create_topics: bool = False) -> list:
    """Start (or find) the listener actor of every disk node that
    ``placements()`` names, on ``host`` (None: the node's address) and
    ``port`` (0: a free one); their handles. ``topics``, ``coordinator``,
    ``tls`` and ``auto_create_topics``: as
    :func:`raylog.kafka.service.start_listener` takes them."""
    from raylog.kafka.service import start_listener
    from raylog.metadata import ConnectionSettings

    settings = ConnectionSettings(zookeeper=zookeeper, cluster=cluster)
    return [start_listener(settings, identity, host, port, options, topics, coordinator, tls, auto_create_topics)
            for identity, options in placements()]


def _start_all_task(*args) -> int:
    return len(start_all(*args))


def start_soon(zookeeper: str, cluster: str, host: str | None, placements, topics, coordinator=None, tls=None):
    """Have a Ray task start the listeners (free ports, on ``host`` or each
    node's address; over TLS with ``tls``); returns the task's reference at once."""
    import ray  # heavy (Ray): imported when used

    return ray.remote(num_cpus=0, max_retries=0)(_start_all_task).remote(zookeeper, cluster, host, 0, placements,
                                                                         topics, coordinator, tls)
