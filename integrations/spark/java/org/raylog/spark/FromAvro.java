package org.raylog.spark;

import java.io.IOException;
import java.util.HashMap;
import java.util.Map;

import org.apache.avro.AvroRuntimeException;
import org.apache.avro.Schema;
import org.apache.avro.SchemaCompatibility;
import org.apache.avro.io.BinaryDecoder;
import org.apache.avro.io.Decoder;
import org.apache.avro.io.DecoderFactory;
import org.apache.avro.io.ResolvingDecoder;
import org.apache.spark.TaskContext;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.apache.spark.util.TaskCompletionListener;

/**
 * The expression of {@code raylog_spark.functions.from_avro} and
 * {@code from_confluent_avro}: binary values decoded into the Spark type of
 * an Avro schema ({@link AvroTypes#typed}), as Spark's
 * {@code AvroDataToCatalyst}; the values are those of {@link AvroNodes}.
 *
 * <ul>
 *   <li>plain Avro binary ({@link #plain}): one body per value, written under
 *       the given schema (the writer's), read as it or, with option
 *       {@code avroSchema}, as that reader schema (Avro schema resolution);
 *   <li>Confluent-framed ({@link #confluent}): magic byte 0, the writer's
 *       registry id (u32 big-endian), the body; the reader schema is a
 *       registry subject's version and each frame's schema is resolved
 *       through raylog's registry, as {@link AvroReader} reads topics.
 * </ul>
 *
 * <p>A value that does not decode (the body ends early, a union index or
 * enum ordinal out of range, bytes left after the value, a frame too short,
 * with a wrong magic byte or an unknown schema id): mode {@code PERMISSIVE}
 * gives null; {@code FAILFAST} (the default) fails the task with a
 * SchemaError (UnknownSchemaError for an unknown id) that names the value:
 * its partition and offset when the child is the struct
 * {@code (value, partition, offset)} ({@code positioned}), else its size and
 * first bytes. A null value is null. The result is always nullable.
 *
 * <p>Not thread-safe (its decoders): each task evaluates its own copy.
 */
public final class FromAvro extends JavaUnaryExpression {

  private static final long serialVersionUID = 1L;
  /** the options of the plain variant, as Spark's AvroOptions (datetimeRebaseMode: CORRECTED alone) */
  static final String[] OPTIONS = {"mode", "avroSchema", "datetimeRebaseMode"};

  private final boolean positioned;
  private final boolean permissive;
  /** plain: the writer's schema and the reader's (null: the writer's) */
  private final String writerJson;
  private final String readerJson;
  /** Confluent-framed: the read's reader schema and registered schemas; null when plain */
  private final AvroSpec spec;
  private final ReadOptions.Settings settings;
  private final DataType type;

  private transient AvroNodes node;
  private transient Schema writer;
  private transient BinaryDecoder binary;
  private transient ResolvingDecoder resolving;
  private transient AvroReader framed;
  private transient boolean framedRecord;

  private FromAvro(Expression child, boolean positioned, boolean permissive, String writerJson, String readerJson,
      AvroSpec spec, ReadOptions.Settings settings, DataType type) {
    super(child);
    this.positioned = positioned;
    this.permissive = permissive;
    this.writerJson = writerJson;
    this.readerJson = readerJson;
    this.spec = spec;
    this.settings = settings;
    this.type = type;
  }

  /**
   * {@code from_avro(data, jsonFormatSchema, options)} of plain Avro binary;
   * {@code positioned}: {@code data} is the struct (value, partition, offset).
   * ConfigError for an option not in {@link #OPTIONS} or a bad value.
   */
  public static Column plain(Column data, String jsonFormatSchema, Map<String, String> options, boolean positioned) {
    CaseInsensitiveStringMap o = new CaseInsensitiveStringMap(options == null ? new HashMap<>() : options);
    for (String key : o.keySet()) {
      if (!java.util.Arrays.asList(OPTIONS).stream().anyMatch(key::equalsIgnoreCase)) {
        throw SourceOptions.config("from_avro has no option '" + key + "'; its options are mode (FAILFAST or "
            + "PERMISSIVE), avroSchema (a reader schema) and datetimeRebaseMode (CORRECTED)");
      }
    }
    String rebase = o.get("datetimeRebaseMode");
    if (rebase != null && !rebase.trim().equalsIgnoreCase("CORRECTED")) {
      throw SourceOptions.config("from_avro reads dates and timestamps as written (datetimeRebaseMode "
          + "CORRECTED); got '" + rebase + "'");
    }
    boolean permissive = AvroSpec.permissive(o);
    Schema writer = AvroSpec.parse(-1, jsonFormatSchema);
    String readerJson = o.get("avroSchema");
    Schema reader = readerJson == null ? writer : AvroSpec.parse(-1, readerJson);
    if (readerJson != null) { // refuse schemas that do not resolve, on the driver
      SchemaCompatibility.SchemaPairCompatibility pair =
          SchemaCompatibility.checkReaderWriterCompatibility(reader, writer);
      if (pair.getType() != SchemaCompatibility.SchemaCompatibilityType.COMPATIBLE) {
        throw new RaylogReadException(RaylogReadException.SCHEMA, "values of the schema given cannot be read as "
            + "option avroSchema's: " + pair.getDescription());
      }
    }
    DataType type = AvroTypes.typed(reader).type;
    return new Column(new FromAvro(data.expr(), positioned, permissive, jsonFormatSchema, readerJson, null, null,
        type));
  }

