package org.raylog.spark;

import java.io.Closeable;
import java.util.Arrays;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.util.ArrayData;
import org.apache.spark.sql.catalyst.util.GenericArrayData;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * The rows of a typed Avro read ({@link AvroSpec}): each message's value
 * decoded by an {@link AvroReader} into the value's columns (only the fields
 * the query needs are built; the others are skipped in the body), beside the
 * message's columns. A query that needs no value column (a count) decodes no
 * value. Not thread-safe: one per reader.
 */
final class TypedRows implements Closeable {

  private final int[] columns;
  private final AvroReader avro;
  private final boolean permissive;

  TypedRows(AvroSpec spec, int[] columns, ReadOptions.Settings settings) {
    this.columns = columns;
    this.permissive = spec.permissive;
    boolean[] wanted = AvroReader.wanted(spec, columns);
    this.avro = wanted == null ? null : new AvroReader(spec, wanted, settings);
  }

  /** The row of the message {@code m} points at. */
  InternalRow row(MessageSet m, int partition, UTF8String topic, String where) {
    Object[] fields = null;
    if (avro != null && m.valueLength >= 0) { // a null value (a tombstone): null value columns
      try {
        fields = avro.fields(m.data, m.valueOffset, m.valueLength);
      } catch (RaylogReadException e) {
        if (permissive && (e.code() == RaylogReadException.SCHEMA || e.code() == RaylogReadException.UNKNOWN_SCHEMA)) {
          fields = null; // mode PERMISSIVE: the row with null value columns
        } else {
          throw located(e, m, where);
        }
      }
    }
    Object[] values = new Object[columns.length];
    for (int i = 0; i < columns.length; i++) {
      int c = columns[i];
      if (c >= AvroSpec.VALUE_FIELD) {
        values[i] = fields == null ? null : fields[c - AvroSpec.VALUE_FIELD];
      } else if (c == AvroSpec.VALUE_STRUCT) {
        values[i] = fields == null ? null : new GenericInternalRow(fields);
      } else {
        values[i] = meta(c, m, partition, topic);
      }
    }
    return new GenericInternalRow(values);
  }

  private static RaylogReadException located(RaylogReadException e, MessageSet m, String where) {
    String message = e.getMessage().substring(e.errorName().length() + 2);
    return new RaylogReadException(e.code(), message + " [the value of " + where + " at offset " + m.offset + "]",
        e.details(), e);
  }

  static Object meta(int column, MessageSet m, int partition, UTF8String topic) {
    switch (column) {
      case RaylogTable.KEY:
        return m.keyLength < 0 ? null : Arrays.copyOfRange(m.data, m.keyOffset, m.keyOffset + m.keyLength);
      case RaylogTable.VALUE:
        return m.valueLength < 0 ? null : Arrays.copyOfRange(m.data, m.valueOffset, m.valueOffset + m.valueLength);
      case RaylogTable.TOPIC:
        return topic;
      case RaylogTable.PARTITION:
        return partition;
      case RaylogTable.OFFSET:
        return m.offset;
      case RaylogTable.TIMESTAMP:
        return m.timestamp * 1000L;
      case RaylogTable.TIMESTAMP_TYPE:
        return m.timestampType;
      case RaylogTable.NEXT_OFFSET:
        return m.nextOffset;
      case RaylogTable.HEADERS:
        return headers(m);
      default:
        throw new IllegalStateException("no column " + column);
    }
  }

  /** The headers of {@code m} as Spark's Kafka source has them: an array of (key string, value binary). */
  static ArrayData headers(MessageSet m) {
    byte[][] kv = m.headers();
    Object[] rows = new Object[kv.length / 2];
    for (int h = 0; h < rows.length; h++) {
      rows[h] = new GenericInternalRow(new Object[] {UTF8String.fromBytes(kv[2 * h]), kv[2 * h + 1]});
    }
    return new GenericArrayData(rows);
  }

  @Override
  public void close() {
    if (avro != null) {
      avro.close();
    }
  }
}
