package org.raylog.spark;

import java.util.EnumSet;
import java.util.Set;

import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/** A planned read of a topic as a batch-readable table. Immutable. */
final class RaylogTable implements SupportsRead {

  /** Column ordinals of {@link #SCHEMA}. */
  static final int KEY = 0, VALUE = 1, TOPIC = 2, PARTITION = 3, OFFSET = 4, TIMESTAMP = 5;

  /** The columns of Spark's Kafka source, in this order. */
  static final StructType SCHEMA =
      new StructType()
          .add("key", DataTypes.BinaryType, true)
          .add("value", DataTypes.BinaryType, true)
          .add("topic", DataTypes.StringType, true)
          .add("partition", DataTypes.IntegerType, true)
          .add("offset", DataTypes.LongType, true)
          .add("timestamp", DataTypes.TimestampType, true);

  @Override
  public String name() {
    return "raylog";
  }

  @Override
  @SuppressWarnings("deprecation") // Spark 3.5 still asks tables for schema()
  public StructType schema() {
    return SCHEMA;
  }

  @Override
  public Set<TableCapability> capabilities() {
    return EnumSet.of(TableCapability.BATCH_READ);
  }

  @Override
  public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
    return new RaylogScanBuilder(ReadOptions.parse(options));
  }
}
