package org.raylog.spark;

import java.io.Closeable;
import java.io.EOFException;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.net.SocketTimeoutException;
import java.nio.charset.StandardCharsets;
import java.security.GeneralSecurityException;
import java.security.MessageDigest;
import java.security.SecureRandom;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Map;

import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;

import com.fasterxml.jackson.databind.ObjectMapper;

/**
 * The client end of a partition actor's data socket (FETCH, COUNT, OFFSETS,
 * OFFSETS_FOR_TIME, PRODUCE): the wire protocol of
 * {@code raylog/transfer/protocol.py}, big-endian throughout.
 *
 * <pre>
 * request frame                         FETCH body                    AUTH body (version 1)
 *   1. size            u32                5. topic length u16           5. step  i8 (1 HELLO, 2 PROOF)
 *   2. api key         i16 (1 FETCH,      6. topic        UTF-8         6. data  32 bytes: the client
 *                           3 AUTH)       7. partition    i32              nonce, or the client proof
 *   3. version         i16 (0; AUTH 1)    8. offset       i64
 *   4. correlation id  i32                9. max bytes    i32
 *                                        10. max wait ms  i32 (0 here: no long poll)
 *
 * OFFSETS body: 5. topic length u16, 6. topic UTF-8, 7. partition i32
 * OFFSETS_FOR_TIME body: 5. topic length u16, 6. topic UTF-8, 7. partition i32, 8. timestamp i64
 * OFFSETS_FOR_TIME reply body (error code 0): 4. offset i64 (of the first message whose timestamp
 *   is at or after the time; the high watermark when there is none)
 * OFFSETS reply body (error code 0): 4. log start offset i64, 5. high watermark i64
 * COUNT body: 5. topic length u16, 6. topic UTF-8, 7. partition i32, 8. start i64, 9. end i64, 10. max bytes i32
 * COUNT reply body (error code 0): 4. messages i64 (in [start, next offset), counted and CRC-checked by
 *   the partition), 5. next offset i64 (the end, or where max bytes stopped the walk)
 * COUNT version 1 body: the fields of version 0, then 11. max messages i64 (-1: no bound); start may
 *   be a record offset inside a compressed wrapper; the reply is version 0's, its next offset the
 *   record offset after the last message counted (inside a wrapper when the count stopped there)
 *
 * reply frame                           FETCH reply body (error code 0)
 *   1. size            u32                4. high watermark   i64
 *   2. correlation id  i32                5. log start offset i64
 *   3. error code      i16                6. data length      i32
 *                                         7. data             the log from the offset:
 * error reply body (error code != 0)         whole messages and maybe a partial last one
 *   4. message length u16, 5. message UTF-8, 6. details length u16, 7. details JSON object
 * AUTH HELLO reply body: 4. server nonce 32 bytes, 5. server proof 32 bytes; AUTH PROOF reply: nothing
 * </pre>
 *
 * <p>AUTH is the challenge–response of {@code raylog/transfer/handshake.py}:
 * server proof = HMAC-SHA256(token, "raylog-auth-server\0" + client nonce +
 * server nonce), client proof the same with "raylog-auth-client\0". The
 * client sends its proof only after checking the server's, so a forged
 * endpoint learns nothing of the token.
 *
 * <p>One request may be outstanding while the caller works on the previous
 * reply ({@link #sendFetch} then {@link #readFetch}): the next reply streams
 * into the socket meanwhile. A connection-level failure closes the socket.
 * Not thread-safe: one reader owns it.
 */
final class FetchClient implements Closeable {

