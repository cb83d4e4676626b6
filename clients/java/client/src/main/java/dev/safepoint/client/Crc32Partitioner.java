package dev.safepoint.client;

import java.util.Map;
import java.util.zip.CRC32;
import org.apache.kafka.clients.producer.Partitioner;
import org.apache.kafka.common.Cluster;

/**
 * Places a record by the CRC-32 of its key, as librdkafka's default partitioner does, so a node's events land on
 * the partition the Python and Go clients put them on.
 */
public class Crc32Partitioner implements Partitioner {
    /** The partition of key among n partitions. */
    public static int partitionOf(byte[] key, int n) {
        CRC32 crc = new CRC32();
        crc.update(key);
        return (int) (crc.getValue() % n);
    }

    @Override
    public int partition(String topic, Object key, byte[] keyBytes, Object value, byte[] valueBytes, Cluster cluster) {
        Integer count = cluster.partitionCountForTopic(topic);
        int n = count == null ? cluster.partitionsForTopic(topic).size() : count;
        return partitionOf(keyBytes == null ? new byte[0] : keyBytes, Math.max(n, 1));
    }

    @Override
    public void close() {}

    @Override
    public void configure(Map<String, ?> configs) {}
}
