package org.raylog.spark;

import java.io.IOException;
import java.io.Serializable;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Collections;
import java.util.List;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * The options of a raylog read, as set by raylog's Python driver
 * ({@code raylog_spark.read_topic}). Immutable.
 *
 * <table>
 *   <caption>options</caption>
 *   <tr><th>option</th><th>meaning</th><th>default</th></tr>
 *   <tr><td>ranges</td><td>JSON array of ranges, each an object with topic (string), partition
 *       (int), start and end (byte offsets, message boundaries, end exclusive), host and port
 *       (the partition's data socket: its leader) and optionally location (the host of the node
 *       that serves it) and replicas (the replicas that may serve it, leader included: objects
 *       with node, host, port, location and leader; Spark prefers every one's host, and the
 *       reader reads from the one on its own host, else from the leader)</td><td>required</td></tr>
 *   <tr><td>token</td><td>the data sockets' shared token, base64</td><td>none (no AUTH)</td></tr>
 *   <tr><td>fetch_bytes</td><td>bytes asked for by one FETCH</td><td>8 MiB</td></tr>
 *   <tr><td>max_message_bytes</td><td>the topic's message size bound; replies may be at most
 *       this plus 64 KiB</td><td>1 MiB</td></tr>
 *   <tr><td>max_inflated_bytes</td><td>the topic's bound on a compressed wrapper's inflated
 *       inner set (topic setting max_inflated_bytes)</td><td>8 times max_message_bytes</td></tr>
 *   <tr><td>timeout_ms</td><td>read timeout of the data socket (a connect waits at most 2 s of it)</td><td>30000</td></tr>
 *   <tr><td>fail_on_data_loss</td><td>a range deleted by retention since planning fails the
 *       task (true) or is skipped and logged (false)</td><td>true</td></tr>
 *   <tr><td>locality</td><td>prefer the ranges' locations</td><td>true</td></tr>
 *   <tr><td>count_pushdown</td><td>a bare COUNT(*) is answered by the partitions' COUNT
 *       requests ({@link CountReader}); also for reads by name</td><td>true</td></tr>
 *   <tr><td>zookeeper, cluster</td><td>where readers look up the endpoint of a partition whose
 *       actor moved (its socket unreachable, NotOwnerError) for up to timeout_ms</td><td>none (no
 *       lookup: the task fails)</td></tr>
 * </table>
 */
final class ReadOptions implements Serializable {

  private static final long serialVersionUID = 1L;

  static final int KiB = 1024;
  static final int MiB = 1024 * KiB;

  /** A replica that may serve a range: its raylog node, data socket and host (location). Immutable. */
  static final class Replica implements Serializable {
    private static final long serialVersionUID = 1L;

    final String node;
    final String host;
    final int port;
    /** the host of its node (Spark's location), or null */
    final String location;
    final boolean leader;

    Replica(String node, String host, int port, String location, boolean leader) {
      this.node = node;
      this.host = host;
      this.port = port;
      this.location = location;
      this.leader = leader;
    }
  }

  /** One range of the plan: bytes [start, end) of a partition's log. Immutable. */
  static final class Range implements Serializable {
    private static final long serialVersionUID = 1L;

    final String topic;
    final int partition;
    final long start;
    final long end;
    final String host;
    final int port;
    /** the host of the node that serves the range (its leader's), or null */
    final String location;
    /** the replicas that may serve the range, leader included (empty: the leader alone) */
    final List<Replica> replicas;

    Range(String topic, int partition, long start, long end, String host, int port, String location) {
      this(topic, partition, start, end, host, port, location, Collections.emptyList());
    }

    Range(String topic, int partition, long start, long end, String host, int port, String location,
        List<Replica> replicas) {
      this.topic = topic;
      this.partition = partition;
      this.start = start;
      this.end = end;
      this.host = host;
      this.port = port;
      this.location = location;
      this.replicas = replicas;
    }

