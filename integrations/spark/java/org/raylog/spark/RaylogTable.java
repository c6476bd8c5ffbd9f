package org.raylog.spark;

import java.util.EnumSet;
import java.util.Set;

import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/** Topics as a table for batch and micro-batch reads. Immutable. */
final class RaylogTable implements SupportsRead, SupportsWrite {

  private final StructType schema;
  /** the typed Avro read, or null */
  private final AvroSpec avro;

  RaylogTable(StructType schema, AvroSpec avro) {
    this.schema = schema;
    this.avro = avro;
  }

  /**
   * Column ordinals of {@link #COLUMNS}, the columns a reader can build: a scan
   * maps each column of its table to one of these by name.
   */
  static final int KEY = 0, VALUE = 1, TOPIC = 2, PARTITION = 3, OFFSET = 4, TIMESTAMP = 5, TIMESTAMP_TYPE = 6,
      NEXT_OFFSET = 7, HEADERS = 8;

  /** timestampType of a message: 0, the producer's create time (Kafka's CreateTime) */
  static final int CREATE_TIME = 0;
  /** timestampType of a record of a LogAppendTime batch (Kafka's LogAppendTime) */
  static final int LOG_APPEND_TIME = 1;

  /** The type of the {@code headers} column, Spark's Kafka source's: keys strings, values bytes (null allowed). */
  static final ArrayType HEADERS_TYPE = new ArrayType(
      new StructType().add("key", DataTypes.StringType, true).add("value", DataTypes.BinaryType, true), true);

  /**
   * The columns of Spark's Kafka source, exactly (names, types, order, all
   * nullable): the schema of a read without {@code includeHeaders} or
   * {@code includeNextOffset}. Every message has an offset of its own (inner
   * message i of a compressed wrapper at w: w + i), so
   * {@code (topic, partition, offset)} identifies a row.
   */
  static final StructType SCHEMA =
      new StructType()
          .add("key", DataTypes.BinaryType, true)
          .add("value", DataTypes.BinaryType, true)
          .add("topic", DataTypes.StringType, true)
          .add("partition", DataTypes.IntegerType, true)
          .add("offset", DataTypes.LongType, true)
          .add("timestamp", DataTypes.TimestampType, true)
          .add("timestampType", DataTypes.IntegerType, true);

  /**
   * Every column a reader builds, in the order of the ordinals above: {@link #SCHEMA}, then
   * {@code next_offset} (where to resume after the message: the option
   * {@code includeNextOffset=true}) and {@code headers} (the option {@code includeHeaders=true}).
   * Not the schema of any table: a table's columns are {@link #schema}'s.
   */
  static final StructType COLUMNS =
      SCHEMA.add("next_offset", DataTypes.LongType, true).add("headers", HEADERS_TYPE, true);

  /**
   * {@code base} ({@link #SCHEMA}, or a typed read's columns) with, as the options ask, the
   * record's headers (as Spark's Kafka source: in order, duplicates kept; empty for a format-1
   * message) and then raylog's {@code next_offset}, last.
   */
  static StructType schema(StructType base, java.util.Map<String, String> options) {
    StructType out = flag(options, "includeHeaders") ? base.add("headers", HEADERS_TYPE, true) : base;
    return flag(options, "includeNextOffset") ? out.add("next_offset", DataTypes.LongType, true) : out;
  }

  /**
   * A boolean option such as {@code includeHeaders} or {@code includeNextOffset}: "true" or
   * "false" (any case), default false; ConfigError for anything else.
   */
  static boolean flag(java.util.Map<String, String> options, String name) {
    String v = null;
    for (java.util.Map.Entry<String, String> e : options.entrySet()) {
      if (e.getKey().equalsIgnoreCase(name)) {
        v = e.getValue();
      }
    }
    if (v == null || v.trim().equalsIgnoreCase("false")) {
      return false;
    }
    if (v.trim().equalsIgnoreCase("true")) {
      return true;
    }
    throw SourceOptions.config("option '" + name + "' must be 'true' or 'false', not '" + v + "'");
  }

  @Override
  public String name() {
    return "raylog";
  }

  @Override
  @SuppressWarnings("deprecation") // Spark 3.5 still asks tables for schema()
  public StructType schema() {
    return schema;
  }

  @Override
  public Set<TableCapability> capabilities() {
    // no BATCH_WRITE: a batch write goes through RaylogSource.createRelation (BatchSink), which takes
    // the default save mode as Spark's Kafka sink does
    return EnumSet.of(TableCapability.BATCH_READ, TableCapability.MICRO_BATCH_READ,
        TableCapability.STREAMING_WRITE, TableCapability.ACCEPT_ANY_SCHEMA);
  }

  @Override
  public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
    return new RaylogWrite(info);
  }

  @Override
  public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
    return new RaylogScanBuilder(options, schema, avro);
  }
}
