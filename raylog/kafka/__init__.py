"""The Kafka protocol front door (docs/design.md section 10).

A listener per disk node speaks the Kafka wire protocol so that Kafka
clients in any language produce to and fetch from raylog topics:

* :mod:`raylog.kafka.frames` -- request frames in, response frames out; the
  APIs and versions served;
* :mod:`raylog.kafka.records` -- Kafka record batches to raylog message sets
  and back;
* :mod:`raylog.kafka.sasl` -- SCRAM-SHA-256 (user: the cluster, secret: its token);
* :mod:`raylog.kafka.handlers` -- the API handlers of one connection;
* :mod:`raylog.kafka.brokers` -- the listeners' registry in ZooKeeper and
  which listener Metadata names for a partition;
* :mod:`raylog.kafka.listener` -- the socket server;
* :mod:`raylog.kafka.service` -- the listener actor.

Start the listeners with :meth:`raylog.Client.start_kafka_listeners`; give
a Kafka client :meth:`raylog.Client.kafka_config`.
"""
