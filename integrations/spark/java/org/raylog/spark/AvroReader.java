package org.raylog.spark;

import java.io.Closeable;
import java.io.IOException;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Map;

import org.apache.avro.AvroRuntimeException;
import org.apache.avro.Schema;
import org.apache.avro.io.BinaryDecoder;
import org.apache.avro.io.Decoder;
import org.apache.avro.io.DecoderFactory;
import org.apache.avro.io.ResolvingDecoder;

/**
 * Decodes framed Avro values ({@link AvroSpec}) into the Spark values of the
 * reader schema's fields, in an executor. A value written under the reader
 * schema is read with a plain binary decoder; one written under another
 * schema through a {@link ResolvingDecoder} built once per writer schema.
 * Writer schemas not shipped with the read are fetched from ZooKeeper.
 *
 * <p>Errors are those of Python's {@code raylog.avro.AvroDeserializer}:
 * SchemaError for a frame too short, a wrong magic byte, a body that does not
 * decode or bytes left after the record; UnknownSchemaError for an id not
 * registered.
 *
 * <p>Not thread-safe: one per reader.
 */
final class AvroReader implements Closeable {

  /** magic byte and schema id */
  static final int HEADER = 5;

  private final AvroSpec spec;
  private final ReadOptions.Settings settings;
  private final Schema reader;
  private final boolean record;
  /** the top-level record (fields pruned to those wanted), or the node of a non-record value */
  private final AvroNodes.Record fields;
  private final AvroNodes single;
  private final Map<Integer, ResolvingDecoder> resolvers = new HashMap<>();
  private BinaryDecoder binary;
  private Zk zk;

  /** {@code wanted}: per field of the value struct, whether to build it (null: all). */
  AvroReader(AvroSpec spec, boolean[] wanted, ReadOptions.Settings settings) {
    this.spec = spec;
    this.settings = settings;
    this.reader = spec.reader();
    this.record = reader.getType() == Schema.Type.RECORD;
    this.fields = record ? new AvroNodes.Record(reader, wanted) : null;
    this.single = record ? null : AvroNodes.of(reader, false);
  }

  /** The values of the value struct's fields in {@code data[off, off + len)} (null where not wanted). */
  Object[] fields(byte[] data, int off, int len) {
    if (len < HEADER) {
      throw new RaylogReadException(RaylogReadException.SCHEMA, "Avro frame too short: " + len
          + " bytes, the header alone is " + HEADER + "; the value was not written by an AvroSerializer");
    }
    if (data[off] != 0) {
      throw new RaylogReadException(RaylogReadException.SCHEMA, "Avro frame starts with magic byte "
          + (data[off] & 0xFF) + ", expected 0; the value was not written by an AvroSerializer");
    }
    int id = FetchClient.readInt(data, off + 1);
    binary = DecoderFactory.get().binaryDecoder(data, off + HEADER, len - HEADER, binary);
    Decoder in = id == spec.readerId ? binary : resolver(id);
    Object[] out;
    try {
      out = record ? fields.fields(in) : new Object[] {single.read(in)};
      if (in instanceof ResolvingDecoder) {
        ((ResolvingDecoder) in).drain();
      }
      if (!binary.isEnd()) {
        throw new RaylogReadException(RaylogReadException.SCHEMA, "bytes left after decoding a record of schema "
            + (id & 0xFFFFFFFFL) + "; the value is corrupt or was framed with the wrong id");
      }
    } catch (IOException | AvroRuntimeException | ArithmeticException | IndexOutOfBoundsException
        | NegativeArraySizeException e) {
      throw new RaylogReadException(RaylogReadException.SCHEMA, "Avro body does not decode under schema "
          + (id & 0xFFFFFFFFL) + ": " + e + "; the value is corrupt or was framed with the wrong id", null, e);
    }
    return out;
  }

  private ResolvingDecoder resolver(int id) {
    ResolvingDecoder found = resolvers.get(id);
    if (found == null) {
      Schema writer = AvroSpec.parse(id, writerJson(id));
      try {
        found = DecoderFactory.get().resolvingDecoder(writer, reader, binary);
      } catch (IOException | AvroRuntimeException e) {
        throw new RaylogReadException(RaylogReadException.SCHEMA, "values of schema " + (id & 0xFFFFFFFFL)
            + " cannot be read as schema " + spec.readerId + ": " + e.getMessage(), null, e);
      }
      resolvers.put(id, found);
    }
    try {
      found.configure(binary);
    } catch (IOException e) {
      throw new RaylogReadException(RaylogReadException.SCHEMA, "cannot decode schema " + id + ": " + e, null, e);
    }
    return found;
  }

  private String writerJson(int id) {
    String json = id < 0 ? null : spec.schemas.get(id);
    if (json == null && id >= 0 && settings.zookeeper != null) {
      if (zk == null) {
        zk = new Zk(settings.zookeeper, settings.cluster, settings.timeoutMs);
      }
      json = zk.schema(id);
    }
    if (json == null) {
      throw AvroSpec.unknown(id, settings.cluster);
    }
    return json;
  }

  /** Per field of {@code spec}'s value struct, whether one of {@code columns} needs it; null when none does. */
  static boolean[] wanted(AvroSpec spec, int[] columns) {
    boolean[] wanted = new boolean[spec.valueType().fields().length];
    boolean any = false;
    for (int c : columns) {
      if (c == AvroSpec.VALUE_STRUCT) {
        Arrays.fill(wanted, true);
        any = true;
      } else if (c >= AvroSpec.VALUE_FIELD) {
        wanted[c - AvroSpec.VALUE_FIELD] = true;
        any = true;
      }
    }
    return any ? wanted : null;
  }

  @Override
  public void close() {
    if (zk != null) {
      zk.close();
      zk = null;
    }
  }
}
