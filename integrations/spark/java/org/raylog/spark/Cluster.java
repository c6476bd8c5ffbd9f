package org.raylog.spark;

import java.io.Closeable;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

import com.fasterxml.jackson.databind.JsonNode;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The driver's view of a raylog cluster for reads by name: topics and
 * partitions from ZooKeeper, each partition's log start and high watermark
 * from its data socket (OFFSETS), and the byte ranges of a read.
 *
 * <p>A partition whose endpoint is missing or unreachable is looked up again
 * in ZooKeeper until {@code timeout_ms} has passed (its actor may be
 * restarting on a new port).
 *
 * <p>Not thread-safe: one planning thread (Spark's driver) uses it.
 */
final class Cluster implements Closeable {

  private static final Logger LOG = LoggerFactory.getLogger(Cluster.class);
  /** waits between endpoint lookups of a partition that is not reachable */
  private static final long[] BACKOFF_MS = {50, 100, 200, 400, 800, 1000};

  final SourceOptions options;
  private final Zk zk;
  private final Map<String, FetchClient> clients = new HashMap<>();
  private final Map<String, JsonNode> configs = new HashMap<>();
  /** how long a looked-up endpoint is used without asking ZooKeeper again (one plan's lookups) */
  static final long ENDPOINT_TTL_MS = 1000;
  /** endpoints looked up lately ({@code topic-partition}), with when; dropped when unreachable */
  private final Map<String, Zk.Endpoint> endpoints = new HashMap<>();
  private final Map<String, Long> lookedUp = new HashMap<>();

  Cluster(SourceOptions options) {
    this.options = options;
    this.zk = new Zk(options.zookeeper, options.cluster, options.timeoutMs);
    if (options.bootstrapServers != null) {
      try {
        checkBootstrap(options.bootstrapServers, zk.kafkaListeners());
      } catch (RuntimeException e) {
        zk.close();
        throw e;
      }
    }
  }

  /**
   * ConfigError unless every {@code host:port} of kafka.bootstrap.servers is one of
   * {@code listeners} (the cluster's Kafka listeners): same port, and the same host name or
   * a host that resolves to an address of the listener's host.
   */
  void checkBootstrap(List<String> servers, List<Zk.Endpoint> listeners) {
    List<String> known = new ArrayList<>();
    for (Zk.Endpoint l : listeners) {
      known.add(l.host + ":" + l.port);
    }
    String where = "the raylog cluster '" + options.cluster + "' at ZooKeeper " + options.zookeeper;
    for (String server : servers) {
      int colon = server.lastIndexOf(':');
      String host = server.substring(0, colon);
      if (host.startsWith("[") && host.endsWith("]")) {
        host = host.substring(1, host.length() - 1);
      }
      int port = Integer.parseInt(server.substring(colon + 1));
      boolean found = false;
      for (Zk.Endpoint l : listeners) {
        if (l.port == port && sameHost(host, l.host)) {
          found = true;
          break;
        }
      }
      if (!found) {
        throw SourceOptions.config("option 'kafka.bootstrap.servers' names " + server + ", which is not a Kafka "
            + "listener of " + where + (listeners.isEmpty() ? " (it runs none)" : "; its listeners are "
            + String.join(", ", known)) + ". The raylog source reads the cluster its ZooKeeper names; give that "
            + "cluster's listeners, or leave the option out");
      }
    }
  }

  private static boolean sameHost(String a, String b) {
    if (a.equalsIgnoreCase(b)) {
      return true;
    }
    try {
      java.util.Set<java.net.InetAddress> mine = new java.util.HashSet<>(java.util.Arrays.asList(
          java.net.InetAddress.getAllByName(a)));
      for (java.net.InetAddress x : java.net.InetAddress.getAllByName(b)) {
        if (mine.contains(x)) {
          return true;
        }
      }
    } catch (java.net.UnknownHostException e) {
      return false;
    }
    return false;
  }

  /** {@code topic -> partitions} of the selected topics; UnknownTopicError for a subscribed topic that is missing. */
  Map<String, Integer> partitions() {
    Map<String, Integer> out = new TreeMap<>();
    for (String topic : options.topics(zk)) {
      out.put(topic, config(topic).path("partitions").asInt());
    }
    return out;
  }

  private JsonNode config(String topic) {
    JsonNode c = configs.get(topic);
    if (c == null) {
      c = zk.config(topic);
      configs.put(topic, c);
    }
    return c;
  }

  /** The largest message size bound of the topics. */
  int maxMessageBytes(Iterable<String> topics) {
    int max = ReadOptions.MiB;
    for (String t : topics) {
      max = Math.max(max, config(t).path("max_message_bytes").asInt(ReadOptions.MiB));
    }
    return max;
  }

  /** The largest bound on a wrapper's inflated size of the topics (topic setting max_inflated_bytes). */
  long maxInflatedBytes(Iterable<String> topics) {
    long max = 0;
    for (String t : topics) {
      JsonNode c = config(t);
      long own = c.path("max_inflated_bytes").asLong(0);
      if (own <= 0) {
        own = MessageSet.INFLATED_FACTOR * c.path("max_message_bytes").asLong(ReadOptions.MiB);
      }
      max = Math.max(max, own);
    }
    return max;
  }

  ReadOptions.Settings settings(int maxMessageBytes, long maxInflatedBytes) {
    return new ReadOptions.Settings(options.token, options.fetchBytes, maxMessageBytes, maxInflatedBytes,
        options.timeoutMs, options.failOnDataLoss, options.zookeeper, options.cluster, "the option failOnDataLoss to false");
  }

  /**
   * {@code {log start offset, high watermark}} of each selected partition:
   * the endpoints asked of ZooKeeper at once, every OFFSETS request sent
   * before any reply is read; a partition that fails there is asked again
   * through {@link #call} (which finds a moved actor).
   */
  Map<String, Map<Integer, long[]>> offsets(Map<String, Integer> partitions) {
    long now = System.currentTimeMillis();
    Map<String, Map<Integer, long[]>> out = new TreeMap<>();
    List<Object[]> sent = new ArrayList<>(); // {topic, partition, client}
    for (Map.Entry<String, Integer> t : partitions.entrySet()) {
      String topic = t.getKey();
      Zk.Endpoint[] found = zk.endpoints(topic, t.getValue(), options.timeoutMs);
      out.put(topic, new TreeMap<>());
      for (int p = 0; p < found.length; p++) {
        if (found[p] == null) {
          continue;
        }
        endpoints.put(topic + "-" + p, found[p]);
        lookedUp.put(topic + "-" + p, now);
        FetchClient c = client(found[p], topic);
        if (!c.busy()) {
          try {
            c.sendOffsets(bytes(topic), p);
            sent.add(new Object[] {topic, p, c});
          } catch (RaylogReadException e) {
            forget(found[p], topic, p); // asked again below
          }
        }
      }
    }
    for (Object[] s : sent) {
      String topic = (String) s[0];
      int p = (Integer) s[1];
      FetchClient c = (FetchClient) s[2];
      try {
        out.get(topic).put(p, c.readOffsets());
      } catch (RaylogReadException e) {
        if (!RangeReader.moved(e)) {
          throw e;
        }
        forget(endpoints.get(topic + "-" + p), topic, p); // asked again below
      }
    }
    for (Map.Entry<String, Integer> t : partitions.entrySet()) {
      Map<Integer, long[]> parts = out.get(t.getKey());
      for (int p = 0; p < t.getValue(); p++) {
        if (!parts.containsKey(p)) {
          final int partition = p;
          parts.put(p, call(t.getKey(), p, c -> c.offsets(bytes(t.getKey()), partition)));
        }
      }
    }
    return assigned(out);
  }

  /** {@code logs} cut to the partitions of the option assign (all of them without it). */
  private Map<String, Map<Integer, long[]>> assigned(Map<String, Map<Integer, long[]>> logs) {
    if (options.assign == null) {
      return logs;
    }
    Map<String, Map<Integer, long[]>> out = new TreeMap<>();
    for (Map.Entry<String, List<Integer>> t : options.assign.entrySet()) {
      Map<Integer, long[]> all = logs.get(t.getKey());
      Map<Integer, long[]> mine = new TreeMap<>();
      if (all == null) {
        continue; // a deleted topic of a stream (partitionsPresent left it out)
      }
      for (int p : t.getValue()) {
        if (!all.containsKey(p)) {
          throw new RaylogReadException(RaylogReadException.UNKNOWN_PARTITION, "option 'assign' names "
              + t.getKey() + "-" + p + ", but " + t.getKey() + " has partitions 0.."
              + (all == null ? -1 : all.size() - 1));
        }
        mine.put(p, all.get(p));
      }
      out.put(t.getKey(), mine);
    }
    return out;
  }

  /** The topics the options select now (subscribePattern: those that match). */
  List<String> selected() {
    return options.topics(zk);
  }

  /**
   * The topics of {@code topics} that exist now, with their partition
   * counts; the others are left out (a stream's deleted topics).
   */
  Map<String, Integer> partitionsPresent(java.util.Collection<String> topics) {
    java.util.Set<String> present = new java.util.HashSet<>(zk.topics());
    Map<String, Integer> out = new TreeMap<>();
    for (String topic : topics) {
      if (present.contains(topic)) {
        configs.remove(topic); // it may have been deleted and made again
        try {
          out.put(topic, config(topic).path("partitions").asInt());
        } catch (RaylogReadException e) {
          if (e.code() != RaylogReadException.UNKNOWN_TOPIC) {
            throw e;
          }
        }
      }
    }
    return out;
  }

  /**
   * The startingOffsets of a read (the option value, or JSON from
   * startingTimestamp / startingOffsetsByTimestamp: the first message at or
   * after the time). A partition with no such message fails the read
   * (startingOffsetsByTimestampStrategy=error, Kafka's default) or starts at
   * its end (=latest). {@code fallback}: the default when no option is given.
   */
  String starting(Map<String, Map<Integer, long[]>> logs, String fallback) {
    if (options.startingTimestamp == null && options.startingByTimestamp == null) {
      return options.startingOffsets == null ? fallback : options.startingOffsets;
    }
    String name = options.startingTimestamp != null ? "startingTimestamp" : "startingOffsetsByTimestamp";
    return forTimes(logs, name, options.startingTimestamp, options.startingByTimestamp, true);
  }

  /**
   * The endingOffsets of a batch read (the option value, or JSON from
   * endingTimestamp / endingOffsetsByTimestamp: each partition ends before
   * its first message at or after the time, or at latest when it has none,
   * as in Spark's Kafka source).
   */
  String ending(Map<String, Map<Integer, long[]>> logs) {
    if (options.endingTimestamp == null && options.endingByTimestamp == null) {
      return options.endingOffsets;
    }
    String name = options.endingTimestamp != null ? "endingTimestamp" : "endingOffsetsByTimestamp";
    return forTimes(logs, name, options.endingTimestamp, options.endingByTimestamp, false);
  }

  private String forTimes(Map<String, Map<Integer, long[]>> logs, String name, Long all,
      Map<String, Map<Integer, Long>> each, boolean start) {
    if (each != null) {
      for (Map.Entry<String, Map<Integer, long[]>> t : logs.entrySet()) {
        Map<Integer, Long> given = each.get(t.getKey());
        if (given == null || !given.keySet().equals(t.getValue().keySet())) {
          throw SourceOptions.config("option '" + name + "' must give a time for every partition the query reads "
              + "(as in Spark's Kafka source): " + t.getKey() + " has partitions " + t.getValue().keySet()
              + ", the option gives " + (given == null ? "none" : given.keySet()));
        }
      }
      for (String topic : each.keySet()) {
        if (!logs.containsKey(topic)) {
          throw SourceOptions.config("option '" + name + "' names " + topic + ", which the query does not read");
        }
      }
    }
    Map<String, Map<Integer, Long>> out = new TreeMap<>();
    for (Map.Entry<String, Map<Integer, long[]>> t : logs.entrySet()) {
      Map<Integer, Long> parts = new TreeMap<>();
      for (Map.Entry<Integer, long[]> e : t.getValue().entrySet()) {
        final int partition = e.getKey();
        final long time = all != null ? all : each.get(t.getKey()).get(partition);
        long offset = call(t.getKey(), partition, c -> c.offsetForTime(bytes(t.getKey()), partition, time));
        long end = e.getValue()[1];
        if (offset >= end) { // no message at or after the time
          if (start && !options.latestWhenNoTimestampMatch) {
            Map<String, Object> d = new HashMap<>();
            d.put("timestamp", time);
            d.put("latest", end);
            throw new RaylogReadException(RaylogReadException.OFFSET_OUT_OF_RANGE, name + ": no message of "
                + t.getKey() + "-" + partition + " is at or after " + time + " (as Spark's Kafka source, the read "
                + "fails); set startingOffsetsByTimestampStrategy to 'latest' to start such partitions at their "
                + "end", d, null);
          }
          offset = end;
        }
        parts.put(partition, offset);
      }
      out.put(t.getKey(), parts);
    }
    return new RaylogOffset(out).json();
  }

  /**
   * {@code ranges} cut at message boundaries into at least {@code minPartitions}
   * ranges (as raylog.read.plan's split: the larger ranges into more pieces,
   * in proportion to their bytes); each cut is the last message boundary at
   * or before its target, found with one FETCH from the previous cut. A
   * range of one message is not cut.
   */
  List<ReadOptions.Range> split(List<ReadOptions.Range> ranges, long minPartitions, int maxMessageBytes) {
    if (ranges.isEmpty() || ranges.size() >= minPartitions) {
      return ranges;
    }
    long total = 0;
    for (ReadOptions.Range r : ranges) {
      total += r.end - r.start;
    }
    int[] counts = new int[ranges.size()];
    int sum = 0;
    for (int i = 0; i < counts.length; i++) {
      long size = ranges.get(i).end - ranges.get(i).start;
      counts[i] = (int) Math.max(1, Math.min(size, Math.round((double) minPartitions * size / total)));
      sum += counts[i];
    }
    while (sum < minPartitions) { // the range with the largest pieces gets one more
      int best = 0;
      for (int i = 1; i < counts.length; i++) {
        long a = ranges.get(i).end - ranges.get(i).start;
        long b = ranges.get(best).end - ranges.get(best).start;
        if ((double) a / counts[i] > (double) b / counts[best]) {
          best = i;
        }
      }
      if (ranges.get(best).end - ranges.get(best).start <= counts[best]) {
        break;
      }
      counts[best]++;
      sum++;
    }
    List<ReadOptions.Range> out = new ArrayList<>();
    for (int i = 0; i < counts.length; i++) {
      ReadOptions.Range r = ranges.get(i);
      long from = r.start;
      long size = r.end - r.start;
      for (int k = 1; k < counts[i] && from < r.end; k++) {
        long target = r.start + size * k / counts[i];
        if (target <= from) {
          continue;
        }
        long cut = boundaryAtMost(r.topic, r.partition, from, target, maxMessageBytes);
        if (cut > from && cut < r.end) {
          out.add(new ReadOptions.Range(r.topic, r.partition, from, cut, r.host, r.port, r.location, r.replicas));
          from = cut;
        }
      }
      out.add(new ReadOptions.Range(r.topic, r.partition, from, r.end, r.host, r.port, r.location, r.replicas));
    }
    return out;
  }

  private FetchClient client(Zk.Endpoint e, String topic) {
    String key = e.host + ":" + e.port;
    FetchClient c = clients.get(key);
    if (c == null) {
      c = new FetchClient(e.host, e.port, options.token, options.timeoutMs, maxMessageBytes(List.of(topic)));
      clients.put(key, c);
    }
    return c;
  }

  /** Drop the connection to {@code e} and the partition's endpoint: the next call looks it up again. */
  private void forget(Zk.Endpoint e, String topic, int partition) {
    if (e != null) {
      FetchClient c = clients.remove(e.host + ":" + e.port);
      if (c != null) {
        c.close();
      }
    }
    endpoints.remove(topic + "-" + partition);
  }

  /** The host of the partition's endpoint now (Spark's preferred location of its reads), or null. */
  String host(String topic, int partition) {
    Zk.Endpoint e = endpoint(topic, partition);
    return e == null ? null : e.host;
  }

  /**
   * The partition's endpoint: looked up in ZooKeeper at most once per
   * {@link #ENDPOINT_TTL_MS} (a plan's OFFSETS and ranges share one lookup),
   * and again at once after {@link #call} found it unreachable.
   */
  private Zk.Endpoint endpoint(String topic, int partition) {
    String key = topic + "-" + partition;
    long now = System.currentTimeMillis();
    Zk.Endpoint e = endpoints.get(key);
    if (e == null || now - lookedUp.get(key) >= ENDPOINT_TTL_MS) {
      e = zk.endpoint(topic, partition);
      if (e == null) {
        endpoints.remove(key);
      } else {
        endpoints.put(key, e);
        lookedUp.put(key, now);
      }
    }
    return e;
  }

  /**
   * The largest message boundary in {@code (start, limit]} of the partition,
   * or the end of the first message at {@code start} when that one alone
   * passes {@code limit}: one FETCH from {@code start}.
   */
  long boundaryAtMost(String topic, int partition, long start, long limit, int maxMessageBytes) {
    return call(topic, partition, c -> {
      int want = (int) Math.max(MessageSet.HEADER_SIZE, Math.min(limit - start, c.maxDataBytes()));
      c.sendFetch(bytes(topic), partition, start, want);
      byte[] buf = c.readFetch(new byte[Math.min(want, 1 << 20)]);
      int n = c.dataLength;
      long from = MessageSet.dataStart(buf, n, start); // a record batch that holds start: from its start
      int whole = MessageSet.wholeMessages(buf, n, maxMessageBytes, from);
      if (whole == 0) { // one larger than the share
        int first = MessageSet.entryLength(buf, 0, n, maxMessageBytes, from);
        return first <= 0 ? from : MessageSet.entryNext(buf, 0, n, MessageSet.entryOffset(buf, 0, from), first);
      }
      // by the batches' own offsets: a cleaned segment's batches lie closer together than their offsets
      return MessageSet.nextOffsetAfter(buf, whole, from, limit, maxMessageBytes);
    });
  }

  /**
   * {@code {records, offset reached}}: the records of the partition from the record offset
   * {@code start} (a message boundary, or inside a compressed wrapper) up to the message boundary
   * {@code end}, at most {@code max} of them (-1: all), counted and checked by the partition
   * (COUNT version 1, repeated while its walk of at most 64 MiB stops short). The offset reached is
   * {@code end}, or the record offset after the last record counted.
   */
  long[] records(String topic, int partition, long start, long end, long max) {
    if (end <= start || max == 0) {
      return new long[] {0, start};
    }
    return call(topic, partition, c -> {
      long pos = start;
      long n = 0;
      while (pos < end && (max < 0 || n < max)) {
        long[] r = c.countRecords(bytes(topic), partition, pos, end, FetchClient.COUNT_MAX_BYTES, max < 0 ? -1 : max - n);
        if (r[1] <= pos && r[0] == 0) {
          break; // nothing more to count (cannot happen before end)
        }
        n += r[0];
        pos = r[1];
      }
      return new long[] {n, pos};
    });
  }

  /**
   * InvalidOffsetError unless a whole, valid message starts at {@code offset} or it lies inside a
   * compressed wrapper (the record offset of an inner message, docs/design.md §2) or a record
   * batch (a record's offset: the partition answers with the batch).
   */
  void checkBoundary(String topic, int partition, long offset, int maxMessageBytes) {
    call(topic, partition, c -> {
      c.sendFetch(bytes(topic), partition, offset, 64 * 1024);
      byte[] buf;
      try {
        buf = c.readFetch(new byte[64 * 1024]);
      } catch (RaylogReadException e) {
        if (e.code() == RaylogReadException.INVALID_OFFSET && e.longDetail("wrapper_offset", -1) >= 0) {
          return null;
        }
        throw e;
      }
      int n = c.dataLength;
      long from = MessageSet.dataStart(buf, n, offset);
      try {
        int whole = MessageSet.wholeMessages(buf, n, maxMessageBytes, from);
        if (whole > 0) {
          MessageSet set = new MessageSet(maxMessageBytes, 0);
          set.reset(buf, Math.min(whole, MessageSet.entryLength(buf, 0, n, maxMessageBytes, from)), from);
          set.next(); // the first record of the entry: its checks pass
        }
      } catch (RaylogReadException e) {
        throw new RaylogReadException(RaylogReadException.INVALID_OFFSET,
            "offset " + offset + " of " + topic + "-" + partition + " is not the start of a message ("
                + e.getMessage() + "); start and end offsets must be offsets the log gave out",
            null, e);
      }
      return null;
    });
  }

  interface Call<T> {
    T apply(FetchClient client);
  }

  /** Run a call on the partition's data socket, finding its endpoint again while it is unreachable. */
  <T> T call(String topic, int partition, Call<T> call) {
    long deadline = System.currentTimeMillis() + options.timeoutMs;
    int attempt = 0;
    for (;;) {
      RaylogReadException failure;
      Zk.Endpoint e = endpoint(topic, partition);
      if (e == null) {
        if (partition >= config(topic).path("partitions").asInt()) {
          throw new RaylogReadException(RaylogReadException.UNKNOWN_PARTITION,
              topic + " has no partition " + partition);
        }
        failure = new RaylogReadException(RaylogReadException.BROKER_UNAVAILABLE,
            "no partition actor serves " + topic + "-" + partition + " (no endpoint in ZooKeeper)");
      } else {
        FetchClient c = client(e, topic);
        try {
          return call.apply(c);
        } catch (RaylogReadException x) {
          if (!RangeReader.moved(x)) {
            throw x;
          }
          forget(e, topic, partition);
          failure = x;
        }
      }
      if (System.currentTimeMillis() >= deadline) {
        throw failure;
      }
      LOG.info("{}-{} is not reachable ({}); looking up its endpoint again", topic, partition, failure.getMessage());
      sleep(BACKOFF_MS[Math.min(attempt++, BACKOFF_MS.length - 1)]);
    }
  }

  static void sleep(long ms) {
    try {
      Thread.sleep(ms);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new RaylogReadException(RaylogReadException.REQUEST_TIMEOUT, "interrupted");
    }
  }

  static byte[] bytes(String topic) {
    return topic.getBytes(StandardCharsets.UTF_8);
  }

  /**
   * Concrete {@code [start, end)} of every partition for a batch read:
   * {@code starting}/{@code ending} are the option values (null: the
   * defaults). Explicit offsets are checked against the log: past the end
   * (OffsetOutOfRangeError), deleted (DataLossError, or moved up to the log
   * start without failOnDataLoss), off a message start (InvalidOffsetError).
   */
  Map<String, Map<Integer, long[]>> bounds(Map<String, Map<Integer, long[]>> logs, String starting,
      String ending, int maxMessageBytes) {
    Map<String, Map<Integer, Long>> start = spec("startingOffsets", starting, SourceOptions.EARLIEST, logs);
    Map<String, Map<Integer, Long>> end = spec("endingOffsets", ending, SourceOptions.LATEST, logs);
    Map<String, Map<Integer, long[]>> out = new TreeMap<>();
    for (Map.Entry<String, Map<Integer, long[]>> t : logs.entrySet()) {
      Map<Integer, long[]> parts = new TreeMap<>();
      for (Map.Entry<Integer, long[]> p : t.getValue().entrySet()) {
        String topic = t.getKey();
        int partition = p.getKey();
        long[] log = p.getValue();
        long s = resolve(topic, partition, start.get(topic).get(partition), log, "startingOffsets", maxMessageBytes);
        long e = resolve(topic, partition, end.get(topic).get(partition), log, "endingOffsets", maxMessageBytes);
        if (e < s) {
          throw SourceOptions.config(topic + "-" + partition + " starts at " + s + ", after its ending offset " + e);
        }
        parts.put(partition, new long[] {s, e});
      }
      out.put(t.getKey(), parts);
    }
    return out;
  }

  private static Map<String, Map<Integer, Long>> spec(String name, String raw, long fallback,
      Map<String, Map<Integer, long[]>> logs) {
    Long word = raw == null ? Long.valueOf(fallback) : SourceOptions.word(raw);
    Map<String, Map<Integer, Long>> given = word == null ? SourceOptions.parseJson(name, raw) : new HashMap<>();
    for (String topic : given.keySet()) {
      if (!logs.containsKey(topic)) {
        throw SourceOptions.config("option '" + name + "' names " + topic + ", which the query does not read");
      }
      for (int p : given.get(topic).keySet()) {
        if (!logs.get(topic).containsKey(p)) {
          throw new RaylogReadException(RaylogReadException.UNKNOWN_PARTITION,
              "option '" + name + "' names " + topic + "-" + p + ", but " + topic + " has partitions 0.."
                  + (logs.get(topic).size() - 1));
        }
      }
    }
    if (word == null) { // JSON: every partition read, as Spark's Kafka source requires
      List<String> missing = new ArrayList<>();
      for (Map.Entry<String, Map<Integer, long[]>> t : logs.entrySet()) {
        Map<Integer, Long> mine = given.getOrDefault(t.getKey(), Collections.emptyMap());
        for (int p : t.getValue().keySet()) {
          if (!mine.containsKey(p)) {
            missing.add(t.getKey() + "-" + p);
          }
        }
      }
      if (!missing.isEmpty()) {
        throw SourceOptions.config("option '" + name + "' gives specific offsets, so it must name every partition "
            + "the query reads (as in Spark's Kafka source; -2 for earliest, -1 for latest); it leaves out "
            + String.join(", ", missing));
      }
    }
    Map<String, Map<Integer, Long>> out = new TreeMap<>();
    for (Map.Entry<String, Map<Integer, long[]>> t : logs.entrySet()) {
      Map<Integer, Long> parts = new TreeMap<>();
      Map<Integer, Long> mine = given.getOrDefault(t.getKey(), new HashMap<>());
      for (int p : t.getValue().keySet()) {
        parts.put(p, mine.getOrDefault(p, word == null ? fallback : word));
      }
      out.put(t.getKey(), parts);
    }
    return out;
  }

  private long resolve(String topic, int partition, long spec, long[] log, String name, int maxMessageBytes) {
    if (spec == SourceOptions.EARLIEST) {
      return log[0];
    }
    if (spec == SourceOptions.LATEST) {
      return log[1];
    }
    if (spec > log[1]) {
      Map<String, Object> d = new HashMap<>();
      d.put("offset", spec);
      d.put("earliest", log[0]);
      d.put("latest", log[1]);
      throw new RaylogReadException(RaylogReadException.OFFSET_OUT_OF_RANGE,
          name + ": offset " + spec + " of " + topic + "-" + partition + " is past its end " + log[1], d, null);
    }
    if (spec < log[0]) {
      String lost = topic + "-" + partition + " [" + spec + ", " + log[0] + ")";
      if (options.failOnDataLoss) {
        Map<String, Object> d = new HashMap<>();
        d.put("offset", spec);
        d.put("earliest", log[0]);
        d.put("latest", log[1]);
        throw new RaylogReadException(RaylogReadException.DATA_LOSS,
            name + ": offsets " + lost + " were deleted by retention; start at 'earliest' or set failOnDataLoss "
                + "to false to skip them", d, null);
      }
      LOG.warn("{}: skipping {}, deleted by retention (failOnDataLoss=false)", name, lost);
      return log[0];
    }
    if (spec != log[0] && spec != log[1]) {
      checkBoundary(topic, partition, spec, maxMessageBytes);
    }
    return spec;
  }

  /**
   * The ranges of {@code bounds} that hold data, each preferring its
   * partition's host and listing the replicas that may serve it (the leader
   * and, for a replicated partition, its in-sync followers that run, as
   * {@code read_topic}'s plans do): a reader reads from the follower on its
   * own host and falls back to the leader ({@link RangeReader}).
   */
  List<ReadOptions.Range> ranges(Map<String, Map<Integer, long[]>> bounds) {
    List<ReadOptions.Range> out = new ArrayList<>();
    for (Map.Entry<String, Map<Integer, long[]>> t : bounds.entrySet()) {
      for (Map.Entry<Integer, long[]> p : t.getValue().entrySet()) {
        long[] b = p.getValue();
        if (b[1] > b[0]) {
          Zk.Endpoint e = endpoint(t.getKey(), p.getKey());
          String host = e == null ? "unknown" : e.host;
          int port = e == null ? 1 : e.port;
          out.add(new ReadOptions.Range(t.getKey(), p.getKey(), b[0], b[1], host, port,
              e == null ? null : options.location(host),
              replicas(t.getKey(), p.getKey(), e)));
        }
      }
    }
    return out;
  }

  /** The replicas of a range of the partition led at {@code leader} (empty: the leader alone). */
  private List<ReadOptions.Replica> replicas(String topic, int partition, Zk.Endpoint leader) {
    List<Zk.ReplicaEndpoint> found = zk.inSyncReplicas(topic, partition, leader);
    if (found.size() < 2) {
      return java.util.Collections.emptyList();
    }
    List<ReadOptions.Replica> out = new ArrayList<>();
    for (int i = 0; i < found.size(); i++) {
      Zk.ReplicaEndpoint r = found.get(i);
      out.add(new ReadOptions.Replica(r.node, r.host, r.port, options.location(r.host), i == 0));
    }
    return java.util.Collections.unmodifiableList(out);
  }

  @Override
  public void close() {
    for (FetchClient c : clients.values()) {
      c.close();
    }
    clients.clear();
    zk.close();
  }
}
