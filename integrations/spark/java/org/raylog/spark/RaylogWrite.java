package org.raylog.spark;

import java.io.Serializable;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.write.BatchWrite;
import org.apache.spark.sql.connector.write.DataWriter;
import org.apache.spark.sql.connector.write.DataWriterFactory;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.PhysicalWriteInfo;
import org.apache.spark.sql.connector.write.Write;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.connector.write.WriterCommitMessage;
import org.apache.spark.sql.connector.write.streaming.StreamingDataWriterFactory;
import org.apache.spark.sql.connector.write.streaming.StreamingWrite;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.BinaryType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.IntegerType;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The raylog sink of a stream, {@code df.writeStream.format("raylog")}, as
 * Spark's Kafka sink (a batch write, {@code df.write.format("raylog")},
 * goes through {@link BatchSink} with the same {@link Plan}).
 *
 * <p>Columns, as Spark's Kafka sink: {@code value} (binary or string,
 * required; null: a tombstone), {@code key} (binary or string, optional; null:
 * no key), {@code topic} (string, optional: the row's topic when the option
 * {@code topic} is not given; the option overrides it, as in Spark's Kafka
 * sink), {@code partition} (int, optional) and {@code headers}
 * ({@code array<struct<key: string, value: binary>>}, optional; null: none).
 * Other columns are ignored. Rows are written as format-2 record batches
 * (docs/design.md §2). Options:
 * {@code topic}, {@code zookeeper}, {@code cluster}, {@code token} (as for
 * reads, {@link SourceOptions}), {@code batch_bytes} (largest record batch
 * sent at once, default 256 KiB, at most the topic's max_message_bytes) and
 * {@code timeout_ms}; and Kafka's producer options with Kafka's meaning:
 * {@code kafka.acks} ({@code all} / {@code -1}, the default, {@code 1},
 * {@code 0}), {@code kafka.compression.type} ({@code none}, {@code gzip},
 * {@code snappy}, {@code lz4}, {@code zstd}), {@code kafka.batch.size} (the
 * Kafka name of batch_bytes; 0: one record per batch) and
 * {@code kafka.linger.ms} (a whole number; met by never waiting, see
 * {@link TopicWriter}). A bad value is a ConfigError naming the option. Each
 * task writes with a {@link TopicWriter}, idempotently: a retried task
 * stores its rows once. Immutable.
 */
final class RaylogWrite implements WriteBuilder, Write, BatchWrite, StreamingWrite {

  private static final Logger LOG = LoggerFactory.getLogger(RaylogWrite.class);

  /** What every task's writer needs. Immutable. */
  static final class Plan implements Serializable {
    private static final long serialVersionUID = 1L;
    final String topic;
    final String zookeeper;
    final String cluster;
    final byte[] token;
    final int timeoutMs;
    final int batchBytes;
    final int valueColumn;
    final boolean valueIsString;
    final int keyColumn;
    final boolean keyIsString;
    final int topicColumn;
    final int partitionColumn;
    /** the headers column, or -1 */
    final int headersColumn;
    /** kafka.acks: -1 ("all", the default), 1 or 0 */
    final int acks;
    /** kafka.compression.type as Kafka's codec number: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd */
    final int codec;
    /** kafka.linger.ms (accepted; a task writer never waits for rows: see TopicWriter) */
    final long lingerMs;
    /** drawn at random on the driver, once per write: the seed of the tasks' producer ids */
    final long writeId;

    Plan(CaseInsensitiveStringMap options, StructType schema) {
      OptionNames.check(options, OptionNames.Use.SINK);
      SourceOptions.Connection c = SourceOptions.connection(options);
      this.zookeeper = c.zookeeper;
      this.cluster = c.cluster;
      this.token = c.token;
      this.topic = options.get("topic");
      this.timeoutMs = (int) Math.min(Integer.MAX_VALUE, options.getLong("timeout_ms", 30_000));
      long bytes = options.getLong("batch_bytes", 256 * 1024);
      if (options.containsKey("kafka.batch.size")) {
        long kafkaBytes = integer(options, "kafka.batch.size", 0);
        if (options.containsKey("batch_bytes") && kafkaBytes != bytes) {
          throw SourceOptions.config("options 'kafka.batch.size' (" + kafkaBytes + ") and 'batch_bytes' (" + bytes
              + ") disagree; 'kafka.batch.size' is the Kafka name of 'batch_bytes': give one");
        }
        bytes = Math.max(1, kafkaBytes); // 0: as Kafka's batch.size=0, one record per batch
      }
      this.batchBytes = (int) Math.min(Integer.MAX_VALUE, bytes);
      if (timeoutMs <= 0 || batchBytes <= 0) {
        throw SourceOptions.config("options 'timeout_ms' and 'batch_bytes' must be positive");
      }
      this.acks = acks(options.getOrDefault("kafka.acks", "all"));
      this.codec = codec(options.getOrDefault("kafka.compression.type", "none"));
      this.lingerMs = integer(options, "kafka.linger.ms", 0);
      this.writeId = new java.security.SecureRandom().nextLong();
      this.valueColumn = column(schema, "value", true, true);
      this.valueIsString = schema.fields()[valueColumn].dataType() instanceof StringType;
      this.keyColumn = column(schema, "key", true, false);
      this.keyIsString = keyColumn >= 0 && schema.fields()[keyColumn].dataType() instanceof StringType;
      this.topicColumn = column(schema, "topic", false, false);
      this.partitionColumn = column(schema, "partition", false, false);
      this.headersColumn = column(schema, "headers", false, false);
      if (headersColumn >= 0 && !headersType(schema.fields()[headersColumn].dataType())) {
        throw SourceOptions.config("column 'headers' must be " + RaylogTable.HEADERS_TYPE.simpleString()
            + " (Spark's Kafka sink's), got " + schema.fields()[headersColumn].dataType().simpleString());
      }
      if (topicColumn >= 0 && !(schema.fields()[topicColumn].dataType() instanceof StringType)) {
        throw SourceOptions.config("column 'topic' must be a string");
      }
      if (partitionColumn >= 0 && !(schema.fields()[partitionColumn].dataType() instanceof IntegerType)) {
        throw SourceOptions.config("column 'partition' must be an int");
      }
      if (topic == null && topicColumn < 0) {
        throw SourceOptions.config("the raylog sink needs the option 'topic' or a 'topic' column");
      }
    }

    /** Kafka's acks: "all" or "-1" (the default), "1" or "0"; else a ConfigError naming kafka.acks. */
    static int acks(String value) {
      switch (value.trim().toLowerCase()) {
        case "all":
        case "-1":
          return -1;
        case "1":
          return 1;
        case "0":
          return 0;
        default:
          throw SourceOptions.config("option 'kafka.acks' must be all (or -1), 1 or 0, got '" + value + "'");
      }
    }

    /** Kafka's codec number of a kafka.compression.type; else a ConfigError naming the option. */
    static int codec(String value) {
      switch (value.trim().toLowerCase()) {
        case "none":
          return 0;
        case "gzip":
          return 1;
        case "snappy":
          return 2;
        case "lz4":
          return 3;
        case "zstd":
          return 4;
        default:
          throw SourceOptions.config("option 'kafka.compression.type' must be none, gzip, snappy, lz4 or zstd, "
              + "got '" + value + "'");
      }
    }

    /** A whole number of at least {@code min}; else a ConfigError naming the option. */
    private static long integer(CaseInsensitiveStringMap options, String name, long min) {
      String value = options.get(name);
      if (value == null) {
        return min;
      }
      long n;
      try {
        n = Long.parseLong(value.trim());
      } catch (NumberFormatException e) {
        throw SourceOptions.config("option '" + name + "' must be a whole number, got '" + value + "'");
      }
      if (n < min || n > Integer.MAX_VALUE) {
        throw SourceOptions.config("option '" + name + "' must be between " + min + " and " + Integer.MAX_VALUE
            + ", got " + n);
      }
      return n;
    }

    /** array of struct(key string, value binary) (the order of Spark's Kafka sink; nullability free) */
    private static boolean headersType(DataType type) {
      if (!(type instanceof ArrayType) || !(((ArrayType) type).elementType() instanceof StructType)) {
        return false;
      }
      StructType element = (StructType) ((ArrayType) type).elementType();
      return element.fields().length == 2
          && element.fields()[0].name().equals("key") && element.fields()[0].dataType() instanceof StringType
          && element.fields()[1].name().equals("value") && element.fields()[1].dataType() instanceof BinaryType;
    }

    private static int column(StructType schema, String name, boolean bytes, boolean required) {
      String[] names = schema.fieldNames();
      for (int i = 0; i < names.length; i++) {
        if (names[i].equalsIgnoreCase(name)) {
          DataType type = schema.fields()[i].dataType();
          if (bytes && !(type instanceof BinaryType || type instanceof StringType)) {
            throw SourceOptions.config("column '" + name + "' must be binary or string, got " + type.simpleString()
                + "; cast it (e.g. to_json(struct(...)) for a struct)");
          }
          return i;
        }
      }
      if (required) {
        throw SourceOptions.config("the raylog sink needs a '" + name + "' column; the query has "
            + String.join(", ", names));
      }
      return -1;
    }
  }

  /** Makes each task's writer. Immutable. */
  static final class Factory implements DataWriterFactory, StreamingDataWriterFactory {
    private static final long serialVersionUID = 1L;
    private final Plan plan;

    Factory(Plan plan) {
      this.plan = plan;
    }

    @Override
    public DataWriter<InternalRow> createWriter(int partitionId, long taskId) {
      return new TopicWriter(plan, partitionId);
    }

    @Override
    public DataWriter<InternalRow> createWriter(int partitionId, long taskId, long epochId) {
      // refused rows counted; commit(epoch) fails on the driver
      return new TopicWriter(plan, partitionId, epochId, true);
    }
  }

  private final Plan plan;

  RaylogWrite(LogicalWriteInfo info) {
    this.plan = new Plan(info.options(), info.schema());
  }

  @Override
  public Write build() {
    return this;
  }

  @Override
  public boolean useCommitCoordinator() {
    return false; // every task writes its own rows; nothing to coordinate
  }

  @Override
  public BatchWrite toBatch() {
    return this;
  }

  @Override
  public StreamingWrite toStreaming() {
    return this;
  }

  @Override
  public String description() {
    return "raylog sink" + (plan.topic == null ? "" : " into " + plan.topic);
  }

  @Override
  public Factory createBatchWriterFactory(PhysicalWriteInfo info) {
    return new Factory(plan);
  }

  @Override
  public Factory createStreamingWriterFactory(PhysicalWriteInfo info) {
    return new Factory(plan);
  }

  private static long total(WriterCommitMessage[] messages) {
    long n = 0;
    for (WriterCommitMessage m : messages) {
      if (m instanceof TopicWriter.Written) {
        n += ((TopicWriter.Written) m).messages;
      }
    }
    return n;
  }

  @Override
  public void commit(WriterCommitMessage[] messages) {
    LOG.info("{}: wrote {} messages", description(), total(messages));
  }

  @Override
  public void abort(WriterCommitMessage[] messages) {
    LOG.warn("{}: a write failed; {} messages were acknowledged before (a new write writes them again)",
        description(), total(messages));
  }

  @Override
  public void commit(long epochId, WriterCommitMessage[] messages) {
    long refused = 0;
    String why = null;
    for (WriterCommitMessage m : messages) {
      if (m instanceof TopicWriter.Written && ((TopicWriter.Written) m).refused > 0) {
        refused += ((TopicWriter.Written) m).refused;
        why = why == null ? ((TopicWriter.Written) m).firstRefusal : why;
      }
    }
    if (refused > 0) { // on the driver: the query fails once, no task is retried for it
      throw SourceOptions.config(refused + " rows of epoch " + epochId + " were not written, the first for " + why
          + "; the other " + total(messages) + " rows were written");
    }
    LOG.info("{}: epoch {} wrote {} messages", description(), epochId, total(messages));
  }

  @Override
  public void abort(long epochId, WriterCommitMessage[] messages) {
    LOG.warn("{}: epoch {} failed after {} acknowledged messages", description(), epochId, total(messages));
  }
}
