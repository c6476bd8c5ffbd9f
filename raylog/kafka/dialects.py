"""The settings a Kafka client needs to reach raylog's listeners, in the
names each client takes (:meth:`raylog.Client.kafka_config`'s ``dialect``).

The settings are made once in librdkafka's names
(:func:`raylog.kafka.service.kafka_config`) and said here in the others':

================  ================================================================
dialect           what it gives
================  ================================================================
``librdkafka``    ``bootstrap.servers``, ``security.protocol``, ``sasl.mechanisms``,
                  ``sasl.username``, ``sasl.password``, over TLS
                  ``ssl.ca.location``: confluent-kafka, kcat,
                  Quix Streams (``confluent_kafka.Producer(config)`` as it is)
``java``          ``bootstrap.servers``, ``security.protocol``, ``sasl.mechanism``,
                  ``sasl.jaas.config`` (SCRAM's login module, or PLAIN's, the
                  token as the password), over TLS ``ssl.truststore.type``
                  ``PEM`` and ``ssl.truststore.location``: Kafka's Java client,
                  Kafka's tools (``--command-config``), Spark's Kafka source
                  (prefix each key with ``kafka.``)
``kafka-python``  ``bootstrap_servers`` (a list), ``security_protocol``,
                  ``sasl_mechanism``, ``sasl_plain_username``, ``sasl_plain_password``,
                  over TLS ``ssl_cafile``: ``KafkaProducer(**config)``
``aiokafka``      the same SASL keys, ``bootstrap_servers`` a comma-separated
                  string, over TLS ``ssl_context`` (an :class:`ssl.SSLContext`
                  that trusts the CA: aiokafka takes no file name):
                  ``AIOKafkaProducer(**config)``
================  ================================================================

A cluster opened on purpose (no token) gives the servers and
``PLAINTEXT`` only (``SSL`` and the CA over TLS).
"""

from __future__ import annotations

from raylog.errors import ConfigError

#: the dialects :func:`in_dialect` speaks
DIALECTS = ("librdkafka", "java", "kafka-python", "aiokafka")


def in_dialect(config: dict, dialect: str) -> dict:
    """``config`` (librdkafka's names) in ``dialect``'s names; ConfigError
    naming the dialects for any other."""
    if dialect == "librdkafka":
        return dict(config)
    if dialect == "java":
        out = {"bootstrap.servers": config["bootstrap.servers"], "security.protocol": config["security.protocol"]}
        if "sasl.mechanisms" in config:
            module = ("org.apache.kafka.common.security.plain.PlainLoginModule" if config["sasl.mechanisms"] == "PLAIN"
                      else "org.apache.kafka.common.security.scram.ScramLoginModule")
            out["sasl.mechanism"] = config["sasl.mechanisms"]
            out["sasl.jaas.config"] = (
                f'{module} required username="{config["sasl.username"]}" password="{config["sasl.password"]}";')
        if "ssl.ca.location" in config:  # a PEM truststore file (Kafka 2.7 on, KIP-651)
            out["ssl.truststore.type"] = "PEM"
            out["ssl.truststore.location"] = config["ssl.ca.location"]
        return out
    if dialect in ("kafka-python", "aiokafka"):
        servers = config["bootstrap.servers"]
        out = {"bootstrap_servers": servers.split(",") if dialect == "kafka-python" else servers,
               "security_protocol": config["security.protocol"]}
        if "sasl.mechanisms" in config:
            out.update(sasl_mechanism=config["sasl.mechanisms"], sasl_plain_username=config["sasl.username"],
                       sasl_plain_password=config["sasl.password"])
        if config["security.protocol"].endswith("SSL"):
            if dialect == "kafka-python":
                if "ssl.ca.location" in config:
                    out["ssl_cafile"] = config["ssl.ca.location"]
            else:
                import ssl

                out["ssl_context"] = ssl.create_default_context(cafile=config.get("ssl.ca.location"))
        return out
    raise ConfigError(f"dialect must be one of {', '.join(repr(d) for d in DIALECTS)}, got {dialect!r}")
