package org.raylog.spark;

import java.util.Map;

import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SQLContext;
import org.apache.spark.sql.SaveMode;
import org.apache.spark.sql.sources.BaseRelation;
import org.apache.spark.sql.sources.CreatableRelationProvider;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * The raylog batch source for Spark (DataSource V2), short name {@code "raylog"}.
 *
 * <p>It reads a fixed plan of byte ranges of partition logs, made by raylog's
 * Python driver ({@code raylog.read.plan_read}), straight from the partition
 * actors' data sockets inside the executors' JVMs:
 *
 * <pre>
 *   spark.read.format("raylog")
 *       .option("ranges", "[{\"topic\": \"clicks\", \"partition\": 0, \"start\": 0,
 *                            \"end\": 4096, \"host\": \"10.0.0.5\", \"port\": 40123,
 *                            \"location\": \"10.0.0.5\"}]")
 *       .load()
 * </pre>
 *
 * <p>The options are described in {@link ReadOptions}. Each range becomes one
 * Spark partition ({@link RangePartition}) that prefers the host of its
 * partition's node; {@link RangeReader} fetches it, checks every message and
 * builds the rows. The schema is exactly that of Spark's Kafka source
 * ({@link RaylogTable#SCHEMA}; {@code headers} with {@code includeHeaders=true},
 * then raylog's {@code next_offset} with {@code includeNextOffset=true}), or
 * with {@code value_format=avro} the typed columns of a registered Avro schema
 * in place of {@code value} ({@link AvroSpec}).
 *
 * <p>Spark asks one instance for the schema and the table of one read;
 * not shared between reads. Thread-safe.
 *
 * <p>Python users call {@code raylog_spark.read_topic}, which plans the read
 * and sets the options; this class is the entry point Spark finds through
 * {@code META-INF/services/org.apache.spark.sql.sources.DataSourceRegister}.
 */
public final class RaylogSource implements TableProvider, DataSourceRegister, CreatableRelationProvider {

  /** The name of the format: {@code spark.read.format("raylog")}. */
  public static final String SHORT_NAME = "raylog";

  @Override
  public String shortName() {
    return SHORT_NAME;
  }

  /**
   * The ids of the ZooKeeper sessions this JVM keeps open for reads by name
   * (one per ZooKeeper, shared by every read; see {@code ZkSessions}): for
   * tests and monitoring.
   */
  public static long[] zooKeeperSessionIds() {
    return ZkSessions.sessionIds();
  }

  /**
   * Close the ZooKeeper sessions of reads by name that no read holds now
   * (called when the Spark session stops, so that none outlives the
   * ZooKeeper it talks to; a later read opens a new one).
   */
  public static void closeIdleZooKeeperSessions() {
    ZkSessions.closeUnheld();
  }

  /** the typed Avro read of the options (null: binary), once {@link #loaded} */
  private AvroSpec avro;
  private boolean loaded;

  /** Spark asks one instance for the schema and then for the table of the same options. */
  private synchronized AvroSpec avro(CaseInsensitiveStringMap options) {
    if (!loaded) {
      avro = AvroSpec.load(options);
      loaded = true;
    }
    return avro;
  }

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    AvroSpec spec = avro(options);
    return RaylogTable.schema(spec == null ? RaylogTable.SCHEMA : spec.tableSchema(), options);
  }

  @Override
  public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
    AvroSpec spec = avro(new CaseInsensitiveStringMap(properties));
    return new RaylogTable(
        RaylogTable.schema(spec == null ? RaylogTable.SCHEMA : spec.tableSchema(), properties), spec);
  }

  /**
   * A batch write ({@code df.write.format("raylog").save()}): Spark writes
   * through here because the table offers no batch write of its own, so
   * that the default save mode works as with Spark's Kafka sink ({@link BatchSink}).
   */
  @Override
  public BaseRelation createRelation(SQLContext sqlContext, SaveMode mode,
      scala.collection.immutable.Map<String, String> parameters, Dataset<Row> data) {
    return BatchSink.write(sqlContext, mode, parameters, data);
  }
}
