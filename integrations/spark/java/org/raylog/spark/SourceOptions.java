package org.raylog.spark;

import java.io.IOException;
import java.io.Serializable;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Collections;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.regex.Pattern;
import java.util.regex.PatternSyntaxException;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * The options of a read by name, {@code spark.read.format("raylog")} and
 * {@code spark.readStream.format("raylog")}, with the names of Spark's Kafka
 * source. Immutable.
 *
 * <table>
 *   <caption>options</caption>
 *   <tr><th>option</th><th>meaning</th><th>default</th></tr>
 *   <tr><td>assign, subscribe, subscribePattern</td><td>exactly one: JSON {@code {"topic": [0, 1]}}
 *       (those partitions), topics comma-separated, or a Java regular expression matched against
 *       whole names</td><td>required</td></tr>
 *   <tr><td>startingOffsets</td><td>{@code earliest}, {@code latest} (streaming only) or JSON
 *       {@code {"topic": {"0": 1234, "1": -2}}} (byte offsets at message starts; -2 earliest,
 *       -1 latest) naming every partition of every topic read, as Spark's Kafka source requires
 *       (ConfigError naming the partitions left out)</td><td>batch: earliest,
 *       streaming: latest</td></tr>
 *   <tr><td>endingOffsets</td><td>batch only: {@code latest} or JSON as above, no earliest; JSON
 *       names every partition, as Spark's Kafka source requires</td><td>latest</td></tr>
 *   <tr><td>startingTimestamp, startingOffsetsByTimestamp</td><td>ms since the epoch (one for all, or
 *       JSON per partition naming every partition): a partition starts at its first message at or
 *       after the time (OFFSETS_FOR_TIME); one with none fails the read, or starts at its end with
 *       startingOffsetsByTimestampStrategy=latest. As in Spark's Kafka source, startingTimestamp
 *       wins over startingOffsetsByTimestamp, which wins over startingOffsets</td><td></td></tr>
 *   <tr><td>endingTimestamp, endingOffsetsByTimestamp</td><td>batch only: a partition ends before its
 *       first message at or after the time, or at latest when it has none; endingTimestamp wins over
 *       endingOffsetsByTimestamp, which wins over endingOffsets</td><td></td></tr>
 *   <tr><td>includeHeaders</td><td>the column {@code headers} after Spark's Kafka columns</td>
 *       <td>false</td></tr>
 *   <tr><td>includeNextOffset</td><td>raylog's column {@code next_offset} (where to resume after the
 *       message), last</td><td>false</td></tr>
 *   <tr><td>kafka.bootstrap.servers</td><td>{@code host:port} entries, each one of the cluster's Kafka
 *       listeners (ZooKeeper {@code kafka/listeners}): a check that the read names the cluster the
 *       options' ZooKeeper holds; one that is not: ConfigError naming the listeners. The cluster is
 *       still found through ZooKeeper</td><td></td></tr>
 *   <tr><td>failOnDataLoss</td><td>offsets deleted by retention, or a topic deleted under a stream,
 *       fail the query (true) or are skipped with a warning in the driver's log (false)</td><td>true</td></tr>
 *   <tr><td>minPartitions</td><td>ranges cut at message boundaries into at least this many Spark
 *       partitions ({@link Cluster#split})</td><td></td></tr>
 *   <tr><td>maxOffsetsPerTrigger</td><td>streaming: at most this many records per
 *       micro-batch, shared by the partitions in proportion to their backlog in records (Kafka's
 *       rate limit: each share rounded down, a share under one record rounded up); the offset
 *       after a share is found by the partition (COUNT version 1) and may lie inside a
 *       compressed set</td><td>no limit</td></tr>
 *   <tr><td>minOffsetsPerTrigger, maxTriggerDelay</td><td>streaming: a trigger with fewer than
 *       minOffsetsPerTrigger records available runs no batch, unless maxTriggerDelay (a time
 *       such as {@code 30s}) has passed since the last batch</td><td>none; 15m</td></tr>
 *   <tr><td>zookeeper</td><td>host:port of the cluster's ZooKeeper</td><td>Spark conf
 *       {@code spark.raylog.zookeeper} (set by {@code raylog_spark.init_spark}), else
 *       {@code $RAYLOG_ZOOKEEPER}</td></tr>
 *   <tr><td>cluster</td><td>the raylog cluster name</td><td>{@code spark.raylog.cluster}, else
 *       {@code $RAYLOG_CLUSTER}, else default</td></tr>
 *   <tr><td>token</td><td>the data sockets' token, base64</td><td>{@code spark.raylog.token},
 *       else {@code $RAYLOG_TOKEN} (text), else derived from Ray's auth token as raylog.auth
 *       does</td></tr>
 *   <tr><td>(Spark conf) spark.raylog.localHost</td><td>the Ray node address of this machine:
 *       Spark's preferred location of a partition served on a loopback address (a cluster on one
 *       machine), so that it matches the executors' hosts; set by {@code raylog_spark.use_cluster}
 *       </td><td>none: the endpoint's host</td></tr>
 *   <tr><td>fetch_bytes, timeout_ms</td><td>as in {@link ReadOptions} (timeout_ms defaults to
 *       kafkaConsumer.pollTimeoutMs when that is given)</td><td></td></tr>
 *   <tr><td>others</td><td>refused by name ({@link OptionNames})</td><td></td></tr>
 *   <tr><td>value_format, avro_schema_id, flatten</td><td>typed Avro values, see
 *       {@link AvroSpec}</td><td>binary</td></tr>
 * </table>
 */
final class SourceOptions implements Serializable {

  private static final long serialVersionUID = 1L;
  static final long EARLIEST = -2;
  static final long LATEST = -1;

  final String zookeeper;
  final String cluster;
  final byte[] token;
  final List<String> subscribe;
  final String pattern;
  final String startingOffsets;
  final String endingOffsets;
  final Long startingTimestamp;
  final Long endingTimestamp;
  /** startingOffsetsByTimestamp / endingOffsetsByTimestamp: topic -> partition -> ms, or null */
  final Map<String, Map<Integer, Long>> startingByTimestamp;
  final Map<String, Map<Integer, Long>> endingByTimestamp;
  /** startingOffsetsByTimestampStrategy=latest: a partition with no message at or after the time starts at its end */
  final boolean latestWhenNoTimestampMatch;
  /** assign: topic -> the partitions read, or null (subscribe, subscribePattern) */
  final Map<String, List<Integer>> assign;
  /** minPartitions, 0 when not given */
  final long minPartitions;
  final boolean failOnDataLoss;
  /** streaming: the most records per micro-batch; 0 for no limit */
  final long maxOffsetsPerTrigger;
  /** streaming: the fewest records for a micro-batch (before maxTriggerDelayMs); 0 for none */
  final long minOffsetsPerTrigger;
  /** streaming: with minOffsetsPerTrigger, a batch runs anyway this long after the last one */
  final long maxTriggerDelayMs;
  /** Spark's Kafka source's default maxTriggerDelay, 15 minutes */
  static final long DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000L;
  final int fetchBytes;
  final int timeoutMs;
  /** Spark conf spark.raylog.localHost: the location of a loopback endpoint, or null */
  final String localHost;
  /** kafka.bootstrap.servers as {@code host:port} entries, or null; checked against the cluster's listeners */
  final List<String> bootstrapServers;

  /** Where the cluster is and its token. Immutable. */
  static final class Connection implements Serializable {
    private static final long serialVersionUID = 1L;
    final String zookeeper;
    final String cluster;
    final byte[] token;

    Connection(String zookeeper, String cluster, byte[] token) {
      this.zookeeper = zookeeper;
      this.cluster = cluster;
      this.token = token;
    }
  }

  /** The cluster of the options: option, else Spark conf spark.raylog.*, else environment. */
  static Connection connection(CaseInsensitiveStringMap o) {
    String zk = setting(o, "zookeeper", "RAYLOG_ZOOKEEPER");
    if (zk == null || zk.isEmpty()) {
      throw config("the raylog source needs the option 'zookeeper' (host:port of the cluster's ZooKeeper), "
          + "the Spark conf spark.raylog.zookeeper (raylog_spark.init_spark sets it after raylog.connect()) "
          + "or $RAYLOG_ZOOKEEPER");
    }
    String c = setting(o, "cluster", "RAYLOG_CLUSTER");
    String cluster = c == null || c.isEmpty() ? "default" : c;
    return new Connection(zk, cluster, token(o, cluster));
  }

  private SourceOptions(CaseInsensitiveStringMap o) {
    OptionNames.check(o, OptionNames.Use.READ_BY_NAME);
    Connection connection = connection(o);
    this.zookeeper = connection.zookeeper;
    this.cluster = connection.cluster;
    this.token = connection.token;
    String topics = o.get("subscribe");
    String pat = o.get("subscribePattern");
    String assigned = o.get("assign");
    int chosen = (topics == null ? 0 : 1) + (pat == null ? 0 : 1) + (assigned == null ? 0 : 1);
    if (chosen != 1) {
      throw config((chosen == 0 ? "one" : "only one") + " of the options 'assign' (JSON {\"topic\": [0, 1]}), "
          + "'subscribe' (topics, comma-separated) and 'subscribePattern' (a regular expression) must be given, "
          + "as for Spark's Kafka source");
    }
    List<String> names = new ArrayList<>();
    if (topics != null) {
      for (String t : topics.split(",")) {
        if (!t.trim().isEmpty()) {
          names.add(t.trim());
        }
      }
      if (names.isEmpty()) {
        throw config("option 'subscribe' names no topic");
      }
    } else if (pat != null) {
      try {
        Pattern.compile(pat);
      } catch (PatternSyntaxException e) {
        throw config("option 'subscribePattern' is not a regular expression: " + e.getMessage());
      }
    }
    this.assign = assigned == null ? null : parseAssign(assigned);
    if (assign != null) {
      names.addAll(assign.keySet());
    }
    this.subscribe = Collections.unmodifiableList(names);
    this.pattern = pat;
    this.startingOffsets = o.get("startingOffsets");
    this.endingOffsets = o.get("endingOffsets");
    if (endingOffsets != null && endingOffsets.trim().equalsIgnoreCase("earliest")) {
      throw config("option 'endingOffsets' can't be 'earliest' (as in Spark's Kafka source); give 'latest' or "
          + "JSON offsets");
    }
    // as Spark's Kafka source: startingTimestamp wins over startingOffsetsByTimestamp, which wins over
    // startingOffsets (the same for the ending options); an option that loses is not used
    String ts = o.get("startingTimestamp");
    String ets = o.get("endingTimestamp");
    this.startingTimestamp = ts == null ? null : parseLong("startingTimestamp", ts);
    this.endingTimestamp = ets == null ? null : parseLong("endingTimestamp", ets);
    this.startingByTimestamp =
        ts != null ? null : timestamps("startingOffsetsByTimestamp", o.get("startingOffsetsByTimestamp"));
    this.endingByTimestamp =
        ets != null ? null : timestamps("endingOffsetsByTimestamp", o.get("endingOffsetsByTimestamp"));
    String servers = o.get("kafka.bootstrap.servers");
    this.bootstrapServers = servers == null ? null : bootstrap(servers);
    String strategy = o.getOrDefault("startingOffsetsByTimestampStrategy", "error").trim().toLowerCase();
    if (!strategy.equals("error") && !strategy.equals("latest")) {
      throw config("option 'startingOffsetsByTimestampStrategy' must be 'error' or 'latest', got " + strategy);
    }
    this.latestWhenNoTimestampMatch = strategy.equals("latest");
    String fail = o.containsKey("failOnDataLoss") ? o.get("failOnDataLoss") : o.getOrDefault("fail_on_data_loss", "true");
    if (!fail.trim().equalsIgnoreCase("true") && !fail.trim().equalsIgnoreCase("false")) {
      throw config("option 'failOnDataLoss' must be 'true' or 'false', got " + fail);
    }
    this.failOnDataLoss = fail.trim().equalsIgnoreCase("true");
    String mp = o.get("minPartitions");
    this.minPartitions = mp == null ? 0 : parseLong("minPartitions", mp);
    if (mp != null && (minPartitions <= 0 || minPartitions > Integer.MAX_VALUE)) {
      throw config("option 'minPartitions' must be a positive integer, got " + mp);
    }
    String max = o.get("maxOffsetsPerTrigger");
    this.maxOffsetsPerTrigger = max == null ? 0 : parseLong("maxOffsetsPerTrigger", max);
    if (max != null && maxOffsetsPerTrigger <= 0) {
      throw config("option 'maxOffsetsPerTrigger' must be a positive number of records, got " + max);
    }
    String min = o.get("minOffsetsPerTrigger");
    this.minOffsetsPerTrigger = min == null ? 0 : parseLong("minOffsetsPerTrigger", min);
    if (min != null && minOffsetsPerTrigger <= 0) {
      throw config("option 'minOffsetsPerTrigger' must be a positive number of records, got " + min);
    }
    String delay = o.get("maxTriggerDelay");
    if (delay != null && min == null) {
      throw config("option 'maxTriggerDelay' goes with minOffsetsPerTrigger (as in Spark's Kafka source); "
          + "set both, or leave maxTriggerDelay out");
    }
    try {
      this.maxTriggerDelayMs = delay == null ? DEFAULT_MAX_TRIGGER_DELAY_MS
          : org.apache.spark.network.util.JavaUtils.timeStringAsMs(delay.trim());
    } catch (NumberFormatException e) {
      throw config("option 'maxTriggerDelay' must be a time such as 30s or 15m, got " + delay);
    }
    if (maxTriggerDelayMs < 0) {
      throw config("option 'maxTriggerDelay' must not be negative, got " + delay);
    }
    this.fetchBytes = (int) positive(o, "fetch_bytes", 8 * ReadOptions.MiB);
    long poll = positive(o, "kafkaConsumer.pollTimeoutMs", 30_000);
    this.timeoutMs = (int) positive(o, "timeout_ms", poll);
    String local = sparkConf("spark.raylog.localHost");
    this.localHost = local == null || local.isEmpty() ? null : local;
  }

  /**
   * Spark's preferred location of a partition served at {@code host}: the
   * host itself, or {@link #localHost} for a loopback address (the executors
   * register with the node's address, never a loopback one).
   */
  String location(String host) {
    if (host == null || localHost == null) {
      return host;
    }
    boolean loopback = host.equals("localhost") || host.startsWith("127.") || host.equals("::1");
    return loopback ? localHost : host;
  }

  /**
   * Checks of a batch read (Spark's Kafka source's rules): no 'latest' start,
   * no 'earliest' end, no stream-only option.
   */
  void checkBatch() {
    if (maxOffsetsPerTrigger > 0) {
      throw config("option 'maxOffsetsPerTrigger' is for streaming reads (spark.readStream)");
    }
    if (minOffsetsPerTrigger > 0) {
      throw config("option 'minOffsetsPerTrigger' is for streaming reads (spark.readStream)");
    }
    if (startingOffsets != null && startingTimestamp == null && startingByTimestamp == null) {
      Long w = word(startingOffsets);
      if (w != null && w == LATEST) {
        throw config("option 'startingOffsets' can't be 'latest' for batch queries (as in Spark's Kafka "
            + "source); use 'earliest' or JSON offsets");
      }
      if (w == null) {
        for (Map.Entry<String, Map<Integer, Long>> t : parseJson("startingOffsets", startingOffsets).entrySet()) {
          for (Map.Entry<Integer, Long> p : t.getValue().entrySet()) {
            if (p.getValue() == LATEST) {
              throw config("option 'startingOffsets': the offset of " + t.getKey() + "-" + p.getKey()
                  + " can't be -1 (latest) for batch queries (as in Spark's Kafka source)");
            }
          }
        }
      }
    }
    if (endingOffsets != null && word(endingOffsets) == null) {
      for (Map.Entry<String, Map<Integer, Long>> t : parseJson("endingOffsets", endingOffsets).entrySet()) {
        for (Map.Entry<Integer, Long> p : t.getValue().entrySet()) {
          if (p.getValue() == EARLIEST) {
            throw config("option 'endingOffsets': the offset of " + t.getKey() + "-" + p.getKey()
                + " can't be -2 (earliest) for batch queries (as in Spark's Kafka source)");
          }
        }
      }
    }
  }

  /** Checks of a streaming read: no ending option (as Spark's Kafka source). */
  static void checkStream(CaseInsensitiveStringMap o) {
    for (String name : new String[] {"endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"}) {
      if (o.containsKey(name)) {
        throw config("option '" + name + "' is for batch reads; a stream reads on as data comes");
      }
    }
  }

  /** The {@code host:port} entries of kafka.bootstrap.servers (comma-separated, as Kafka's clients take them). */
  private static List<String> bootstrap(String raw) {
    List<String> out = new ArrayList<>();
    for (String part : raw.split(",")) {
      String s = part.trim();
      if (s.isEmpty()) {
        continue;
      }
      int colon = s.lastIndexOf(':');
      boolean ok = colon > 0 && colon < s.length() - 1;
      if (ok) {
        try {
          int port = Integer.parseInt(s.substring(colon + 1));
          ok = port > 0 && port < 65536;
        } catch (NumberFormatException e) {
          ok = false;
        }
      }
      if (!ok) {
        throw config("option 'kafka.bootstrap.servers' must be host:port entries, comma-separated; got " + raw);
      }
      out.add(s);
    }
    if (out.isEmpty()) {
      throw config("option 'kafka.bootstrap.servers' names no server");
    }
    return Collections.unmodifiableList(out);
  }

  /** {@code topic -> partitions} of the option {@code assign}. */
  private static Map<String, List<Integer>> parseAssign(String raw) {
    JsonNode root;
    try {
      root = new ObjectMapper().readTree(raw);
    } catch (IOException e) {
      root = null;
    }
    if (root == null || !root.isObject() || root.size() == 0) {
      throw config("option 'assign' must be a JSON object {\"topic\": [0, 1]}, got " + raw);
    }
    Map<String, List<Integer>> out = new TreeMap<>();
    for (Iterator<Map.Entry<String, JsonNode>> it = root.fields(); it.hasNext();) {
      Map.Entry<String, JsonNode> t = it.next();
      if (!t.getValue().isArray()) {
        throw config("option 'assign': the partitions of " + t.getKey() + " must be a JSON array, got " + t.getValue());
      }
      List<Integer> parts = new ArrayList<>();
      for (JsonNode p : t.getValue()) {
        if (!p.isIntegralNumber() || p.asInt() < 0) {
          throw config("option 'assign': " + t.getKey() + " has partition " + p + ", not a partition number");
        }
        parts.add(p.asInt());
      }
      out.put(t.getKey(), Collections.unmodifiableList(parts));
    }
    return Collections.unmodifiableMap(out);
  }

  /** {@code topic -> partition -> ms since the epoch} of a ...ByTimestamp option, or null. */
  private static Map<String, Map<Integer, Long>> timestamps(String name, String raw) {
    if (raw == null) {
      return null;
    }
    Map<String, Map<Integer, Long>> out = parseJson(name, raw);
    for (Map.Entry<String, Map<Integer, Long>> t : out.entrySet()) {
      for (Map.Entry<Integer, Long> p : t.getValue().entrySet()) {
        if (p.getValue() < 0) {
          throw config("option '" + name + "': " + t.getKey() + "-" + p.getKey()
              + " must be a time in ms since the epoch, got " + p.getValue());
        }
      }
    }
    return out;
  }

  static SourceOptions parse(CaseInsensitiveStringMap options) {
    return new SourceOptions(options);
  }

  /** The topics the options select, sorted, from the cluster's topics. */
  List<String> topics(Zk zk) {
    if (pattern == null) { // subscribe, or the topics of assign
      return subscribe;
    }
    Pattern p = Pattern.compile(pattern);
    List<String> out = new ArrayList<>();
    for (String t : zk.topics()) {
      if (p.matcher(t).matches()) {
        out.add(t);
      }
    }
    return out;
  }

  /**
   * A JSON offsets option as {@code topic -> partition -> offset} (-2 earliest,
   * -1 latest), or null for {@code earliest}/{@code latest} given as a word,
   * which {@link #word} tells apart.
   */
  static Map<String, Map<Integer, Long>> parseJson(String name, String raw) {
    JsonNode root;
    try {
      root = new ObjectMapper().readTree(raw);
    } catch (IOException e) {
      throw config("option '" + name + "' must be 'earliest', 'latest' or JSON offsets, got " + raw);
    }
    if (root == null || !root.isObject()) {
      throw config("option '" + name + "' must be a JSON object {\"topic\": {\"0\": offset}}, got " + raw);
    }
    Map<String, Map<Integer, Long>> out = new TreeMap<>();
    for (Iterator<Map.Entry<String, JsonNode>> it = root.fields(); it.hasNext();) {
      Map.Entry<String, JsonNode> topic = it.next();
      if (!topic.getValue().isObject()) {
        throw config("option '" + name + "': the offsets of " + topic.getKey() + " must be an object");
      }
      Map<Integer, Long> parts = new TreeMap<>();
      for (Iterator<Map.Entry<String, JsonNode>> p = topic.getValue().fields(); p.hasNext();) {
        Map.Entry<String, JsonNode> e = p.next();
        int partition;
        try {
          partition = Integer.parseInt(e.getKey());
        } catch (NumberFormatException x) {
          throw config("option '" + name + "': partition " + e.getKey() + " of " + topic.getKey() + " is not a number");
        }
        if (!e.getValue().isIntegralNumber() || e.getValue().asLong() < EARLIEST) {
          throw config("option '" + name + "': " + topic.getKey() + "-" + partition
              + " must be a byte offset, -2 (earliest) or -1 (latest), got " + e.getValue());
        }
        parts.put(partition, e.getValue().asLong());
      }
      out.put(topic.getKey(), parts);
    }
    return out;
  }

  /** {@code earliest} (-2), {@code latest} (-1), or null when {@code raw} is JSON. */
  static Long word(String raw) {
    String w = raw.trim().toLowerCase();
    if (w.equals("earliest")) {
      return EARLIEST;
    }
    if (w.equals("latest")) {
      return LATEST;
    }
    return null;
  }

  private static String setting(CaseInsensitiveStringMap o, String key, String env) {
    String v = o.get(key);
    if (v == null) {
      v = sparkConf("spark.raylog." + key);
    }
    if (v == null) {
      v = System.getenv(env);
    }
    return v;
  }

  private static byte[] token(CaseInsensitiveStringMap o, String cluster) {
    String encoded = o.get("token");
    if (encoded == null) {
      encoded = sparkConf("spark.raylog.token");
    }
    if (encoded != null && !encoded.isEmpty()) {
      try {
        return Base64.getDecoder().decode(encoded);
      } catch (IllegalArgumentException e) {
        throw config("raylog option 'token' must be base64: " + e.getMessage());
      }
    }
    String text = System.getenv("RAYLOG_TOKEN");
    if (text != null && !text.isEmpty()) {
      return text.getBytes(StandardCharsets.UTF_8);
    }
    return derivedToken(cluster);
  }

  /**
   * The cluster token as raylog.auth derives it from Ray's auth token
   * ({@code hex(HMAC-SHA256(ray token, "raylog:" + cluster))}), read as Ray
   * reads it: {@code $RAY_AUTH_TOKEN}, the file {@code $RAY_AUTH_TOKEN_PATH},
   * else {@code ~/.ray/auth_token}; null without one or with
   * {@code RAY_AUTH_MODE=disabled}.
   */
  static byte[] derivedToken(String cluster) {
    String mode = System.getenv("RAY_AUTH_MODE");
    if (mode != null && mode.equalsIgnoreCase("disabled")) {
      return null;
    }
    String raw = System.getenv("RAY_AUTH_TOKEN");
    byte[] rayToken = raw == null || raw.trim().isEmpty() ? null : raw.trim().getBytes(StandardCharsets.UTF_8);
    if (rayToken == null) {
      String path = System.getenv("RAY_AUTH_TOKEN_PATH");
      if (path == null || path.isEmpty()) {
        path = System.getProperty("user.home") + "/.ray/auth_token";
      }
      try {
        String text = new String(java.nio.file.Files.readAllBytes(java.nio.file.Paths.get(path)),
            StandardCharsets.UTF_8).trim();
        rayToken = text.isEmpty() ? null : text.getBytes(StandardCharsets.UTF_8);
      } catch (IOException | RuntimeException e) {
        return null;
      }
    }
    if (rayToken == null) {
      return null;
    }
    try {
      javax.crypto.Mac mac = javax.crypto.Mac.getInstance("HmacSHA256");
      mac.init(new javax.crypto.spec.SecretKeySpec(rayToken, "HmacSHA256"));
      byte[] digest = mac.doFinal(("raylog:" + cluster).getBytes(StandardCharsets.UTF_8));
      StringBuilder hex = new StringBuilder(digest.length * 2);
      for (byte b : digest) {
        hex.append(String.format("%02x", b & 0xFF));
      }
      return hex.toString().getBytes(StandardCharsets.UTF_8);
    } catch (java.security.GeneralSecurityException e) {
      return null;
    }
  }

  private static String sparkConf(String key) {
    try {
      scala.Option<SparkSession> active = SparkSession.getActiveSession();
      if (active.isEmpty()) {
        return null;
      }
      return active.get().conf().get(key, null);
    } catch (RuntimeException e) {
      return null;
    }
  }

  private static long parseLong(String key, String raw) {
    try {
      return Long.parseLong(raw.trim());
    } catch (NumberFormatException e) {
      throw config("option '" + key + "' must be an integer, got " + raw);
    }
  }

  private static long positive(CaseInsensitiveStringMap o, String key, long fallback) {
    String raw = o.get(key);
    if (raw == null) {
      return fallback;
    }
    long v = parseLong(key, raw);
    if (v <= 0 || v > Integer.MAX_VALUE) {
      throw config("option '" + key + "' must be a positive int, got " + raw);
    }
    return v;
  }

  static RaylogReadException config(String message) {
    return new RaylogReadException(RaylogReadException.CONFIG, message);
  }
}
