package org.raylog.spark;

import java.util.ArrayList;
import java.util.List;

import org.apache.avro.Schema;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
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
 * one-field struct {@code value}. Stateless.
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
