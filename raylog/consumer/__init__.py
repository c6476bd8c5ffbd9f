"""The consumer (:class:`Consumer`) and its per-partition fetcher (:mod:`raylog.consumer.fetcher`)."""

from raylog.consumer.consumer import Consumer

__all__ = ["Consumer"]
