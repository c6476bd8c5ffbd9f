package org.raylog.spark;

import net.jpountz.xxhash.XXHash32;
import net.jpountz.xxhash.XXHashFactory;

/**
 * One LZ4 frame (the format of Python's {@code lz4.frame}), decoded into one
 * contiguous output buffer so that linked blocks (lz4.frame's default, which
 * lz4-java's LZ4FrameInputStream refuses) may refer back into earlier blocks.
 *
 * <pre>
 *  magic        u32 LE  0x184D2204
 *  FLG          u8      version 01 (bits 7-6), block independence (5), block checksum (4),
 *                       content size (3), content checksum (2), reserved 0 (1), dict id (0)
 *  BD           u8      block max size (bits 6-4: 4 = 64 KiB .. 7 = 4 MiB); other bits 0
 *  content size u64 LE  when FLG bit 3
 *  dict id      u32 LE  when FLG bit 0 (not supported: raylog never sets one)
 *  HC           u8      (xxh32 of FLG..dict id) >> 8 &amp; 0xFF
 *  blocks       u32 LE size (high bit: stored uncompressed), data, xxh32 of data when FLG bit 4
 *  end mark     u32 0
 *  checksum     u32 LE  xxh32 of the content, when FLG bit 2
 * </pre>
 *
 * Checksums come from lz4-java's xxhash (in Spark's jars). Nothing may follow
 * the frame. Not thread-safe.
 */
final class Lz4Frame {

  /** A stream that is not one well-formed LZ4 frame. */
  static final class Malformed extends RuntimeException {
    private static final long serialVersionUID = 1L;

    Malformed(String message) {
      super(message, null, false, false);
    }
  }

  private static final int MAGIC = 0x184D2204;
  private static final XXHash32 XXH = XXHashFactory.fastestJavaInstance().hash32();

  private final byte[] src;
  private final int end;
  private int pos;
  private final boolean blockChecksum;
  private final boolean contentChecksum;
  private final int blockMax;
  private final long contentSize;

  Lz4Frame(byte[] src, int off, int len) {
    this.src = src;
    this.end = off + len;
    this.pos = off;
    need(7);
    if (le32(pos) != MAGIC) {
      throw new Malformed("not an LZ4 frame: bad magic");
    }
    int descriptor = pos + 4;
    int flg = src[descriptor] & 0xFF;
    int bd = src[descriptor + 1] & 0xFF;
    if ((flg >>> 6) != 1) {
      throw new Malformed("unsupported LZ4 frame version " + (flg >>> 6));
    }
    if ((flg & 0x02) != 0 || (bd & 0x8F) != 0) {
      throw new Malformed("reserved bits are set in the frame descriptor");
    }
    if ((flg & 0x01) != 0) {
      throw new Malformed("frames with a dictionary id are not supported");
    }
    int sizeCode = (bd >>> 4) & 0x07;
    if (sizeCode < 4) {
      throw new Malformed("bad block maximum size code " + sizeCode);
    }
    blockMax = 1 << (2 * sizeCode + 8);
    blockChecksum = (flg & 0x10) != 0;
    contentChecksum = (flg & 0x04) != 0;
    pos = descriptor + 2;
    if ((flg & 0x08) != 0) {
      need(8);
      contentSize = le32(pos) & 0xFFFFFFFFL | ((long) le32(pos + 4) << 32);
      if (contentSize < 0) {
        throw new Malformed("content size out of range");
      }
      pos += 8;
    } else {
      contentSize = -1;
    }
    need(1);
    int hc = (XXH.hash(src, descriptor, pos - descriptor, 0) >>> 8) & 0xFF;
    if ((src[pos] & 0xFF) != hc) {
      throw new Malformed("frame descriptor checksum mismatch");
    }
    pos += 1;
  }

  /** The declared content size, or -1. */
  long contentSize() {
    return contentSize;
  }

