package org.raylog.spark;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;

import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * The allow-list of the options of the raylog source and sink: every option
 * Spark hands over is either one raylog implements (with the meaning of
 * Spark's Kafka source and sink, or a raylog setting), or refused by name
 * with a ConfigError that says why and what to use instead. Nothing is
 * accepted and ignored. Checked on the driver, before any task runs.
 *
 * <p>Option names are case-insensitive, as Spark's are. Stateless.
 */
final class OptionNames {

  private OptionNames() {}

  /** every option name as written, sorted (for the error's list of options) */
  private static final java.util.TreeSet<String> CANONICAL = new java.util.TreeSet<>(String.CASE_INSENSITIVE_ORDER);

  /** Where the options came from: a read by name, a planned read (ranges) or the sink. */
  enum Use { READ_BY_NAME, PLANNED_READ, SINK }

  private static final List<String> CONNECTION = Arrays.asList("zookeeper", "cluster", "token", "timeout_ms");
  /** camelCase spellings of raylog's snake_case options, accepted but not listed */
  private static final Set<String> CAMEL_ALIASES =
      new HashSet<>(Arrays.asList("valueFormat", "avroSchemaId", "avroSubject", "avroSubjectVersion"));

  private static final List<String> AVRO =
      Arrays.asList("value_format", "valueFormat", "avro_schema_id", "avroSchemaId", "avro_subject", "avroSubject",
          "avro_subject_version", "avroSubjectVersion", "flatten", "mode");

  /** Options of a read by name (Spark's Kafka source names and raylog's settings). */
  static final Set<String> READ_BY_NAME = lower(CONNECTION, AVRO, Arrays.asList(
      "subscribe", "subscribePattern", "assign", "startingOffsets", "endingOffsets", "includeHeaders",
      "includeNextOffset", "kafka.bootstrap.servers", "startingTimestamp", "endingTimestamp", "startingOffsetsByTimestamp", "endingOffsetsByTimestamp",
      "startingOffsetsByTimestampStrategy", "failOnDataLoss", "fail_on_data_loss", "minPartitions",
      "maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay", "kafkaConsumer.pollTimeoutMs", "fetch_bytes", "count_pushdown"));

  /** Options of a read of planned ranges (set by raylog_spark.read_topic; see ReadOptions). */
  static final Set<String> PLANNED_READ = lower(CONNECTION, AVRO, Arrays.asList(
      "ranges", "includeHeaders", "includeNextOffset", "fetch_bytes", "max_message_bytes", "max_inflated_bytes", "fail_on_data_loss", "locality",
      "count_pushdown"));

  /** Options of the sink ({@code checkpointLocation} is the stream's, handed over by Spark). */
  static final Set<String> SINK = lower(CONNECTION, Arrays.asList("topic", "batch_bytes", "checkpointLocation",
      "kafka.acks", "kafka.compression.type", "kafka.linger.ms", "kafka.batch.size"));

  /** Options of Spark's Kafka source and sink that raylog refuses, with the reason and what to use instead. */
  static final Map<String, String> REFUSED = new HashMap<>();

  static {
    refuse("maxRecordsPerPartition", "raylog splits a read by bytes, not records; use minPartitions");
    refuse("fetchOffset.numRetries", "raylog looks a partition's offsets up again for timeout_ms; set "
        + "'timeout_ms' instead");
    refuse("fetchOffset.retryIntervalMs", "raylog looks a partition's offsets up again for timeout_ms with "
        + "its own back-off; set 'timeout_ms' instead");
    refuse("groupIdPrefix", "a raylog read by name uses no consumer group; leave it out");
    refuse("kafka.group.id", "a raylog read by name uses no consumer group; leave it out");
    // a read by name takes kafka.bootstrap.servers when it names the cluster's Kafka listeners (SourceOptions)
    refuse("kafka.bootstrap.servers", "raylog finds its cluster through ZooKeeper: set the option 'zookeeper' "
        + "(host:port), or the Spark conf spark.raylog.zookeeper (raylog_spark.init_spark sets it)");
    refuse("kafka.auto.offset.reset", "as in Spark's Kafka source, set the option 'startingOffsets' to "
        + "'earliest' or 'latest' instead");
    refuse("kafka.key.deserializer", "as in Spark's Kafka source, keys are always read as bytes; "
        + "deserialize them with DataFrame operations");
    refuse("kafka.value.deserializer", "as in Spark's Kafka source, values are always read as bytes; "
        + "deserialize them with DataFrame operations (or read typed Avro values with value_format=avro)");
    refuse("kafka.key.serializer", "as in Spark's Kafka sink, keys are always written as bytes; cast the "
        + "'key' column to string or binary");
    refuse("kafka.value.serializer", "as in Spark's Kafka sink, values are always written as bytes; cast the "
        + "'value' column to string or binary");
    refuse("kafka.enable.auto.commit", "as in Spark's Kafka source, the source commits no offsets (the "
        + "query's checkpoint keeps them)");
    refuse("kafka.isolation.level", "the raylog source reads as read_uncommitted does (every record, as "
        + "Spark's Kafka source by default); read read_committed with raylog_spark.read_topic(spark, topic, "
        + "isolation_level='read_committed')");
    refuse("isolationLevel", "the raylog source reads as read_uncommitted does (every record); read "
        + "read_committed with raylog_spark.read_topic(spark, topic, isolation_level='read_committed')");
    refuse("kafka.interceptor.classes", "as in Spark's Kafka source, interceptors could change the rows the "
        + "source reads");
  }

  private static void refuse(String name, String why) {
    REFUSED.put(name.toLowerCase(), name + "' is not supported: " + why);
  }

  @SafeVarargs
  private static Set<String> lower(List<String>... lists) {
    Set<String> out = new HashSet<>();
    for (List<String> l : lists) {
      for (String s : l) {
        out.add(s.toLowerCase());
        if (!CAMEL_ALIASES.contains(s)) { // the snake_case forms are listed
          CANONICAL.add(s);
        }
      }
    }
    return Collections.unmodifiableSet(out);
  }

  /** ConfigError naming the first option {@code use} does not take, and why. */
  static void check(CaseInsensitiveStringMap options, Use use) {
    Set<String> allowed = use == Use.READ_BY_NAME ? READ_BY_NAME : use == Use.PLANNED_READ ? PLANNED_READ : SINK;
    String what = use == Use.SINK ? "the raylog sink" : "the raylog source";
    List<String> names = new ArrayList<>(options.asCaseSensitiveMap().keySet());
    Collections.sort(names);
    for (String name : names) {
      String key = name.toLowerCase();
      if (allowed.contains(key)) {
        continue;
      }
      String refused = REFUSED.get(key);
      if (refused != null) {
        throw SourceOptions.config("option '" + refused);
      }
      if (key.startsWith("kafka.")) {
        throw SourceOptions.config("option '" + name + "' is not supported: raylog is not a Kafka cluster and "
            + "maps no Kafka client setting; leave it out (raylog's own settings are zookeeper, cluster, token, "
            + "timeout_ms)");
      }
      List<String> known = new ArrayList<>();
      for (String canonical : CANONICAL) {
        if (allowed.contains(canonical.toLowerCase())) {
          known.add(canonical);
        }
      }
      throw SourceOptions.config("option '" + name + "' is not an option of " + what + "; its options are "
          + String.join(", ", known));
    }
  }
}
