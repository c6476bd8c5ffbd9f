package org.raylog.spark;

import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * Builds the scan of a planned read, with only the columns the query needs:
 * a count needs none, and then no key or value is copied (every message is
 * still fetched and checked). Not thread-safe (Spark uses it from one thread).
 */
final class RaylogScanBuilder implements ScanBuilder, SupportsPushDownRequiredColumns {

  private final CaseInsensitiveStringMap options;
  private final StructType table;
  private final AvroSpec avro;
  private StructType required;

  RaylogScanBuilder(CaseInsensitiveStringMap options, StructType table, AvroSpec avro) {
    this.options = options;
    this.table = table;
    this.avro = avro;
    this.required = table;
  }

  @Override
  public void pruneColumns(StructType requiredSchema) {
    this.required = requiredSchema;
  }

  @Override
  public Scan build() {
    return new RaylogScan(options, table, required, avro);
  }
}
