package org.raylog.spark;

import java.io.Serializable;
import java.util.Collections;
import java.util.Map;
import java.util.TreeMap;

import org.apache.avro.Schema;
import org.apache.avro.SchemaParseException;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * A typed Avro read: values in Confluent framing (magic byte 0, the schema id
 * as a big-endian u32, the Avro binary body; see raylog/avro.py) decoded in
 * the executors into typed columns of one reader schema (options below).
 * Values written under another registered schema are resolved to it (Avro
 * schema evolution). Immutable; shipped to the executors with every
 * registered schema known when the read was planned (the readers fetch any
 * later one from ZooKeeper).
 *
 * <table>
 *   <caption>options</caption>
 *   <tr><th>option</th><th>meaning</th><th>default</th></tr>
 *   <tr><td>value_format (or valueFormat)</td><td>{@code binary} or {@code avro}</td><td>binary</td></tr>
 *   <tr><td>avro_schema_id (or avroSchemaId)</td><td>the registry id of the reader schema</td><td>this
 *       or avro_subject with avro</td></tr>
 *   <tr><td>avro_subject, avro_subject_version (or avroSubject, avroSubjectVersion)</td><td>the reader
 *       schema as a version ({@code latest} or a number from 1) of a subject of the registry</td>
 *       <td>version latest</td></tr>
 *   <tr><td>flatten</td><td>the value's fields as top-level columns (true) or one struct column
 *       {@code value} (false)</td><td>true</td></tr>
 *   <tr><td>mode</td><td>a value that does not decode (not Avro-framed, an unknown schema id, a
 *       body that does not fit its schema), as Spark's {@code from_avro}: {@code FAILFAST} fails
 *       the read naming the message; {@code PERMISSIVE} gives the row with null value columns
 *       (every value column is then nullable)</td><td>FAILFAST</td></tr>
 * </table>
 *
 * <p>The table's columns are the value's (flattened or as {@code value}) then
 * those of {@link RaylogTable#SCHEMA} but {@code value}.
 */
final class AvroSpec implements Serializable {

  private static final long serialVersionUID = 1L;

  /** Column code of the whole value struct (flatten=false) and the base of a value field's ({@code + field}). */
  static final int VALUE_STRUCT = 99, VALUE_FIELD = 100;

  final int readerId;
  final boolean flatten;
  /** mode PERMISSIVE: a value that does not decode gives null value columns */
  final boolean permissive;
  /** registered schemas (canonical JSON) by id, the reader's among them */
  final Map<Integer, String> schemas;
  private transient StructType valueType;

  private AvroSpec(int readerId, boolean flatten, boolean permissive, Map<Integer, String> schemas) {
    this.readerId = readerId;
    this.flatten = flatten;
    this.permissive = permissive;
    this.schemas = Collections.unmodifiableMap(schemas);
  }

  /** Whether the options ask for a typed Avro read; ConfigError for an unknown value format. */
  static boolean requested(CaseInsensitiveStringMap o) {
    String format = o.getOrDefault("value_format", o.get("valueFormat"));
    if (format == null || format.equalsIgnoreCase("binary")) {
      return false;
    }
    if (format.equalsIgnoreCase("avro")) {
      return true;
    }
    throw SourceOptions.config("option 'value_format' must be 'binary' or 'avro', got '" + format + "' "
        + "(JSON values: read binary and parse with from_json, or use raylog_spark.read_topic(value_format='json'))");
  }

  /** The spec of the options (with the registry's schemas read from ZooKeeper), or null for a binary read. */
  static AvroSpec load(CaseInsensitiveStringMap o) {
    if (!requested(o)) {
      return null;
    }
    String id = o.getOrDefault("avro_schema_id", o.get("avroSchemaId"));
    String subject = o.getOrDefault("avro_subject", o.get("avroSubject"));
    String version = o.getOrDefault("avro_subject_version", o.get("avroSubjectVersion"));
    if (id != null && subject != null) {
      throw SourceOptions.config("give 'avro_schema_id' or 'avro_subject', not both: each names the reader schema");
    }
    if (version != null && subject == null) {
      throw SourceOptions.config("option 'avro_subject_version' needs 'avro_subject'");
    }
    if (id == null && subject == null) {
      throw SourceOptions.config("a typed Avro read needs the option 'avro_schema_id' (the registry id of the "
          + "reader schema) or 'avro_subject' (its subject, with 'avro_subject_version', default latest); "
          + "raylog_spark.read_topic(value_format='avro') takes the first message's");
    }
    SourceOptions.Connection c = SourceOptions.connection(o);
    int readerId;
    if (subject != null) {
      try (Zk zk = new Zk(c.zookeeper, c.cluster, 30_000)) {
        readerId = zk.subjectVersion(subject, version == null ? "latest" : version);
      }
    } else {
      try {
        readerId = Integer.parseInt(id.trim());
      } catch (NumberFormatException e) {
        throw SourceOptions.config("option 'avro_schema_id' must be an integer, got " + id);
      }
    }
    Map<Integer, String> schemas = new TreeMap<>();
    try (Zk zk = new Zk(c.zookeeper, c.cluster, 30_000)) {
      for (int known : zk.schemaIds()) {
        String json = zk.schema(known);
        if (json != null) {
          schemas.put(known, json);
        }
      }
      if (!schemas.containsKey(readerId)) {
        throw unknown(readerId, c.cluster);
      }
    }
    AvroSpec spec = new AvroSpec(readerId, o.getBoolean("flatten", true), permissive(o), schemas);
    spec.tableSchema(); // refuse what has no Spark type, or clashes, when the read is defined
    return spec;
  }

  /** Option {@code mode}: FAILFAST (default) or PERMISSIVE; ConfigError for another (DROPMALFORMED: Spark's from_avro refuses it too). */
  static boolean permissive(CaseInsensitiveStringMap o) {
    String mode = o.getOrDefault("mode", "FAILFAST").trim();
    if (mode.equalsIgnoreCase("FAILFAST")) {
      return false;
    }
    if (mode.equalsIgnoreCase("PERMISSIVE")) {
      return true;
    }
    throw SourceOptions.config("option 'mode' must be FAILFAST or PERMISSIVE (as Spark's from_avro), got '" + mode
        + "'");
  }

  static RaylogReadException unknown(int id, String cluster) {
    return new RaylogReadException(RaylogReadException.UNKNOWN_SCHEMA,
        "no schema is registered under id " + id + " in cluster '" + cluster + "'; register it first (or "
            + "check that producer and consumer use the same cluster)");
  }

  static Schema parse(int id, String json) {
    try {
      return new Schema.Parser().setValidateDefaults(false).parse(json);
    } catch (SchemaParseException e) {
      throw new RaylogReadException(RaylogReadException.SCHEMA,
          "schema " + id + " is not a valid Avro schema: " + e.getMessage());
    }
  }

  Schema reader() {
    return parse(readerId, schemas.get(readerId));
  }

  /** The struct of the reader schema's records. */
  StructType valueType() {
    if (valueType == null) {
      valueType = AvroTypes.structOf(reader());
      if (permissive) { // a value that does not decode gives nulls
        StructType nullable = new StructType();
        for (StructField f : valueType.fields()) {
          nullable = nullable.add(f.name(), f.dataType(), true, f.metadata());
        }
        valueType = nullable;
      }
    }
    return valueType;
  }

  /** The table's columns: the value's, then the message's. */
  StructType tableSchema() {
    StructType out = new StructType();
    if (flatten) {
      for (StructField f : valueType().fields()) {
        if (isMeta(f.name())) {
          throw SourceOptions.config("value field '" + f.name() + "' has the name of a column of the read; "
              + "pass flatten=false (the value as one struct column) and select what you need");
        }
        out = out.add(f);
      }
    } else {
      out = out.add("value", valueType(), true);
    }
    for (StructField f : RaylogTable.SCHEMA.fields()) {
      if (!f.name().equals("value")) {
        out = out.add(f);
      }
    }
    return out;
  }

  private static boolean isMeta(String name) {
    for (String n : RaylogTable.COLUMNS.fieldNames()) {
      if (n.equals(name)) {
        return true;
      }
    }
    return false;
  }

  /** The column code of {@code name}: a message column's ordinal, {@link #VALUE_STRUCT} or a value field's. */
  int column(String name) {
    if (isMeta(name) && !(name.equals("value"))) {
      return RaylogTable.COLUMNS.fieldIndex(name);
    }
    if (!flatten) {
      return VALUE_STRUCT;
    }
    return VALUE_FIELD + valueType().fieldIndex(name);
  }
}