    /** The hosts Spark should prefer for this read: the location and every replica's, each once. */
    String[] locations() {
      java.util.LinkedHashSet<String> out = new java.util.LinkedHashSet<>();
      if (location != null) {
        out.add(location);
      }
      for (Replica r : replicas) {
        if (r.location != null) {
          out.add(r.location);
        }
      }
      return out.toArray(new String[0]);
    }

    /**
     * The follower this range is read from by a reader on {@code ownHost}:
     * the leader when it is on that host (or unknown), else the first
     * follower there; null for the leader.
     */
    Replica follower(String ownHost) {
      if (ownHost == null) {
        return null;
      }
      Replica chosen = null;
      for (Replica r : replicas) {
        if (ownHost.equals(r.location) || ownHost.equals(r.host)) {
          if (r.leader) {
            return null;
          }
          if (chosen == null) {
            chosen = r;
          }
        }
      }
      return chosen;
    }

    String describe() {
      return topic + "-" + partition + " [" + start + ", " + end + ")";
    }
  }

  /** What every reader of the read needs besides its range. Immutable. */
  static final class Settings implements Serializable {
    private static final long serialVersionUID = 1L;

    /** null: the data sockets need no AUTH */
    final byte[] token;
    final int fetchBytes;
    final int maxMessageBytes;
    /** bound on a wrapper's inflated inner set; 0: 8 times maxMessageBytes */
    final long maxInflatedBytes;
    final int timeoutMs;
    final boolean failOnDataLoss;
    /** ZooKeeper and cluster name to find a moved partition's endpoint again, or null */
    final String zookeeper;
    final String cluster;
    /** how the error of lost data names the setting that skips it */
    final String failOnDataLossName;

    Settings(byte[] token, int fetchBytes, int maxMessageBytes, long maxInflatedBytes, int timeoutMs,
        boolean failOnDataLoss, String zookeeper, String cluster) {
      this(token, fetchBytes, maxMessageBytes, maxInflatedBytes, timeoutMs, failOnDataLoss, zookeeper, cluster,
          "fail_on_data_loss=False");
    }

    Settings(byte[] token, int fetchBytes, int maxMessageBytes, long maxInflatedBytes, int timeoutMs,
        boolean failOnDataLoss, String zookeeper, String cluster, String failOnDataLossName) {
      this.failOnDataLossName = failOnDataLossName;
      this.token = token;
      this.fetchBytes = fetchBytes;
      this.maxMessageBytes = maxMessageBytes;
      this.maxInflatedBytes = maxInflatedBytes;
      this.timeoutMs = timeoutMs;
      this.failOnDataLoss = failOnDataLoss;
      this.zookeeper = zookeeper;
      this.cluster = cluster;
    }
  }

  final List<Range> ranges;
  final Settings settings;
  final boolean locality;

  ReadOptions(List<Range> ranges, Settings settings, boolean locality) {
    this.ranges = ranges;
    this.settings = settings;
    this.locality = locality;
  }

  static ReadOptions parse(CaseInsensitiveStringMap options) {
    String json = options.get("ranges");
    if (json == null) {
      throw new IllegalArgumentException(
          "the raylog source needs the option 'ranges' (a JSON array of byte ranges); "
              + "read topics with raylog_spark.read_topic, which plans them");
    }
    List<Range> ranges = parseRanges(json);
    byte[] token = null;
    String encoded = options.get("token");
    if (encoded != null && !encoded.isEmpty()) {
      try {
        token = Base64.getDecoder().decode(encoded);
      } catch (IllegalArgumentException e) {
        throw new IllegalArgumentException("raylog option 'token' must be base64: " + e.getMessage());
      }
    }
    int fetchBytes = positive(options, "fetch_bytes", 8 * MiB);
    int maxMessageBytes = positive(options, "max_message_bytes", MiB);
    int timeoutMs = positive(options, "timeout_ms", 30_000);
    boolean failOnDataLoss = options.getBoolean("fail_on_data_loss", true);
    boolean locality = options.getBoolean("locality", true);
    String zookeeper = options.get("zookeeper");
    String cluster = options.get("cluster");
    String inflated = options.get("max_inflated_bytes");
    long maxInflatedBytes;
    try {
      maxInflatedBytes = inflated == null ? 0 : Long.parseLong(inflated.trim());
    } catch (NumberFormatException e) {
      throw new IllegalArgumentException("raylog option 'max_inflated_bytes' must be an integer, got " + inflated);
    }
    Settings settings = new Settings(token, fetchBytes, maxMessageBytes, maxInflatedBytes, timeoutMs, failOnDataLoss,
        zookeeper == null || zookeeper.isEmpty() ? null : zookeeper, cluster == null ? "default" : cluster);
    return new ReadOptions(ranges, settings, locality);
  }

