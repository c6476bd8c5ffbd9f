"""Moved to :mod:`raylog.producer.partitioner`; kept so that existing imports work."""

from raylog.producer.partitioner import StickyPartitioner, partition_for_key

__all__ = ["StickyPartitioner", "partition_for_key"]
