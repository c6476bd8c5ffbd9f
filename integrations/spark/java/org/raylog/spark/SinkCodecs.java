package org.raylog.spark;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.io.UncheckedIOException;
import java.util.zip.GZIPOutputStream;

import com.github.luben.zstd.Zstd;
import net.jpountz.lz4.LZ4FrameOutputStream;
import org.xerial.snappy.SnappyOutputStream;

/**
 * Compression of a record batch's records section for the sink, by Kafka's
 * codec numbers (a batch's attributes bits 0-2), with the libraries Spark
 * ships, in the streams raylog's partitions read
 * (raylog.storage.compression, raylog.storage.record_batch):
 *
 * <pre>
 *  1 gzip    java.util.zip's gzip stream
 *  2 snappy  snappy-java's SnappyOutputStream: xerial's framing, as Kafka's Java client writes it
 *  3 lz4     lz4-java's LZ4FrameOutputStream: one LZ4 frame of independent 64 KiB blocks
 *  4 zstd    zstd-jni's Zstd.compress at level 3: one frame that declares its content size
 * </pre>
 *
 * Stateless.
 */
final class SinkCodecs {

  /** zstd's default level (raylog's ZSTD_LEVEL) */
  static final int ZSTD_LEVEL = 3;

  private SinkCodecs() {}

  /** {@code data} compressed with Kafka's codec {@code kafka} (1-4). */
  static byte[] compress(int kafka, byte[] data) {
    if (kafka == 4) {
      return Zstd.compress(data, ZSTD_LEVEL);
    }
    ByteArrayOutputStream out = new ByteArrayOutputStream(Math.max(64, data.length / 2));
    try {
      OutputStream s;
      switch (kafka) {
        case 1:
          s = new GZIPOutputStream(out, 8192);
          break;
        case 2:
          s = new SnappyOutputStream(out);
          break;
        case 3:
          s = new LZ4FrameOutputStream(out, LZ4FrameOutputStream.BLOCKSIZE.SIZE_64KB,
              LZ4FrameOutputStream.FLG.Bits.BLOCK_INDEPENDENCE);
          break;
        default:
          throw new IllegalArgumentException("no codec " + kafka);
      }
      s.write(data);
      s.close();
    } catch (IOException e) {
      throw new UncheckedIOException(e); // a ByteArrayOutputStream does not fail
    }
    return out.toByteArray();
  }
}
