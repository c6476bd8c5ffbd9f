"""IncrementalAlterConfigs and AlterConfigs through the Kafka front door
(issue 46 point 2, issue 49) with confluent-kafka's AdminClient and
kafka-python's KafkaAdminClient, on real ZooKeeper, Ray and sockets: a
live topic's configs change under Kafka's names, as raylog's own view
(client.describe_topic) and the running partition actor show; unknown
names, bad values and settings fixed at creation are refused with
INVALID_CONFIG and nothing changes; validate_only changes nothing."""

from __future__ import annotations

import uuid

import pytest

from raylog.testing.clusters import wait_until

confluent_kafka = pytest.importorskip("confluent_kafka")

from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource  # noqa: E402

WAIT_S = 120.0


def _topic(client, **settings) -> str:
    name = f"kc-{uuid.uuid4().hex[:12]}"
    client.create_topic(name, partitions=1, **settings)
    return name


def _incremental(admin, name, entries, **kwargs):
    resource = ConfigResource(ConfigResource.Type.TOPIC, name, incremental_configs=[
        ConfigEntry(key, value, incremental_operation=op) for key, op, value in entries])
    return admin.incremental_alter_configs([resource], **kwargs)[resource]


def _refused(future):
    with pytest.raises(confluent_kafka.KafkaException) as raised:
        future.result(timeout=WAIT_S)
    return raised.value.args[0]


def _described(admin, name) -> dict:
    resource = ConfigResource(ConfigResource.Type.TOPIC, name)
    return admin.describe_configs([resource])[resource].result(timeout=WAIT_S)


# -------------------------------------------------------------- failures first


@pytest.mark.parametrize("key, value, says", [
    ("compression.type", "lz4", "not supported by raylog"),
    ("min.cleanable.dirty.ratio", "2", "min.cleanable.dirty.ratio"),
    ("cleanup.policy", "shred", "cleanup.policy"),
    ("retention.ms", "soon", "an integer is expected"),
    ("max.message.bytes", "65536", "max.message.bytes cannot change on a live topic"),
], ids=["unknown", "ratio", "policy", "not-a-number", "fixed"])
def test_a_refused_change_is_invalid_config_and_changes_nothing(raylog_client, kafka_config, key, value, says):
    name = _topic(raylog_client, retention_ms=120_000)
    before = raylog_client.describe_topic(name)["config"]
    admin = AdminClient(kafka_config)
    # with a good change beside it: nothing of the resource is changed
    err = _refused(_incremental(admin, name, [(key, AlterConfigOpType.SET, value),
                                              ("retention.ms", AlterConfigOpType.SET, "60000")]
                                if key != "retention.ms" else [(key, AlterConfigOpType.SET, value)]))
    assert err.name() == "INVALID_CONFIG"
    assert says in err.str()
    assert raylog_client.describe_topic(name)["config"] == before


def test_append_to_a_config_that_is_not_a_list_and_an_unknown_topic_are_refused(raylog_client, kafka_config):
    name = _topic(raylog_client)
    admin = AdminClient(kafka_config)
    err = _refused(_incremental(admin, name, [("retention.ms", AlterConfigOpType.APPEND, "5")]))
    assert err.name() == "INVALID_CONFIG" and "cleanup.policy only" in err.str()
    err = _refused(_incremental(admin, name, [("cleanup.policy", AlterConfigOpType.SUBTRACT, "delete")]))
    assert err.name() == "INVALID_CONFIG" and "cannot be empty" in err.str()
    assert raylog_client.describe_topic(name)["config"].cleanup_policy == "delete"
    missing = f"kc-{uuid.uuid4().hex[:12]}"
    err = _refused(_incremental(admin, missing, [("retention.ms", AlterConfigOpType.SET, "5")]))
    assert err.name() == "UNKNOWN_TOPIC_OR_PART"


def test_validate_only_changes_nothing(raylog_client, kafka_config):
    name = _topic(raylog_client)
    admin = AdminClient(kafka_config)
    assert _incremental(admin, name, [("cleanup.policy", AlterConfigOpType.SET, "compact")],
                        validate_only=True).result(timeout=WAIT_S) is None
    assert raylog_client.describe_topic(name)["config"].cleanup_policy == "delete"
    err = _refused(_incremental(admin, name, [("cleanup.policy", AlterConfigOpType.SET, "shred")],
                                validate_only=True))
    assert err.name() == "INVALID_CONFIG"


