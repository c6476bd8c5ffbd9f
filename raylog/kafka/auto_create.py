"""Topics created on a Kafka client's first Metadata request for them
(Kafka's ``auto.create.topics.enable``), off unless the listener is
started with ``auto_create_topics=True``
(:meth:`raylog.Client.start_kafka_listeners`).

As on a Kafka broker, the setting is the listener's: a Metadata request
that names a topic the cluster does not have, and allows creation
(``allow_auto_topic_creation``, Metadata 4 and later; always before 4),
asks this listener to create it; the answer for that topic is
LEADER_NOT_AVAILABLE (a client asks again, as it does while a new topic's
leader is elected) until the topic is served, then its partitions. A name
that is not a valid topic name is answered INVALID_TOPIC_EXCEPTION and
nothing is created. A topic is created with the defaults
:meth:`raylog.Client.create_topic` uses (one partition, as Kafka's
``num.partitions``; the replication factor of :class:`raylog.config.TopicConfig`).

Creation goes on one background thread, one topic at a time, so a
Metadata request never waits for partition actors to start. At most
:data:`MAX_PENDING` names wait at once; a request naming more is answered
UNKNOWN_TOPIC_OR_PARTITION for the rest (asked again later, they are
created then). A creation that fails is logged, and the name may be asked
for again.

Thread-safety: :meth:`AutoCreation.request` may be called from any
connection's thread (one lock); the creations run on the object's thread.
"""

from __future__ import annotations

import logging
import threading
from collections import deque

from raylog.errors import ConfigError, RaylogError, TopicExistsError
from raylog.zk.registry import validate_topic_name

log = logging.getLogger(__name__)

#: the most topic names waiting for creation at once
MAX_PENDING = 64
#: how long one creation may take (partition actors placed and serving)
CREATE_TIMEOUT_S = 60.0

#: Kafka's error codes for a Metadata topic (as in raylog.kafka.handlers)
NONE = 0
UNKNOWN_TOPIC_OR_PARTITION = 3
LEADER_NOT_AVAILABLE = 5
INVALID_TOPIC_EXCEPTION = 17


class AutoCreation:
    """Creates topics through ``topics`` (the listener's
    :class:`~raylog.admin.topics.TopicAdmin`), one at a time, on a thread
    of its own started with the first request."""

    def __init__(self, topics):
        self._topics = topics
        self._lock = threading.Lock()
        self._pending: deque[str] = deque()
        self._waiting: set[str] = set()
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._closed = False
        #: topics created so far by this listener (for its stats)
        self.created = 0

    def request(self, name: str) -> int:
        """Ask for topic ``name`` to be created; the Metadata error code to
        answer for it now (see the module docstring)."""
        try:
            validate_topic_name(name)
        except ConfigError:
            return INVALID_TOPIC_EXCEPTION
        with self._lock:
            if self._closed:
                return UNKNOWN_TOPIC_OR_PARTITION
            if name in self._waiting:
                return LEADER_NOT_AVAILABLE
            if len(self._waiting) >= MAX_PENDING:
                return UNKNOWN_TOPIC_OR_PARTITION
            self._waiting.add(name)
            self._pending.append(name)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="kafka-auto-create", daemon=True)
                self._thread.start()
            self._wake.notify()
        return LEADER_NOT_AVAILABLE

    def close(self) -> None:
        """Create nothing more (a creation under way finishes)."""
        with self._lock:
            self._closed = True
            self._pending.clear()
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                name = self._pending[0]
            try:
                self._topics.create_topic(name, timeout_s=CREATE_TIMEOUT_S)
                log.info("Kafka listener: created topic %s on a client's first request for it", name)
                self.created += 1
            except TopicExistsError:
                pass  # made meanwhile (another listener, or raylog itself)
            except RaylogError as err:
                log.warning("Kafka listener: creating topic %s on a client's request failed: %s",
                            name, str(err).splitlines()[0])
            except Exception:  # noqa: BLE001 - one failed creation never ends the thread
                log.exception("Kafka listener: creating topic %s on a client's request failed", name)
            with self._lock:
                if self._pending and self._pending[0] == name:
                    self._pending.popleft()
                self._waiting.discard(name)