  /** Decode the blocks into {@code codecs}' output (at most {@code limit} bytes); return the length. */
  int decode(Codecs codecs, int limit) {
    byte[] dst = codecs.output();
    int d = 0;
    for (;;) {
      need(4);
      int word = le32(pos);
      pos += 4;
      if (word == 0) {
        break;
      }
      boolean stored = (word & 0x80000000) != 0;
      int size = word & 0x7FFFFFFF;
      if (size > blockMax) {
        throw new Malformed("block of " + size + " bytes is larger than the frame's maximum " + blockMax);
      }
      need(size + (blockChecksum ? 4 : 0));
      if (blockChecksum && XXH.hash(src, pos, size, 0) != le32(pos + size)) {
        throw new Malformed("block checksum mismatch");
      }
      int room = (int) Math.min((long) d + blockMax, limit);
      if (dst.length < room) {
        dst = codecs.grow(room, d, limit, Codecs.LZ4);
      }
      if (stored) {
        if (d + size > limit) {
          throw Codecs.tooLarge(Codecs.LZ4, limit, -1);
        }
        System.arraycopy(src, pos, dst, d, size);
        d += size;
      } else {
        d = block(src, pos, pos + size, dst, d, Math.min(dst.length, limit));
      }
      pos += size + (blockChecksum ? 4 : 0);
    }
    if (contentChecksum) {
      need(4);
      if (XXH.hash(dst, 0, d, 0) != le32(pos)) {
        throw new Malformed("content checksum mismatch");
      }
      pos += 4;
    }
    if (contentSize >= 0 && d != contentSize) {
      throw new Malformed("the frame holds " + d + " bytes but declares " + contentSize);
    }
    if (pos != end) {
      throw new Malformed("trailing bytes");
    }
    return d;
  }

  /**
   * Decode one LZ4 block ({@code src[s..srcEnd)}) to {@code dst} at {@code d};
   * matches may reach back anywhere into {@code dst[0..d)}. Returns the new end.
   */
  static int block(byte[] src, int s, int srcEnd, byte[] dst, int d, int dstLimit) {
    for (;;) {
      if (s >= srcEnd) {
        throw new Malformed("a block ends without its last literals");
      }
      int token = src[s++] & 0xFF;
      int literals = token >>> 4;
      if (literals == 15) {
        int b;
        do {
          if (s >= srcEnd) {
            throw new Malformed("a block is cut in a literal length");
          }
          b = src[s++] & 0xFF;
          literals += b;
        } while (b == 255);
      }
      if (literals > srcEnd - s) {
        throw new Malformed("literals run past the block");
      }
      if (literals > dstLimit - d) {
        throw overflow(dstLimit);
      }
      System.arraycopy(src, s, dst, d, literals);
      s += literals;
      d += literals;
      if (s == srcEnd) {
        return d; // the last sequence has literals only
      }
      if (srcEnd - s < 2) {
        throw new Malformed("a block is cut in a match offset");
      }
      int distance = (src[s] & 0xFF) | ((src[s + 1] & 0xFF) << 8);
      s += 2;
      if (distance == 0 || distance > d) {
        throw new Malformed("a match refers to " + distance + " bytes back, before the output");
      }
      int length = token & 0x0F;
      if (length == 15) {
        int b;
        do {
          if (s >= srcEnd) {
            throw new Malformed("a block is cut in a match length");
          }
          b = src[s++] & 0xFF;
          length += b;
        } while (b == 255);
      }
      length += 4;
      if (length > dstLimit - d) {
        throw overflow(dstLimit);
      }
      int from = d - distance;
      if (distance >= length) {
        System.arraycopy(dst, from, dst, d, length);
        d += length;
      } else {
        // an overlapping match repeats the last `distance` bytes
        int stop = d + length;
        while (d < stop) {
          dst[d++] = dst[from++];
        }
      }
    }
  }

  private static RaylogReadException overflow(int limit) {
    return Codecs.tooLarge(Codecs.LZ4, limit, -1);
  }

  private void need(int n) {
    if (n < 0 || end - pos < n) {
      throw new Malformed("truncated");
    }
  }

  private int le32(int p) {
    return (src[p] & 0xFF) | ((src[p + 1] & 0xFF) << 8) | ((src[p + 2] & 0xFF) << 16) | ((src[p + 3] & 0xFF) << 24);
  }
}
