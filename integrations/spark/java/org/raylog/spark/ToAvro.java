package org.raylog.spark;

import java.io.ByteArrayOutputStream;
import java.io.IOException;

import org.apache.avro.Schema;
import org.apache.avro.io.BinaryEncoder;
import org.apache.avro.io.EncoderFactory;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.catalyst.analysis.TypeCheckResult;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;

/**
 * The expression of {@code raylog_spark.functions.to_avro} and
 * {@code to_confluent_avro}: a column's values encoded as Avro binary, as
 * Spark's {@code CatalystDataToAvro}, by {@link AvroEncoders}. The schema is
 * the one given or, without one, derived from the column's type
 * ({@link AvroTypes#avroOf}, as Spark derives it). With a registry id each
 * value is Confluent-framed: magic byte 0, the id (u32 big-endian), the body.
 *
 * <p>A column type the schema cannot hold is refused when the query is
 * analysed; a value that does not fit it fails the task with a SchemaError
 * naming the field ({@link AvroEncoders}). A null value is null.
 *
 * <p>Not thread-safe (its buffer): each task evaluates its own copy.
 */
public final class ToAvro extends JavaUnaryExpression {

  private static final long serialVersionUID = 1L;

  /** the schema to write, or null: derived from the child's type */
  private final String schemaJson;
  /** the registry id of the frames, or -1: plain Avro binary */
  private final int schemaId;

  private transient AvroEncoders encoder;
  private transient ByteArrayOutputStream buffer;
  private transient BinaryEncoder out;

  private ToAvro(Expression child, String schemaJson, int schemaId) {
    super(child);
    this.schemaJson = schemaJson;
    this.schemaId = schemaId;
  }

  /** {@code to_avro(data, jsonFormatSchema)}; {@code schemaId} >= 0: frames of that registry id. */
  public static Column column(Column data, String jsonFormatSchema, int schemaId) {
    if (jsonFormatSchema != null) {
      AvroSpec.parse(schemaId, jsonFormatSchema); // SchemaError now for a schema that does not parse
    }
    return new Column(new ToAvro(data.expr(), jsonFormatSchema, schemaId));
  }

  /** The schema written: the one given, or the one derived from the child's type. */
  Schema schema() {
    if (schemaJson != null) {
      return AvroSpec.parse(schemaId, schemaJson);
    }
    return AvroTypes.avroOf(child().dataType(), child().nullable(), "topLevelRecord", "");
  }

  private AvroEncoders encoder() {
    if (encoder == null) {
      encoder = AvroEncoders.of(child().dataType(), child().nullable(), schema());
    }
    return encoder;
  }

  @Override
  public TypeCheckResult checkInputDataTypes() {
    try {
      encoder();
      return TypeCheckResult.TypeCheckSuccess$.MODULE$;
    } catch (RaylogReadException e) {
      return new TypeCheckResult.TypeCheckFailure(e.getMessage());
    }
  }

  @Override
  public DataType dataType() {
    return DataTypes.BinaryType;
  }

  @Override
  public boolean nullable() {
    return child().nullable();
  }

  @Override
  public String prettyName() {
    return schemaId < 0 ? "to_avro" : "to_confluent_avro";
  }

  @Override
  Object nullSafeEval(Object input) {
    AvroEncoders write = encoder();
    if (buffer == null) {
      buffer = new ByteArrayOutputStream();
    }
    buffer.reset();
    out = EncoderFactory.get().directBinaryEncoder(buffer, out);
    try {
      if (schemaId >= 0) {
        buffer.write(0);
        buffer.write(schemaId >>> 24);
        buffer.write(schemaId >>> 16);
        buffer.write(schemaId >>> 8);
        buffer.write(schemaId);
      }
      write.write(input, out);
      out.flush();
    } catch (IOException e) {
      throw new RaylogReadException(RaylogReadException.SCHEMA, "to_avro could not encode a value: " + e, null, e);
    }
    return buffer.toByteArray();
  }

  @Override
  Expression withNewChild(Expression newChild) {
    return new ToAvro(newChild, schemaJson, schemaId);
  }
}
