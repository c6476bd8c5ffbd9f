package org.raylog.spark;

import java.util.List;
import java.util.Map;

import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * The scan of a read: a batch of byte ranges, either given by raylog's Python
 * driver (option {@code ranges}, see {@link ReadOptions}) or planned here from
 * the Kafka-style options ({@link SourceOptions}), or a micro-batch stream
 * ({@link RaylogMicroBatchStream}). Immutable; the batch plan is made once,
 * when Spark first asks for the partitions.
 */
final class RaylogScan implements Scan, Batch {

  private final CaseInsensitiveStringMap rawOptions;
  private final StructType schema;
  /**
   * for each column of {@link #schema}, its ordinal in {@link RaylogTable#COLUMNS}
   * or its code in a typed Avro read ({@link AvroSpec#column})
   */
  private final int[] columns;
  private final AvroSpec avro;
  /** a pushed-down COUNT(*): one row of one column, the number of messages ({@link CountReader}) */
  private final boolean count;
  private ReadOptions planned;

  /** The schema of a pushed-down count. */
  static final StructType COUNT_SCHEMA = new StructType().add("count", DataTypes.LongType, false);

  /**
   * {@code required}: the columns the query needs (a value struct is read
   * whole, as {@code table} has it); null for a pushed-down COUNT(*).
   */
  RaylogScan(CaseInsensitiveStringMap options, StructType table, StructType required, AvroSpec avro) {
    this.rawOptions = options;
    this.avro = avro;
    this.count = required == null;
    if (count) {
      this.columns = new int[0];
      this.schema = COUNT_SCHEMA;
      return;
    }
    StructField[] fields = required.fields();
    StructType read = new StructType();
    this.columns = new int[fields.length];
    for (int i = 0; i < fields.length; i++) {
      String name = fields[i].name();
      read = read.add(table.apply(name));
      columns[i] = avro == null ? RaylogTable.COLUMNS.fieldIndex(name) : avro.column(name);
    }
    this.schema = read;
  }

  @Override
  public StructType readSchema() {
    return schema;
  }

  @Override
  public String description() {
    if (planned == null) {
      return "raylog " + (rawOptions.containsKey("ranges") ? "(planned ranges)" : rawOptions.get("subscribe"));
    }
    List<ReadOptions.Range> ranges = planned.ranges;
    String topic = ranges.isEmpty() ? "(nothing)" : ranges.get(0).topic;
    long bytes = 0;
    for (ReadOptions.Range r : ranges) {
      bytes += r.end - r.start;
    }
    return "raylog " + topic + ": " + ranges.size() + " ranges, " + bytes + " bytes"
        + (count ? ", COUNT(*) pushed down" : "");
  }

  @Override
  public Batch toBatch() {
    plan();
    return this;
  }

  private synchronized ReadOptions plan() {
    if (planned == null) {
      if (rawOptions.containsKey("ranges")) {
        OptionNames.check(rawOptions, OptionNames.Use.PLANNED_READ);
        planned = ReadOptions.parse(rawOptions);
      } else {
        planned = planByName();
      }
    }
    return planned;
  }

  private ReadOptions planByName() {
    SourceOptions options = SourceOptions.parse(rawOptions);
    options.checkBatch();
    try (Cluster cluster = new Cluster(options)) {
      Map<String, Integer> partitions = cluster.partitions();
      int maxMessageBytes = cluster.maxMessageBytes(partitions.keySet());
      Map<String, Map<Integer, long[]>> logs = cluster.offsets(partitions);
      Map<String, Map<Integer, long[]>> bounds =
          cluster.bounds(logs, cluster.starting(logs, null), cluster.ending(logs), maxMessageBytes);
      List<ReadOptions.Range> ranges = cluster.ranges(bounds);
      if (options.minPartitions > 0) {
        ranges = cluster.split(ranges, options.minPartitions, maxMessageBytes);
      }
      return new ReadOptions(ranges,
          cluster.settings(maxMessageBytes, cluster.maxInflatedBytes(partitions.keySet())), true);
    }
  }

  @Override
  public InputPartition[] planInputPartitions() {
    ReadOptions options = plan();
    List<ReadOptions.Range> ranges = options.ranges;
    if (count) {
      return new InputPartition[] {new CountReader.Ranges(ranges)}; // one row, even for no ranges
    }
    InputPartition[] partitions = new InputPartition[ranges.size()];
    for (int i = 0; i < partitions.length; i++) {
      partitions[i] = new RangePartition(i, ranges.get(i), options.locality);
    }
    return partitions;
  }

  @Override
  public PartitionReaderFactory createReaderFactory() {
    return new RangeReaderFactory(plan().settings, columns, avro);
  }

  @Override
  public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
    if (rawOptions.containsKey("ranges")) {
      throw SourceOptions.config("a streaming read takes topics (option 'subscribe'), not planned 'ranges'");
    }
    SourceOptions.checkStream(rawOptions);
    return new RaylogMicroBatchStream(SourceOptions.parse(rawOptions), columns, avro, checkpointLocation);
  }
}
