package org.raylog.spark;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.apache.spark.sql.connector.read.streaming.CompositeReadLimit;
import org.apache.spark.sql.connector.read.streaming.ReadAllAvailable;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;
import org.apache.spark.sql.connector.read.streaming.ReadMaxRows;
import org.apache.spark.sql.connector.read.streaming.ReadMinRows;
import org.apache.spark.sql.connector.read.streaming.ReportsSourceMetrics;
import org.apache.spark.sql.connector.read.streaming.SupportsTriggerAvailableNow;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A Structured Streaming micro-batch read of raylog topics
 * ({@code spark.readStream.format("raylog")}).
 *
 * <p>Positions are {@link RaylogOffset}s: the next byte offset of every
 * partition. Spark writes each batch's end position to the query's
 * checkpoint before the batch runs and reads it back on restart, so a
 * restarted query runs the same ranges again and goes on from there (with
 * an idempotent sink such as files, every message lands exactly once). The
 * first position (startingOffsets, default {@code latest}, or
 * startingTimestamp) is resolved once and kept in the source's checkpoint
 * folder ({@code initial-offsets.json}), so a query stopped before its first
 * batch committed starts at the same place again.
 *
 * <ul>
 *   <li>Each trigger reads up to the partitions' high watermarks (OFFSETS);
 *       with {@code maxOffsetsPerTrigger} at most that many records in all,
 *       shared in proportion to each partition's backlog in records
 *       ({@link TriggerLimits#split}); the partitions count their records
 *       and find the offset after a share (COUNT version 1), which may lie
 *       inside a compressed set. With {@code minOffsetsPerTrigger} a trigger
 *       runs no batch while fewer records are available, until
 *       {@code maxTriggerDelay} has passed since the last batch.</li>
 *   <li>Progress: the latest offsets of each trigger
 *       ({@link #reportLatestOffset}) and the records behind them
 *       ({@link #metrics}: min/avg/maxOffsetsBehindLatest).</li>
 *   <li>{@code Trigger.AvailableNow}: the high watermarks when the query
 *       starts are the end; the query stops there
 *       ({@link #prepareForTriggerAvailableNow}).</li>
 *   <li>Partitions (and, with subscribePattern, topics) that appear while
 *       the query runs are read from their log start.</li>
 *   <li>Readers are the batch readers ({@link RangeReader}): every CRC checked,
 *       moved endpoints found again in ZooKeeper, lost data failing the
 *       batch or skipped per failOnDataLoss.</li>
 * </ul>
 *
 * <p>Not thread-safe: Spark's stream execution thread drives it.
 */
final class RaylogMicroBatchStream implements MicroBatchStream, SupportsTriggerAvailableNow, ReportsSourceMetrics {

  private static final Logger LOG = LoggerFactory.getLogger(RaylogMicroBatchStream.class);

  private final SourceOptions options;
  private final int[] columns;
  /** the typed Avro read, or null */
  private final AvroSpec avro;
  private final String checkpointLocation;
  private Cluster cluster;
  private int maxMessageBytes = ReadOptions.MiB;
  private long maxInflatedBytes;
  /** the end of a Trigger.AvailableNow query, or null */
  private RaylogOffset availableNowEnd;
  /** the latest offsets of the last trigger (Spark's progress reports them), or null */
  private RaylogOffset latestAvailable;
  /** the partitions' log starts at the last trigger */
  private Map<String, Map<Integer, Long>> latestLogStarts = new TreeMap<>();
  /** when the last batch was let through by minOffsetsPerTrigger (0: the first trigger runs, as in Kafka's source) */
  private long lastTriggerMillis;
  /** deleted topics already reported in the driver's log */
  private final java.util.Set<String> warnedTopics = new java.util.HashSet<>();

  RaylogMicroBatchStream(SourceOptions options, int[] columns, AvroSpec avro, String checkpointLocation) {
    this.options = options;
    this.columns = columns;
    this.avro = avro;
    this.checkpointLocation = checkpointLocation;
  }

  private Cluster cluster() {
    if (cluster == null) {
      cluster = new Cluster(options);
    }
    return cluster;
  }

  /** Every selected partition's log start and high watermark now (the query's start: every subscribed topic). */
  private Map<String, Map<Integer, long[]>> logs() {
    return logs(cluster().partitions());
  }

  private Map<String, Map<Integer, long[]>> logs(Map<String, Integer> partitions) {
    maxMessageBytes = cluster().maxMessageBytes(partitions.keySet());
    maxInflatedBytes = cluster().maxInflatedBytes(partitions.keySet());
    return cluster().offsets(partitions);
  }

  /**
   * The logs of the topics that exist now, of those the query reads and of
   * {@code read} (the topics of its last position). A topic of {@code read}
   * that was deleted is data loss: a DataLossError naming failOnDataLoss,
   * or with failOnDataLoss=false a warning in the driver's log and the
   * topic is left out (as Spark's Kafka source).
   */
  private Map<String, Map<Integer, long[]>> liveLogs(java.util.Collection<String> read) {
    java.util.Set<String> wanted = new java.util.TreeSet<>(read);
    if (options.pattern == null) {
      wanted.addAll(options.subscribe);
    } else {
      wanted = new java.util.TreeSet<>(read);
      wanted.addAll(cluster().selected());
    }
    Map<String, Integer> present = cluster().partitionsPresent(wanted);
    for (String topic : read) {
      if (!present.containsKey(topic)) {
        lostTopic(topic);
      }
    }
    return logs(present);
  }

  private void lostTopic(String topic) {
    if (options.failOnDataLoss) {
      Map<String, Object> d = new HashMap<>();
      d.put("topic", topic);
      throw new RaylogReadException(RaylogReadException.DATA_LOSS, "topic " + topic + " was deleted while the "
          + "stream read it: its unread messages are lost; set the option failOnDataLoss to false to skip them "
          + "and go on", d, null);
    }
    if (warnedTopics.add(topic)) {
      LOG.warn("raylog stream: topic {} was deleted; its unread messages are skipped (failOnDataLoss=false)", topic);
    }
  }

  @Override
  public Offset initialOffset() {
    Path path = new Path(checkpointLocation, "initial-offsets.json");
    try {
      FileSystem fs = path.getFileSystem(hadoopConf());
      if (fs.exists(path)) {
        try (InputStream in = fs.open(path)) {
          return RaylogOffset.parse(new String(in.readAllBytes(), StandardCharsets.UTF_8));
        }
      }
      RaylogOffset initial = resolveInitial();
      fs.mkdirs(path.getParent());
      Path tmp = new Path(checkpointLocation, "initial-offsets.json.tmp");
      try (OutputStream out = fs.create(tmp, true)) {
        out.write(initial.json().getBytes(StandardCharsets.UTF_8));
      }
      if (!fs.rename(tmp, path)) {
        throw new IOException("cannot rename " + tmp + " to " + path);
      }
      LOG.info("raylog stream starts at {}", initial.json());
      return initial;
    } catch (IOException e) {
      throw new RaylogReadException(RaylogReadException.CONFIG,
          "cannot keep the stream's initial offsets under " + checkpointLocation + ": " + e, null, e);
    }
  }

  private static Configuration hadoopConf() {
    scala.Option<SparkSession> active = SparkSession.getActiveSession();
    return active.isDefined() ? active.get().sessionState().newHadoopConf() : new Configuration();
  }

  private RaylogOffset resolveInitial() {
    Map<String, Map<Integer, long[]>> logs = logs();
    Map<String, Map<Integer, long[]>> bounds =
        cluster().bounds(logs, cluster().starting(logs, "latest"), "latest", maxMessageBytes);
    Map<String, Map<Integer, Long>> start = new TreeMap<>();
    for (Map.Entry<String, Map<Integer, long[]>> t : bounds.entrySet()) {
      Map<Integer, Long> parts = new TreeMap<>();
      for (Map.Entry<Integer, long[]> p : t.getValue().entrySet()) {
        parts.put(p.getKey(), p.getValue()[0]);
      }
      start.put(t.getKey(), parts);
    }
    return new RaylogOffset(start);
  }

  @Override
  public Offset deserializeOffset(String json) {
    return RaylogOffset.parse(json);
  }

  /** Spark's Kafka source's read limits: minOffsetsPerTrigger (with maxTriggerDelay) and maxOffsetsPerTrigger. */
  @Override
  public ReadLimit getDefaultReadLimit() {
    ReadLimit min = options.minOffsetsPerTrigger > 0
        ? ReadLimit.minRows(options.minOffsetsPerTrigger, options.maxTriggerDelayMs) : null;
    ReadLimit max = options.maxOffsetsPerTrigger > 0 ? ReadLimit.maxRows(options.maxOffsetsPerTrigger) : null;
    if (min != null && max != null) {
      return ReadLimit.compositeLimit(new ReadLimit[] {min, max});
    }
    return min != null ? min : max != null ? max : ReadLimit.allAvailable();
  }

  @Override
  public void prepareForTriggerAvailableNow() {
    Map<String, Map<Integer, Long>> end = new TreeMap<>();
    for (Map.Entry<String, Map<Integer, long[]>> t : logs().entrySet()) {
      Map<Integer, Long> parts = new TreeMap<>();
      for (Map.Entry<Integer, long[]> p : t.getValue().entrySet()) {
        parts.put(p.getKey(), p.getValue()[1]);
      }
      end.put(t.getKey(), parts);
    }
    availableNowEnd = new RaylogOffset(end);
    LOG.info("Trigger.AvailableNow: the raylog stream ends at {}", availableNowEnd.json());
  }

  @Override
  public Offset latestOffset() {
    throw new UnsupportedOperationException("Spark asks latestOffset(start, limit) of a raylog stream");
  }

  @Override
  public Offset latestOffset(Offset startOffset, ReadLimit limit) {
    RaylogOffset start = (RaylogOffset) startOffset;
    Map<String, Map<Integer, long[]>> logs = liveLogs(start.offsets.keySet());
    // {from, latest, log start} of every partition: latest is the high watermark (AvailableNow: capped)
    Map<String, Map<Integer, long[]>> spans = new TreeMap<>();
    Map<String, Map<Integer, Long>> latest = new TreeMap<>();
    for (Map.Entry<String, Map<Integer, long[]>> t : logs.entrySet()) {
      Map<Integer, long[]> parts = new TreeMap<>();
      Map<Integer, Long> ends = new TreeMap<>();
      for (Map.Entry<Integer, long[]> p : t.getValue().entrySet()) {
        String topic = t.getKey();
        int partition = p.getKey();
        Long from = start.get(topic, partition);
        long s = from != null ? from : p.getValue()[0]; // a new partition: from its log start
        long e = Math.max(s, p.getValue()[1]);
        if (availableNowEnd != null) {
          Long cap = availableNowEnd.get(topic, partition);
          e = cap == null ? s : Math.max(s, Math.min(e, cap));
        }
        parts.put(partition, new long[] {s, e, p.getValue()[0]});
        ends.put(partition, e);
      }
      spans.put(t.getKey(), parts);
      latest.put(t.getKey(), ends);
    }
    latestAvailable = new RaylogOffset(latest);
    latestLogStarts = new TreeMap<>();
    for (Map.Entry<String, Map<Integer, long[]>> t : spans.entrySet()) {
      Map<Integer, Long> starts = new TreeMap<>();
      for (Map.Entry<Integer, long[]> p : t.getValue().entrySet()) {
        starts.put(p.getKey(), p.getValue()[2]);
      }
      latestLogStarts.put(t.getKey(), starts);
    }
    List<ReadLimit> limits = new ArrayList<>();
    if (limit instanceof CompositeReadLimit) {
      limits.addAll(java.util.Arrays.asList(((CompositeReadLimit) limit).getReadLimits()));
    } else {
      limits.add(limit);
    }
    ReadMinRows lower = null;
    ReadMaxRows upper = null;
    for (ReadLimit l : limits) {
      if (l instanceof ReadAllAvailable) {
        return latestAvailable; // the highest priority, as in Kafka's source
      }
      if (l instanceof ReadMinRows) {
        lower = (ReadMinRows) l;
      } else if (l instanceof ReadMaxRows) {
        upper = (ReadMaxRows) l;
      }
    }
    // an AvailableNow query reads what is there up to its end: no trigger of it waits for more
    if (lower != null && availableNowEnd == null && delayBatch(lower, spans)) {
      LOG.debug("raylog stream: fewer than {} records available, the batch waits", lower.minRows());
      return start;
    }
    if (upper == null) {
      return latestAvailable;
    }
    // maxOffsetsPerTrigger: records, shared by the partitions' backlogs in records
    List<String[]> keys = new ArrayList<>();
    List<long[]> ranges = new ArrayList<>();
    for (Map.Entry<String, Map<Integer, long[]>> t : spans.entrySet()) {
      for (Map.Entry<Integer, long[]> p : t.getValue().entrySet()) {
        keys.add(new String[] {t.getKey(), Integer.toString(p.getKey())});
        ranges.add(p.getValue());
      }
    }
    long[] backlogs = new long[ranges.size()];
    for (int i = 0; i < backlogs.length; i++) {
      backlogs[i] = backlog(keys.get(i)[0], Integer.parseInt(keys.get(i)[1]), ranges.get(i), -1);
    }
    long[] shares = TriggerLimits.split(backlogs, upper.maxRows());
    Map<String, Map<Integer, Long>> end = new TreeMap<>();
    for (int i = 0; i < backlogs.length; i++) {
      String topic = keys.get(i)[0];
      int partition = Integer.parseInt(keys.get(i)[1]);
      long[] r = ranges.get(i);
      long e = r[1];
      if (shares[i] < backlogs[i]) {
        e = cluster().records(topic, partition, countFrom(r), r[1], shares[i])[1];
      }
      end.computeIfAbsent(topic, k -> new TreeMap<>()).put(partition, e);
    }
    return new RaylogOffset(end);
  }

  /** Where a partition's records are counted from: its position, or its log start when retention passed it. */
  private static long countFrom(long[] span) {
    return Math.max(span[0], span[2]);
  }

  /** The records of a span {from, latest, log start} (at most {@code max}, -1 for all): COUNT version 1. */
  private long backlog(String topic, int partition, long[] span, long max) {
    long from = countFrom(span);
    return span[1] > from ? cluster().records(topic, partition, from, span[1], max)[0] : 0;
  }

  /**
   * Kafka's delayBatch: true when the batch waits (fewer than minRows records available and
   * maxTriggerDelay not passed since the last batch); a batch that runs sets the time of the last one.
   */
  private boolean delayBatch(ReadMinRows lower, Map<String, Map<Integer, long[]>> spans) {
    long now = System.currentTimeMillis();
    if (now - lastTriggerMillis >= lower.maxTriggerDelayMs()) {
      lastTriggerMillis = now;
      return false;
    }
    long available = 0;
    for (Map.Entry<String, Map<Integer, long[]>> t : spans.entrySet()) {
      for (Map.Entry<Integer, long[]> p : t.getValue().entrySet()) {
        if (available >= lower.minRows()) {
          break;
        }
        available += backlog(t.getKey(), p.getKey(), p.getValue(), lower.minRows() - available);
      }
    }
    if (available < lower.minRows()) {
      return true;
    }
    lastTriggerMillis = now;
    return false;
  }

  @Override
  public Offset reportLatestOffset() {
    return latestAvailable;
  }

  /**
   * Records behind the latest offsets of the last trigger, per partition: minOffsetsBehindLatest,
   * maxOffsetsBehindLatest and avgOffsetsBehindLatest, as Spark's Kafka source reports them (in
   * records, counted by the partitions); none before the first trigger or when a count fails.
   */
  @Override
  public Map<String, String> metrics(java.util.Optional<Offset> latestConsumedOffset) {
    if (!latestConsumedOffset.isPresent() || latestAvailable == null) {
      return java.util.Collections.emptyMap();
    }
    RaylogOffset consumed = (RaylogOffset) latestConsumedOffset.get();
    List<Long> behind = new ArrayList<>();
    try {
      for (Map.Entry<String, Map<Integer, Long>> t : latestAvailable.offsets.entrySet()) {
        for (Map.Entry<Integer, Long> p : t.getValue().entrySet()) {
          Long logStart = latestLogStarts.get(t.getKey()).get(p.getKey());
          Long at = consumed.get(t.getKey(), p.getKey());
          long from = at != null ? at : logStart;
          behind.add(backlog(t.getKey(), p.getKey(), new long[] {from, p.getValue(), logStart}, -1));
        }
      }
    } catch (RaylogReadException e) {
      LOG.warn("raylog stream: records behind latest not counted ({})", e.getMessage());
      return java.util.Collections.emptyMap();
    }
    if (behind.isEmpty()) {
      return java.util.Collections.emptyMap();
    }
    long min = Long.MAX_VALUE;
    long max = Long.MIN_VALUE;
    long sum = 0;
    for (long b : behind) {
      min = Math.min(min, b);
      max = Math.max(max, b);
      sum += b;
    }
    Map<String, String> out = new HashMap<>();
    out.put("minOffsetsBehindLatest", Long.toString(min));
    out.put("maxOffsetsBehindLatest", Long.toString(max));
    out.put("avgOffsetsBehindLatest", Double.toString((double) sum / behind.size()));
    return out;
  }

  @Override
  public InputPartition[] planInputPartitions(Offset startOffset, Offset endOffset) {
    RaylogOffset start = (RaylogOffset) startOffset;
    RaylogOffset end = (RaylogOffset) endOffset;
    Map<String, Map<Integer, long[]>> bounds = new TreeMap<>();
    // the logs now, checked here on the driver: deleted topics and offsets deleted by retention are
    // failOnDataLoss's to decide before any task runs
    Map<String, Map<Integer, long[]>> logs = liveLogs(end.offsets.keySet());
    for (Map.Entry<String, Map<Integer, Long>> t : end.offsets.entrySet()) {
      if (!logs.containsKey(t.getKey())) {
        continue; // deleted, skipped (liveLogs failed the batch otherwise)
      }
      Map<Integer, long[]> parts = new TreeMap<>();
      for (Map.Entry<Integer, Long> p : t.getValue().entrySet()) {
        Long from = start == null ? null : start.get(t.getKey(), p.getKey());
        long[] log = logs.get(t.getKey()).get(p.getKey());
        if (from == null) { // a partition that appeared during the batch: from its log start
          from = log != null ? Math.min(log[0], p.getValue()) : p.getValue();
        } else if (log != null && from < log[0] && p.getValue() > from) {
          long lostEnd = Math.min(log[0], p.getValue());
          String lost = t.getKey() + "-" + p.getKey() + " [" + from + ", " + lostEnd + ")";
          if (options.failOnDataLoss) {
            Map<String, Object> d = new HashMap<>();
            d.put("topic", t.getKey());
            d.put("partition", p.getKey());
            d.put("lost_start", from);
            d.put("lost_end", lostEnd);
            throw new RaylogReadException(RaylogReadException.DATA_LOSS, "offsets " + lost + " were deleted by "
                + "retention before the stream read them; set the option failOnDataLoss to false to skip them",
                d, null);
          }
          LOG.warn("raylog stream: skipping {}, deleted by retention (failOnDataLoss=false)", lost);
          from = lostEnd;
        }
        parts.put(p.getKey(), new long[] {from, p.getValue()});
      }
      bounds.put(t.getKey(), parts);
    }
    maxMessageBytes = Math.max(maxMessageBytes, cluster().maxMessageBytes(bounds.keySet()));
    maxInflatedBytes = Math.max(maxInflatedBytes, cluster().maxInflatedBytes(bounds.keySet()));
    List<ReadOptions.Range> ranges = cluster().ranges(bounds);
    if (options.minPartitions > 0) {
      ranges = cluster().split(ranges, options.minPartitions, maxMessageBytes);
    }
    List<InputPartition> out = new ArrayList<>(ranges.size());
    for (int i = 0; i < ranges.size(); i++) {
      out.add(new RangePartition(i, ranges.get(i), true));
    }
    return out.toArray(new InputPartition[0]);
  }

  @Override
  public PartitionReaderFactory createReaderFactory() {
    return new RangeReaderFactory(cluster().settings(maxMessageBytes, maxInflatedBytes), columns, avro);
  }

  @Override
  public void commit(Offset end) {
    // nothing to do: the log keeps the data until retention deletes it
  }

  @Override
  public void stop() {
    if (cluster != null) {
      cluster.close();
      cluster = null;
    }
  }

  @Override
  public String toString() {
    return "RaylogMicroBatchStream[" + (options.pattern != null ? options.pattern : options.subscribe) + "]";
  }
}