  private static int positive(CaseInsensitiveStringMap options, String key, int fallback) {
    String raw = options.get(key);
    if (raw == null) {
      return fallback;
    }
    try {
      int value = Integer.parseInt(raw.trim());
      if (value > 0) {
        return value;
      }
    } catch (NumberFormatException e) {
      // reported below
    }
    throw new IllegalArgumentException("raylog option '" + key + "' must be a positive int, got " + raw);
  }

  static List<Range> parseRanges(String json) {
    JsonNode root;
    try {
      root = new ObjectMapper().readTree(json);
    } catch (IOException e) {
      throw new IllegalArgumentException("raylog option 'ranges' is not valid JSON: " + e.getMessage(), e);
    }
    if (root == null || !root.isArray()) {
      throw new IllegalArgumentException("raylog option 'ranges' must be a JSON array of ranges");
    }
    List<Range> ranges = new ArrayList<>(root.size());
    for (int i = 0; i < root.size(); i++) {
      JsonNode node = root.get(i);
      String what = "raylog option 'ranges'[" + i + "]";
      if (!node.isObject()) {
        throw new IllegalArgumentException(what + " must be an object");
      }
      String topic = text(node, "topic", what);
      int partition = (int) number(node, "partition", what);
      long start = number(node, "start", what);
      long end = number(node, "end", what);
      String host = text(node, "host", what);
      int port = (int) number(node, "port", what);
      JsonNode loc = node.get("location");
      String location = loc == null || loc.isNull() || loc.asText().isEmpty() ? null : loc.asText();
      if (start < 0 || end < start) {
        throw new IllegalArgumentException(what + " has start " + start + " and end " + end);
      }
      if (partition < 0 || port <= 0 || port > 0xFFFF) {
        throw new IllegalArgumentException(what + " has partition " + partition + " and port " + port);
      }
      List<Replica> replicas = new ArrayList<>();
      JsonNode listed = node.get("replicas");
      if (listed != null && !listed.isNull()) {
        if (!listed.isArray()) {
          throw new IllegalArgumentException(what + " has 'replicas' that is not an array");
        }
        for (int k = 0; k < listed.size(); k++) {
          JsonNode r = listed.get(k);
          String in = what + ".replicas[" + k + "]";
          if (!r.isObject()) {
            throw new IllegalArgumentException(in + " must be an object");
          }
          int rport = (int) number(r, "port", in);
          if (rport <= 0 || rport > 0xFFFF) {
            throw new IllegalArgumentException(in + " has port " + rport);
          }
          JsonNode rloc = r.get("location");
          replicas.add(new Replica(text(r, "node", in), text(r, "host", in), rport,
              rloc == null || rloc.isNull() || rloc.asText().isEmpty() ? null : rloc.asText(),
              r.path("leader").asBoolean(false)));
        }
      }
      ranges.add(new Range(topic, partition, start, end, host, port, location,
          Collections.unmodifiableList(replicas)));
    }
    return Collections.unmodifiableList(ranges);
  }

  private static String text(JsonNode node, String field, String what) {
    JsonNode value = node.get(field);
    if (value == null || !value.isTextual()) {
      throw new IllegalArgumentException(what + " needs a string '" + field + "'");
    }
    return value.asText();
  }

  private static long number(JsonNode node, String field, String what) {
    JsonNode value = node.get(field);
    if (value == null || !value.canConvertToLong() || !value.isIntegralNumber()) {
      throw new IllegalArgumentException(what + " needs an integer '" + field + "'");
    }
    return value.asLong();
  }
}
