"""Consumer apps on Ray: a consumer group as a pool of Ray actors that
grows and shrinks with its lag (``client.consumer_pool``).

One concept per module:

* :mod:`~raylog.pool.spec`: the pool's settings, checked whole before
  anything starts, and the name its controller is found by;
* :mod:`~raylog.pool.handler`: the user's handler inside a member (made
  once, called per batch with retries and back-off, torn down once);
* :mod:`~raylog.pool.output`: what the handler returns, produced to the
  pool's ``output_topic`` at least once or exactly once (a transactional
  producer per input partition);
* :mod:`~raylog.pool.member`: the member actor, one real member of the
  consumer group, committing only what its handler returned from;
* :mod:`~raylog.pool.lag`: the group's lag per partition in bytes,
  messages and seconds;
* :mod:`~raylog.pool.scaling`: the scaling decision by lag, pure logic;
* :mod:`~raylog.pool.controller`: the named controller actor that owns the
  members, replaces dead ones and applies the decision;
* :mod:`~raylog.pool.handle`: starting a pool, and the handle
  (``status``, ``scale``, ``stop``).
"""

from raylog.pool.handle import PoolHandle, start_pool  # noqa: E402

__all__ = ["PoolHandle", "start_pool"]
