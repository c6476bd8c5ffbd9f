package org.raylog.spark;

import java.io.ByteArrayOutputStream;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;
import java.util.zip.CRC32C;

import com.fasterxml.jackson.databind.JsonNode;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.write.DataWriter;
import org.apache.spark.sql.connector.write.WriterCommitMessage;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Writes the rows of one Spark task into raylog topics: each row becomes one
 * message (docs/design.md section 2: size, CRC32C, magic 1, attributes 0, the time of
 * the write, key, value), gathered per partition into message sets of up to
 * {@code batch_bytes} (at most the topic's max_message_bytes) and sent with
 * PRODUCE (version 0, acks=1) to the partition's data socket; each set is
 * acknowledged before the next is sent to that partition, and
 * {@link #commit()} returns once every set is acknowledged.
 *
 * <p>Partitions: the row's {@code partition} column when the query has one,
 * else {@code crc32c(key) mod partitions} for a keyed row (the producer's
 * stable hash, raylog.producer.partitioner) and, for keyless rows, one
 * partition per task (the task's partition id mod partitions).
 *
 * <p>A partition whose actor moved is looked up again in ZooKeeper and the
 * set sent again (for up to timeout_ms): a set whose first send was stored
 * but not acknowledged is then stored twice. Delivery is at least once
 * (a failed Spark task is retried and writes its rows again).
 *
 * <p>Not thread-safe: Spark drives each writer from one task thread.
 */
final class TopicWriter implements DataWriter<InternalRow> {

  private static final Logger LOG = LoggerFactory.getLogger(TopicWriter.class);

  /** What the task wrote, for the driver's log. Immutable. */
  static final class Written implements WriterCommitMessage {
    private static final long serialVersionUID = 1L;
    final long messages;
    /** rows refused (null value or no topic), counted by a batch write's tasks */
    final long refused;
    final String firstRefusal;

    Written(long messages, long refused, String firstRefusal) {
      this.messages = messages;
      this.refused = refused;
      this.firstRefusal = firstRefusal;
    }
  }

  private static final class Topic {
    final String name;
    final byte[] nameBytes;
    final int partitions;
    final int maxSetBytes;
    final ByteArrayOutputStream[] pending;
    /** messages in each pending set */
    final long[] counts;

    Topic(String name, int partitions, int maxSetBytes) {
      this.name = name;
      this.nameBytes = name.getBytes(StandardCharsets.UTF_8);
      this.partitions = partitions;
      this.maxSetBytes = maxSetBytes;
      this.pending = new ByteArrayOutputStream[partitions];
      this.counts = new long[partitions];
    }
  }

  private final RaylogWrite.Plan plan;
  private final int taskPartition;
  private final Map<String, Topic> topics = new HashMap<>();
  private final Map<String, FetchClient> clients = new HashMap<>();
  private final CRC32C crc = new CRC32C();
  private final byte[] head = new byte[22];
  private Zk zk;
  private long written;
  /** messages acknowledged by the partitions */
  private long sent;
  /** rows refused (null value, or no topic) */
  private long refused;
  private String firstRefusal;
  /** count refused rows and go on (a batch write), or fail the task at the first one (a stream) */
  private final boolean countRefused;

  TopicWriter(RaylogWrite.Plan plan, int taskPartition) {
    this(plan, taskPartition, false);
  }

  TopicWriter(RaylogWrite.Plan plan, int taskPartition, boolean countRefused) {
    this.plan = plan;
    this.taskPartition = taskPartition;
    this.countRefused = countRefused;
  }

  /** Rows refused so far (null value or no topic). */
  long refused() {
    return refused;
  }

  /** Why the first refused row was refused, or null. */
  String firstRefusal() {
    return firstRefusal;
  }

  private Zk zk() {
    if (zk == null) {
      zk = new Zk(plan.zookeeper, plan.cluster, plan.timeoutMs);
    }
    return zk;
  }

  private Topic topic(String name) {
    Topic t = topics.get(name);
    if (t == null) {
      JsonNode config = zk().config(name); // UnknownTopicError
      int maxMessageBytes = config.path("max_message_bytes").asInt(ReadOptions.MiB);
      t = new Topic(name, config.path("partitions").asInt(), Math.min(plan.batchBytes, maxMessageBytes));
      topics.put(name, t);
    }
    return t;
  }

  @Override
  public void write(InternalRow row) {
    // the option 'topic' overrides a 'topic' column, as in Spark's Kafka sink
    String name = plan.topic != null ? plan.topic
        : !row.isNullAt(plan.topicColumn) ? row.getUTF8String(plan.topicColumn).toString() : null;
    if (name == null || row.isNullAt(plan.valueColumn)) {
      if (refused++ == 0) {
        firstRefusal = name == null ? "a null topic (give the option 'topic', or fill the column)"
            : "a null value (a raylog message's value is the rest of the message: a null could not be told from "
                + "an empty value; filter the rows or fill them, e.g. coalesce(value, '') )";
      }
      if (!countRefused) {
        throw SourceOptions.config("a row has " + firstRefusal + "; this task had written " + sent
            + " messages before it");
      }
      return; // counted: the driver fails the write naming how many rows were refused
    }
    byte[] value = plan.valueIsString ? row.getUTF8String(plan.valueColumn).getBytes() : row.getBinary(plan.valueColumn);
    byte[] key = null;
    if (plan.keyColumn >= 0 && !row.isNullAt(plan.keyColumn)) {
      key = plan.keyIsString ? row.getUTF8String(plan.keyColumn).getBytes() : row.getBinary(plan.keyColumn);
    }
    Topic t = topic(name);
    int partition;
    if (plan.partitionColumn >= 0 && !row.isNullAt(plan.partitionColumn)) {
      partition = row.getInt(plan.partitionColumn);
      if (partition < 0 || partition >= t.partitions) {
        throw new RaylogReadException(RaylogReadException.UNKNOWN_PARTITION,
            "partition " + partition + " is not one of " + name + "'s 0.." + (t.partitions - 1));
      }
    } else if (key != null) {
      crc.reset();
      crc.update(key, 0, key.length);
      partition = (int) (crc.getValue() % t.partitions);
    } else {
      partition = Math.floorMod(taskPartition, t.partitions);
    }
    int size = 22 - 4 + (key == null ? 0 : key.length) + value.length;
    ByteArrayOutputStream set = t.pending[partition];
    if (set != null && set.size() + 4 + size > t.maxSetBytes) {
      send(t, partition);
      set = null;
    }
    if (set == null) {
      set = t.pending[partition] = new ByteArrayOutputStream(Math.min(t.maxSetBytes, 64 * 1024));
      t.counts[partition] = 0;
    }
    encode(set, key, value, size);
    t.counts[partition]++;
    written++;
  }

  /** One message (docs/design.md section 2) at the end of {@code set}. */
  private void encode(ByteArrayOutputStream set, byte[] key, byte[] value, int size) {
    byte[] h = head;
    FetchClient.putInt(h, 0, size);
    h[8] = 1; // magic
    h[9] = 0; // attributes: no codec
    long now = System.currentTimeMillis();
    FetchClient.putInt(h, 10, (int) (now >>> 32));
    FetchClient.putInt(h, 14, (int) now);
    FetchClient.putInt(h, 18, key == null ? -1 : key.length);
    crc.reset();
    crc.update(h, 8, 14);
    if (key != null) {
      crc.update(key, 0, key.length);
    }
    crc.update(value, 0, value.length);
    FetchClient.putInt(h, 4, (int) crc.getValue());
    set.write(h, 0, 22);
    if (key != null) {
      set.write(key, 0, key.length);
    }
    set.write(value, 0, value.length);
  }

  /** Send the pending set of a partition and wait for its acknowledgement. */
  private void send(Topic t, int partition) {
    ByteArrayOutputStream set = t.pending[partition];
    t.pending[partition] = null;
    if (set == null || set.size() == 0) {
      return;
    }
    byte[] data = set.toByteArray();
    long deadline = 0;
    int attempt = 0;
    for (;;) {
      Zk.Endpoint e = zk().endpoint(t.name, partition);
      RaylogReadException failure;
      if (e == null) {
        failure = new RaylogReadException(RaylogReadException.BROKER_UNAVAILABLE,
            "no partition actor serves " + t.name + "-" + partition + " (no endpoint in ZooKeeper)");
      } else {
        String where = e.host + ":" + e.port;
        FetchClient c = clients.get(where);
        if (c == null) {
          c = new FetchClient(e.host, e.port, plan.token, plan.timeoutMs, t.maxSetBytes);
          clients.put(where, c);
        }
        try {
          c.produce(t.nameBytes, partition, data);
          sent += t.counts[partition];
          return;
        } catch (RaylogReadException x) {
          if (!RangeReader.moved(x)) {
            throw x;
          }
          c.close();
          clients.remove(where);
          failure = x;
        }
      }
      long now = System.currentTimeMillis();
      if (deadline == 0) {
        deadline = now + plan.timeoutMs;
      } else if (now >= deadline) {
        throw failure;
      }
      LOG.info("writing {}-{}: {}; looking up its endpoint again", t.name, partition, failure.getMessage());
      Cluster.sleep(Math.min(1000L, 50L << Math.min(attempt++, 5)));
    }
  }

  @Override
  public WriterCommitMessage commit() {
    for (Topic t : topics.values()) {
      for (int p = 0; p < t.partitions; p++) {
        send(t, p);
      }
    }
    return new Written(written, refused, firstRefusal);
  }

  @Override
  public void abort() {
    for (Topic t : topics.values()) {
      java.util.Arrays.fill(t.pending, null);
    }
  }

  @Override
  public void close() {
    for (FetchClient c : clients.values()) {
      c.close();
    }
    clients.clear();
    if (zk != null) {
      zk.close();
      zk = null;
    }
  }
}
