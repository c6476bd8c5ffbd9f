package org.raylog.spark;

import java.io.IOException;
import java.util.Collections;
import java.util.Iterator;
import java.util.Map;
import java.util.TreeMap;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

import org.apache.spark.sql.connector.read.streaming.Offset;

/**
 * A stream's position: the next byte offset of every partition read, as the
 * JSON Spark keeps in the query's checkpoint (the startingOffsets format):
 * {@code {"clicks": {"0": 4096, "1": 0}}}. Topics and partitions are sorted,
 * so equal positions have equal JSON. Immutable.
 */
final class RaylogOffset extends Offset {

  private static final ObjectMapper JSON = new ObjectMapper();

  final Map<String, Map<Integer, Long>> offsets;

  RaylogOffset(Map<String, Map<Integer, Long>> offsets) {
    Map<String, Map<Integer, Long>> copy = new TreeMap<>();
    for (Map.Entry<String, Map<Integer, Long>> t : offsets.entrySet()) {
      copy.put(t.getKey(), Collections.unmodifiableMap(new TreeMap<>(t.getValue())));
    }
    this.offsets = Collections.unmodifiableMap(copy);
  }

  /** The offset of a partition, or null when this position does not know it. */
  Long get(String topic, int partition) {
    Map<Integer, Long> parts = offsets.get(topic);
    return parts == null ? null : parts.get(partition);
  }

  @Override
  public String json() {
    Map<String, Map<String, Long>> out = new TreeMap<>();
    for (Map.Entry<String, Map<Integer, Long>> t : offsets.entrySet()) {
      Map<String, Long> parts = new TreeMap<>((a, b) -> Integer.compare(Integer.parseInt(a), Integer.parseInt(b)));
      for (Map.Entry<Integer, Long> p : t.getValue().entrySet()) {
        parts.put(String.valueOf(p.getKey()), p.getValue());
      }
      out.put(t.getKey(), parts);
    }
    try {
      return JSON.writeValueAsString(out);
    } catch (IOException e) {
      throw new IllegalStateException(e);
    }
  }

  static RaylogOffset parse(String json) {
    JsonNode root;
    try {
      root = JSON.readTree(json);
    } catch (IOException e) {
      throw SourceOptions.config("a raylog stream offset in the checkpoint is not JSON: " + json);
    }
    Map<String, Map<Integer, Long>> out = new TreeMap<>();
    for (Iterator<Map.Entry<String, JsonNode>> it = root.fields(); it.hasNext();) {
      Map.Entry<String, JsonNode> t = it.next();
      Map<Integer, Long> parts = new TreeMap<>();
      for (Iterator<Map.Entry<String, JsonNode>> p = t.getValue().fields(); p.hasNext();) {
        Map.Entry<String, JsonNode> e = p.next();
        parts.put(Integer.parseInt(e.getKey()), e.getValue().asLong());
      }
      out.put(t.getKey(), parts);
    }
    return new RaylogOffset(out);
  }
}
