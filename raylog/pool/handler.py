"""The user's handler inside one member: made once, called per batch with
retries, torn down once.

A handler is a plain function ``handler(batch)`` or a class with
``__call__(self, batch)`` and optional ``setup(self)`` / ``teardown(self)``;
the class is instantiated once in each member (``setup`` after that,
``teardown`` when the member leaves). ``batch`` is a list of
:class:`raylog.Message` of **one partition**, in offset order; returning at
all means the batch is done. What it returns is ignored, unless the pool
has an ``output_topic``: then it is the batch's outputs
(:mod:`raylog.pool.output`).

**Retries.** A handler that raises is called again with the same batch
after a pause that starts at ``retry.delay_s`` and doubles up to
``retry.max_delay_s`` (:class:`raylog.RetryPolicy`, with jitter); after
``retry.max_tries`` consecutive failures on the batch, :meth:`HandlerRunner.run`
gives up and returns the last error as a :class:`HandlerFailure`: the
member then stops consuming that partition (nothing after the batch is
handled or committed, nothing is skipped). A stop asked for while it
waits between tries ends the waiting: the batch counts as not handled
(and is not committed).

Thread-safety: confined to the member's loop thread.
"""

from __future__ import annotations

import dataclasses
import inspect
import threading
import time
import traceback

from raylog.retry import RetryPolicy


class BatchAbandoned(Exception):
    """Raised through :meth:`HandlerRunner.run` by its ``around`` (not by
    the handler): the batch is not this member's to handle any more (its
    partition's transactional producer was fenced by a newer owner). Not a
    failure of the handler: it is not retried and not counted."""


@dataclasses.dataclass(frozen=True)
class HandlerFailure:
    """The handler failed ``failures`` times in a row on the batch starting
    at ``offset`` (the partition stops there)."""

    offset: int
    failures: int
    error: str
    traceback: str
    at: float  # time.time() of the last failure

    def public(self) -> dict:
        return dataclasses.asdict(self)


def retry_policy(spec) -> RetryPolicy:
    """A pool's handler retries: ``max_handler_failures`` tries, no deadline."""
    return RetryPolicy(max_tries=spec.max_handler_failures, delay_s=spec.retry_delay_s,
                       max_delay_s=spec.retry_max_delay_s, jitter=0.2, deadline_s=None)


class HandlerRunner:
    """One member's handler (see the module docstring). ``stopping`` is the
    member's stop event: set, it ends a wait between tries."""

    def __init__(self, handler, retry: RetryPolicy, stopping: threading.Event | None = None):
        self.retry = retry
        self.stopping = stopping or threading.Event()
        self._instance = handler() if inspect.isclass(handler) else handler
        self.failures = 0  # consecutive failures of the batch being handled, across tries
        setup = getattr(self._instance, "setup", None) if inspect.isclass(handler) else None
        self._teardown = getattr(self._instance, "teardown", None) if inspect.isclass(handler) else None
        if setup is not None:
            setup()

    def run(self, batch: list, on_failure=None, around=None) -> HandlerFailure | None:
        """Handle ``batch``: None once the handler returned; a
        :class:`HandlerFailure` after ``retry.max_tries`` failures in a row
        (``on_failure(failure)`` is called after each one). Raises
        :class:`InterruptedError` when a stop ended the wait between tries
        (the batch is not handled).

        ``around(call)``, if given, makes each try instead of the bare call:
        it calls ``call()`` (the handler on the batch; its result is what the
        handler returned) and does what goes with it (the pool's outputs,
        :mod:`raylog.pool.output`); its errors count as the handler's, but
        :class:`BatchAbandoned`, which is raised as it is."""
        backoff = self.retry.start()
        self.failures = 0
        call = lambda: self._instance(batch)  # noqa: E731 - one try
        while True:
            try:
                if around is None:
                    call()
                else:
                    around(call)
                self.failures = 0
                return None
            except BatchAbandoned:
                raise
            except Exception as err:  # noqa: BLE001 - the user's code: any error is a failure of the batch
                self.failures += 1
                failure = HandlerFailure(offset=batch[0].offset, failures=self.failures,
                                         error=f"{type(err).__name__}: {err}",
                                         traceback="".join(traceback.format_exception(err))[-4000:],
                                         at=time.time())
                if on_failure is not None:
                    on_failure(failure)
                pause = backoff.next_delay()
                if pause is None:
                    return failure
                if self.stopping.wait(pause):
                    raise InterruptedError("the member stops; the batch is not handled") from None

    def teardown(self) -> None:
        if self._teardown is not None:
            self._teardown()
