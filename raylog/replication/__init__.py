"""Replication of partitions (docs/design.md section 7).

A topic with ``replication_factor`` N > 1 has, per partition, N replica
actors (:class:`raylog.actors.partition.PartitionActor`), each pinned to its
own disk node and owning its own log directory. One is the **leader**: it
registers the partition's endpoint and serves producers and consumers. The
others are **followers**: they fetch the leader's bytes over the data channel
and append them at the same byte offsets (:mod:`raylog.replication.follower`).

- :mod:`raylog.replication.state`: the ZooKeeper ``state`` node (leader,
  leader epoch, ISR, replicas) and the ``replicas/<node>`` nodes;
- :mod:`raylog.replication.assignment`: which nodes hold a partition's
  replicas, their actor names and log directories;
- :mod:`raylog.replication.leader`: the leader's view of its followers
  (their log ends, the ISR, the high watermark);
- :mod:`raylog.replication.follower`: the follower's fetch loop;
- :mod:`raylog.replication.admin`: creating, describing and stopping the
  replicas of a topic;
- :mod:`raylog.replication.reassign` and :mod:`raylog.replication.repair`:
  moving replicas, and the supervisor's pass over replicated partitions;
- :mod:`raylog.replication.replica_actors`: the interface through which
  replication starts replica actors and has logs removed; the actors layer
  above hands the implementation in (:mod:`raylog.actors.replica_actors`).

This package imports storage, transfer and zk only (docs/design.md section 1;
``tests/test_layering.py``): never the actors or the producer. An
unreplicated topic never enters it.
"""
