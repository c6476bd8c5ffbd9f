package org.raylog.spark;

import java.io.Closeable;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

import org.apache.zookeeper.KeeperException;
import org.apache.zookeeper.ZooKeeper;

/**
 * What the raylog source reads from the cluster's ZooKeeper (docs/design.md section 4,
 * root {@code /raylog/<cluster>}): the topics, a topic's config (JSON: its
 * {@code partitions} and {@code max_message_bytes}) and a partition's endpoint
 * ({@code topics/<topic>/partitions/<p>/endpoint}, JSON with {@code host} and
 * {@code port}, present while a partition actor serves), a replicated
 * partition's in-sync replicas that serve reads ({@code state} and
 * {@code replicas/<node>}, {@link #inSyncReplicas}) and the registered
 * Avro schemas ({@code schemas/<id>}, see raylog/zk/schemas.py). Reads only; no
 * watches. The session is the JVM's shared one with that ZooKeeper
 * ({@link ZkSessions}); opening one waits at most {@code timeoutMs}.
 *
 * <p>Thread-safe (the ZooKeeper client is).
 */
final class Zk implements Closeable {

  private static final ObjectMapper JSON = new ObjectMapper();

  private final ZooKeeper zk;
  private final ZkSessions.Session session;
  private final String root;
  private final String connect;
  private boolean closed;

  /** Endpoint of a partition: its data socket. Immutable. */
  static final class Endpoint {
    final String host;
    final int port;

    Endpoint(String host, int port) {
      this.host = host;
      this.port = port;
    }
  }

  /**
   * A view of {@code cluster} in the ZooKeeper at {@code connect}, on the
   * JVM's shared session with it ({@link ZkSessions}: opened when there is
   * none, waiting at most {@code timeoutMs}); {@link #close} gives it back.
   */
  Zk(String connect, String cluster, int timeoutMs) {
    this.connect = connect;
    this.root = "/raylog/" + cluster;
    this.session = ZkSessions.acquire(connect, timeoutMs);
    this.zk = session.zk;
  }

  /** The topics of the cluster, sorted. */
  List<String> topics() {
    List<String> names = children(root + "/topics");
    return names == null ? Collections.emptyList() : names;
  }

  /** The topic's config JSON; UnknownTopicError when there is no such topic. */
  JsonNode config(String topic) {
    byte[] data = data(root + "/topics/" + topic);
    if (data == null) {
      throw new RaylogReadException(RaylogReadException.UNKNOWN_TOPIC,
          "no topic " + topic + " in the raylog cluster " + root.substring(8) + " at " + connect
              + " (topics: " + topics() + ")");
    }
    try {
      return JSON.readTree(data);
    } catch (IOException e) {
      throw new RaylogReadException(RaylogReadException.PROTOCOL, "topic " + topic + " has a config that is not JSON");
    }
  }

  /** The partition's endpoint, or null while no partition actor serves it. */
  Endpoint endpoint(String topic, int partition) {
    return parseEndpoint(topic, partition, data(endpointPath(topic, partition)));
  }