  static final short API_PRODUCE = 0;
  static final short API_FETCH = 1;
  static final short API_OFFSETS = 2;
  static final short API_AUTH = 3;
  static final short API_OFFSETS_FOR_TIME = 4;
  static final short API_COUNT = 5;
  /** COUNT version 1: bounded by a number of messages, from any record offset */
  static final short COUNT_VERSION_BOUNDED = 1;
  /** the most log one COUNT walks on the server (raylog.transfer.protocol.COUNT_MAX_BYTES) */
  static final int COUNT_MAX_BYTES = 64 << 20;
  static final short VERSION = 0;
  /** PRODUCE version 1: acks=-1 and idempotent producers (raylog.transfer.protocol) */
  static final short PRODUCE_VERSION_IDEMPOTENT = 1;
  static final short AUTH_VERSION = 1;
  static final int NONCE_BYTES = 32;
  private static final byte[] SERVER_LABEL = "raylog-auth-server\0".getBytes(StandardCharsets.US_ASCII);
  private static final byte[] CLIENT_LABEL = "raylog-auth-client\0".getBytes(StandardCharsets.US_ASCII);
  private static final SecureRandom RANDOM = new SecureRandom();
  /** header room on top of the largest message (protocol.FRAME_OVERHEAD_BYTES) */
  static final int FRAME_OVERHEAD_BYTES = 64 * 1024;
  /**
   * The connect's own deadline (raylog.config.CONNECT_TIMEOUT_MS), never more than the read
   * timeout: a SYN to a host cut off is never answered, and the task fails over sooner.
   */
  static final int CONNECT_TIMEOUT_MS = 2000;
  /** size, correlation id, error code */
  private static final int REPLY_HEADER = 10;
  /** high watermark, log start offset, data length */
  private static final int FETCH_FIELDS = 20;

  private final String host;
  private final int port;
  private final byte[] token;
  private final int timeoutMs;
  private final int maxFrameBytes;

  private Socket socket;
  private InputStream in;
  private OutputStream out;
  private int correlation;
  /** the correlation id of the request {@link #frame} built last, and the position after its first field */
  private int lastId;
  private int cursor;
  /** correlation id of the FETCH or COUNT sent and not read yet, or null */
  private Integer outstanding;
  private final byte[] header = new byte[REPLY_HEADER + FETCH_FIELDS];
  private final byte[] request = new byte[256];

  /** What the last FETCH reply said: its data length, high watermark and log start. */
  int dataLength;
  long highWatermark;
  long logStartOffset;
  /** the pieces a reply's data is read and walked in (readFetch with a walk) */
  static final int WALK_PIECE = 256 << 10;
  /** the run of whole messages the last walked readFetch found, or the error of its walk */
  private int walked;
  private RaylogReadException walkError;

  FetchClient(String host, int port, byte[] token, int timeoutMs, int maxMessageBytes) {
    this.host = host;
    this.port = port;
    this.token = token;
    this.timeoutMs = timeoutMs;
    this.maxFrameBytes = maxMessageBytes + FRAME_OVERHEAD_BYTES;
  }

  String where() {
    return host + ":" + port;
  }

  /** The most log bytes one reply can carry. */
  int maxDataBytes() {
    return maxFrameBytes - (REPLY_HEADER - 4) - FETCH_FIELDS;
  }

  private void connect() {
    if (socket != null) {
      return;
    }
    Socket s = new Socket();
    try {
      s.setTcpNoDelay(true);
      s.setSoTimeout(timeoutMs);
      s.connect(new InetSocketAddress(host, port), Math.min(timeoutMs, CONNECT_TIMEOUT_MS));
      socket = s;
      in = s.getInputStream();
      out = s.getOutputStream();
    } catch (IOException e) {
      closeQuietly(s);
      throw new RaylogReadException(
          RaylogReadException.BROKER_UNAVAILABLE,
          "cannot connect to the data socket " + where() + ": " + e
              + "; the partition actor may have moved or restarted since the read was planned "
              + "(Spark retries the task; read the topic again to plan with its new endpoint)",
          null,
          e);
    }
    if (token != null) {
      authenticate();
    }
  }

  /** The client side of the challenge–response: the proof goes out only after the server proved itself. */
  private void authenticate() {
    byte[] nonce = new byte[NONCE_BYTES];
    RANDOM.nextBytes(nonce);
    int hello = ++correlation;
    write(authFrame(hello, (byte) 1, nonce), 4 + 8 + 1 + NONCE_BYTES);
    readReplyHeader(hello, "AUTH");
    int size = readInt(header, 0);
    if (size != REPLY_HEADER - 4 + 2 * NONCE_BYTES) {
      unproven("answered the AUTH HELLO with a reply of " + size + " bytes");
    }
    byte[] body = new byte[2 * NONCE_BYTES];
    readFully(body, 0, body.length);
    byte[] serverNonce = Arrays.copyOfRange(body, 0, NONCE_BYTES);
    byte[] proof = Arrays.copyOfRange(body, NONCE_BYTES, 2 * NONCE_BYTES);
    if (!MessageDigest.isEqual(hmac(SERVER_LABEL, nonce, serverNonce), proof)) {
      unproven("answered the AUTH HELLO with a wrong proof");
    }
    int id = ++correlation;
    write(authFrame(id, (byte) 2, hmac(CLIENT_LABEL, nonce, serverNonce)), 4 + 8 + 1 + NONCE_BYTES);
    readReply(id, "AUTH", 0);
  }

