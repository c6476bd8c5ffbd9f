"""Run as a script by test_kafka_replicas.py (a Ray cluster of its own needs
a process of its own): a ``ray.cluster_utils.Cluster`` with two disk nodes,
a topic of replication factor 2, the Kafka listeners; prints one JSON line
with the listeners and what Metadata (raw, and librdkafka's view through
AdminClient.list_topics) says of each partition's leader, replicas and ISR.

    python replicated_metadata.py <zookeeper connect string> <data dir>
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

WAIT_S = 120.0


def main(zookeeper: str, data_dir: str) -> None:
    import ray
    from confluent_kafka.admin import AdminClient
    from kafka.protocol.metadata import MetadataRequest, MetadataResponse
    from kafka_raw import RawKafka
    from ray.cluster_utils import Cluster

    from raylog.client import Client
    from raylog.testing.clusters import start_disk_nodes

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    client = None
    try:
        start_disk_nodes(cluster, ("disk-a", "disk-b"))
        client = Client(zookeeper=zookeeper, cluster=f"kr-{uuid.uuid4().hex[:12]}", data_dir=data_dir,
                        data_host="127.0.0.1")
        topic = "replicated"
        client.create_topic(topic, partitions=2, replication_factor=2, min_insync_replicas=1)
        listeners = client.start_kafka_listeners()
        config = client.kafka_config()
        deadline = time.monotonic() + WAIT_S
        while True:
            with RawKafka(config) as raw:
                raw.authenticate()
                answer = raw.request(MetadataRequest[8](
                    topics=[MetadataRequest.MetadataRequestTopic(name=topic)], allow_auto_topic_creation=False,
                    include_cluster_authorized_operations=False, include_topic_authorized_operations=False),
                    MetadataResponse)
            parts = [{"partition": p.partition_index, "leader": p.leader_id, "replicas": list(p.replica_nodes),
                      "isr": list(p.isr_nodes)} for p in answer.topics[0].partitions]
            if all(len(p["isr"]) == 2 for p in parts) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        seen = AdminClient(config).list_topics(topic, timeout=60).topics[topic].partitions
        librdkafka = [{"partition": p, "leader": m.leader, "replicas": list(m.replicas), "isr": list(m.isrs)}
                      for p, m in sorted(seen.items())]
        print(json.dumps({"listeners": listeners, "raw": parts, "librdkafka": librdkafka}))
    finally:
        if client is not None:
            client.close()
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
