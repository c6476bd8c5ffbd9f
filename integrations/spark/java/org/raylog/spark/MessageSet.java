package org.raylog.spark;

import java.util.HashMap;
import java.util.Map;
import java.util.zip.CRC32C;

/**
 * A cursor over the messages of a message set (docs/design.md §2), the same bytes on
 * disk and on the wire; big-endian throughout. A message at byte offset
 * {@code o} of a partition log:
 *
 * <pre>
 *    field        type   bytes       meaning
 * 1. size         u32    o+0..4      number of bytes that follow this field
 * 2. crc          u32    o+4..8      CRC32C (Castagnoli) of bytes o+8 .. o+4+size
 * 3. magic        u8     o+8         format version, always 1
 * 4. attributes   u8     o+9         bits 0-2: codec of value (0 none, 1 gzip, 2 zstd, 3 lz4);
 *                                    bits 3-7 are 0
 * 5. timestamp    i64    o+10..18    producer's create time, ms since the epoch
 * 6. key_length   i32    o+18..22    -1 when there is no key
 * 7. key          bytes  o+22..      key_length bytes
 * 8. value        bytes  ..o+4+size  the rest of the message
 * </pre>
 *
 * <p>A compressed set is one wrapper message whose value is the compressed
 * inner set ({@link Codecs}); its key, when there is one, is padding that is
 * skipped. Its inner messages are returned in turn, the i-th (from 0) of a
 * wrapper at {@code w} reporting the offset {@code w + i} (clamped to the
 * wrapper's last byte for an old wrapper shorter than its count, as
 * {@code raylog.storage.message.inner_offset}), and may not be wrappers themselves.
 *
 * <p>Checks, as {@code raylog.storage.decoding.decode_messages} does: every
 * CRC32C (CorruptMessageError), magic, attributes and key length
 * (InvalidMessageError), the size bound before anything of that size is
 * allocated (MessageTooLargeError), and whole inner sets. Errors name log
 * offsets; errors inside a wrapper name the wrapper and the inner position.
 *
 * <p>Not thread-safe: one reader owns it. The fields of the current message
 * point into buffers that stay valid until the next call of {@link #next()}.
 */
final class MessageSet {

  static final int LOG_OVERHEAD = 4;
  static final int HEADER_SIZE = 22;
  static final int MIN_MESSAGE_SIZE = HEADER_SIZE - LOG_OVERHEAD;
  static final int MAGIC = 1;
  static final int CODEC_MASK = 0x07;
  /**
   * a wrapper's decompressed inner set may be this many times max_message_bytes
   * unless the topic sets max_inflated_bytes (raylog.config.INFLATED_FACTOR)
   */
  static final int INFLATED_FACTOR = 8;

  private final int maxMessageBytes;
  private final long maxInflatedBytes;
  private final CRC32C crc = new CRC32C();
  private final Codecs codecs = new Codecs();

  // -- the current message ---------------------------------------------------------
  /** the message's record offset (inner message i of a wrapper at w: w + i) */
  long offset;
  /**
   * where to resume after the message: offset + 4 + size; for an inner message the next inner
   * message's offset, or the wrapper's end after the last one
   */
  long nextOffset;
  long timestamp;
  /** the buffer holding the key and value */
  byte[] data;
  /** -1: no key */
  int keyLength;
  int keyOffset;
  int valueOffset;
  int valueLength;

  // -- the outer set ---------------------------------------------------------------
  private byte[] outer;
  private int pos;
  private int limit;
  private long base;

  // -- the inner set of the current wrapper ------------------------------------------
  private boolean inWrapper;
  private int innerPos;
  private int innerLimit;
  private long wrapperOffset;
  private long wrapperNext;
  private int innerCount;
  private int wrapperCodec;

  MessageSet(int maxMessageBytes, long maxInflatedBytes) {
    this.maxMessageBytes = maxMessageBytes;
    this.maxInflatedBytes = maxInflatedBytes > 0 ? maxInflatedBytes : INFLATED_FACTOR * (long) maxMessageBytes;
  }