  private byte[] authFrame(int id, byte step, byte[] data) {
    byte[] frame = new byte[4 + 8 + 1 + NONCE_BYTES];
    int pos = putInt(frame, 0, 8 + 1 + NONCE_BYTES);
    pos = putShort(frame, pos, API_AUTH);
    pos = putShort(frame, pos, AUTH_VERSION);
    pos = putInt(frame, pos, id);
    frame[pos] = step;
    System.arraycopy(data, 0, frame, pos + 1, NONCE_BYTES);
    return frame;
  }

  private byte[] hmac(byte[] label, byte[] clientNonce, byte[] serverNonce) {
    try {
      Mac mac = Mac.getInstance("HmacSHA256");
      mac.init(new SecretKeySpec(token, "HmacSHA256"));
      mac.update(label);
      mac.update(clientNonce);
      mac.update(serverNonce);
      return mac.doFinal();
    } catch (GeneralSecurityException e) {
      throw new IllegalStateException("HmacSHA256 is not available: " + e, e);
    }
  }

  private void unproven(String why) {
    close();
    throw new RaylogReadException(
        RaylogReadException.AUTHENTICATION,
        "the data endpoint " + where() + " " + why + ": it did not prove that it holds the cluster's token, so "
            + "nothing derived from the token was sent to it; check that the endpoint registered in ZooKeeper is "
            + "the partition's, and that this reader has the cluster's token");
  }

  /**
   * A request frame of {@code api}: its header (declaring a body of
   * {@code body} bytes) and then {@code field} (u16 length, bytes) written;
   * {@link #cursor} is after them. The frame holds {@code frameBody} bytes of
   * body (the rest, if any, is written apart); its correlation id is {@link #lastId}.
   */
  private byte[] frame(short api, byte[] field, int frameBody, int body) {
    lastId = ++correlation;
    byte[] frame = 4 + 8 + frameBody <= request.length ? request : new byte[4 + 8 + frameBody];
    int pos = putHeader(frame, api, lastId, body);
    pos = putShort(frame, pos, field.length);
    System.arraycopy(field, 0, frame, pos, field.length);
    cursor = pos + field.length;
    return frame;
  }

  /** Start a request that must not overlap a FETCH: connect, then {@link #frame}. */
  private byte[] call(short api, byte[] topic, int frameBody, int body) {
    if (outstanding != null) {
      throw new IllegalStateException("a request is outstanding");
    }
    connect();
    return frame(api, topic, frameBody, body);
  }

  /** Read the reply of request {@code id}: exactly {@code fields} bytes of body after the header, into {@link #header}. */
  private void readReply(int id, String api, int fields) {
    readReplyHeader(id, api);
    int size = readInt(header, 0);
    if (size != REPLY_HEADER - 4 + fields) {
      fail(RaylogReadException.PROTOCOL, api + " reply of " + size + " bytes, expected " + (REPLY_HEADER - 4 + fields));
    }
    readFully(header, REPLY_HEADER, fields);
  }

  /** Send a FETCH of up to {@code maxBytes} of the log at {@code offset} (no long poll). */
  void sendFetch(byte[] topic, int partition, long offset, int maxBytes) {
    sendFetch(topic, partition, offset, maxBytes, 0);
  }

  /**
   * Send a FETCH of up to {@code maxBytes} of the log at {@code offset}; the
   * server waits up to {@code maxWaitMs} for data when there is none yet.
   */
  void sendFetch(byte[] topic, int partition, long offset, int maxBytes, int maxWaitMs) {
    if (outstanding != null) {
      throw new IllegalStateException("a FETCH is already outstanding");
    }
    connect();
    int body = 2 + topic.length + 4 + 8 + 4 + 4;
    byte[] frame = frame(API_FETCH, topic, body, body);
    int pos = putInt(frame, cursor, partition);
    pos = putLong(frame, pos, offset);
    pos = putInt(frame, pos, maxBytes);
    pos = putInt(frame, pos, maxWaitMs);
    write(frame, pos);
    outstanding = lastId;
  }

