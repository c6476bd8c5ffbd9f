"""How a partition actor gives its partition back to Ray: it ends its
process, and Ray (``max_restarts=-1``) starts the actor again, which then
recovers its log from the disk. Used where going on would wedge the
partition: a disk error (:data:`EXIT_DISK_ERROR`), or ZooKeeper unreachable
for :data:`STARTUP_ZOOKEEPER_WAIT_S` while starting
(:data:`EXIT_ZOOKEEPER_UNAVAILABLE`). Raising from the actor's ``__init__``
instead would end the actor for good: Ray never restarts an actor whose
constructor failed.
"""

from __future__ import annotations

import logging
import os
import time

from raylog.errors import ZooKeeperUnavailableError
from raylog.retry import RetryPolicy

log = logging.getLogger(__name__)

#: exit status of an actor process ended by a disk error
EXIT_DISK_ERROR = 75
#: exit status of an actor process whose timer failed unexpectedly (a bug: the traceback is logged)
EXIT_TIMER_FAILED = 70
#: exit status of an actor process that could not reach ZooKeeper while starting
EXIT_ZOOKEEPER_UNAVAILABLE = 76
#: how long a starting actor retries ZooKeeper before its process exits
STARTUP_ZOOKEEPER_WAIT_S = 60.0


def exit_process(status: int, message: str, *args, exc_info: bool = False) -> None:
    """Log ``message`` as critical (with the traceback being handled, with
    ``exc_info``), flush the log handlers, end the process."""
    log.critical(message, *args, exc_info=exc_info)
    for handler in logging.getLogger().handlers:
        try:
            handler.flush()
        except Exception:  # noqa: BLE001 - exiting anyway
            pass
    os._exit(status)


def until_zookeeper(deadline: float, what: str, step, *args):
    """Run a start-up ``step``, retried (jittered back-off, a warning now and
    then) while ZooKeeper is unreachable; past ``deadline`` (monotonic) the
    process exits with :data:`EXIT_ZOOKEEPER_UNAVAILABLE`. Other errors are
    raised as they are."""
    backoff = RetryPolicy.until(max(0.0, deadline - time.monotonic()), delay_s=0.2, max_delay_s=2.0).start()
    while True:
        try:
            return step(*args)
        except ZooKeeperUnavailableError as err:
            if not backoff.wait():
                exit_process(EXIT_ZOOKEEPER_UNAVAILABLE, "%s could not reach ZooKeeper for %.0fs while starting "
                             "(%s); exiting so that Ray starts it again", what, STARTUP_ZOOKEEPER_WAIT_S, err)
            if backoff.tries == 1 or backoff.tries % 10 == 0:
                log.warning("%s is waiting for ZooKeeper to start serving: %s", what, err)
