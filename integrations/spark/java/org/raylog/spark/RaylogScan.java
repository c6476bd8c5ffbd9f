package org.raylog.spark;

import java.util.List;

import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/** The scan of a planned read: one input partition per range. Immutable. */
final class RaylogScan implements Scan, Batch {

  private final ReadOptions options;
  private final StructType schema;
  /** for each column of {@link #schema}, its ordinal in {@link RaylogTable#SCHEMA} */
  private final int[] columns;

  RaylogScan(ReadOptions options, StructType schema) {
    this.options = options;
    this.schema = schema;
    StructField[] fields = schema.fields();
    this.columns = new int[fields.length];
    for (int i = 0; i < fields.length; i++) {
      columns[i] = RaylogTable.SCHEMA.fieldIndex(fields[i].name());
    }
  }

  @Override
  public StructType readSchema() {
    return schema;
  }

  @Override
  public String description() {
    List<ReadOptions.Range> ranges = options.ranges;
    String topic = ranges.isEmpty() ? "(nothing)" : ranges.get(0).topic;
    long bytes = 0;
    for (ReadOptions.Range r : ranges) {
      bytes += r.end - r.start;
    }
    return "raylog " + topic + ": " + ranges.size() + " ranges, " + bytes + " bytes";
  }

  @Override
  public Batch toBatch() {
    return this;
  }

  @Override
  public InputPartition[] planInputPartitions() {
    List<ReadOptions.Range> ranges = options.ranges;
    InputPartition[] partitions = new InputPartition[ranges.size()];
    for (int i = 0; i < partitions.length; i++) {
      partitions[i] = new RangePartition(i, ranges.get(i), options.locality);
    }
    return partitions;
  }

  @Override
  public PartitionReaderFactory createReaderFactory() {
    return new RangeReaderFactory(options.settings, columns);
  }
}
