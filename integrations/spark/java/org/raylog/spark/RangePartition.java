package org.raylog.spark;

import org.apache.spark.sql.connector.read.InputPartition;

/** One range of the plan as a Spark input partition. Immutable. */
final class RangePartition implements InputPartition {

  private static final long serialVersionUID = 1L;

  final int index;
  final ReadOptions.Range range;
  private final boolean locality;

  RangePartition(int index, ReadOptions.Range range, boolean locality) {
    this.index = index;
    this.range = range;
    this.locality = locality;
  }

  /** The node that holds the range's partition, when known: reads run next to the data. */
  @Override
  public String[] preferredLocations() {
    if (!locality || range.location == null) {
      return new String[0];
    }
    return new String[] {range.location};
  }
}