  /**
   * Send a COUNT of the messages in {@code [start, end)}, walking at most
   * {@code maxBytes} of log (the server caps it); its reply: {@link #readCount}.
   */
  void sendCount(byte[] topic, int partition, long start, long end, int maxBytes) {
    if (outstanding != null) {
      throw new IllegalStateException("a request is already outstanding");
    }
    connect();
    int body = 2 + topic.length + 4 + 8 + 8 + 4;
    byte[] frame = frame(API_COUNT, topic, body, body);
    int pos = putLong(frame, putLong(frame, putInt(frame, cursor, partition), start), end);
    write(frame, putInt(frame, pos, maxBytes));
    outstanding = lastId;
  }

  /**
   * COUNT version 1: {@code {messages, next offset}} of the messages in {@code [start, end)} from the
   * record offset {@code start}, at most {@code maxMessages} of them (-1: no bound), walking at most
   * {@code maxBytes} of log; an error reply raises its error.
   */
  long[] countRecords(byte[] topic, int partition, long start, long end, int maxBytes, long maxMessages) {
    int body = 2 + topic.length + 4 + 8 + 8 + 4 + 8;
    byte[] frame = call(API_COUNT, topic, body, body);
    putShort(frame, 6, COUNT_VERSION_BOUNDED);
    int pos = putLong(frame, putLong(frame, putInt(frame, cursor, partition), start), end);
    write(frame, putLong(frame, putInt(frame, pos, maxBytes), maxMessages));
    int id = lastId;
    readReply(id, "COUNT", 16);
    return new long[] {readLong(header, REPLY_HEADER), readLong(header, REPLY_HEADER + 8)};
  }

  /** The reply of the outstanding COUNT: {@code {messages, next offset}}; an error reply raises its error. */
  long[] readCount() {
    if (outstanding == null) {
      throw new IllegalStateException("no COUNT is outstanding");
    }
    int id = outstanding;
    outstanding = null;
    readReply(id, "COUNT", 16);
    return new long[] {readLong(header, REPLY_HEADER), readLong(header, REPLY_HEADER + 8)};
  }

  /**
   * Append a message set and wait for its reply: PRODUCE version 0 (topic
   * length u16, topic, partition i32, acks i8, set length i32, set) for acks
   * 1 or 0, version 1 (the same with producer id i64 -1, producer epoch i16 0
   * and sequence i32 -1 before the set length: a format-2 batch carries its
   * own producer fields) for acks -1 ("all": answered once the set is
   * flushed and on every in-sync replica). Returns the base offset (for a
   * duplicate of an idempotent batch, the offset of its first store), or -1
   * for acks 0, which gets no reply (raylog.transfer.protocol).
   */
  long produce(byte[] topic, int partition, byte[] set, int acks) {
    boolean v1 = acks == -1;
    int fields = v1 ? 4 + 1 + 8 + 2 + 4 + 4 : 4 + 1 + 4;
    byte[] frame = call(API_PRODUCE, topic, 2 + topic.length + fields, 2 + topic.length + fields + set.length);
    if (v1) {
      putShort(frame, 6, PRODUCE_VERSION_IDEMPOTENT); // the header's version field
    }
    int pos = putInt(frame, cursor, partition);
    frame[pos++] = (byte) acks;
    if (v1) {
      pos = putInt(frame, pos, -1); // producer id -1 (i64): the batch's fields are judged
      pos = putInt(frame, pos, -1);
      pos = putShort(frame, pos, 0); // producer epoch
      pos = putInt(frame, pos, -1); // sequence
    }
    pos = putInt(frame, pos, set.length);
    write(frame, pos);
    write(set, set.length);
    if (acks == 0) {
      return -1L;
    }
    readReply(lastId, "PRODUCE", 8);
    return readLong(header, REPLY_HEADER);
  }

  /** {@code {log start offset, high watermark}} of the partition (an OFFSETS call). */
  long[] offsets(byte[] topic, int partition) {
    sendOffsets(topic, partition);
    return readOffsets();
  }

  /** Send an OFFSETS request; its reply: {@link #readOffsets}. */
  void sendOffsets(byte[] topic, int partition) {
    byte[] frame = call(API_OFFSETS, topic, 2 + topic.length + 4, 2 + topic.length + 4);
    write(frame, putInt(frame, cursor, partition));
    outstanding = lastId;
  }

  /** The reply of the outstanding OFFSETS: {@code {log start offset, high watermark}}. */
  long[] readOffsets() {
    if (outstanding == null) {
      throw new IllegalStateException("no OFFSETS is outstanding");
    }
    int id = outstanding;
    outstanding = null;
    readReply(id, "OFFSETS", 16);
    return new long[] {readLong(header, REPLY_HEADER), readLong(header, REPLY_HEADER + 8)};
  }

