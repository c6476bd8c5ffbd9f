"""The Kafka protocol front door (docs/design.md section 10).

A listener per disk node speaks the Kafka wire protocol so that Kafka
clients in any language produce to and fetch from raylog topics:

* :mod:`raylog.kafka.frames` -- request frames in, response frames out; the
  APIs and versions served;
* :mod:`raylog.kafka.records` -- Kafka record batches checked and stored as
  they came (format 2), and stored ones cut for a Fetch; format 1's messages
  converted;
* ``raylog.kafka._kafkarecords`` -- the per-record loops of those batches
  in C (``records`` holds the reference in Python);
* :mod:`raylog.kafka.produce_wire`, :mod:`raylog.kafka.fetch_wire` -- Produce
  requests and responses, and Fetch responses, read and written directly;
* :mod:`raylog.kafka.file_ranges` -- stored batches of a partition on the
  listener's machine sent to a Fetch by ``sendfile`` from their segment file;
* :mod:`raylog.kafka.sasl` -- SCRAM-SHA-512 and -256, and PLAIN over TLS
  (user: the cluster, secret: its token);
* :mod:`raylog.kafka.tls` -- TLS on the listener: its settings, the
  handshake of each connection, the CA file a client is given, the files
  ``raylog tls init`` makes;
* :mod:`raylog.kafka.connections` -- the listener's connections as a bounded
  set (strangers shed first, a bound per address);
* :mod:`raylog.kafka.handlers` -- the API handlers of one connection;
* :mod:`raylog.kafka.group_offsets` -- FindCoordinator, OffsetCommit and
  OffsetFetch on raylog's group offsets;
* :mod:`raylog.kafka.idempotence` -- InitProducerId, and the partition's
  answers to idempotent batches (judged by the log's producer state);
* :mod:`raylog.kafka.admin` -- CreateTopics, DeleteTopics, CreatePartitions,
  DescribeConfigs, AlterConfigs, IncrementalAlterConfigs and DeleteRecords
  through raylog's own topic administration;
* :mod:`raylog.kafka.auto_create` -- topics made on a client's first
  Metadata request for them (off unless turned on);
* :mod:`raylog.kafka.transaction_admin` -- ListTransactions and
  DescribeTransactions on the transaction records, DescribeProducers on
  the partitions' producer state;
* :mod:`raylog.kafka.transactions` -- FindCoordinator for a transactional
  id, InitProducerId with one, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn
  and TxnOffsetCommit on the cluster's transaction coordinator;
* :mod:`raylog.kafka.consumer_protocol` -- what a Kafka consumer group's
  member bytes (subscription, assignment) say, for raylog's views;
* :mod:`raylog.kafka.coordinator` -- JoinGroup, SyncGroup, Heartbeat and
  LeaveGroup: Kafka-protocol consumer groups (``subscribe()``);
* :mod:`raylog.kafka.group_admin` -- ListGroups, DescribeGroups,
  DeleteGroups and OffsetDelete on raylog's groups and Kafka-protocol ones;
* :mod:`raylog.kafka.brokers` -- the listeners' registry in ZooKeeper and
  which listener Metadata names for a partition;
* :mod:`raylog.kafka.listener` -- the socket server;
* :mod:`raylog.kafka.service` -- the listener actor;
* :mod:`raylog.kafka.launch` -- starting a listener actor on each disk node.

Served (:data:`raylog.kafka.frames.SUPPORTED`; a test holds this list to it):
Produce 3-9, Fetch 4-12, ListOffsets 1-6, Metadata 1-9, OffsetCommit 0-8,
OffsetFetch 1-6, FindCoordinator 0-3, JoinGroup 0-6, Heartbeat 0-4,
LeaveGroup 0-4, SyncGroup 0-4, SaslHandshake 0-1, ApiVersions 0-3,
SaslAuthenticate 0-1, InitProducerId 0-4, AddPartitionsToTxn 0-3,
AddOffsetsToTxn 0-3, EndTxn 0-4, TxnOffsetCommit 0-3, CreateTopics 2-5,
DeleteTopics 1-5, CreatePartitions 0-3, DescribeConfigs 1-4, AlterConfigs 0-2,
IncrementalAlterConfigs 0-1, ListGroups 0-4, DescribeGroups 0-5,
DeleteGroups 0-2, OffsetDelete 0, DeleteRecords 0-2, DescribeCluster 0-2, DescribeProducers 0,
ListTransactions 0-1, DescribeTransactions 0.
Produce and Fetch are advertised from version 0 for old librdkafka's
feature check (:data:`raylog.kafka.frames.ADVERTISED_LOWEST`).
Consumer groups include static membership (``group.instance.id``:
:mod:`raylog.kafka.coordinator`). The first flexible version of each API
is served (Produce 9, Fetch 12, Metadata 9, the groups'); the later ones
that name topics by id (Fetch 13, Metadata 10) or batch several groups in
one request are not.

Start the listeners with :meth:`raylog.Client.start_kafka_listeners`
(``tls=raylog.TlsSettings(...)`` for SASL_SSL); give
a Kafka client :meth:`raylog.Client.kafka_config` (in the names of the
client at hand: :mod:`raylog.kafka.dialects`).
"""
