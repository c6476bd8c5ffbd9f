"""ZooKeeper: the embedded server, the cluster registry, consumer-group coordination, offsets and the schema registry."""
