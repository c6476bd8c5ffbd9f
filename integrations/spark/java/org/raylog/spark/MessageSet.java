package org.raylog.spark;

import java.util.HashMap;
import java.util.Map;
import java.util.zip.CRC32C;

/**
 * A cursor over the records of a log's bytes (docs/design.md §2), the same bytes on
 * disk and on the wire, in either format: format 1's messages and format 2's
 * record batches, told apart entry by entry by byte 8 (format 1's magic, 1; the
 * high byte of a batch's batchLength, 0). Big-endian throughout.
 *
 * <p><b>Format 1.</b> A message at byte offset {@code o} of a partition log:
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
 * <p><b>Format 2</b>, Kafka's RecordBatch v2 ({@code raylog/storage/record_batch.py}
 * defines it field by field). A batch at byte offset {@code p}:
 *
 * <pre>
 *    field                 type   bytes     meaning
 * 1. baseOffset            i64    0..8      p, the batch's position (set at append)
 * 2. batchLength           i32    8..12     bytes after this field (at most 16 MiB - 1: byte 8 is 0)
 * 3. partitionLeaderEpoch  i32    12..16
 * 4. magic                 i8     16        2
 * 5. crc                   u32    17..21    CRC32C of bytes 21 .. 12 + batchLength
 * 6. attributes            i16    21..23    bits 0-2 codec (Kafka's: 0 none, 1 gzip, 2 snappy, 3 lz4,
 *                                           4 zstd), bit 3 LogAppendTime, bit 4 transactional,
 *                                           bit 5 control; bits 6-15 are 0
 * 7. lastOffsetDelta       i32    23..27    12 + batchLength - 1 (or count - 1, a Kafka client's)
 * 8. baseTimestamp         i64    27..35
 * 9. maxTimestamp          i64    35..43
 * 10. producerId           i64    43..51
 * 11. producerEpoch        i16    51..53
 * 12. baseSequence         i32    53..57
 * 13. count                i32    57..61    records (at least 1)
 * 14. records              bytes  61..      count records; with a codec, one stream of the codec
 * </pre>
 *
 * <p>A record (zigzag varints): length, attributes i8 (0), timestampDelta
 * (varlong), offsetDelta (= its index i), keyLength (-1: null), key,
 * valueLength (-1: null, a tombstone), value, header count, then per header:
 * keyLength, key (UTF-8), valueLength (-1: null), value. Record i of the batch
 * at {@code p} has offset {@code p + i}; after the last record comes the next
 * batch, at {@code p + 12 + batchLength} = {@code p + lastOffsetDelta + 1}.
 * In a segment the log cleaner rewrote (docs/design.md §3) a kept batch keeps
 * its baseOffset and lastOffsetDelta but not its position: its offset is its
 * baseOffset, and the next offset after it is baseOffset + lastOffsetDelta + 1
 * (the offsets between it and the next kept batch were removed; a batch the
 * cleaner split holds records 0 .. n - 1 with lastOffsetDelta n - 1). A LogAppendTime batch reports
 * maxTimestamp for every record. The records of a control batch (a
 * transaction marker) are not returned. Checks, as
 * {@code raylog.storage.record_batch.decode_batch}: sizes, magic, crc,
 * attributes, count, lastOffsetDelta, every record's varints and lengths.
 *
 * <p>A fetch that starts inside a batch (at a record's offset) is answered
 * from the batch's start: {@link #dataStart} tells where a reply's bytes begin.
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
  // format 2 (record batches)
  static final int BATCH_OVERHEAD = 12;
  static final int BATCH_HEADER_SIZE = 61;
  static final int BATCH_MAGIC = 2;
  static final int MAX_BATCH_LENGTH = (1 << 24) - 1;
  static final int MIN_BATCH_LENGTH = BATCH_HEADER_SIZE - BATCH_OVERHEAD;
  static final int MIN_RECORD_SIZE = 7;
  private static final int BATCH_LOG_APPEND_TIME = 0x08;
  private static final int BATCH_CONTROL = 0x20;
  private static final int BATCH_KNOWN_ATTRIBUTES = 0x3F;
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
  /** 0 CreateTime; 1 LogAppendTime (a record of a batch with that attribute) */
  int timestampType;
  /** the buffer holding the key and value */
  byte[] data;
  /** -1: no key */
  int keyLength;
  int keyOffset;
  int valueOffset;
  /** -1: a null value (a tombstone, format 2 only) */
  int valueLength;
  /** the record's headers (format 2): how many, and where the first starts in {@link #data} */
  int headerCount;
  int headersOffset;

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

  // -- the records of the current record batch (format 2) ------------------------------
  private boolean inBatch;
  private byte[] recBuf;
  private int recPos;
  private int recLimit;
  private int recIndex;
  private int recCount;
  private long batchOffset;
  private long batchNext;
  private long baseTimestamp;
  private long maxTimestamp;
  private boolean logAppendTime;
  private int batchCodec;
  /** where the last varint read ended */
  private int vpos;

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
    for (;;) {
      int length = entryLength(buf, p, n, maxMessageBytes, base + p);
      if (length < 0 || (long) p + length > n) {
        break;
      }
      p += length;
    }
    return p;
  }

  /** Whether the entry at {@code p} is a format-2 record batch (byte 8 is 0; 9 bytes must be there). */
  static boolean isBatch(byte[] buf, int p) {
    return buf[p + 8] == 0;
  }

  /**
   * The whole length of the entry (a message or a record batch) at {@code p} of {@code buf[0..n)},
   * from its size field alone (checked against the limits: a bad one raises); -1 when the bytes
   * there do not yet tell it.
   */
  static int entryLength(byte[] buf, int p, int n, int maxMessageBytes, long at) {
    if (n - p < 9) {
      return -1;
    }
    if (isBatch(buf, p)) {
      if (n - p < BATCH_OVERHEAD) {
        return -1;
      }
      int batchLength = FetchClient.readInt(buf, p + 8);
      checkBatchLength(batchLength, maxMessageBytes, at);
      return BATCH_OVERHEAD + batchLength;
    }
    int size = FetchClient.readInt(buf, p);
    checkSize(size, maxMessageBytes, at);
    return LOG_OVERHEAD + size;
  }

  /**
   * Where the bytes of a FETCH reply at {@code asked} begin: a reply that starts with a record
   * batch starts at the batch (its baseOffset, which may lie before a record offset asked for);
   * else at {@code asked}.
   */
  static long dataStart(byte[] buf, int n, long asked) {
    if (n >= 17 && isBatch(buf, 0) && (buf[16] & 0xFF) == BATCH_MAGIC) {
      long base = FetchClient.readLong(buf, 0);
      if (base > asked || asked - base < BATCH_OVERHEAD + (long) MAX_BATCH_LENGTH) {
        return base; // past asked: the log cleaner removed asked, the reply starts at the next kept batch
      }
    }
    return asked;
  }

  /**
   * The log offset of the entry at {@code p} of a buffer whose first byte is at log offset
   * {@code base}: a record batch's stored baseOffset (in a segment the log cleaner rewrote, file
   * positions and offsets differ, docs/design.md §3; a baseOffset of 0 is taken as unset, as
   * {@code raylog.storage.record_batch} takes it), else {@code base + p}. The bytes at {@code p}
   * must hold the first 9 of the entry.
   */
  static long entryOffset(byte[] buf, int p, long base) {
    if (isBatch(buf, p)) {
      long stored = FetchClient.readLong(buf, p);
      if (stored != 0) {
        return stored;
      }
    }
    return base + p;
  }

  /**
   * Where a read goes on after an entry: for a record batch at offset {@code at} of
   * {@code length} bytes its baseOffset + lastOffsetDelta + 1 (a batch the cleaner kept keeps
   * them, so this skips the records it removed after the batch), else {@code at + length}; the
   * entry's header must lie in {@code buf[p..n)}.
   */
  static long entryNext(byte[] buf, int p, int n, long at, int length) {
    if (isBatch(buf, p) && n - p >= 27) {
      return at + FetchClient.readInt(buf, p + 23) + 1L;
    }
    return at + length;
  }

  /**
   * The offset after the whole entries of {@code buf[0..n)} (which starts at log offset
   * {@code base}) where a read goes on: the largest entry end at or below {@code limit}, or the
   * first entry's end when that one alone passes it; {@code base} when there is no whole entry.
   * Offsets, not {@code base + n}: a cleaned segment's batches lie closer together than their
   * offsets (docs/design.md §3).
   */
  static long nextOffsetAfter(byte[] buf, int n, long base, long limit, int maxMessageBytes) {
    long found = base;
    int p = 0;
    for (;;) {
      int length = entryLength(buf, p, n, maxMessageBytes, base + p);
      if (length < 0 || (long) p + length > n) {
        return found;
      }
      long after = entryNext(buf, p, n, entryOffset(buf, p, base), length);
      if (after > limit) {
        return p == 0 ? after : found;
      }
      found = after;
      p += length;
    }
  }

  private static void checkBatchLength(int batchLength, int maxMessageBytes, long offset) {
    if (batchLength < 0 || batchLength > Math.min(maxMessageBytes, MAX_BATCH_LENGTH)) {
      throw error(
          RaylogReadException.MESSAGE_TOO_LARGE,
          "batch at offset " + offset + " claims " + (batchLength & 0xFFFFFFFFL) + " bytes, more than the limit of "
              + Math.min(maxMessageBytes, MAX_BATCH_LENGTH) + "; raise max_message_bytes or send smaller batches",
          offset);
    }
    if (batchLength < MIN_BATCH_LENGTH) {
      throw error(
          RaylogReadException.INVALID_MESSAGE,
          "batch at offset " + offset + " claims batchLength " + batchLength + ", less than the minimum "
              + MIN_BATCH_LENGTH,
          offset);
    }
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
    this.inBatch = false;
  }

  /** Move to the next message; false at the end of the set. */
  boolean next() {
    for (;;) {
      if (inBatch) {
        if (recIndex < recCount) {
          nextRecord();
          return true;
        }
        endBatch();
      }
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
      if (limit - p >= 9 && isBatch(buf, p)) {
        startBatch(buf, p, entryOffset(buf, p, base));
        continue;
      }
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
    headerCount = 0;
    timestampType = 0;
  }

  // -- format 2 ----------------------------------------------------------------------

  /** Check the batch at {@code p} (whole in {@code buf[..limit)}) and make its records current. */
  private void startBatch(byte[] buf, int p, long at) {
    if (limit - p < BATCH_OVERHEAD) {
      throw incomplete(limit - p, at);
    }
    int batchLength = FetchClient.readInt(buf, p + 8);
    checkBatchLength(batchLength, maxMessageBytes, at);
    int end = p + BATCH_OVERHEAD + batchLength;
    if (end > limit || end < 0) {
      throw incomplete(limit - p, at);
    }
    int magic = buf[p + 16] & 0xFF;
    if (magic != BATCH_MAGIC) {
      throw error(RaylogReadException.INVALID_MESSAGE,
          "batch at offset " + at + " has magic " + magic + ", expected " + BATCH_MAGIC, at);
    }
    checkCrc(buf, p + 21, end - (p + 21), FetchClient.readInt(buf, p + 17), "batch", at);
    int attrs = ((buf[p + 21] & 0xFF) << 8) | (buf[p + 22] & 0xFF);
    int kafkaCodec = attrs & CODEC_MASK;
    if ((attrs & ~BATCH_KNOWN_ATTRIBUTES) != 0 || Codecs.fromKafka(kafkaCodec) < 0) {
      throw error(RaylogReadException.INVALID_MESSAGE,
          String.format("batch at offset %d has unknown attributes %#06x", at, attrs), at);
    }
    int count = FetchClient.readInt(buf, p + 57);
    int lastOffsetDelta = FetchClient.readInt(buf, p + 23);
    int size = BATCH_OVERHEAD + batchLength;
    // an empty batch (no record): what a log's cleaner keeps of a producer's last batch; passed over
    boolean empty = count == 0 && size == BATCH_HEADER_SIZE && lastOffsetDelta >= 0;
    if (count < 1 && !empty) {
      throw error(RaylogReadException.INVALID_MESSAGE,
          "batch at offset " + at + " has record count " + count + "; a batch holds at least one record", at);
    }
    if (!empty && lastOffsetDelta != count - 1 && lastOffsetDelta != size - 1) {
      throw error(RaylogReadException.INVALID_MESSAGE,
          "batch at offset " + at + " has lastOffsetDelta " + lastOffsetDelta + "; expected " + (size - 1)
              + " (12 + batchLength - 1) or " + (count - 1) + " (count - 1, a Kafka client's)", at);
    }
    pos = end;
    if ((attrs & BATCH_CONTROL) != 0) {
      return; // a transaction marker: nothing for readers
    }
    batchCodec = Codecs.fromKafka(kafkaCodec);
    if (batchCodec == Codecs.NONE) {
      recBuf = buf;
      recPos = p + BATCH_HEADER_SIZE;
      recLimit = end;
    } else {
      try {
        recLimit = codecs.decompress(batchCodec, buf, p + BATCH_HEADER_SIZE, end - p - BATCH_HEADER_SIZE,
            maxInflatedBytes, false);
      } catch (RaylogReadException e) {
        throw inBatch(e, batchCodec, at);
      }
      recBuf = codecs.output();
      recPos = 0;
    }
    if (count > (recLimit - recPos) / MIN_RECORD_SIZE) {
      throw error(RaylogReadException.INVALID_MESSAGE,
          "batch at offset " + at + " claims " + count + " records, more than its " + (recLimit - recPos)
              + " bytes of records can hold", at);
    }
    baseTimestamp = FetchClient.readLong(buf, p + 27);
    maxTimestamp = FetchClient.readLong(buf, p + 35);
    logAppendTime = (attrs & BATCH_LOG_APPEND_TIME) != 0;
    batchOffset = at;
    batchNext = at + lastOffsetDelta + 1L; // past the records a log cleaner removed after the batch
    recIndex = 0;
    recCount = count;
    inBatch = true;
  }

  /** The batch's records are all returned: no bytes may be left over. */
  private void endBatch() {
    inBatch = false;
    if (recPos != recLimit) {
      throw badRecord(recCount, (recLimit - recPos) + " bytes follow the last of the " + recCount + " records");
    }
  }

  /** Check and make current record {@link #recIndex} of the batch. */
  private void nextRecord() {
    byte[] b = recBuf;
    int i = recIndex;
    int length = varint(b, recPos, recLimit, 5, i);
    int p = vpos;
    if (length < MIN_RECORD_SIZE - 1 || length > recLimit - p) {
      throw badRecord(i, "its length " + length + " does not fit the " + (recLimit - p) + " bytes left");
    }
    int rend = p + length;
    if (b[p] != 0) {
      throw badRecord(i, "its attributes are " + b[p] + ", expected 0");
    }
    long tsDelta = varlong(b, p + 1, rend, i);
    int offsetDelta = varint(b, vpos, rend, 5, i);
    if (offsetDelta != i) {
      throw badRecord(i, "its offsetDelta is " + offsetDelta + ", expected " + i);
    }
    long ts = baseTimestamp + tsDelta;
    if (!logAppendTime && ts > maxTimestamp) {
      throw badRecord(i, "its timestamp " + ts + " is later than the batch's maxTimestamp " + maxTimestamp);
    }
    int klen = varint(b, vpos, rend, 5, i);
    p = vpos;
    if (klen < -1 || klen > rend - p) {
      throw badRecord(i, "its key length " + klen + " does not fit the record");
    }
    keyOffset = p;
    keyLength = klen;
    p += Math.max(klen, 0);
    int vlen = varint(b, p, rend, 5, i);
    p = vpos;
    if (vlen < -1 || vlen > rend - p) {
      throw badRecord(i, "its value length " + vlen + " does not fit the record");
    }
    valueOffset = p;
    valueLength = vlen;
    p += Math.max(vlen, 0);
    int hcount = varint(b, p, rend, 5, i);
    p = vpos;
    if (hcount < 0 || hcount > rend - p) {
      throw badRecord(i, "its header count " + hcount + " does not fit the record");
    }
    headersOffset = p;
    for (int h = 0; h < hcount; h++) {
      int hklen = varint(b, p, rend, 5, i);
      p = vpos;
      if (hklen < 0 || hklen > rend - p) {
        throw badRecord(i, "a header key length " + hklen + " does not fit the record");
      }
      p += hklen;
      int hvlen = varint(b, p, rend, 5, i);
      p = vpos;
      if (hvlen < -1 || hvlen > rend - p) {
        throw badRecord(i, "a header value length " + hvlen + " does not fit the record");
      }
      p += Math.max(hvlen, 0);
    }
    if (p != rend) {
      throw badRecord(i, "its fields end " + (rend - p) + " bytes before its length says");
    }
    headerCount = hcount;
    data = b;
    timestamp = logAppendTime ? maxTimestamp : ts;
    timestampType = logAppendTime ? 1 : 0;
    offset = batchOffset + i;
    recPos = rend;
    recIndex = i + 1;
    nextOffset = recIndex < recCount ? batchOffset + recIndex : batchNext;
  }

  /**
   * The headers of the current record, {@code [key0, value0, key1, value1, ...]}: keys as UTF-8
   * bytes, values as bytes or null (a null header value). Empty for format 1.
   */
  byte[][] headers() {
    byte[][] out = new byte[2 * headerCount][];
    int p = headersOffset;
    for (int h = 0; h < headerCount; h++) {
      int klen = varint(data, p, data.length, 5, recIndex - 1);
      p = vpos;
      out[2 * h] = java.util.Arrays.copyOfRange(data, p, p + klen);
      p += klen;
      int vlen = varint(data, p, data.length, 5, recIndex - 1);
      p = vpos;
      out[2 * h + 1] = vlen < 0 ? null : java.util.Arrays.copyOfRange(data, p, p + vlen);
      p += Math.max(vlen, 0);
    }
    return out;
  }

  /** A zigzag varint of at most {@code maxBytes} bytes at {@code p} (before {@code end}); sets {@link #vpos}. */
  private int varint(byte[] b, int p, int end, int maxBytes, int record) {
    long v = readVarlong(b, p, end, maxBytes, record);
    if (v < Integer.MIN_VALUE || v > Integer.MAX_VALUE) {
      throw badRecord(record, "a varint holds " + v + ", out of an i32's range");
    }
    return (int) v;
  }

  private long varlong(byte[] b, int p, int end, int record) {
    return readVarlong(b, p, end, 10, record);
  }

  private long readVarlong(byte[] b, int p, int end, int maxBytes, int record) {
    long raw = 0;
    int shift = 0;
    for (int n = 0; n < maxBytes; n++) {
      if (p >= end) {
        throw badRecord(record, "a varint is cut by the end of the record");
      }
      int x = b[p++] & 0xFF;
      raw |= (long) (x & 0x7F) << shift;
      if ((x & 0x80) == 0) {
        vpos = p;
        return (raw >>> 1) ^ -(raw & 1);
      }
      shift += 7;
    }
    throw badRecord(record, "a varint is longer than " + maxBytes + " bytes");
  }

  private RaylogReadException badRecord(int record, String why) {
    Map<String, Object> details = new HashMap<>();
    details.put("offset", batchOffset);
    details.put("record", record);
    return new RaylogReadException(RaylogReadException.INVALID_MESSAGE,
        "batch at offset " + batchOffset + ", record " + record + ": " + why, details, null);
  }

  private static RaylogReadException inBatch(RaylogReadException e, int codec, long offset) {
    Map<String, Object> details = new HashMap<>(e.details());
    details.put("offset", offset);
    String message = e.getMessage().substring(e.errorName().length() + 2);
    return new RaylogReadException(
        e.code(), "in the " + Codecs.name(codec) + " batch at offset " + offset + ": " + message, details, e);
  }

  /** Check the CRC, magic, attributes and key length of the message at p; return its attributes. */
  private int check(byte[] buf, int p, int size, long at) {
    checkCrc(buf, p + 8, size - 4, FetchClient.readInt(buf, p + 4), "message", at);
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

  /** CorruptMessageError unless the CRC32C of {@code buf[from, from + n)} is {@code stored}. */
  private void checkCrc(byte[] buf, int from, int n, int stored, String what, long at) {
    CRC32C c = crc;
    c.reset();
    c.update(buf, from, n);
    int computed = (int) c.getValue();
    if (computed != stored) {
      Map<String, Object> details = new HashMap<>();
      details.put("offset", at);
      details.put("stored_crc", stored & 0xFFFFFFFFL);
      details.put("computed_crc", computed & 0xFFFFFFFFL);
      throw new RaylogReadException(
          RaylogReadException.CORRUPT_MESSAGE,
          String.format(
              "%s at offset %d fails its CRC32C check (stored %#010x, computed %#010x): "
                  + "its bytes were damaged on disk or in transit",
              what, at, stored, computed),
          details,
          null);
    }
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
