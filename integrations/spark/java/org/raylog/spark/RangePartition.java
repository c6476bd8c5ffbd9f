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

  /**
   * The hosts of the replicas that may serve the range (its leader's and its
   * in-sync followers'), when known: reads run next to the data, and the
   * reader reads from the replica on its own host.
   */
  @Override
  public String[] preferredLocations() {
    if (!locality) {
      return new String[0];
    }
    return range.locations();
  }
}
