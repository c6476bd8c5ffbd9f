package org.raylog.spark;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.util.zip.GZIPInputStream;

import com.github.luben.zstd.Zstd;
import com.github.luben.zstd.ZstdInputStream;
import org.xerial.snappy.Snappy;

/**
 * Decompression of wrapper values, as {@code raylog/storage/compression.py}:
 *
 * <pre>
 *  id  name  stream                                          here
 *  1   gzip  a gzip member (zlib, wbits 31)                  java.util.zip
 *  2   zstd  one frame that declares its content size        zstd-jni (in Spark's jars)
 *  3   lz4   one LZ4 frame (python lz4.frame: linked blocks) {@link Lz4Frame}
 *  4   snappy  xerial framing (Java's SnappyOutputStream:      snappy-java (in Spark's jars)
 *              magic, two u32 versions, then u32-prefixed raw
 *              blocks) or one raw block (format 2 only)
 * </pre>
 *
 * <p>These are this class's ids, format 1's numbers; format 2 (a record batch)
 * numbers codecs as Kafka does (1 gzip, 2 snappy, 3 lz4, 4 zstd): {@link #fromKafka}
 * maps them. A zstd frame of format 2 may leave out its content size (Kafka's
 * Java client writes such frames): it is inflated as a stream up to the limit.
 *
 * <p>Output is bounded: a zstd frame (which must declare its size) or an lz4
 * frame that claims more than the limit is refused before anything of that
 * size is allocated; gzip and size-less lz4 frames are inflated up to the
 * limit. A value that is not one well-formed stream of its codec raises
 * InvalidMessageError; one that inflates past the limit, MessageTooLargeError.
 *
 * <p>Not thread-safe: the output buffer is reused by the next call.
 */
final class Codecs {

  static final int NONE = 0;
  static final int GZIP = 1;
  static final int ZSTD = 2;
  static final int LZ4 = 3;
  static final int SNAPPY = 4;

  private static final String[] NAMES = {"none", "gzip", "zstd", "lz4", "snappy"};
  /** Kafka's codec id (a record batch's attributes bits 0-2) to this class's */
  private static final int[] FROM_KAFKA = {NONE, GZIP, SNAPPY, LZ4, ZSTD};
  private static final byte[] XERIAL_MAGIC = {(byte) 0x82, 'S', 'N', 'A', 'P', 'P', 'Y', 0};

  /** This class's id of Kafka's codec {@code kafka} (0-4), or -1 for an unknown one. */
  static int fromKafka(int kafka) {
    return kafka >= 0 && kafka < FROM_KAFKA.length ? FROM_KAFKA[kafka] : -1;
  }

  private byte[] out = new byte[64 * 1024];

  static String name(int codec) {
    return codec >= 0 && codec < NAMES.length ? NAMES[codec] : "codec " + codec;
  }

  /** The buffer holding the output of the last {@link #decompress}. */
  byte[] output() {
    return out;
  }

  /** Decompress {@code src[off..off+len)} into {@link #output()}; return the output's length. */
  int decompress(int codec, byte[] src, int off, int len, long maxBytes) {
    return decompress(codec, src, off, len, maxBytes, true);
  }

  /**
   * {@link #decompress(int, byte[], int, int, long)}; {@code sizedOnly} false (format 2) also takes a
   * zstd frame that does not declare its content size, and snappy.
   */
  int decompress(int codec, byte[] src, int off, int len, long maxBytes, boolean sizedOnly) {
    int limit = (int) Math.min(maxBytes, Integer.MAX_VALUE - 16);
    switch (codec) {
      case GZIP:
        return gunzip(src, off, len, limit);
      case ZSTD:
        if (!sizedOnly && unsizedZstd(src, off, len)) {
          return unzstdStream(src, off, len, limit);
        }
        return unzstd(src, off, len, limit);
      case SNAPPY:
        if (sizedOnly) {
          throw new RaylogReadException(RaylogReadException.INVALID_MESSAGE, "unknown codec id " + codec);
        }
        return unsnappy(src, off, len, limit);
      case LZ4:
        try {
          Lz4Frame frame = new Lz4Frame(src, off, len);
          long claimed = frame.contentSize();
          if (claimed > limit) {
            throw tooLarge(codec, limit, claimed);
          }
          if (claimed >= 0) {
            ensure((int) claimed, limit, codec);
          }
          int n = frame.decode(this, limit);
          return n;
        } catch (Lz4Frame.Malformed e) {
          throw badStream(codec, e.getMessage());
        }
      default:
        throw new RaylogReadException(RaylogReadException.INVALID_MESSAGE, "unknown codec id " + codec);
    }
  }

  /** Make {@link #output()} hold at least {@code size} bytes (keeping its first {@code keep}). */
  byte[] grow(int size, int keep, int limit, int codec) {
    if (size > limit) {
      throw tooLarge(codec, limit, -1);
    }
    if (size > out.length) {
      long doubled = Math.max((long) size, 2L * out.length);
      byte[] bigger = new byte[(int) Math.min(doubled, (long) limit)];
      System.arraycopy(out, 0, bigger, 0, keep);
      out = bigger;
    }
    return out;
  }

  private void ensure(int size, int limit, int codec) {
    if (size > out.length) {
      grow(size, 0, limit, codec);
    }
  }