  /**
   * The length of the run of whole messages at the start of {@code buf[0..n)},
   * which starts at log offset {@code base}; a message cut off by {@code n} is
   * left out (the next fetch starts there). A size field out of bounds raises
   * here, from the 4 size bytes alone.
   */
  static int wholeMessages(byte[] buf, int n, int maxMessageBytes, long base) {
    return wholeMessagesFrom(buf, 0, n, maxMessageBytes, base);
  }

  /**
   * {@link #wholeMessages} from position {@code p}, a message start (the
   * whole run found so far): the walk goes on as more of a reply comes in.
   */
  static int wholeMessagesFrom(byte[] buf, int p, int n, int maxMessageBytes, long base) {
    while (n - p >= LOG_OVERHEAD) {
      int size = FetchClient.readInt(buf, p);
      checkSize(size, maxMessageBytes, base + p);
      if ((long) p + LOG_OVERHEAD + size > n) {
        break;
      }
      p += LOG_OVERHEAD + size;
    }
    return p;
  }

  private static void checkSize(int size, int maxMessageBytes, long offset) {
    if (size < 0 || size > maxMessageBytes) {
      throw error(
          RaylogReadException.MESSAGE_TOO_LARGE,
          "message at offset " + offset + " claims " + (size & 0xFFFFFFFFL) + " bytes, more than the limit of "
              + maxMessageBytes + "; raise max_message_bytes or send smaller messages",
          offset);
    }
    if (size < MIN_MESSAGE_SIZE) {
      throw error(
          RaylogReadException.INVALID_MESSAGE,
          "message at offset " + offset + " claims size " + size + ", less than the minimum " + MIN_MESSAGE_SIZE,
          offset);
    }
  }

  /** Walk {@code buf[0..limit)}, whole messages that start at log offset {@code base}. */
  void reset(byte[] buf, int limit, long base) {
    this.outer = buf;
    this.pos = 0;
    this.limit = limit;
    this.base = base;
    this.inWrapper = false;
  }

  /** Move to the next message; false at the end of the set. */
  boolean next() {
    for (;;) {
      if (inWrapper) {
        if (innerPos < innerLimit) {
          nextInner();
          return true;
        }
        inWrapper = false;
      }
      if (pos >= limit) {
        return false;
      }
      byte[] buf = outer;
      int p = pos;
      long at = base + p;
      int size = FetchClient.readInt(buf, p);
      checkSize(size, maxMessageBytes, at); // wholeMessages checked it; cheap
      int attrs = check(buf, p, size, at);
      pos = p + LOG_OVERHEAD + size;
      int klen = FetchClient.readInt(buf, p + 18);
      if (attrs == 0) {
        set(buf, p, size, klen, at);
        nextOffset = at + LOG_OVERHEAD + size;
        return true;
      }
      int codec = attrs & CODEC_MASK;
      int start = p + HEADER_SIZE + Math.max(klen, 0);
      try {
        innerLimit = codecs.decompress(codec, buf, start, pos - start, maxInflatedBytes);
      } catch (RaylogReadException e) {
        throw inWrapper(e, codec, at);
      }
      innerPos = 0;
      wrapperOffset = at;
      wrapperNext = at + LOG_OVERHEAD + size;
      innerCount = 0;
      wrapperCodec = codec;
      inWrapper = true;
    }
  }

