package org.raylog.spark;

/**
 * How a micro-batch's record limit ({@code maxOffsetsPerTrigger}) is shared by
 * the partitions: Spark's Kafka source's rate limit, in records. Pure; thread-safe.
 *
 * <p>Each partition with a backlog gets {@code limit * backlog / total}
 * records, rounded down, or rounded up when under one (so a small partition
 * is never starved), and never more than its backlog. As in Kafka's source
 * the shares may add up to a little less than the limit (rounding down), or
 * more when several partitions get their one record.
 */
public final class TriggerLimits {

  private TriggerLimits() {}

  /**
   * The records each partition reads in the next batch, of {@code backlogs}
   * (records available per partition, in any order) under {@code limit}
   * records in all; every backlog when they add up to at most the limit.
   */
  public static long[] split(long[] backlogs, long limit) {
    long[] out = new long[backlogs.length];
    double total = 0;
    for (long b : backlogs) {
      total += Math.max(0, b);
    }
    for (int i = 0; i < backlogs.length; i++) {
      long backlog = Math.max(0, backlogs[i]);
      if (total <= limit || backlog == 0) {
        out[i] = backlog;
        continue;
      }
      double prorate = limit * (backlog / total);
      long share = (long) (prorate < 1 ? Math.ceil(prorate) : Math.floor(prorate));
      out[i] = Math.min(backlog, share);
    }
    return out;
  }
}
