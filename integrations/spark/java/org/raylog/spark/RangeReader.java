package org.raylog.spark;

import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.catalyst.expressions.codegen.UnsafeRowWriter;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.unsafe.types.UTF8String;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Reads one range of the plan in an executor: FETCHes of up to
 * {@code fetch_bytes} from the partition actor's data socket, from the
 * range's start until its end, each next FETCH sent as soon as the previous
 * reply is in (so the next reply streams in while this one is turned into
 * rows). Every message is checked ({@link MessageSet}); a partial last
 * message of a reply is fetched again with the next request. Only messages
 * whose offset is below the range's end are returned (the end is a message
 * boundary; the requests never ask past it).
 *
 * <p>Rows are {@link UnsafeRow}s of the pruned schema, written into one
 * reused buffer; with no columns (a count) nothing is copied.
 *
 * <p>Data loss, as {@code raylog.read.read_range}: a range that retention
 * deleted since planning raises DataLossError, or with
 * {@code fail_on_data_loss=false} is skipped and logged. A partition actor
 * that moved (NotOwnerError, an unreachable socket, a timeout) is looked up
 * again in ZooKeeper (when the options name it) and the read goes on from
 * the same offset at its new endpoint, for up to {@code timeout_ms} per
 * failure; after that, or without ZooKeeper, the task fails with a clear
 * error.
 *
 * <p>Replicas: when the range lists a follower on the executor's own host
 * (and the leader is not there), the reader reads from that follower, which
 * serves only up to the high watermark it learned from the leader; FETCHes
 * to it wait (a long poll of {@link #FOLLOWER_WAIT_MS}) for it to catch up.
 * Any error of the follower, an empty reply, or a message of its reply that
 * fails its checks (a bad CRC), and the rest of the range is read from the
 * leader, from where the follower failed (no lookup budget is spent on it).
 *
 * <p>Not thread-safe: Spark drives each reader from one task thread.
 */
final class RangeReader implements PartitionReader<InternalRow> {

  private static final Logger LOG = LoggerFactory.getLogger(RangeReader.class);
  private static final InternalRow NO_COLUMNS = new UnsafeRowWriter(0).getRow();
  /** log one COUNT request asks the partition to walk (the server walks at most 64 MiB) */
  static final int COUNT_REQUEST_BYTES = 64 << 20;
  /** how long one FETCH from a follower waits for it to serve the offset */
  static final int FOLLOWER_WAIT_MS = 2000;
  /** how long a replicated leader's empty replies below the range's end are waited out (long polls) */
  static final long LEADER_CATCH_UP_MS = 30_000;
  /** the long poll of a FETCH while a leader catches up */
  static final int CATCH_UP_WAIT_MS = 500;

  private final ReadOptions.Range range;
  private final ReadOptions.Settings settings;
  private final int[] columns;
  private final byte[] topicBytes;
  private final UTF8String topic;
  private FetchClient client;
  /** the follower read from, or null: the leader */
  private ReadOptions.Replica follower;
  /** whether the messages being returned came from the follower */
  private boolean fromFollower;
  /** endpoint lookups of a moved partition: opened at the first failure */
  private Zk zk;
  /** when the lookups of the current failure give up (0: no failure) */
  private long refindDeadline;
  private int refindAttempt;
  /** until when a replicated leader's empty replies are waited out (0: none now) */
  private long catchUpDeadline;
  private final MessageSet messages;
  private final UnsafeRowWriter writer;
  /** the rows of a typed Avro read, or null */
  private final TypedRows typed;
  /** the headers column is read: rows are built as generic rows (an array of structs) */
  private final boolean generic;
  private byte[] buffer;

  /** the offset of the next FETCH: everything before it was fetched */
  private long next;
  /**
   * messages below this offset are not returned: the range's start, which may be the record offset
   * of an inner message (the wrapper is fetched from its start, docs/design.md §2)
   */
  private long skipBelow;
  /** whether a FETCH (or COUNT) at {@link #next} was sent and not read */
  private boolean pending;
  private long rows;
  /** the messages COUNT replies gave for {@code [range.start, next)} */
  private long counted;

  RangeReader(ReadOptions.Range range, ReadOptions.Settings settings, int[] columns, AvroSpec avro) {
    this.range = range;
    this.settings = settings;
    this.columns = columns;
    this.topicBytes = range.topic.getBytes(StandardCharsets.UTF_8);
    this.topic = UTF8String.fromBytes(topicBytes);
    this.follower = range.follower(ownHost());
    if (follower != null) {
      this.client = new FetchClient(follower.host, follower.port, settings.token, settings.timeoutMs,
          settings.maxMessageBytes);
    } else {
      this.client = new FetchClient(range.host, range.port, settings.token, settings.timeoutMs,
          settings.maxMessageBytes);
    }
    this.messages = new MessageSet(settings.maxMessageBytes, settings.maxInflatedBytes);
    this.writer = columns.length == 0 || avro != null ? null : new UnsafeRowWriter(columns.length, 256);
    this.typed = columns.length == 0 || avro == null ? null : new TypedRows(avro, columns, settings);
    boolean headers = false;
    for (int c : columns) {
      headers |= c == RaylogTable.HEADERS;
    }
    this.generic = headers;
    this.next = range.start;
    this.skipBelow = range.start;
  }

  @Override
  public boolean next() {
    for (;;) {
      while (!nextMessage()) {
        if (next >= range.end) {
          return false;
        }
        fetch();
      }
      long at = messages.offset;
      if (at < skipBelow || at >= range.end) {
        continue; // inner messages of a wrapper that holds the range's start or end, outside the range
      }
      rows++;
      return true;
    }
  }

  /**
   * The next message of the current reply; false at its end. A message of
   * a follower's reply that fails its checks (a bad CRC: its copy was
   * damaged on its disk or on the way) is fetched again from the leader,
   * with the rest of the range: nothing of it was returned yet (a wrapper's
   * inner messages are returned only once its own CRC, which covers them
   * all, passed). The same failure in the leader's bytes fails the task.
   */
  private boolean nextMessage() {
    try {
      return messages.next();
    } catch (RaylogReadException e) {
      long at = e.longDetail("offset", -1);
      if (!fromFollower || e.details().containsKey("inner_offset") || at < range.start || at >= next) {
        throw e;
      }
      if (follower != null) {
        leaveFollower(e.getMessage());
      } else {
        LOG.info("{}: the follower's reply fails its checks ({}); reading from the leader {}:{}", range.describe(),
            e.getMessage(), range.host, range.port);
      }
      fromFollower = false;
      next = at; // the rest from the leader, from the damaged message on
      pending = false;
      messages.reset(buffer, 0, at);
      return false;
    }
  }

  @Override
  public InternalRow get() {
    if (typed != null) {
      return typed.row(messages, range.partition, topic, range.describe());
    }
    if (writer == null) {
      return NO_COLUMNS;
    }
    MessageSet m = messages;
    if (generic) {
      Object[] values = new Object[columns.length];
      for (int i = 0; i < columns.length; i++) {
        values[i] = TypedRows.meta(columns[i], m, range.partition, topic);
      }
      return new GenericInternalRow(values);
    }
    UnsafeRowWriter w = writer;
    w.reset();
    w.zeroOutNullBytes();
    for (int i = 0; i < columns.length; i++) {
      switch (columns[i]) {
        case RaylogTable.KEY:
          if (m.keyLength < 0) {
            w.setNullAt(i);
          } else {
            w.write(i, m.data, m.keyOffset, m.keyLength);
          }
          break;
        case RaylogTable.VALUE:
          if (m.valueLength < 0) {
            w.setNullAt(i); // a tombstone
          } else {
            w.write(i, m.data, m.valueOffset, m.valueLength);
          }
          break;
        case RaylogTable.TOPIC:
          w.write(i, topic);
          break;
        case RaylogTable.PARTITION:
          w.write(i, range.partition);
          break;
        case RaylogTable.OFFSET:
          w.write(i, m.offset);
          break;
        case RaylogTable.TIMESTAMP:
          w.write(i, m.timestamp * 1000L);
          break;
        case RaylogTable.TIMESTAMP_TYPE:
          w.write(i, m.timestampType);
          break;
        case RaylogTable.NEXT_OFFSET:
          w.write(i, m.nextOffset);
          break;
        default:
          throw new IllegalStateException("no column " + columns[i]);
      }
    }
    return w.getRow();
  }

  /** Fetch the next reply at {@link #next} and point {@link #messages} at its whole messages. */
  private void fetch() {
    if (buffer == null) {
      long want = Math.min((long) settings.fetchBytes, range.end - range.start);
      buffer = new byte[(int) Math.min(Math.max(4096, want), client.maxDataBytes())];
    }
    for (;;) {
      int length;
      try {
        if (!pending) {
          send(); // connecting to a partition actor that moved fails here
        }
        pending = false;
        buffer = client.readFetch(buffer, range.end - next, settings.maxMessageBytes, next);
        length = client.dataLength;
        refindDeadline = 0;
      } catch (RaylogReadException e) {
        long wrapper = e.longDetail("wrapper_offset", -1);
        if (e.code() == RaylogReadException.INVALID_OFFSET && wrapper >= 0 && wrapper < next) {
          next = wrapper; // the range starts inside this compressed wrapper: read it whole, skip what is before
          continue;
        }
        if (follower != null) {
          leaveFollower(e.getMessage());
          continue;
        }
        if (moved(e) && refind(e)) {
          continue;
        }
        if (e.code() != RaylogReadException.OFFSET_OUT_OF_RANGE) {
          throw located(e);
        }
        skipLost(e);
        if (next >= range.end) {
          messages.reset(buffer, 0, next);
          return;
        }
        continue;
      }
      if (length == 0 && follower != null) {
        leaveFollower("nothing served within " + FOLLOWER_WAIT_MS + " ms (behind)");
        continue;
      }
      if (length == 0 && range.replicas.size() > 1 && client.highWatermark <= next) {
        // a replicated leader that does not serve this far yet (one that took over learns its followers' ends)
        long now = System.currentTimeMillis();
        if (catchUpDeadline == 0) {
          catchUpDeadline = now + LEADER_CATCH_UP_MS;
        }
        if (now < catchUpDeadline) {
          continue;
        }
      }
      if (length == 0) {
        throw dataLoss(
            range.topic + "-" + range.partition + " has nothing at " + next + " although the plan reads it up to "
                + range.end + ": the log lost flushed data since it was planned",
            next, range.end, client.logStartOffset, client.highWatermark);
      }
      catchUpDeadline = 0;
      int n = (int) Math.min(length, range.end - next);
      int whole;
      try {
        whole = client.wholeLength(); // MessageSet.wholeMessages(buffer, n, ...), walked as the data came in
      } catch (RaylogReadException e) {
        if (follower == null) {
          throw e;
        }
        leaveFollower(e.getMessage());
        continue;
      }
      // a reply that starts with a record batch holding next (a range that starts at a record of
      // it) starts at the batch: its records before the range's start are skipped (skipBelow)
      long from = MessageSet.dataStart(buffer, length, next);
      if (whole == 0 && (n < length || from < next)) {
        // the range ends inside the compressed wrapper or record batch at next, or starts inside a
        // batch longer than the rest of the range: read it whole (its records outside the range
        // are not returned)
        int first = MessageSet.entryLength(buffer, 0, length, settings.maxMessageBytes, from);
        if (first > 0 && first <= length) {
          whole = MessageSet.wholeMessages(buffer, first, settings.maxMessageBytes, from);
        }
      }
      if (whole == 0 && follower != null) {
        leaveFollower("no whole message in the reply");
        continue;
      }
      if (whole == 0) {
        throw MessageSet.error(
            RaylogReadException.INVALID_MESSAGE,
            "the fetch of " + range.topic + "-" + range.partition + " at " + next + " returned no whole message",
            next);
      }
      messages.reset(buffer, whole, from);
      fromFollower = follower != null;
      next = MessageSet.nextOffsetAfter(buffer, whole, from, Long.MAX_VALUE, settings.maxMessageBytes);
      if (next < range.end) {
        try {
          send(); // the next reply streams in while these messages become rows
        } catch (RaylogReadException e) {
          if (follower != null) {
            leaveFollower(e.getMessage());
          } else if (!moved(e)) {
            throw located(e);
          }
          pending = false; // sent again (after a lookup) by the next fetch
        }
      }
      return;
    }
  }

  /**
   * Send a COUNT of {@code [next, range.end)} (a pushed-down count, see
   * {@link CountReader}) unless one is pending; a partition actor that
   * cannot be reached is left to {@link #readCount}, which looks it up again.
   */
  void sendCount() {
    if (pending || next >= range.end) {
      return;
    }
    if (follower != null) { // counts are the leader's: the plan's ends are its high watermark
      follower = null;
      client.close();
      client = new FetchClient(range.host, range.port, settings.token, settings.timeoutMs, settings.maxMessageBytes);
    }
    try {
      client.sendCount(topicBytes, range.partition, next, range.end, COUNT_REQUEST_BYTES);
      pending = true;
    } catch (RaylogReadException e) {
      if (!moved(e)) {
        throw located(e);
      }
    }
  }

  /**
   * Read the reply of the COUNT sent (sending it first when none is
   * pending) and add its messages; true when the whole range is counted.
   * Failures as for FETCH: a moved partition is found again, data deleted
   * by retention is a DataLossError or skipped (fail_on_data_loss), a
   * damaged message fails with its error.
   */
  boolean readCount() {
    if (next >= range.end) {
      return true;
    }
    for (;;) {
      long[] reply;
      try {
        if (!pending) {
          client.sendCount(topicBytes, range.partition, next, range.end, COUNT_REQUEST_BYTES);
        }
        pending = false;
        reply = client.readCount();
        refindDeadline = 0;
      } catch (RaylogReadException e) {
        if (moved(e) && refind(e)) {
          continue;
        }
        if (e.code() == RaylogReadException.INVALID_OFFSET && e.longDetail("wrapper_offset", -1) >= 0) {
          // the range starts or ends inside a compressed wrapper: its messages are read and counted
          while (next()) {
            counted++;
          }
          return true;
        }
        if (e.code() != RaylogReadException.OFFSET_OUT_OF_RANGE) {
          throw located(e);
        }
        if (range.replicas.size() > 1 && e.longDetail("latest", -1) < range.end) {
          // a replicated leader that does not serve this far yet (one that took
          // over learns its followers' ends): the rest is read, with its waits
          while (next()) {
            counted++;
          }
          return true;
        }
        skipLost(e);
        if (next >= range.end) {
          return true;
        }
        continue;
      }
      if (reply[0] < 0 || reply[1] <= next || reply[1] > range.end) {
        throw located(new RaylogReadException(RaylogReadException.PROTOCOL,
            "COUNT reply of " + reply[0] + " messages up to " + reply[1] + " for a count from " + next));
      }
      counted += reply[0];
      next = reply[1];
      return next >= range.end;
    }
  }

  /** The messages counted so far ({@link #readCount}). */
  long counted() {
    return counted;
  }

  /** Errors after which the partition may be served elsewhere: its endpoint is looked up again. */
  static boolean moved(RaylogReadException e) {
    int code = e.code();
    return code == RaylogReadException.BROKER_UNAVAILABLE || code == RaylogReadException.NOT_OWNER
        || code == RaylogReadException.REQUEST_TIMEOUT;
  }

  /**
   * After {@code e}, the partition's endpoint from ZooKeeper and a new
   * connection to it, after a back-off; false when the reader has no
   * ZooKeeper to ask or {@code timeout_ms} passed since the failure began.
   */
  private boolean refind(RaylogReadException e) {
    if (settings.zookeeper == null) {
      return false;
    }
    long now = System.currentTimeMillis();
    if (refindDeadline == 0) {
      refindDeadline = now + settings.timeoutMs;
      refindAttempt = 0;
    } else if (now >= refindDeadline) {
      return false;
    }
    client.close();
    pending = false;
    Cluster.sleep(Math.min(1000L, 50L << Math.min(refindAttempt++, 5)));
    if (zk == null) {
      zk = new Zk(settings.zookeeper, settings.cluster, settings.timeoutMs);
    }
    Zk.Endpoint found = zk.endpoint(range.topic, range.partition);
    if (found != null) {
      LOG.info("{}: {} at {}; reading on from {}:{}", range.describe(), e.errorName(), client.where(), found.host,
          found.port);
      client = new FetchClient(found.host, found.port, settings.token, settings.timeoutMs, settings.maxMessageBytes);
    }
    return true;
  }

  private void send() {
    int want = (int) Math.min(Math.min((long) settings.fetchBytes, range.end - next), client.maxDataBytes());
    int waitMs = follower != null ? FOLLOWER_WAIT_MS : catchUpDeadline != 0 ? CATCH_UP_WAIT_MS : 0;
    client.sendFetch(topicBytes, range.partition, next, want, waitMs);
    pending = true;
  }

  /** Read the rest of the range from the leader (after an error or a delay of the follower). */
  private void leaveFollower(String why) {
    LOG.info("{}: the follower {} at {} ({}); reading from the leader {}:{}", range.describe(), follower.node,
        client.where(), why, range.host, range.port);
    client.close();
    follower = null;
    pending = false;
    client = new FetchClient(range.host, range.port, settings.token, settings.timeoutMs, settings.maxMessageBytes);
  }

  /** The host of this executor as Spark knows it (its block manager's), else this machine's address. */
  static String ownHost() {
    try {
      org.apache.spark.SparkEnv env = org.apache.spark.SparkEnv.get();
      if (env != null && env.blockManager() != null) {
        return env.blockManager().blockManagerId().host();
      }
      return java.net.InetAddress.getLocalHost().getHostAddress();
    } catch (Exception | LinkageError e) {
      return null; // no preference: the leader
    }
  }

  /** An OffsetOutOfRangeError at {@link #next}: the range (in part) deleted by retention, or a shorter log. */
  private void skipLost(RaylogReadException e) {
    long earliest = e.longDetail("earliest", -1);
    long latest = e.longDetail("latest", -1);
    String partition = range.topic + "-" + range.partition;
    if (earliest < 0 || next >= earliest) {
      throw dataLoss(
          partition + " ends at " + latest + " but the plan reads it up to " + range.end
              + ": the log lost flushed data since it was planned",
          Math.max(next, latest), range.end, earliest, latest);
    }
    long lostEnd = Math.min(range.end, earliest);
    String lost =
        partition + " [" + next + ", " + lostEnd + ") (" + (lostEnd - next) + " bytes; the log now starts at "
            + earliest + ")";
    if (settings.failOnDataLoss) {
      throw dataLoss(
          "offsets " + lost + " were deleted by retention after the read was planned; plan the read again, "
              + "or set " + settings.failOnDataLossName + " to skip what was lost",
          next, lostEnd, earliest, latest);
    }
    LOG.warn("reading {}: skipping lost {} (failOnDataLoss is false)", range.topic, lost);
    next = lostEnd;
  }

  private RaylogReadException dataLoss(String message, long lostStart, long lostEnd, long earliest, long latest) {
    Map<String, Object> details = new HashMap<>();
    details.put("topic", range.topic);
    details.put("partition", range.partition);
    details.put("lost_start", lostStart);
    details.put("lost_end", lostEnd);
    details.put("offset", next);
    details.put("earliest", earliest);
    details.put("latest", latest);
    return new RaylogReadException(RaylogReadException.DATA_LOSS, message, details, null);
  }

  /** The error with the range it happened in. */
  private RaylogReadException located(RaylogReadException e) {
    String message = e.getMessage().substring(e.errorName().length() + 2);
    String hint = "";
    if (e.code() == RaylogReadException.NOT_OWNER) {
      hint = "; the partition moved since the read was planned (Spark retries the task; read the topic "
          + "again to plan with its new endpoint)";
    }
    return new RaylogReadException(
        e.code(), message + hint + " [reading " + range.describe() + " from " + client.where() + "]", e.details(), e);
  }

  @Override
  public void close() {
    client.close();
    if (typed != null) {
      typed.close();
    }
    if (zk != null) {
      zk.close();
    }
    if (LOG.isDebugEnabled()) {
      LOG.debug("read {} rows of {}", rows, range.describe());
    }
  }
}
