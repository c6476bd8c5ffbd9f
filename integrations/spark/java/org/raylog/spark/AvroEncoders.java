package org.raylog.spark;

import java.io.IOException;
import java.io.Serializable;
import java.math.BigDecimal;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.apache.avro.Schema;
import org.apache.avro.io.Encoder;
import org.apache.avro.util.Utf8;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.util.ArrayData;
import org.apache.spark.sql.catalyst.util.MapData;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.Decimal;
import org.apache.spark.sql.types.DecimalType;
import org.apache.spark.sql.types.MapType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * Encoders of Spark's internal values into Avro binary, compiled once from a
 * Spark type and the Avro schema to write (the inverse of {@link AvroNodes}),
 * as Spark's {@code to_avro} pairs them:
 *
 * <table>
 *   <caption>Spark to Avro</caption>
 *   <tr><th>Spark</th><th>Avro</th></tr>
 *   <tr><td>boolean; byte, short, int; long; float; double</td><td>boolean; int; long; float; double</td></tr>
 *   <tr><td>string</td><td>string, or enum (the value must be one of its symbols)</td></tr>
 *   <tr><td>binary</td><td>bytes, or fixed (of its size)</td></tr>
 *   <tr><td>date</td><td>int (days)</td></tr>
 *   <tr><td>timestamp, timestamp_ntz</td><td>long: microseconds, milliseconds for
 *       {@code timestamp-millis} / {@code local-timestamp-millis}</td></tr>
 *   <tr><td>decimal</td><td>bytes or fixed {@code decimal} (the unscaled value, big-endian two's
 *       complement, at the schema's scale)</td></tr>
 *   <tr><td>array, map (string keys), struct</td><td>array, map, record (fields matched by name,
 *       every field on both sides)</td></tr>
 *   <tr><td>any type</td><td>a union of null and that type (either order): null or the value</td></tr>
 * </table>
 *
 * <p>A pairing outside the table is refused when the encoder is built
 * (SchemaError naming the field); a value that does not fit its schema when
 * it is written (a null where the schema has no null branch, a string not a
 * symbol of the enum, binary of another size than the fixed, a decimal of
 * more digits than its precision): SchemaError naming the field. Immutable
 * and serializable.
 */
abstract class AvroEncoders implements Serializable {

  private static final long serialVersionUID = 1L;

  /** Write {@code value} (an internal value of the encoder's Spark type, not null). */
  abstract void write(Object value, Encoder out) throws IOException;

  /** The encoder of Spark values of {@code type} (null allowed when {@code nullable}) into {@code schema}. */
  static AvroEncoders of(DataType type, boolean nullable, Schema schema) {
    return encoder(type, nullable, schema, "the value");
  }

  private static AvroEncoders encoder(DataType type, boolean nullable, Schema schema, String where) {
    if (schema.getType() == Schema.Type.UNION) {
      return union(type, schema, where);
    }
    AvroEncoders one = value(type, schema, where);
    return nullable ? new NotNull(one, where) : one;
  }

  private static AvroEncoders value(DataType type, Schema schema, String where) {
    String logical = AvroTypes.logical(schema);
    switch (schema.getType()) {
      case NULL:
        if (type == DataTypes.NullType) {
          return new Leaf((v, out) -> out.writeNull());
        }
        break;
      case BOOLEAN:
        if (type == DataTypes.BooleanType) {
          return new Leaf((v, out) -> out.writeBoolean((Boolean) v));
        }
        break;
      case INT:
        if (type == DataTypes.IntegerType || type == DataTypes.DateType) {
          return new Leaf((v, out) -> out.writeInt((Integer) v));
        }
        if (type == DataTypes.ShortType) {
          return new Leaf((v, out) -> out.writeInt((Short) v));
        }
        if (type == DataTypes.ByteType) {
          return new Leaf((v, out) -> out.writeInt((Byte) v));
        }
        break;
      case LONG:
        if (type == DataTypes.LongType) {
          return new Leaf((v, out) -> out.writeLong((Long) v));
        }
        if (type == DataTypes.TimestampType || type == DataTypes.TimestampNTZType) {
          if ("timestamp-millis".equals(logical) || "local-timestamp-millis".equals(logical)) {
            return new Leaf((v, out) -> out.writeLong(Math.floorDiv((Long) v, 1000L)));
          }
          return new Leaf((v, out) -> out.writeLong((Long) v));
        }
        break;
      case FLOAT:
        if (type == DataTypes.FloatType) {
          return new Leaf((v, out) -> out.writeFloat((Float) v));
        }
        break;
      case DOUBLE:
        if (type == DataTypes.DoubleType) {
          return new Leaf((v, out) -> out.writeDouble((Double) v));
        }
        break;
      case STRING:
        if (type == DataTypes.StringType) {
          return new Leaf((v, out) -> out.writeString(new Utf8(((UTF8String) v).getBytes())));
        }
        break;
      case ENUM:
        if (type == DataTypes.StringType) {
          return new Symbols(schema, where);
        }
        break;
      case BYTES:
      case FIXED:
        int fixed = schema.getType() == Schema.Type.FIXED ? schema.getFixedSize() : -1;
        if (type instanceof DecimalType && "decimal".equals(logical)) {
          return new Decimals(schema, fixed, where);
        }
        if (type == DataTypes.BinaryType) {
          return new Bytes(fixed, where);
        }
        break;
      case ARRAY:
        if (type instanceof ArrayType) {
          ArrayType a = (ArrayType) type;
          return new Items(a.elementType(), encoder(a.elementType(), a.containsNull(), schema.getElementType(),
              where + "'s items"));
        }
        break;
      case MAP:
        if (type instanceof MapType && ((MapType) type).keyType() == DataTypes.StringType) {
          MapType m = (MapType) type;
          return new Entries(m.valueType(), encoder(m.valueType(), m.valueContainsNull(), schema.getValueType(),
              where + "'s values"));
        }
        break;
      case RECORD:
        if (type instanceof StructType) {
          return new Record((StructType) type, schema, where);
        }
        break;
      default:
        break;
    }
    throw new RaylogReadException(RaylogReadException.SCHEMA, "cannot write " + where + " of Spark type "
        + type.simpleString() + " as Avro " + schema + " (to_avro writes the pairings of org.raylog.spark"
        + ".AvroEncoders; cast the column or change the schema)");
  }

  /** A union of null and one type, or of int and long / float and double (the branch of the Spark type). */
  private static AvroEncoders union(DataType type, Schema schema, String where) {
    List<Schema> types = schema.getTypes();
    List<Schema> rest = AvroTypes.nonNull(schema);
    int nullAt = -1;
    for (int i = 0; i < types.size(); i++) {
      if (types.get(i).getType() == Schema.Type.NULL) {
        nullAt = i;
      }
    }
    Schema chosen = null;
    if (rest.size() == 1) {
      chosen = rest.get(0);
    } else if (rest.size() == 2 && AvroTypes.promoted(rest) != null) {
      Schema.Type want = type == DataTypes.IntegerType ? Schema.Type.INT : type == DataTypes.LongType
          ? Schema.Type.LONG : type == DataTypes.FloatType ? Schema.Type.FLOAT : type == DataTypes.DoubleType
          ? Schema.Type.DOUBLE : null;
      for (Schema b : rest) {
        chosen = b.getType() == want ? b : chosen;
      }
    }
    if (chosen == null && !rest.isEmpty()) {
      throw new RaylogReadException(RaylogReadException.SCHEMA, "cannot write " + where + " of Spark type "
          + type.simpleString() + " as the union " + schema + ": to_avro writes unions of null and one type, "
          + "or of int and long, float and double");
    }
    AvroEncoders value = chosen == null ? null : value(type, chosen, where);
    AvroEncoders u = new Union(nullAt, chosen == null ? -1 : types.indexOf(chosen), value);
    return nullAt < 0 ? new NotNull(u, where) : u;
  }

  static RaylogReadException misfit(String where, String why) {
    return new RaylogReadException(RaylogReadException.SCHEMA, "to_avro: " + where + " " + why);
  }

  /** One Avro call. */
  interface Write extends Serializable {
    void apply(Object value, Encoder out) throws IOException;
  }

  static final class Leaf extends AvroEncoders {
    private static final long serialVersionUID = 1L;
    private final Write write;

    Leaf(Write write) {
      this.write = write;
    }

    @Override
    void write(Object value, Encoder out) throws IOException {
      write.apply(value, out);
    }
  }

  /** A type whose Avro schema has no null: a null value is refused. */
  static final class NotNull extends AvroEncoders {
    private static final long serialVersionUID = 1L;
    private final AvroEncoders value;
    private final String where;

    NotNull(AvroEncoders value, String where) {
      this.value = value;
      this.where = where;
    }

    @Override
    void write(Object v, Encoder out) throws IOException {
      if (v == null) {
        throw misfit(where, "is null but its Avro schema has no null branch (make it a union with \"null\")");
      }
      value.write(v, out);
    }
  }

  static final class Union extends AvroEncoders {
    private static final long serialVersionUID = 1L;
    private final int nullAt;
    private final int valueAt;
    private final AvroEncoders value;

    Union(int nullAt, int valueAt, AvroEncoders value) {
      this.nullAt = nullAt;
      this.valueAt = valueAt;
      this.value = value;
    }

    @Override
    void write(Object v, Encoder out) throws IOException {
      if (v == null || value == null) {
        out.writeIndex(nullAt);
        out.writeNull();
        return;
      }
      out.writeIndex(valueAt);
      value.write(v, out);
    }
  }

  static final class Symbols extends AvroEncoders {
    private static final long serialVersionUID = 1L;
    private final Map<String, Integer> ordinals = new HashMap<>();
    private final String name;
    private final String where;

    Symbols(Schema s, String where) {
      List<String> symbols = s.getEnumSymbols();
      for (int i = 0; i < symbols.size(); i++) {
        ordinals.put(symbols.get(i), i);
      }
      this.name = s.getFullName();
      this.where = where;
    }

    @Override
    void write(Object v, Encoder out) throws IOException {
      Integer at = ordinals.get(v.toString());
      if (at == null) {
        throw misfit(where, "'" + v + "' is not a symbol of enum " + name + " " + ordinals.keySet());
      }
      out.writeEnum(at);
    }
  }

  static final class Bytes extends AvroEncoders {
    private static final long serialVersionUID = 1L;
    private final int fixed;
    private final String where;

    Bytes(int fixed, String where) {
      this.fixed = fixed;
      this.where = where;
    }

    @Override
    void write(Object v, Encoder out) throws IOException {
      byte[] b = (byte[]) v;
      if (fixed < 0) {
        out.writeBytes(b);
      } else if (b.length == fixed) {
        out.writeFixed(b);
      } else {
        throw misfit(where, "has " + b.length + " bytes; its Avro fixed holds " + fixed);
      }
    }
  }

  /** decimal: the unscaled value at the schema's scale, big-endian two's complement (sign-extended to a fixed). */
  static final class Decimals extends AvroEncoders {
    private static final long serialVersionUID = 1L;
    private final int fixed;
    private final int precision;
    private final int scale;
    private final String where;

    Decimals(Schema s, int fixed, String where) {
      int[] ps = AvroTypes.decimal(s);
      this.fixed = fixed;
      this.precision = ps[0];
      this.scale = ps[1];
      this.where = where;
    }

    @Override
    void write(Object v, Encoder out) throws IOException {
      BigDecimal d = ((Decimal) v).toJavaBigDecimal();
      BigDecimal scaled;
      try {
        scaled = d.setScale(scale);
      } catch (ArithmeticException e) {
        throw misfit(where, d + " does not fit decimal(" + precision + ", " + scale + ") without rounding");
      }
      if (scaled.precision() > precision) {
        throw misfit(where, d + " has more digits than decimal(" + precision + ", " + scale + ")");
      }
      byte[] unscaled = scaled.unscaledValue().toByteArray();
      if (fixed < 0) {
        out.writeBytes(unscaled);
        return;
      }
      if (unscaled.length > fixed) {
        throw misfit(where, d + " needs " + unscaled.length + " bytes; its Avro fixed holds " + fixed);
      }
      byte[] wide = new byte[fixed];
      byte sign = unscaled[0] < 0 ? (byte) 0xFF : 0;
      for (int i = 0; i < fixed - unscaled.length; i++) {
        wide[i] = sign;
      }
      System.arraycopy(unscaled, 0, wide, fixed - unscaled.length, unscaled.length);
      out.writeFixed(wide);
    }
  }

  static final class Items extends AvroEncoders {
    private static final long serialVersionUID = 1L;
    private final DataType type;
    private final AvroEncoders item;

    Items(DataType type, AvroEncoders item) {
      this.type = type;
      this.item = item;
    }

    @Override
    void write(Object v, Encoder out) throws IOException {
      ArrayData a = (ArrayData) v;
      int n = a.numElements();
      out.writeArrayStart();
      out.setItemCount(n);
      for (int i = 0; i < n; i++) {
        out.startItem();
        item.write(a.isNullAt(i) ? null : a.get(i, type), out);
      }
      out.writeArrayEnd();
    }
  }

  static final class Entries extends AvroEncoders {
    private static final long serialVersionUID = 1L;
    private final DataType type;
    private final AvroEncoders value;

    Entries(DataType type, AvroEncoders value) {
      this.type = type;
      this.value = value;
    }

    @Override
    void write(Object v, Encoder out) throws IOException {
      MapData m = (MapData) v;
      ArrayData keys = m.keyArray();
      ArrayData values = m.valueArray();
      int n = m.numElements();
      out.writeMapStart();
      out.setItemCount(n);
      for (int i = 0; i < n; i++) {
        out.startItem();
        out.writeString(keys.getUTF8String(i).toString());
        value.write(values.isNullAt(i) ? null : values.get(i, type), out);
      }
      out.writeMapEnd();
    }
  }

  /** A record: per Avro field in its order, the struct field of that name. */
  static final class Record extends AvroEncoders {
    private static final long serialVersionUID = 1L;
    private final int[] ordinals;
    private final DataType[] types;
    private final AvroEncoders[] fields;

    Record(StructType struct, Schema s, String where) {
      List<Schema.Field> avro = s.getFields();
      ordinals = new int[avro.size()];
      types = new DataType[avro.size()];
      fields = new AvroEncoders[avro.size()];
      for (int i = 0; i < fields.length; i++) {
        Schema.Field f = avro.get(i);
        String name = f.name();
        if (!java.util.Arrays.asList(struct.fieldNames()).contains(name)) {
          throw new RaylogReadException(RaylogReadException.SCHEMA, "cannot write " + where + " as Avro record "
              + s.getFullName() + ": its field '" + name + "' is not in the struct " + struct.simpleString());
        }
        StructField sf = struct.apply(name);
        ordinals[i] = struct.fieldIndex(name);
        types[i] = sf.dataType();
        fields[i] = encoder(sf.dataType(), sf.nullable(), f.schema(), "field '" + name + "' of " + where);
      }
      for (String name : struct.fieldNames()) {
        if (s.getField(name) == null) {
          throw new RaylogReadException(RaylogReadException.SCHEMA, "cannot write " + where + " as Avro record "
              + s.getFullName() + ": the struct's field '" + name + "' is not in the record");
        }
      }
    }

    @Override
    void write(Object v, Encoder out) throws IOException {
      InternalRow row = (InternalRow) v;
      for (int i = 0; i < fields.length; i++) {
        int at = ordinals[i];
        fields[i].write(row.isNullAt(at) ? null : row.get(at, types[i]), out);
      }
    }
  }
}
