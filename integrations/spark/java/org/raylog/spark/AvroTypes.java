package org.raylog.spark;

import java.util.ArrayList;
import java.util.List;

import org.apache.avro.LogicalTypes;
import org.apache.avro.Schema;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.DecimalType;
import org.apache.spark.sql.types.MapType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/**
 * The Spark type of the records of an Avro schema: the mapping of Python's
 * {@code raylog.avro.avro_to_spark_schema}, for the schemas typed reads
 * support (every union has at most one non-null branch, or is
 * {@code [int, long]} / {@code [float, double]}, with or without null).
 *
 * <table>
 *   <caption>Avro to Spark</caption>
 *   <tr><th>Avro</th><th>Spark</th></tr>
 *   <tr><td>null, boolean, int, long, float, double</td><td>NullType, BooleanType, IntegerType, ...</td></tr>
 *   <tr><td>bytes, fixed</td><td>BinaryType</td></tr>
 *   <tr><td>string, enum</td><td>StringType</td></tr>
 *   <tr><td>array&lt;T&gt;, map&lt;T&gt;, record</td><td>ArrayType(T), MapType(StringType, T), StructType</td></tr>
 *   <tr><td>[null, T] (either order)</td><td>T, nullable</td></tr>
 *   <tr><td>[int, long] / [float, double]</td><td>LongType / DoubleType</td></tr>
 *   <tr><td>int date</td><td>DateType</td></tr>
 *   <tr><td>long timestamp-millis / -micros</td><td>TimestampType</td></tr>
 *   <tr><td>long local-timestamp-millis / -micros</td><td>TimestampNTZType</td></tr>
 *   <tr><td>bytes / fixed decimal(p, s), p &lt;= 38</td><td>DecimalType(p, s)</td></tr>
 *   <tr><td>uuid, time-millis, time-micros (and other logical types)</td><td>the underlying type</td></tr>
 * </table>
 *
 * <p>A record becomes the struct of its fields; any other top-level schema a
 * one-field struct {@code value} ({@link #structOf}; {@link #typed} keeps it
 * as it is). {@link #avroOf} goes the other way, as Spark's {@code to_avro}
 * derives a schema. Stateless.
 */
final class AvroTypes {

  private AvroTypes() {}

  /** The struct of the records of {@code schema}; SchemaError or ConfigError when it has no Spark type here. */
  static StructType structOf(Schema schema) {
    Typed top = convert(schema, new ArrayList<>());
    if (schema.getType() == Schema.Type.RECORD) {
      return (StructType) top.type;
    }
    return new StructType().add("value", top.type, top.nullable);
  }

  /** The Spark type of the values of {@code schema} (a record: its struct) and whether they may be null. */
  static Typed typed(Schema schema) {
    return convert(schema, new ArrayList<>());
  }