  /** Whether a request was sent and its reply not read. */
  boolean busy() {
    return outstanding != null;
  }

  /** The offset of the first message at or after {@code timestampMs} (an OFFSETS_FOR_TIME call). */
  long offsetForTime(byte[] topic, int partition, long timestampMs) {
    int body = 2 + topic.length + 4 + 8;
    byte[] frame = call(API_OFFSETS_FOR_TIME, topic, body, body);
    write(frame, putLong(frame, putInt(frame, cursor, partition), timestampMs));
    readReply(lastId, "OFFSETS_FOR_TIME", 8);
    return readLong(header, REPLY_HEADER);
  }

  /**
   * Read the reply of the outstanding FETCH: its data goes to {@code buf}, or
   * to a larger buffer when it does not fit (the frame bound keeps it at most
   * {@link #maxDataBytes()}); returns that buffer, with the data length in
   * {@link #dataLength}. An error reply raises its raylog error, and the
   * connection stays usable.
   */
  byte[] readFetch(byte[] buf) {
    return readFetch(buf, 0, 0, 0);
  }

  /**
   * {@link #readFetch(byte[])}, and the run of whole messages in the first
   * {@code walkLimit} bytes of the data ({@link MessageSet#wholeMessages},
   * from log offset {@code base}) found while the data comes in, in pieces
   * of {@link #WALK_PIECE} bytes: each piece is walked while it is still in
   * the CPU's cache, where a walk of the whole reply after it came in reads
   * every message header from memory again. The run: {@link #wholeLength()}.
   */
  byte[] readFetch(byte[] buf, long walkLimit, int maxMessageBytes, long base) {
    if (outstanding == null) {
      throw new IllegalStateException("no FETCH is outstanding");
    }
    walkError = null;
    walked = 0;
    int id = outstanding;
    outstanding = null;
    readReplyHeader(id, "FETCH");
    int size = readInt(header, 0);
    if (size < REPLY_HEADER - 4 + FETCH_FIELDS) {
      fail(RaylogReadException.PROTOCOL, "FETCH reply of " + size + " bytes is shorter than its fields");
    }
    readFully(header, REPLY_HEADER, FETCH_FIELDS);
    highWatermark = readLong(header, REPLY_HEADER);
    logStartOffset = readLong(header, REPLY_HEADER + 8);
    int length = readInt(header, REPLY_HEADER + 16);
    if (length < 0 || size != REPLY_HEADER - 4 + FETCH_FIELDS + length) {
      fail(RaylogReadException.PROTOCOL, "FETCH reply of " + size + " bytes carries a data length of " + length);
    }
    if (length > buf.length) {
      buf = new byte[length]; // a message larger than the request: at most maxDataBytes()
    }
    int limit = (int) Math.max(0, Math.min(length, walkLimit));
    int got = 0;
    int p = 0;
    while (got < length) {
      int piece = Math.min(WALK_PIECE, length - got);
      readFully(buf, got, piece);
      got += piece;
      if (walkError == null && p < limit) {
        try {
          p = MessageSet.wholeMessagesFrom(buf, p, Math.min(got, limit), maxMessageBytes, base);
        } catch (RaylogReadException e) {
          walkError = e; // raised by wholeLength(), once the whole reply is read (the connection stays in step)
        }
      }
    }
    walked = p;
    dataLength = length;
    return buf;
  }

  /**
   * The run of whole messages that {@link #readFetch(byte[], long, int, long)}
   * found; a size field out of bounds raises its error here.
   */
  int wholeLength() {
    if (walkError != null) {
      throw walkError;
    }
    return walked;
  }

  /** Read a reply header of the request {@code id}; an error reply is raised here. */
  private void readReplyHeader(int id, String api) {
    readFully(header, 0, REPLY_HEADER);
    long size = readInt(header, 0) & 0xFFFFFFFFL;
    int replyId = readInt(header, 4);
    int code = ((header[8] & 0xFF) << 8) | (header[9] & 0xFF);
    code = (short) code;
    if (size > maxFrameBytes) {
      fail(RaylogReadException.PROTOCOL,
          api + " reply frame of " + size + " bytes exceeds the maximum of " + maxFrameBytes + " bytes");
    }
    if (size < REPLY_HEADER - 4) {
      fail(RaylogReadException.PROTOCOL, api + " reply frame of " + size + " bytes is shorter than its header");
    }
    if (code != 0) {
      byte[] body = new byte[(int) size - (REPLY_HEADER - 4)];
      readFully(body, 0, body.length);
      RaylogReadException err = decodeError(code, body);
      if (replyId != id) {
        close(); // an error about the connection itself: the server closes it
      }
      throw err;
    }
    if (replyId != id) {
      fail(RaylogReadException.PROTOCOL, api + " reply for correlation id " + replyId + ", expected " + id);
    }
  }

