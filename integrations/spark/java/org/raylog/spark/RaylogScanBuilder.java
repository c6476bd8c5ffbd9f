package org.raylog.spark;

import org.apache.spark.sql.connector.expressions.aggregate.AggregateFunc;
import org.apache.spark.sql.connector.expressions.aggregate.Aggregation;
import org.apache.spark.sql.connector.expressions.aggregate.CountStar;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownAggregates;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * Builds the scan of a planned read, with only the columns the query needs:
 * a count needs none, and then no key or value is copied (every message is
 * still fetched and checked).
 *
 * <p>A bare {@code COUNT(*)} (no filter, no grouping: what
 * {@code df.count()} asks) is pushed down whole: the partition actors count
 * their ranges, checking every message, and send only the numbers
 * ({@link CountReader}). Spark offers the push-down only when no filter
 * stays above the scan, so a count of filtered rows reads the rows. The
 * option {@code count_pushdown=false} turns it off.
 *
 * <p>Not thread-safe (Spark uses it from one thread).
 */
final class RaylogScanBuilder implements ScanBuilder, SupportsPushDownRequiredColumns, SupportsPushDownAggregates {

  private final CaseInsensitiveStringMap options;
  private final StructType table;
  private final AvroSpec avro;
  private StructType required;
  private boolean count;

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

  /** Whether {@code aggregation} is a bare COUNT(*) this source answers whole. */
  private boolean countStar(Aggregation aggregation) {
    AggregateFunc[] functions = aggregation.aggregateExpressions();
    return options.getBoolean("count_pushdown", true) && aggregation.groupByExpressions().length == 0
        && functions.length == 1 && functions[0] instanceof CountStar;
  }

  @Override
  public boolean supportCompletePushDown(Aggregation aggregation) {
    return countStar(aggregation); // one row: the count itself
  }

  @Override
  public boolean pushAggregation(Aggregation aggregation) {
    count = countStar(aggregation);
    return count;
  }

  @Override
  public Scan build() {
    return new RaylogScan(options, table, count ? null : required, avro);
  }
}