  /**
   * The Confluent-framed variant: {@code options} are those of
   * {@link AvroSpec} naming the reader schema by {@code avro_subject} (and
   * {@code avro_subject_version}) and the cluster ({@code zookeeper},
   * {@code cluster}; default: the session's {@code spark.raylog.*}), with
   * {@code mode}.
   */
  public static Column confluent(Column data, Map<String, String> options, boolean positioned) {
    Map<String, String> all = new HashMap<>(options);
    all.put("value_format", "avro");
    CaseInsensitiveStringMap o = new CaseInsensitiveStringMap(all);
    AvroSpec spec = AvroSpec.load(o);
    SourceOptions.Connection c = SourceOptions.connection(o);
    ReadOptions.Settings settings = new ReadOptions.Settings(c.token, 0, 0, 0, 30_000, true, c.zookeeper, c.cluster);
    DataType type = AvroTypes.typed(spec.reader()).type;
    return new Column(new FromAvro(data.expr(), positioned, spec.permissive, null, null, spec, settings, type));
  }

  private static ResolvingDecoder resolver(Schema writer, Schema reader) {
    try {
      return DecoderFactory.get().resolvingDecoder(writer, reader, null);
    } catch (IOException | AvroRuntimeException e) {
      throw new RaylogReadException(RaylogReadException.SCHEMA, "values of the schema given cannot be read as "
          + "option avroSchema's: " + e.getMessage(), null, e);
    }
  }

  @Override
  public DataType dataType() {
    return type;
  }

  @Override
  public boolean nullable() {
    return true;
  }

  @Override
  public String prettyName() {
    return spec == null ? "from_avro" : "from_confluent_avro";
  }

  @Override
  Object nullSafeEval(Object input) {
    byte[] data;
    String where;
    if (positioned) {
      InternalRow row = (InternalRow) input;
      if (row.isNullAt(0)) {
        return null;
      }
      data = row.getBinary(0);
      where = "at partition " + (row.isNullAt(1) ? "?" : row.getInt(1)) + " offset "
          + (row.isNullAt(2) ? "?" : row.getLong(2));
    } else {
      data = (byte[]) input;
      where = null;
    }
    try {
      return spec == null ? decodePlain(data) : decodeFramed(data);
    } catch (RaylogReadException e) {
      if (e.code() != RaylogReadException.SCHEMA && e.code() != RaylogReadException.UNKNOWN_SCHEMA) {
        throw e; // ZooKeeper unavailable, ...: not the value's fault
      }
      String message = e.getMessage();
      return malformed(data, where, message.substring(message.indexOf(": ") + 2), e.code(), e);
    } catch (IOException | AvroRuntimeException | ArithmeticException | IndexOutOfBoundsException
        | NegativeArraySizeException | ClassCastException e) {
      String why = e instanceof java.io.EOFException ? "the bytes end before the value does" : e.toString();
      return malformed(data, where, why, RaylogReadException.SCHEMA, e);
    }
  }

  private Object malformed(byte[] data, String where, String why, int code, Throwable cause) {
    if (permissive) {
      return null;
    }
    String value = where != null ? "the value " + where : "a value of " + data.length + " bytes (" + head(data)
        + ")";
    String message = "Malformed Avro record in " + prettyName() + " (mode FAILFAST): " + value
        + " does not decode: " + why + "; options={'mode': 'PERMISSIVE'} gives null for it";
    throw new RaylogReadException(code, message, null, cause);
  }

  private static String head(byte[] data) {
    StringBuilder out = new StringBuilder("0x");
    for (int i = 0; i < Math.min(16, data.length); i++) {
      out.append(String.format("%02x", data[i] & 0xFF));
    }
    return out.append(data.length > 16 ? "..." : "").toString();
  }

  private Object decodePlain(byte[] data) throws IOException {
    if (node == null) {
      writer = AvroSpec.parse(-1, writerJson);
      Schema reader = readerJson == null ? writer : AvroSpec.parse(-1, readerJson);
      node = AvroNodes.of(reader, false);
    }
    binary = DecoderFactory.get().binaryDecoder(data, binary);
    Decoder in = binary;
    if (readerJson != null) {
      if (resolving == null) {
        resolving = resolver(writer, AvroSpec.parse(-1, readerJson));
      }
      resolving.configure(binary);
      in = resolving;
    }
    Object value = node.read(in);
    if (in instanceof ResolvingDecoder) {
      ((ResolvingDecoder) in).drain();
    }
    if (!binary.isEnd()) {
      throw new RaylogReadException(RaylogReadException.SCHEMA, "bytes left after the value; it is corrupt or "
          + "was written under another schema");
    }
    return value;
  }

  private Object decodeFramed(byte[] data) {
    if (framed == null) {
      framed = new AvroReader(spec, null, settings);
      framedRecord = spec.reader().getType() == Schema.Type.RECORD;
      TaskContext task = TaskContext.get();
      if (task != null) {
        AvroReader reader = framed;
        task.addTaskCompletionListener((TaskCompletionListener) t -> reader.close());
      }
    }
    Object[] fields = framed.fields(data, 0, data.length);
    return framedRecord ? new GenericInternalRow(fields) : fields[0];
  }

  @Override
  Expression withNewChild(Expression newChild) {
    return new FromAvro(newChild, positioned, permissive, writerJson, readerJson, spec, settings, type);
  }
}
