"""Ray actors: the partition actor that owns one log and serves it
(:mod:`~raylog.actors.partition`), its placement on nodes
(:mod:`~raylog.actors.placement`, ``place_topic``), the supervisor
(:mod:`~raylog.actors.supervisor`) with the removal of deleted logs
(:mod:`~raylog.actors.removal`), the partition actors as replication sees
them (:mod:`~raylog.actors.replica_actors`), the producer actor
(:mod:`~raylog.actors.producer`), and the transaction coordinator
(:mod:`~raylog.actors.transaction_coordinator`)."""