# -------------------------------------------------------------- what works


def test_incremental_alter_configs_sets_appends_subtracts_and_deletes(raylog_client, kafka_config):
    import ray

    name = _topic(raylog_client, retention_ms=120_000)
    admin = AdminClient(kafka_config)
    assert _incremental(admin, name, [("cleanup.policy", AlterConfigOpType.SET, "compact"),
                                      ("min.cleanable.dirty.ratio", AlterConfigOpType.SET, "0.25"),
                                      ("delete.retention.ms", AlterConfigOpType.SET, "1000")]
                        ).result(timeout=WAIT_S) is None
    config = raylog_client.describe_topic(name)["config"]
    assert (config.cleanup_policy, config.min_cleanable_dirty_ratio, config.delete_retention_ms) == (
        "compact", 0.25, 1000)
    entries = _described(admin, name)
    assert entries["cleanup.policy"].value == "compact"
    assert not entries["cleanup.policy"].is_read_only and entries["max.message.bytes"].is_read_only
    # the running partition actor took it: its cleaner runs
    actor = raylog_client.partition_actor(name, 0)
    assert wait_until(lambda: (ray.get(actor.stats.remote(), timeout=30)["cleaner"] or {}).get("running"), 30)

    assert _incremental(admin, name, [("cleanup.policy", AlterConfigOpType.APPEND, "delete")]
                        ).result(timeout=WAIT_S) is None
    assert raylog_client.describe_topic(name)["config"].cleanup_policy == "compact,delete"
    assert _incremental(admin, name, [("cleanup.policy", AlterConfigOpType.SUBTRACT, "compact"),
                                      ("retention.ms", AlterConfigOpType.DELETE, None)]
                        ).result(timeout=WAIT_S) is None
    config = raylog_client.describe_topic(name)["config"]
    assert config.cleanup_policy == "delete"
    assert config.retention_ms == type(config)().retention_ms  # back to raylog's default
    assert config.min_cleanable_dirty_ratio == 0.25  # not named: kept
    assert wait_until(lambda: ray.get(actor.stats.remote(), timeout=30)["cleaner"] is None, 30)


def test_alter_configs_replaces_the_topics_settings(raylog_client, kafka_config):
    name = _topic(raylog_client, retention_ms=120_000, max_message_bytes=65_536, flush_ms=20)
    admin = AdminClient(kafka_config)
    resource = ConfigResource(ConfigResource.Type.TOPIC, name,
                              set_config={"cleanup.policy": "compact", "segment.bytes": str(1 << 20)})
    assert admin.alter_configs([resource])[resource].result(timeout=WAIT_S) is None
    config = raylog_client.describe_topic(name)["config"]
    defaults = type(config)()
    assert (config.cleanup_policy, config.segment_bytes) == ("compact", 1 << 20)
    assert (config.retention_ms, config.flush_ms) == (defaults.retention_ms, defaults.flush_ms)  # as Kafka
    assert config.max_message_bytes == 65_536  # fixed at creation: kept


def test_kafka_python_admin_alters_configs_both_ways(raylog_client, kafka_config):
    from kafka.admin import ConfigResource as KConfigResource
    from kafka.admin import ConfigResourceType, KafkaAdminClient

    name = _topic(raylog_client)
    admin = KafkaAdminClient(
        bootstrap_servers=kafka_config["bootstrap.servers"].split(","), security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-256", sasl_plain_username=kafka_config["sasl.username"],
        sasl_plain_password=kafka_config["sasl.password"])
    try:
        for incremental, policy in ((True, "compact"), (False, "compact,delete")):
            resource = KConfigResource(ConfigResourceType.TOPIC, name,
                                       configs={"cleanup.policy": policy, "min.compaction.lag.ms": "5000"})
            admin.alter_configs([resource], incremental=incremental, raise_on_unknown=False)
            config = raylog_client.describe_topic(name)["config"]
            assert (config.cleanup_policy, config.min_compaction_lag_ms) == (policy, 5000)
    finally:
        admin.close()
