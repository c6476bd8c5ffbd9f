package org.raylog.spark;

import java.util.ArrayList;
import java.util.List;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.codegen.UnsafeRowWriter;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;

/**
 * A pushed-down {@code COUNT(*)} ({@link RaylogScanBuilder#pushAggregation}):
 * one row, the number of messages in all the ranges of the read. Each
 * partition actor counts its range on its own node (the COUNT request of
 * {@code raylog/transfer/protocol.py}: every message walked and its CRC32C
 * checked there, compressed sets counted by their inner messages) and sends
 * back a number instead of the data. The requests of all ranges are out at
 * once, so the partitions count side by side; a range longer than one
 * request's bound is asked again from where the reply stopped. Failures are
 * those of a read ({@link RangeReader#readCount}): a damaged message fails
 * the count with its error rather than giving a wrong number.
 *
 * <p>Not thread-safe: Spark drives it from one task thread.
 */
final class CountReader implements PartitionReader<InternalRow> {

  /** All the ranges of a read as one Spark partition: the count is one row. Immutable. */
  static final class Ranges implements InputPartition {
    private static final long serialVersionUID = 1L;

    final List<ReadOptions.Range> ranges;

    Ranges(List<ReadOptions.Range> ranges) {
      this.ranges = new ArrayList<>(ranges);
    }
  }

  private final List<RangeReader> readers = new ArrayList<>();
  private boolean done;
  private long total;

  CountReader(Ranges partition, ReadOptions.Settings settings) {
    try {
      for (ReadOptions.Range r : partition.ranges) {
        readers.add(new RangeReader(r, settings, new int[0], null));
      }
    } catch (RuntimeException e) {
      close();
      throw e;
    }
  }

  @Override
  public boolean next() {
    if (done) {
      return false;
    }
    List<RangeReader> open = new ArrayList<>(readers);
    for (RangeReader r : open) {
      r.sendCount();
    }
    while (!open.isEmpty()) {
      List<RangeReader> more = new ArrayList<>();
      for (RangeReader r : open) {
        if (!r.readCount()) {
          r.sendCount();
          more.add(r);
        }
      }
      open = more;
    }
    for (RangeReader r : readers) {
      total += r.counted();
    }
    done = true;
    return true;
  }

  @Override
  public InternalRow get() {
    UnsafeRowWriter w = new UnsafeRowWriter(1);
    w.reset();
    w.zeroOutNullBytes();
    w.write(0, total);
    return w.getRow();
  }

  @Override
  public void close() {
    for (RangeReader r : readers) {
      r.close();
    }
  }
}