  private void nextInner() {
    byte[] buf = codecs.output();
    int p = innerPos;
    try {
      if (innerLimit - p < HEADER_SIZE) {
        throw incomplete(innerLimit - p, p);
      }
      int size = FetchClient.readInt(buf, p);
      checkSize(size, maxMessageBytes, p);
      if ((long) p + LOG_OVERHEAD + size > innerLimit) {
        throw incomplete(innerLimit - p, p);
      }
      int attrs = check(buf, p, size, p);
      if (attrs != 0) {
        throw error(
            RaylogReadException.INVALID_MESSAGE,
            "message at offset " + p + " is a wrapper inside a wrapper; compressed sets may not nest",
            p);
      }
      innerPos = p + LOG_OVERHEAD + size;
      long last = wrapperNext - 1;
      set(buf, p, size, FetchClient.readInt(buf, p + 18), Math.min(wrapperOffset + innerCount, last));
      innerCount++;
      nextOffset = innerPos < innerLimit ? Math.min(wrapperOffset + innerCount, last) : wrapperNext;
    } catch (RaylogReadException e) {
      throw inWrapper(e, wrapperCodec, wrapperOffset);
    }
  }

  private void set(byte[] buf, int p, int size, int klen, long at) {
    offset = at;
    timestamp = FetchClient.readLong(buf, p + 10);
    data = buf;
    keyLength = klen;
    keyOffset = p + HEADER_SIZE;
    valueOffset = keyOffset + Math.max(klen, 0);
    valueLength = p + LOG_OVERHEAD + size - valueOffset;
  }

  /** Check the CRC, magic, attributes and key length of the message at p; return its attributes. */
  private int check(byte[] buf, int p, int size, long at) {
    CRC32C c = crc;
    c.reset();
    c.update(buf, p + 8, size - 4);
    int computed = (int) c.getValue();
    int stored = FetchClient.readInt(buf, p + 4);
    if (computed != stored) {
      Map<String, Object> details = new HashMap<>();
      details.put("offset", at);
      details.put("stored_crc", stored & 0xFFFFFFFFL);
      details.put("computed_crc", computed & 0xFFFFFFFFL);
      throw new RaylogReadException(
          RaylogReadException.CORRUPT_MESSAGE,
          String.format(
              "message at offset %d fails its CRC32C check (stored %#010x, computed %#010x): "
                  + "its bytes were damaged on disk or in transit",
              at, stored, computed),
          details,
          null);
    }
    int magic = buf[p + 8] & 0xFF;
    int attrs = buf[p + 9] & 0xFF;
    int klen = FetchClient.readInt(buf, p + 18);
    if (magic != MAGIC) {
      throw error(RaylogReadException.INVALID_MESSAGE,
          "message at offset " + at + " has magic " + magic + ", expected " + MAGIC, at);
    }
    if ((attrs & ~CODEC_MASK) != 0 || (attrs & CODEC_MASK) > Codecs.LZ4) {
      throw error(RaylogReadException.INVALID_MESSAGE,
          String.format("message at offset %d has unknown attributes %#04x", at, attrs), at);
    }
    if (klen < -1 || klen > size - MIN_MESSAGE_SIZE) {
      throw error(RaylogReadException.INVALID_MESSAGE,
          "message at offset " + at + " has key_length " + klen + ", which does not fit its size " + size, at);
    }
    return attrs;
  }

  private static RaylogReadException incomplete(int have, long at) {
    Map<String, Object> details = new HashMap<>();
    details.put("offset", at);
    details.put("partial", true);
    return new RaylogReadException(
        RaylogReadException.INVALID_MESSAGE,
        "message at offset " + at + " is incomplete: " + have
            + " bytes where the message needs more (a torn or cut message set)",
        details,
        null);
  }

  static RaylogReadException error(int code, String message, long offset) {
    Map<String, Object> details = new HashMap<>();
    details.put("offset", offset);
    return new RaylogReadException(code, message, details, null);
  }

  private static RaylogReadException inWrapper(RaylogReadException e, int codec, long offset) {
    Map<String, Object> details = new HashMap<>(e.details());
    Object inner = details.get("offset");
    details.put("offset", offset);
    details.put("inner_offset", inner);
    String message = e.getMessage().substring(e.errorName().length() + 2);
    return new RaylogReadException(
        e.code(), "in the " + Codecs.name(codec) + " wrapper message at offset " + offset + ": " + message, details, e);
  }
}