  /**
   * The Avro schema of Spark values of {@code type}, as Spark's
   * {@code SchemaConverters.toAvroType}: a struct is a record named
   * {@code name} in {@code namespace} (the top level {@code topLevelRecord},
   * a nested one named by its field, in the namespace of its parents), byte
   * and short are int, date an int {@code date}, timestamp a long
   * {@code timestamp-micros}, timestamp_ntz a long
   * {@code local-timestamp-micros}, decimal(p, s) a fixed {@code decimal} of
   * the fewest bytes that hold p digits (named {@code <name>.fixed}), a map
   * (string keys) a map; a nullable type is the union {@code [type, null]}.
   * SchemaError for a type Avro cannot hold (maps of non-string keys,
   * intervals, ...).
   */
  static Schema avroOf(DataType type, boolean nullable, String name, String namespace) {
    Schema s;
    if (type == DataTypes.BooleanType) {
      s = Schema.create(Schema.Type.BOOLEAN);
    } else if (type == DataTypes.ByteType || type == DataTypes.ShortType || type == DataTypes.IntegerType) {
      s = Schema.create(Schema.Type.INT);
    } else if (type == DataTypes.DateType) {
      s = LogicalTypes.date().addToSchema(Schema.create(Schema.Type.INT));
    } else if (type == DataTypes.TimestampType) {
      s = LogicalTypes.timestampMicros().addToSchema(Schema.create(Schema.Type.LONG));
    } else if (type == DataTypes.TimestampNTZType) {
      s = LogicalTypes.localTimestampMicros().addToSchema(Schema.create(Schema.Type.LONG));
    } else if (type == DataTypes.LongType) {
      s = Schema.create(Schema.Type.LONG);
    } else if (type == DataTypes.FloatType) {
      s = Schema.create(Schema.Type.FLOAT);
    } else if (type == DataTypes.DoubleType) {
      s = Schema.create(Schema.Type.DOUBLE);
    } else if (type == DataTypes.StringType) {
      s = Schema.create(Schema.Type.STRING);
    } else if (type == DataTypes.BinaryType) {
      s = Schema.create(Schema.Type.BYTES);
    } else if (type == DataTypes.NullType) {
      return Schema.create(Schema.Type.NULL);
    } else if (type instanceof DecimalType) {
      DecimalType d = (DecimalType) type;
      String fixed = namespace.isEmpty() ? name + ".fixed" : namespace + "." + name + ".fixed";
      s = LogicalTypes.decimal(d.precision(), d.scale())
          .addToSchema(Schema.createFixed(fixed, null, null, fixedSize(d.precision())));
    } else if (type instanceof ArrayType) {
      ArrayType a = (ArrayType) type;
      s = Schema.createArray(avroOf(a.elementType(), a.containsNull(), name, namespace));
    } else if (type instanceof MapType && ((MapType) type).keyType() == DataTypes.StringType) {
      MapType m = (MapType) type;
      s = Schema.createMap(avroOf(m.valueType(), m.valueContainsNull(), name, namespace));
    } else if (type instanceof StructType) {
      String child = namespace.isEmpty() ? name : namespace + "." + name;
      List<Schema.Field> fields = new ArrayList<>();
      for (StructField f : ((StructType) type).fields()) {
        fields.add(new Schema.Field(f.name(), avroOf(f.dataType(), f.nullable(), f.name(), child)));
      }
      s = Schema.createRecord(name, null, namespace.isEmpty() ? null : namespace, false, fields);
    } else {
      throw new RaylogReadException(RaylogReadException.SCHEMA,
          "Spark type " + type.simpleString() + " has no Avro equivalent; pass an Avro schema or cast the column");
    }
    return nullable ? Schema.createUnion(s, Schema.create(Schema.Type.NULL)) : s;
  }

  /** The fewest bytes whose two's complement holds every unscaled value of {@code precision} digits. */
  static int fixedSize(int precision) {
    int bytes = 1;
    while (Math.pow(2.0, 8 * bytes - 1) < Math.pow(10.0, precision)) {
      bytes++;
    }
    return bytes;
  }

  /** A Spark type and whether values may be null. */
  static final class Typed {
    final DataType type;
    final boolean nullable;

    Typed(DataType type, boolean nullable) {
      this.type = type;
      this.nullable = nullable;
    }
  }

  /** The logical type name of {@code s}, or null. */
  static String logical(Schema s) {
    return s.getProp("logicalType");
  }

  /** The non-null branches of a union. */
  static List<Schema> nonNull(Schema union) {
    List<Schema> rest = new ArrayList<>();
    for (Schema b : union.getTypes()) {
      if (b.getType() != Schema.Type.NULL) {
        rest.add(b);
      }
    }
    return rest;
  }

  /** For a union of two non-null branches, the promoted type ({@code [int, long]}: long), else null. */
  static Schema.Type promoted(List<Schema> rest) {
    if (rest.size() != 2) {
      return null;
    }
    Schema.Type a = rest.get(0).getType();
    Schema.Type b = rest.get(1).getType();
    if ((a == Schema.Type.INT && b == Schema.Type.LONG) || (a == Schema.Type.LONG && b == Schema.Type.INT)) {
      return Schema.Type.LONG;
    }
    if ((a == Schema.Type.FLOAT && b == Schema.Type.DOUBLE) || (a == Schema.Type.DOUBLE && b == Schema.Type.FLOAT)) {
      return Schema.Type.DOUBLE;
    }
    return null;
  }

