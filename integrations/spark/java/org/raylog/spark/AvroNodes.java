package org.raylog.spark;

import java.io.IOException;
import java.math.BigDecimal;
import java.math.BigInteger;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;

import org.apache.avro.Schema;
import org.apache.avro.io.Decoder;
import org.apache.avro.io.ResolvingDecoder;
import org.apache.avro.util.Utf8;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.util.ArrayBasedMapData;
import org.apache.spark.sql.catalyst.util.GenericArrayData;
import org.apache.spark.sql.types.Decimal;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * Decoders of Avro values straight into Spark's internal values, compiled
 * once from the reader schema: the values {@link AvroTypes} types, e.g.
 * {@code UTF8String} for string, enum and uuid, days (int) for date,
 * microseconds (long) for timestamp-millis/-micros and their local kinds,
 * milliseconds (int) for time-millis and microseconds (long) for
 * time-micros (as Python's typed reads), {@link Decimal} for decimal,
 * {@link GenericInternalRow} for records, {@link GenericArrayData} and
 * {@link ArrayBasedMapData} for arrays and maps.
 *
 * <p>A node reads from a plain binary decoder (the writer's schema is the
 * reader's) or from a {@link ResolvingDecoder} (another writer schema:
 * records then follow the resolver's field order, and fields, defaults and
 * promotions are those of Avro schema resolution). Immutable (the decoders
 * they read from are not: one per task).
 */
abstract class AvroNodes {

  /** The value read at the decoder's position. */
  abstract Object read(Decoder in) throws IOException;

  /** Read past the value without building it. */
  void skip(Decoder in) throws IOException {
    read(in);
  }

  /** The node of reader schema {@code s}; {@code widen}: an int or float read as a long or double. */
  static AvroNodes of(Schema s, boolean widen) {
    String logical = AvroTypes.logical(s);
    switch (s.getType()) {
      case NULL:
        return new Leaf(in -> {
          in.readNull();
          return null;
        });
      case BOOLEAN:
        return new Leaf(Decoder::readBoolean);
      case INT:
        return widen ? new Leaf(in -> (long) in.readInt()) : new Leaf(Decoder::readInt);
      case LONG:
        if ("timestamp-millis".equals(logical) || "local-timestamp-millis".equals(logical)) {
          return new Leaf(in -> Math.multiplyExact(in.readLong(), 1000L));
        }
        return new Leaf(Decoder::readLong);
      case FLOAT:
        return widen ? new Leaf(in -> (double) in.readFloat()) : new Leaf(Decoder::readFloat);
      case DOUBLE:
        return new Leaf(Decoder::readDouble);
      case STRING:
        return new Text();
      case ENUM:
        return new Symbols(s);
      case BYTES:
        return "decimal".equals(logical) ? new Decimals(s, -1) : new Bytes(-1);
      case FIXED:
        return "decimal".equals(logical) ? new Decimals(s, s.getFixedSize()) : new Bytes(s.getFixedSize());
      case ARRAY:
        return new Repeated(of(s.getElementType(), false), false);
      case MAP:
        return new Repeated(of(s.getValueType(), false), true);
      case RECORD:
        return new Record(s, null);
      case UNION:
        return new Union(s);
      default:
        throw new IllegalStateException("no decoder for " + s);
    }
  }

  /** One Avro call. */
  interface Read {
    Object apply(Decoder in) throws IOException;
  }

  static final class Leaf extends AvroNodes {
    private final Read read;

    Leaf(Read read) {
      this.read = read;
    }

    @Override
    Object read(Decoder in) throws IOException {
      return read.apply(in);
    }
  }

  /** string (and uuid): a fresh buffer per value, which the UTF8String wraps. */
  static final class Text extends AvroNodes {
    @Override
    Object read(Decoder in) throws IOException {
      Utf8 s = in.readString(null);
      return UTF8String.fromBytes(s.getBytes(), 0, s.getByteLength());
    }

    @Override
    void skip(Decoder in) throws IOException {
      in.skipString();
    }
  }

  static final class Symbols extends AvroNodes {
    private final UTF8String[] symbols;

    Symbols(Schema s) {
      List<String> names = s.getEnumSymbols();
      symbols = new UTF8String[names.size()];
      for (int i = 0; i < symbols.length; i++) {
        symbols[i] = UTF8String.fromString(names.get(i));
      }
    }

    @Override
    Object read(Decoder in) throws IOException {
      return symbols[in.readEnum()];
    }
  }

  static final class Bytes extends AvroNodes {
    /** the fixed size, or -1 for bytes */
    private final int fixed;

    Bytes(int fixed) {
      this.fixed = fixed;
    }

    static byte[] raw(Decoder in, int fixed) throws IOException {
      if (fixed >= 0) {
        byte[] out = new byte[fixed];
        in.readFixed(out);
        return out;
      }
      ByteBuffer b = in.readBytes(null);
      byte[] out = new byte[b.remaining()];
      b.get(out);
      return out;
    }

    @Override
    Object read(Decoder in) throws IOException {
      return raw(in, fixed);
    }

    @Override
    void skip(Decoder in) throws IOException {
      if (fixed >= 0) {
        in.skipFixed(fixed);
      } else {
        in.skipBytes();
      }
    }
  }

  /** decimal: the big-endian two's complement unscaled value. */
  static final class Decimals extends AvroNodes {
    private final int fixed;
    private final int precision;
    private final int scale;

    Decimals(Schema s, int fixed) {
      int[] ps = AvroTypes.decimal(s);
      this.fixed = fixed;
      this.precision = ps[0];
      this.scale = ps[1];
    }

    @Override
    Object read(Decoder in) throws IOException {
      byte[] unscaled = Bytes.raw(in, fixed);
      BigInteger value = unscaled.length == 0 ? BigInteger.ZERO : new BigInteger(unscaled);
      return Decimal.apply(new BigDecimal(value, scale), precision, scale);
    }
  }

  /** array (items) or map (string keys, values): Avro writes them in counted blocks. */
  static final class Repeated extends AvroNodes {
    private final AvroNodes item;
    private final boolean map;

    Repeated(AvroNodes item, boolean map) {
      this.item = item;
      this.map = map;
    }

    @Override
    Object read(Decoder in) throws IOException {
      List<Object> keys = map ? new ArrayList<>() : null;
      List<Object> values = new ArrayList<>();
      for (long n = map ? in.readMapStart() : in.readArrayStart(); n > 0; n = map ? in.mapNext() : in.arrayNext()) {
        for (long i = 0; i < n; i++) {
          if (map) {
            Utf8 key = in.readString(null);
            keys.add(UTF8String.fromBytes(key.getBytes(), 0, key.getByteLength()));
          }
          values.add(item.read(in));
        }
      }
      GenericArrayData items = new GenericArrayData(values.toArray());
      return map ? new ArrayBasedMapData(new GenericArrayData(keys.toArray()), items) : items;
    }
  }

  /** A union: the branch the writer chose (null, the one other type, or int/long, float/double widened). */
  static final class Union extends AvroNodes {
    private final AvroNodes[] branches;

    Union(Schema s) {
      List<Schema> types = s.getTypes();
      boolean widen = AvroTypes.promoted(AvroTypes.nonNull(s)) != null;
      branches = new AvroNodes[types.size()];
      for (int i = 0; i < branches.length; i++) {
        branches[i] = of(types.get(i), widen);
      }
    }

    @Override
    Object read(Decoder in) throws IOException {
      return branches[in.readIndex()].read(in);
    }

    @Override
    void skip(Decoder in) throws IOException {
      branches[in.readIndex()].skip(in);
    }
  }

  /**
   * A record: a {@link GenericInternalRow} of its fields, or with
   * {@link #fields} the field values alone, only those {@code wanted}
   * (the others are skipped).
   */
  static final class Record extends AvroNodes {
    private final AvroNodes[] nodes;
    /** the fields to build; null: every field */
    private final boolean[] wanted;

    Record(Schema s, boolean[] wanted) {
      List<Schema.Field> fields = s.getFields();
      nodes = new AvroNodes[fields.size()];
      for (int i = 0; i < nodes.length; i++) {
        nodes[i] = of(fields.get(i).schema(), false);
      }
      this.wanted = wanted;
    }

    /** The values of the fields, by position in the reader schema (null where not wanted). */
    Object[] fields(Decoder in) throws IOException {
      Object[] out = new Object[nodes.length];
      if (in instanceof ResolvingDecoder) {
        for (Schema.Field f : ((ResolvingDecoder) in).readFieldOrder()) {
          field(in, f.pos(), out);
        }
      } else {
        for (int i = 0; i < nodes.length; i++) {
          field(in, i, out);
        }
      }
      return out;
    }

    private void field(Decoder in, int i, Object[] out) throws IOException {
      if (wanted == null || wanted[i]) {
        out[i] = nodes[i].read(in);
      } else {
        nodes[i].skip(in);
      }
    }

    @Override
    Object read(Decoder in) throws IOException {
      return new GenericInternalRow(fields(in));
    }
  }
}