  /**
   * The endpoints of partitions {@code 0..count-1} of {@code topic} (null
   * where no partition actor serves), asked of ZooKeeper all at once and
   * waited for at most {@code timeoutMs}.
   */
  Endpoint[] endpoints(String topic, int count, int timeoutMs) {
    byte[][] found = new byte[count][];
    AtomicInteger failure = new AtomicInteger(KeeperException.Code.OK.intValue());
    CountDownLatch done = new CountDownLatch(count);
    for (int p = 0; p < count; p++) {
      final int partition = p;
      zk.getData(endpointPath(topic, p), false, (rc, path, ctx, data, stat) -> {
        if (rc == KeeperException.Code.OK.intValue()) {
          found[partition] = data;
        } else if (rc != KeeperException.Code.NONODE.intValue()) {
          failure.set(rc);
        }
        done.countDown();
      }, null);
    }
    boolean ok;
    try {
      ok = done.await(timeoutMs, TimeUnit.MILLISECONDS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      ok = false;
    }
    String where = root + "/topics/" + topic + "/partitions";
    if (!ok) {
      throw unavailable(where, new IllegalStateException("no answer within " + timeoutMs + " ms"));
    }
    if (failure.get() != KeeperException.Code.OK.intValue()) {
      throw unavailable(where, KeeperException.create(KeeperException.Code.get(failure.get())));
    }
    Endpoint[] out = new Endpoint[count];
    for (int p = 0; p < count; p++) {
      out[p] = parseEndpoint(topic, p, found[p]);
    }
    return out;
  }

  private String endpointPath(String topic, int partition) {
    return root + "/topics/" + topic + "/partitions/" + partition + "/endpoint";
  }

  private static Endpoint parseEndpoint(String topic, int partition, byte[] data) {
    if (data == null) {
      return null;
    }
    try {
      JsonNode node = JSON.readTree(data);
      return new Endpoint(node.get("host").asText(), node.get("port").asInt());
    } catch (IOException | RuntimeException e) {
      throw new RaylogReadException(RaylogReadException.PROTOCOL,
          "the endpoint of " + topic + "-" + partition + " is not the JSON {host, port}: "
              + new String(data, StandardCharsets.UTF_8));
    }
  }

  /** A replica actor of a partition that runs now ({@code replicas/<node>}): its node and data socket. Immutable. */
  static final class ReplicaEndpoint {
    final String node;
    final String host;
    final int port;

    ReplicaEndpoint(String node, String host, int port) {
      this.node = node;
      this.host = host;
      this.port = port;
    }
  }

  /**
   * The replicas that may serve reads of {@code topic}-{@code partition},
   * leader first, as {@code raylog.read.replicas.find_candidates} finds them:
   * from the partition's {@code state} (JSON with {@code leader} and
   * {@code isr}, docs/design.md section 4) every in-sync replica whose
   * {@code replicas/<node>} node holds an endpoint. Empty (the leader alone)
   * for a partition without replication, when the state's leader is not the
   * replica at {@code leader} (a change under way), or when the state cannot
   * be read as JSON.
   */
  List<ReplicaEndpoint> inSyncReplicas(String topic, int partition, Endpoint leader) {
    String base = root + "/topics/" + topic + "/partitions/" + partition;
    byte[] stateData = data(base + "/state");
    if (stateData == null || leader == null) {
      return Collections.emptyList();
    }
    String leaderNode;
    List<String> isr = new ArrayList<>();
    try {
      JsonNode state = JSON.readTree(stateData);
      leaderNode = state.get("leader").asText();
      for (JsonNode n : state.get("isr")) {
        isr.add(n.asText());
      }
    } catch (IOException | RuntimeException e) {
      return Collections.emptyList(); // no preference: the leader serves
    }
    Collections.sort(isr);
    List<ReplicaEndpoint> out = new ArrayList<>();
    ReplicaEndpoint lead = replicaEndpoint(base, leaderNode);
    if (lead == null || !lead.host.equals(leader.host) || lead.port != leader.port) {
      return Collections.emptyList();
    }
    out.add(lead);
    for (String node : isr) {
      if (!node.equals(leaderNode)) {
        ReplicaEndpoint r = replicaEndpoint(base, node);
        if (r != null) {
          out.add(r);
        }
      }
    }
    return out;
  }

  /** The endpoint in {@code replicas/<node>} of the partition at {@code base}, or null (none, or not JSON). */
  private ReplicaEndpoint replicaEndpoint(String base, String node) {
    byte[] data = data(base + "/replicas/" + node);
    if (data == null) {
      return null;
    }
    try {
      JsonNode e = JSON.readTree(data);
      JsonNode host = e.get("host");
      JsonNode port = e.get("port");
      if (host == null || port == null || host.asText().isEmpty() || port.asInt() <= 0) {
        return null;
      }
      return new ReplicaEndpoint(node, host.asText(), port.asInt());
    } catch (IOException | RuntimeException e) {
      return null;
    }
  }

  /**
   * The cluster's Kafka listeners ({@code kafka/listeners/<node>}, JSON {@code {"host", "port",
   * "broker_id", "node"}}, raylog.kafka.brokers), in node order; empty when none runs.
   */
  List<Endpoint> kafkaListeners() {
    List<String> names = children(root + "/kafka/listeners");
    List<Endpoint> out = new ArrayList<>();
    if (names == null) {
      return out;
    }
    for (String n : names) {
      byte[] data = data(root + "/kafka/listeners/" + n);
      if (data == null) {
        continue; // gone meanwhile
      }
      try {
        JsonNode e = JSON.readTree(data);
        if (e.path("host").isTextual() && e.path("port").canConvertToInt()) {
          out.add(new Endpoint(e.get("host").asText(), e.get("port").asInt()));
        }
      } catch (java.io.IOException e) {
        // not a listener entry: not one to match
      }
    }
    return out;
  }

  /** The ids of the registered Avro schemas ({@code schemas/<10 digits>}), sorted. */
  List<Integer> schemaIds() {
    List<String> names = children(root + "/schemas");
    List<Integer> ids = new ArrayList<>();
    if (names != null) {
      for (String n : names) {
        if (!n.isEmpty() && n.chars().allMatch(Character::isDigit)) {
          ids.add(Integer.parseInt(n));
        }
      }
    }
    Collections.sort(ids);
    return ids;
  }

  /** The canonical JSON of the Avro schema registered under {@code id} ({@code schemas/<id, 10 digits>}), or null. */
  String schema(int id) {
    byte[] data = data(root + "/schemas/" + String.format("%010d", id));
    return data == null ? null : new String(data, StandardCharsets.UTF_8);
  }

  /**
   * The schema id of version {@code version} ({@code "latest"} or a number
   * from 1) of the schema subject {@code subject}
   * ({@code schema-subjects/<subject>/<10 digits>}, the first version 1;
   * raylog/zk/schemas.py); UnknownSchemaError when there is none.
   */
  int subjectVersion(String subject, String version) {
    if (subject.isEmpty() || subject.contains("/") || subject.equals(".") || subject.equals("..")) {
      throw SourceOptions.config("option 'avro_subject' must be a subject name without '/', got '" + subject + "'");
    }
    String dir = root + "/schema-subjects/" + subject;
    List<String> names = children(dir);
    List<String> versions = new ArrayList<>();
    if (names != null) {
      for (String n : names) {
        if (!n.isEmpty() && n.chars().allMatch(Character::isDigit)) {
          versions.add(n);
        }
      }
    }
    if (versions.isEmpty()) {
      throw new RaylogReadException(RaylogReadException.UNKNOWN_SCHEMA, "no schema is registered under subject '"
          + subject + "' in cluster '" + root.substring("/raylog/".length()) + "'; register one with "
          + "register(schema, subject=...) (AvroSerializer(..., subject=...))");
    }
    Collections.sort(versions);
    int index;
    if (version.equalsIgnoreCase("latest")) {
      index = versions.size() - 1;
    } else {
      int wanted;
      try {
        wanted = Integer.parseInt(version.trim());
      } catch (NumberFormatException e) {
        wanted = 0;
      }
      if (wanted < 1) {
        throw SourceOptions.config("option 'avro_subject_version' must be 'latest' or a number from 1, got '"
            + version + "'");
      }
      index = -1;
      for (int i = 0; i < versions.size(); i++) {
        if (Long.parseLong(versions.get(i)) + 1 == wanted) {
          index = i;
        }
      }
      if (index < 0) {
        throw new RaylogReadException(RaylogReadException.UNKNOWN_SCHEMA, "subject '" + subject
            + "' has no version " + wanted + " (its versions: 1 to "
            + (Long.parseLong(versions.get(versions.size() - 1)) + 1) + ")");
      }
    }
    byte[] data = data(dir + "/" + versions.get(index));
    if (data == null) {
      throw new RaylogReadException(RaylogReadException.UNKNOWN_SCHEMA, "a version of subject '" + subject
          + "' vanished while it was read");
    }
    return Integer.parseInt(new String(data, StandardCharsets.US_ASCII).trim());
  }

  /** A read of ZooKeeper that may raise its exceptions. */
  private interface Request<T> {
    T call() throws KeeperException, InterruptedException;
  }

  /** {@code request}'s result, or null when the node is missing; other failures are ZooKeeperUnavailableError. */
  private <T> T request(String path, Request<T> request) {
    try {
      return request.call();
    } catch (KeeperException.NoNodeException e) {
      return null;
    } catch (KeeperException e) {
      throw unavailable(path, e);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw unavailable(path, e);
    }
  }

  private List<String> children(String path) {
    List<String> names = request(path, () -> new ArrayList<>(zk.getChildren(path, false)));
    if (names != null) {
      Collections.sort(names);
    }
    return names;
  }

  private byte[] data(String path) {
    return request(path, () -> zk.getData(path, false, null));
  }

  private RaylogReadException unavailable(String path, Exception e) {
    return new RaylogReadException(RaylogReadException.ZOOKEEPER_UNAVAILABLE,
        "reading " + path + " from ZooKeeper at " + connect + " failed: " + e, null, e);
  }

  /** Give the shared session back (once; it closes when unused for a while, see {@link ZkSessions}). */
  @Override
  public synchronized void close() {
    if (!closed) {
      closed = true;
      ZkSessions.release(session);
    }
  }
}