  private static Typed convert(Schema s, List<String> stack) {
    String logical = logical(s);
    switch (s.getType()) {
      case NULL:
        return new Typed(DataTypes.NullType, true);
      case BOOLEAN:
        return new Typed(DataTypes.BooleanType, false);
      case INT:
        return new Typed("date".equals(logical) ? DataTypes.DateType : DataTypes.IntegerType, false);
      case LONG:
        if ("timestamp-millis".equals(logical) || "timestamp-micros".equals(logical)) {
          return new Typed(DataTypes.TimestampType, false);
        }
        if ("local-timestamp-millis".equals(logical) || "local-timestamp-micros".equals(logical)) {
          return new Typed(DataTypes.TimestampNTZType, false);
        }
        return new Typed(DataTypes.LongType, false);
      case FLOAT:
        return new Typed(DataTypes.FloatType, false);
      case DOUBLE:
        return new Typed(DataTypes.DoubleType, false);
      case STRING:
      case ENUM:
        return new Typed(DataTypes.StringType, false);
      case BYTES:
      case FIXED:
        if ("decimal".equals(logical)) {
          int[] ps = decimal(s);
          return new Typed(DataTypes.createDecimalType(ps[0], ps[1]), false);
        }
        return new Typed(DataTypes.BinaryType, false);
      case ARRAY: {
        Typed item = convert(s.getElementType(), stack);
        return new Typed(DataTypes.createArrayType(item.type, item.nullable), false);
      }
      case MAP: {
        Typed value = convert(s.getValueType(), stack);
        return new Typed(DataTypes.createMapType(DataTypes.StringType, value.type, value.nullable), false);
      }
      case RECORD: {
        String name = s.getFullName();
        if (stack.contains(name)) {
          throw new RaylogReadException(RaylogReadException.SCHEMA,
              "record " + name + " is recursive; Spark types cannot represent it");
        }
        stack.add(name);
        List<StructField> fields = new ArrayList<>();
        for (Schema.Field f : s.getFields()) {
          Typed t = convert(f.schema(), stack);
          fields.add(DataTypes.createStructField(f.name(), t.type, t.nullable));
        }
        stack.remove(stack.size() - 1);
        return new Typed(DataTypes.createStructType(fields), false);
      }
      case UNION:
        return union(s, stack);
      default:
        throw new RaylogReadException(RaylogReadException.SCHEMA, "Avro type " + s + " has no Spark equivalent");
    }
  }

  private static Typed union(Schema s, List<String> stack) {
    List<Schema> rest = nonNull(s);
    boolean hasNull = rest.size() < s.getTypes().size();
    if (rest.isEmpty()) {
      return new Typed(DataTypes.NullType, true);
    }
    if (rest.size() == 1) {
      Typed one = convert(rest.get(0), stack);
      return new Typed(one.type, hasNull || one.nullable);
    }
    Schema.Type promoted = promoted(rest);
    if (promoted == Schema.Type.LONG) {
      return new Typed(DataTypes.LongType, hasNull);
    }
    if (promoted == Schema.Type.DOUBLE) {
      return new Typed(DataTypes.DoubleType, hasNull);
    }
    throw new RaylogReadException(RaylogReadException.CONFIG,
        "typed Avro reads do not support unions of several non-null types; read value_format='binary' "
            + "and decode the values with raylog.avro.AvroDeserializer");
  }

  /** {precision, scale} of a decimal schema; SchemaError past Spark's 38 digits. */
  static int[] decimal(Schema s) {
    Object p = s.getObjectProp("precision");
    Object sc = s.getObjectProp("scale");
    int precision = p instanceof Number ? ((Number) p).intValue() : 0;
    int scale = sc instanceof Number ? ((Number) sc).intValue() : 0;
    if (precision > 38) {
      throw new RaylogReadException(RaylogReadException.SCHEMA,
          "decimal precision " + precision + " exceeds Spark's maximum of 38");
    }
    if (precision <= 0 || scale < 0 || scale > precision) {
      throw new RaylogReadException(RaylogReadException.SCHEMA,
          "decimal with precision " + precision + " and scale " + scale + " is not valid");
    }
    return new int[] {precision, scale};
  }
}
