"""The consumer (:class:`Consumer`, :mod:`raylog.consumer.consumer`): its
positions and Kafka's commit rule (:mod:`raylog.consumer.positions`), group
changes run on the application's thread (:mod:`raylog.consumer.revocation`),
the per-partition fetcher (:mod:`raylog.consumer.fetcher`) and the message
it hands out (:mod:`raylog.consumer.record`)."""

from raylog.consumer.consumer import Consumer

__all__ = ["Consumer"]
