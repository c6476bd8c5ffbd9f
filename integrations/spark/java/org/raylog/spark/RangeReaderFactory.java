package org.raylog.spark;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;

/** Makes the reader of each range, in the executors. Immutable. */
final class RangeReaderFactory implements PartitionReaderFactory {

  private static final long serialVersionUID = 1L;

  private final ReadOptions.Settings settings;
  private final int[] columns;
  /** the typed Avro read, or null */
  private final AvroSpec avro;

  RangeReaderFactory(ReadOptions.Settings settings, int[] columns, AvroSpec avro) {
    this.settings = settings;
    this.columns = columns;
    this.avro = avro;
  }

  @Override
  public PartitionReader<InternalRow> createReader(InputPartition partition) {
    if (partition instanceof CountReader.Ranges) {
      return new CountReader((CountReader.Ranges) partition, settings);
    }
    return new RangeReader(((RangePartition) partition).range, settings, columns, avro);
  }
}