  private int gunzip(byte[] src, int off, int len, int limit) {
    int n = 0;
    try (GZIPInputStream in = new GZIPInputStream(new ByteArrayInputStream(src, off, len), 64 * 1024)) {
      for (;;) {
        if (n == out.length) {
          if (n >= limit) {
            // one more byte would pass the limit
            if (in.read() < 0) {
              return n;
            }
            throw tooLarge(GZIP, limit, -1);
          }
          grow(n + 1, n, limit, GZIP);
        }
        int got = in.read(out, n, out.length - n);
        if (got < 0) {
          return n;
        }
        n += got;
      }
    } catch (IOException e) {
      throw badStream(GZIP, e.getMessage() == null ? e.toString() : e.getMessage());
    }
  }

  private int unzstd(byte[] src, int off, int len, int limit) {
    long claimed;
    try {
      claimed = Zstd.decompressedSize(src, off, len);
    } catch (RuntimeException e) {
      throw badStream(ZSTD, e.toString());
    }
    if (claimed > limit) {
      throw tooLarge(ZSTD, limit, claimed);
    }
    if (claimed <= 0) {
      // Only a declared size bounds the output before inflating it.
      throw badStream(ZSTD, "the frame does not declare its content size");
    }
    ensure((int) claimed, limit, ZSTD);
    long result;
    try {
      result = Zstd.decompressByteArray(out, 0, (int) claimed, src, off, len);
    } catch (RuntimeException e) {
      throw badStream(ZSTD, e.getMessage());
    }
    if (Zstd.isError(result)) {
      throw badStream(ZSTD, Zstd.getErrorName(result));
    }
    if (result != claimed) {
      throw badStream(ZSTD, "the frame holds " + result + " bytes but declares " + claimed);
    }
    return (int) result;
  }

  private static boolean unsizedZstd(byte[] src, int off, int len) {
    try {
      return Zstd.decompressedSize(src, off, len) <= 0 && len >= 4;
    } catch (RuntimeException e) {
      return false; // not zstd: the sized path names the error
    }
  }

  /** A zstd frame without a content size, inflated as a stream up to {@code limit}. */
  private int unzstdStream(byte[] src, int off, int len, int limit) {
    int n = 0;
    try (ZstdInputStream in = new ZstdInputStream(new ByteArrayInputStream(src, off, len))) {
      for (;;) {
        if (n == out.length) {
          if (n >= limit) {
            if (in.read() < 0) {
              return n;
            }
            throw tooLarge(ZSTD, limit, -1);
          }
          grow(n + 1, n, limit, ZSTD);
        }
        int got = in.read(out, n, out.length - n);
        if (got < 0) {
          return n;
        }
        n += got;
      }
    } catch (IOException | RuntimeException e) {
      throw badStream(ZSTD, e.getMessage() == null ? e.toString() : e.getMessage());
    }
  }

  /**
   * Snappy as {@code raylog.storage.compression.snappy_decompress}: xerial framing or one raw
   * block; every block's declared length is checked against what is left of the limit before it
   * is inflated.
   */
  private int unsnappy(byte[] src, int off, int len, int limit) {
    boolean xerial = len >= XERIAL_MAGIC.length;
    for (int i = 0; xerial && i < XERIAL_MAGIC.length; i++) {
      xerial = src[off + i] == XERIAL_MAGIC[i];
    }
    if (!xerial) {
      return snappyBlock(src, off, len, 0, limit);
    }
    if (len < 16) {
      throw badStream(SNAPPY, "the xerial header is cut");
    }
    int n = 0;
    int p = off + 16;
    int end = off + len;
    while (p < end) {
      if (end - p < 4) {
        throw badStream(SNAPPY, "a xerial block length is cut");
      }
      int blen = FetchClient.readInt(src, p);
      p += 4;
      if (blen < 0 || blen > end - p) {
        throw badStream(SNAPPY, "a xerial block claims " + (blen & 0xFFFFFFFFL) + " bytes, more than remain");
      }
      n = snappyBlock(src, p, blen, n, limit);
      p += blen;
    }
    return n;
  }

  /** One raw snappy block inflated into {@link #output()} at {@code at}; the output's new length. */
  private int snappyBlock(byte[] src, int off, int len, int at, int limit) {
    int claimed;
    try {
      claimed = Snappy.uncompressedLength(src, off, len);
    } catch (IOException | RuntimeException e) {
      throw badStream(SNAPPY, "bad length preamble: " + e.getMessage());
    }
    if (claimed < 0 || (long) at + claimed > limit) {
      throw tooLarge(SNAPPY, limit, (long) at + (claimed & 0xFFFFFFFFL));
    }
    if (at + claimed > out.length) {
      grow(at + claimed, at, limit, SNAPPY);
    }
    int got;
    try {
      got = Snappy.uncompress(src, off, len, out, at);
    } catch (IOException | RuntimeException e) {
      throw badStream(SNAPPY, e.getMessage() == null ? e.toString() : e.getMessage());
    }
    if (got != claimed) {
      throw badStream(SNAPPY, "a block declares " + claimed + " bytes but holds " + got);
    }
    return at + got;
  }

  static RaylogReadException tooLarge(int codec, long limit, long claimed) {
    String what = claimed >= 0 ? "claims " + claimed + " bytes" : "inflates past " + limit + " bytes";
    return new RaylogReadException(
        RaylogReadException.MESSAGE_TOO_LARGE,
        name(codec) + " wrapper " + what + ", more than the limit of " + limit
            + " bytes for a decompressed message set; send smaller compressed batches");
  }

  static RaylogReadException badStream(int codec, String why) {
    return new RaylogReadException(
        RaylogReadException.INVALID_MESSAGE,
        "the value of a " + name(codec) + " wrapper message is not a valid " + name(codec) + " stream (" + why
            + "); the producer sent a malformed batch");
  }
}
