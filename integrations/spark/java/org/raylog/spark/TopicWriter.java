package org.raylog.spark;

import java.io.ByteArrayOutputStream;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;
import java.util.zip.CRC32C;

import com.fasterxml.jackson.databind.JsonNode;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.util.ArrayData;
import org.apache.spark.sql.connector.write.DataWriter;
import org.apache.spark.sql.connector.write.WriterCommitMessage;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Writes the rows of one Spark task into raylog topics: each row becomes one
 * record (key, value or null: a tombstone, headers, the time of the write),
 * gathered per partition into one format-2 record batch (docs/design.md §2;
 * laid out in {@link MessageSet}: raylog's lastOffsetDelta, this writer's
 * producer id, epoch 0 and the partition's next baseSequence, the records
 * compressed with {@code kafka.compression.type} by {@link SinkCodecs}) of up
 * to {@code kafka.batch.size} / {@code batch_bytes} (at most the topic's
 * max_message_bytes) and sent to the partition's data socket with the plan's
 * {@code kafka.acks}: PRODUCE version 1 with acks -1 ("all", the default:
 * answered once the batch is flushed and on every in-sync replica), version
 * 0 with acks 1 or 0 (no answer). Each batch is answered before the next is
 * sent to that partition, and {@link #commit()} returns once every batch is
 * answered (for acks 0: written).
 *
 * <p>Batches: a batch is sent when the next record would not fit, and the
 * last ones at commit; never for time ({@code kafka.linger.ms} is met by
 * never waiting: a task has its rows at hand). A record counts with its
 * timestampDelta as the longest varlong and its length as the longest
 * varint, so where batches end depends on the rows alone.
 *
 * <p>Idempotence: the task's producer id is {@link #producerId} of the
 * write's random id (drawn on the driver, {@link RaylogWrite.Plan#writeId}),
 * the stream's epoch and the Spark partition: the same for every attempt of
 * the task. Sequences run from 0 per raylog partition. A retried task that
 * sees the same rows in the same order (a deterministic stage) sends the
 * same batches under the same sequences: a batch an earlier attempt stored
 * is answered by the partition as a duplicate (raylog.storage.batch_producers)
 * and not stored again, and one stored too long ago for the partition to
 * remember its offset (DuplicateSequenceError) is taken as stored. A batch
 * sent again after its partition moved (below) is a duplicate the same way.
 *
 * <p>Partitions: the row's {@code partition} column when the query has one,
 * else {@code crc32c(key) mod partitions} for a keyed row (the producer's
 * stable hash, raylog.producer.partitioner) and, for keyless rows, one
 * partition per task (the task's partition id mod partitions).
 *
 * <p>A partition whose actor moved is looked up again in ZooKeeper and the
 * batch sent again, same sequence, for up to timeout_ms; so is a batch
 * refused with NotEnoughReplicasError (acks=all while the partition's ISR is
 * below min_insync_replicas: refused before it was appended), as raylog's
 * producer retries it. With acks 1 or all
 * each row of a task is stored once, whatever Spark retries; a write started
 * again (a new save, a query run again from its checkpoint) is another
 * producer and writes its rows again. With acks 0 nothing is known of a
 * batch (a failure can lose rows).
 *
 * <p>Not thread-safe: Spark drives each writer from one task thread.
 */
final class TopicWriter implements DataWriter<InternalRow> {

  private static final Logger LOG = LoggerFactory.getLogger(TopicWriter.class);
  /** the wire code of raylog's DuplicateSequenceError */
  static final int DUPLICATE_SEQUENCE = 17;
  /** the wire code of raylog's NotEnoughReplicasError: an acks=all batch refused before it was appended */
  static final int NOT_ENOUGH_REPLICAS = 27;

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
    /** each partition's pending batch: its records section */
    final ByteArrayOutputStream[] pending;
    /** records in each pending batch */
    final long[] counts;
    /** the first and the largest record time of each pending batch, ms */
    final long[] baseTimestamps;
    final long[] maxTimestamps;
    /** the bytes each pending batch may take, counted so that it does not depend on the time (see write) */
    final long[] budgets;
    /** the next baseSequence of each partition (this writer's producer id) */
    final int[] sequences;

    Topic(String name, int partitions, int maxSetBytes) {
      this.name = name;
      this.nameBytes = name.getBytes(StandardCharsets.UTF_8);
      this.partitions = partitions;
      this.maxSetBytes = maxSetBytes;
      this.pending = new ByteArrayOutputStream[partitions];
      this.counts = new long[partitions];
      this.baseTimestamps = new long[partitions];
      this.maxTimestamps = new long[partitions];
      this.budgets = new long[partitions];
      this.sequences = new int[partitions];
    }
  }

  private final RaylogWrite.Plan plan;
  private final int taskPartition;
  /** the producer id of this task's batches: the same for every attempt of the task */
  private final long producerId;
  private final Map<String, Topic> topics = new HashMap<>();
  private final Map<String, FetchClient> clients = new HashMap<>();
  private final CRC32C crc = new CRC32C();
  /** the record being encoded (after its length varint) */
  private final ByteArrayOutputStream record = new ByteArrayOutputStream(256);
  private final byte[] varintBytes = new byte[10];
  private Zk zk;
  private long written;
  /** messages acknowledged by the partitions */
  private long sent;
  /** rows refused (no topic) */
  private long refused;
  private String firstRefusal;
  /** count refused rows and go on (a batch write), or fail the task at the first one (a stream) */
  private final boolean countRefused;

  TopicWriter(RaylogWrite.Plan plan, int taskPartition) {
    this(plan, taskPartition, -1L, false);
  }

  /**
   * The writer of Spark partition {@code taskPartition} of epoch {@code epoch}
   * (a stream's micro-batch; -1 for a batch write): its producer id is
   * {@link #producerId}{@code (plan.writeId, epoch, taskPartition)}, the same
   * for every attempt of the task.
   */
  TopicWriter(RaylogWrite.Plan plan, int taskPartition, long epoch, boolean countRefused) {
    this.plan = plan;
    this.taskPartition = taskPartition;
    this.countRefused = countRefused;
    this.producerId = producerId(plan.writeId, epoch, taskPartition);
  }

  /**
   * A non-negative producer id for (write, epoch, Spark partition): a
   * SplitMix64 mix of the write's random id (drawn on the driver) with the
   * epoch and the partition, so that it is the same for each attempt of a
   * task and, as raylog's own producer's random ids, different from every
   * other producer's but by a chance of about one in 2^63 per pair.
   */
  static long producerId(long writeId, long epoch, int taskPartition) {
    long x = mix(mix(writeId ^ epoch) + taskPartition);
    return x & Long.MAX_VALUE;
  }

  private static long mix(long z) {
    z += 0x9E3779B97F4A7C15L;
    z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9L;
    z = (z ^ (z >>> 27)) * 0x94D049BB133111EBL;
    return z ^ (z >>> 31);
  }

  /** Bytes of the zigzag varlong of {@code v}. */
  private static int varlongSize(long v) {
    long z = (v << 1) ^ (v >> 63);
    int n = 1;
    while ((z & ~0x7FL) != 0) {
      z >>>= 7;
      n++;
    }
    return n;
  }

  /** Rows refused so far (no topic). */
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
    if (name == null) {
      if (refused++ == 0) {
        firstRefusal = "a null topic (give the option 'topic', or fill the column)";
      }
      if (!countRefused) {
        throw SourceOptions.config("a row has " + firstRefusal + "; this task had written " + sent
            + " messages before it");
      }
      return; // counted: the driver fails the write naming how many rows were refused
    }
    byte[] value = row.isNullAt(plan.valueColumn) ? null // a tombstone
        : plan.valueIsString ? row.getUTF8String(plan.valueColumn).getBytes() : row.getBinary(plan.valueColumn);
    ArrayData headers = plan.headersColumn >= 0 && !row.isNullAt(plan.headersColumn)
        ? row.getArray(plan.headersColumn) : null;
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
    long now = System.currentTimeMillis();
    ByteArrayOutputStream set = t.pending[partition];
    // A record costs its bytes with its timestampDelta counted as the longest
    // varlong (10 bytes) and its length as the longest varint (5): where a
    // batch ends then depends on the rows alone, not on the time, so that a
    // retried task cuts its rows into the same batches under the same
    // sequences (idempotence: see the class comment).
    long cost = 0;
    if (set != null) {
      long delta = now - t.baseTimestamps[partition];
      encodeRecord(t.counts[partition], delta, key, value, headers);
      cost = record.size() - varlongSize(delta) + 10 + 5;
      if (MessageSet.BATCH_HEADER_SIZE + t.budgets[partition] + cost > t.maxSetBytes) {
        send(t, partition);
        set = null;
      }
    }
    if (set == null) {
      set = t.pending[partition] = new ByteArrayOutputStream(Math.min(t.maxSetBytes, 64 * 1024));
      t.counts[partition] = 0;
      t.budgets[partition] = 0;
      t.baseTimestamps[partition] = now;
      t.maxTimestamps[partition] = now;
      encodeRecord(0, 0, key, value, headers);
      cost = record.size() - 1 + 10 + 5;
    }
    t.budgets[partition] += cost;
    writeVarlong(set, record.size());
    set.write(record.toByteArray(), 0, record.size()); // (writeTo declares IOException)
    t.maxTimestamps[partition] = Math.max(t.maxTimestamps[partition], now);
    t.counts[partition]++;
    written++;
  }

  /** One record of a batch, without its length (MessageSet's format 2), into {@link #record}. */
  private void encodeRecord(long index, long timestampDelta, byte[] key, byte[] value, ArrayData headers) {
    ByteArrayOutputStream r = record;
    r.reset();
    r.write(0); // attributes
    writeVarlong(r, timestampDelta);
    writeVarlong(r, index);
    writeBytes(r, key);
    writeBytes(r, value);
    int n = headers == null ? 0 : headers.numElements();
    writeVarlong(r, n);
    for (int i = 0; i < n; i++) {
      if (headers.isNullAt(i)) {
        throw SourceOptions.config("a row's headers hold a null header; a header is a (key, value) struct");
      }
      InternalRow h = headers.getStruct(i, 2);
      if (h.isNullAt(0)) {
        throw SourceOptions.config("a row's headers hold a header with a null key; header keys are strings");
      }
      writeBytes(r, h.getUTF8String(0).getBytes());
      writeBytes(r, h.isNullAt(1) ? null : h.getBinary(1));
    }
  }

  private void writeBytes(ByteArrayOutputStream out, byte[] b) {
    if (b == null) {
      writeVarlong(out, -1);
    } else {
      writeVarlong(out, b.length);
      out.write(b, 0, b.length);
    }
  }

  /** A zigzag varint (Kafka's, as MessageSet reads it). */
  private void writeVarlong(ByteArrayOutputStream out, long v) {
    long z = (v << 1) ^ (v >> 63);
    int n = 0;
    while ((z & ~0x7FL) != 0) {
      varintBytes[n++] = (byte) ((z & 0x7F) | 0x80);
      z >>>= 7;
    }
    varintBytes[n++] = (byte) z;
    out.write(varintBytes, 0, n);
  }

  /**
   * The pending records of a partition as one record batch (MessageSet's
   * format 2), crc set: this writer's producer id, epoch 0 and the
   * partition's next baseSequence; the records section compressed with the
   * plan's codec (attributes bits 0-2, Kafka's number) when that makes it
   * smaller, else stored as it is (attributes 0).
   */
  private byte[] batch(Topic t, int partition, ByteArrayOutputStream records) {
    byte[] recs = records.toByteArray();
    int codec = 0;
    if (plan.codec != 0) {
      byte[] packed = SinkCodecs.compress(plan.codec, recs);
      if (packed.length < recs.length) {
        recs = packed;
        codec = plan.codec;
      }
    }
    int size = MessageSet.BATCH_HEADER_SIZE + recs.length;
    byte[] b = new byte[size];
    int batchLength = size - MessageSet.BATCH_OVERHEAD;
    FetchClient.putInt(b, 8, batchLength); // baseOffset 0: set at append
    FetchClient.putInt(b, 12, -1); // partitionLeaderEpoch: set at append
    b[16] = MessageSet.BATCH_MAGIC;
    b[22] = (byte) codec; // attributes: the codec, CreateTime, not transactional
    FetchClient.putInt(b, 23, size - 1); // lastOffsetDelta: the next batch's position
    putLong(b, 27, t.baseTimestamps[partition]);
    putLong(b, 35, t.maxTimestamps[partition]);
    putLong(b, 43, producerId);
    // producerEpoch 0 (bytes 51..53 stay 0): raylog's producers use epoch 0
    FetchClient.putInt(b, 53, t.sequences[partition]); // baseSequence
    FetchClient.putInt(b, 57, (int) t.counts[partition]);
    System.arraycopy(recs, 0, b, MessageSet.BATCH_HEADER_SIZE, recs.length);
    crc.reset();
    crc.update(b, 21, size - 21);
    FetchClient.putInt(b, 17, (int) crc.getValue());
    return b;
  }

  private static void putLong(byte[] b, int at, long v) {
    FetchClient.putInt(b, at, (int) (v >>> 32));
    FetchClient.putInt(b, at + 4, (int) v);
  }

  /** Send the pending set of a partition and wait for its acknowledgement. */
  private void send(Topic t, int partition) {
    ByteArrayOutputStream set = t.pending[partition];
    t.pending[partition] = null;
    if (set == null || set.size() == 0) {
      return;
    }
    byte[] data = batch(t, partition, set);
    long count = t.counts[partition];
    // the sequence is spent now: every resend of this batch carries it
    t.sequences[partition] = (int) ((t.sequences[partition] + count) & Integer.MAX_VALUE);
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
          c.produce(t.nameBytes, partition, data, plan.acks);
          sent += count;
          return;
        } catch (RaylogReadException x) {
          if (x.code() == DUPLICATE_SEQUENCE) {
            // stored by an earlier attempt of this task, too long ago for the
            // partition to remember its offset: not stored again
            LOG.info("writing {}-{}: a batch was stored before ({})", t.name, partition, x.getMessage());
            sent += count;
            return;
          }
          if (x.code() != NOT_ENOUGH_REPLICAS) { // (the ISR short for a while: the same leader, later)
            if (!RangeReader.moved(x)) {
              throw x;
            }
            c.close();
            clients.remove(where);
          }
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
