"""The partition log on local disk: message format, segment files, the log (append, flush, read, retention, recovery). Knows nothing of Ray, sockets or ZooKeeper."""
