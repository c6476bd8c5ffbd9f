package org.raylog.spark;

import java.util.Collections;
import java.util.Iterator;
import java.util.List;

import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SQLContext;
import org.apache.spark.sql.SaveMode;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.sources.BaseRelation;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A batch write, {@code df.write.format("raylog").option("topic", t).save()},
 * as Spark's Kafka sink does it: the save modes {@code ErrorIfExists} (the
 * default, accepted for a topic that exists) and {@code Append} write; {@code
 * Overwrite} and {@code Ignore} are refused. The options and columns are
 * those of {@link RaylogWrite.Plan}, checked on the driver before any task.
 *
 * <p>Each Spark task writes its rows with a {@link TopicWriter}. A row that
 * cannot be a message (no topic) fails no task: the tasks
 * count such rows and write the others, and the driver then fails the write
 * with a ConfigError saying how many rows were refused and how many
 * messages were written. Stateless.
 */
final class BatchSink {

  private static final Logger LOG = LoggerFactory.getLogger(BatchSink.class);

  private BatchSink() {}

  static BaseRelation write(SQLContext sql, SaveMode mode, scala.collection.immutable.Map<String, String> parameters,
      Dataset<Row> data) {
    if (mode == SaveMode.Overwrite || mode == SaveMode.Ignore) {
      throw SourceOptions.config("save mode " + mode + " is not allowed for the raylog sink (as for Spark's Kafka "
          + "sink); use " + SaveMode.Append + " or " + SaveMode.ErrorIfExists + " (the default)");
    }
    CaseInsensitiveStringMap options =
        new CaseInsensitiveStringMap(scala.collection.JavaConverters.mapAsJavaMap(parameters));
    RaylogWrite.Plan plan = new RaylogWrite.Plan(options, data.schema());
    JavaRDD<InternalRow> rows = data.queryExecution().toRdd().toJavaRDD();
    List<TopicWriter.Written> results = rows.mapPartitionsWithIndex((index, it) -> write(plan, index, it), false)
        .collect();
    long messages = 0;
    long refused = 0;
    String why = null;
    for (TopicWriter.Written w : results) {
      messages += w.messages;
      refused += w.refused;
      if (why == null) {
        why = w.firstRefusal;
      }
    }
    String into = plan.topic == null ? "the rows' topics" : plan.topic;
    if (refused > 0) {
      throw SourceOptions.config(refused + " rows were not written, the first for " + why + "; the other "
          + messages + " rows were written into " + into);
    }
    LOG.info("raylog sink: wrote {} messages into {}", messages, into);
    return new Written(sql);
  }

  private static Iterator<TopicWriter.Written> write(RaylogWrite.Plan plan, int index, Iterator<InternalRow> rows) {
    TopicWriter writer = new TopicWriter(plan, index, -1L, true);
    try {
      while (rows.hasNext()) {
        writer.write(rows.next());
      }
      return Collections.singletonList((TopicWriter.Written) writer.commit()).iterator();
    } catch (RuntimeException e) {
      writer.abort();
      throw e;
    } finally {
      writer.close();
    }
  }

  /** What a save returns to Spark: the relation of the source's columns (never read). */
  private static final class Written extends BaseRelation {
    private final SQLContext sql;

    Written(SQLContext sql) {
      this.sql = sql;
    }

    @Override
    public SQLContext sqlContext() {
      return sql;
    }

    @Override
    public StructType schema() {
      return RaylogTable.SCHEMA;
    }
  }
}