  @SuppressWarnings("unchecked")
  static RaylogReadException decodeError(int code, byte[] body) {
    try {
      int length = ((body[0] & 0xFF) << 8) | (body[1] & 0xFF);
      String message = new String(body, 2, length, StandardCharsets.UTF_8);
      int pos = 2 + length;
      int detailsLength = ((body[pos] & 0xFF) << 8) | (body[pos + 1] & 0xFF);
      Map<String, Object> details = new HashMap<>();
      if (detailsLength > 0) {
        Object parsed = new ObjectMapper().readValue(body, pos + 2, detailsLength, Object.class);
        if (parsed instanceof Map) {
          details.putAll((Map<String, Object>) parsed);
        }
      }
      return new RaylogReadException(code, message, details, null);
    } catch (IOException | RuntimeException e) {
      return new RaylogReadException(RaylogReadException.PROTOCOL, "malformed error reply (error code " + code + ")");
    }
  }

  private void fail(int code, String message) {
    close();
    throw new RaylogReadException(code, message + " from " + where());
  }

  private void write(byte[] frame, int length) {
    try {
      out.write(frame, 0, length);
      out.flush();
    } catch (IOException e) {
      close();
      throw unavailable("sending to", e);
    }
  }

  private void readFully(byte[] buf, int off, int len) {
    try {
      while (len > 0) {
        int n = in.read(buf, off, len);
        if (n < 0) {
          throw new EOFException("the server closed the connection");
        }
        off += n;
        len -= n;
      }
    } catch (SocketTimeoutException e) {
      close();
      throw new RaylogReadException(
          RaylogReadException.REQUEST_TIMEOUT,
          "no reply from the data socket " + where() + " within " + timeoutMs + " ms", null, e);
    } catch (IOException e) {
      close();
      throw unavailable("reading from", e);
    }
  }

  private RaylogReadException unavailable(String what, IOException e) {
    return new RaylogReadException(
        RaylogReadException.BROKER_UNAVAILABLE,
        what + " the data socket " + where() + " failed: " + e
            + "; the partition actor may be restarting (Spark retries the task)",
        null,
        e);
  }

  @Override
  public void close() {
    outstanding = null;
    if (socket != null) {
      closeQuietly(socket);
      socket = null;
      in = null;
      out = null;
    }
  }

  private static void closeQuietly(Socket s) {
    try {
      s.close();
    } catch (IOException e) {
      // closing: nothing to do
    }
  }

  // -- big-endian fields --------------------------------------------------------

  private static int putHeader(byte[] b, short api, int id, int body) {
    int pos = putInt(b, 0, 8 + body);
    pos = putShort(b, pos, api);
    pos = putShort(b, pos, VERSION);
    return putInt(b, pos, id);
  }

  private static int putShort(byte[] b, int pos, int v) {
    b[pos] = (byte) (v >>> 8);
    b[pos + 1] = (byte) v;
    return pos + 2;
  }

  static int putInt(byte[] b, int pos, int v) {
    b[pos] = (byte) (v >>> 24);
    b[pos + 1] = (byte) (v >>> 16);
    b[pos + 2] = (byte) (v >>> 8);
    b[pos + 3] = (byte) v;
    return pos + 4;
  }

  private static int putLong(byte[] b, int pos, long v) {
    putInt(b, pos, (int) (v >>> 32));
    return putInt(b, pos + 4, (int) v);
  }

  static int readInt(byte[] b, int pos) {
    return ((b[pos] & 0xFF) << 24) | ((b[pos + 1] & 0xFF) << 16) | ((b[pos + 2] & 0xFF) << 8) | (b[pos + 3] & 0xFF);
  }

  static long readLong(byte[] b, int pos) {
    return ((long) readInt(b, pos) << 32) | (readInt(b, pos + 4) & 0xFFFFFFFFL);
  }
}
