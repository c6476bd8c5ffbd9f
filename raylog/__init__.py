"""raylog: durable, partitioned, replayable logs on a Ray cluster.

The public API (see the README and docs/design.md §5)::

    import raylog
    client = raylog.connect()
    client.create_topic("clicks", partitions=8)
    producer = client.producer()
    producer.send("clicks", b"value", key=b"user-42")

Heavy parts (Ray, ZooKeeper) are imported on first use, so that the storage
engine and the errors can be used on their own.
"""

from raylog import errors as _errors
from raylog.config import TopicConfig
from raylog.errors import *  # noqa: F401,F403  (every error class is public)
from raylog.errors import RaylogError

__version__ = "0.1.0"

_LAZY = {
    "connect": "raylog.startup",
    "Client": "raylog.client",
    "Producer": "raylog.producer",
    "Consumer": "raylog.consumer",
    "Message": "raylog.consumer.record",
    "RetryPolicy": "raylog.retry",
    "partition_for_key": "raylog.producer.partitioner",
    "EmbeddedZooKeeper": "raylog.zookeeper",
    "AvroSerializer": "raylog.avro",
    "AvroDeserializer": "raylog.avro",
    "TlsSettings": "raylog.kafka.tls",
}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'raylog' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


#: the public surface: docs/reference/api.md documents each of these names
#: (tests/test_public_surface.py holds the two to each other)
__all__ = ["TopicConfig", *_errors.__all__, *_LAZY]
