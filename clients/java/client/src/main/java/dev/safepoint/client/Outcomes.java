package dev.safepoint.client;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.function.Function;
import org.apache.kafka.clients.consumer.CloseOptions;
import org.apache.kafka.clients.consumer.Consumer;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/** Follows the status topic from where it ended when made, for the outcomes of watched actions. Not thread-safe. */
final class Outcomes implements AutoCloseable {
    /** The topic the job writes each cluster's status to, with its control actions' outcomes. */
    static final String DEFAULT_STATUS_TOPIC = "safepoint.status";

    /** The consumer of a hold's outcomes, from its settings. */
    static final Function<Properties, Consumer<byte[], byte[]>> KAFKA =
            p -> new KafkaConsumer<>(p, new ByteArrayDeserializer(), new ByteArrayDeserializer());

    private final Consumer<byte[], byte[]> consumer;
    private final byte[] key;
    private final Set<String> watched = new HashSet<>();
    private final Map<String, String> seen = new HashMap<>();
    private boolean lastRead;

    /** An id part as the job keys records: % and / escaped. */
    static String escapeId(String part) {
        return part.replace("%", "%25").replace("/", "%2F");
    }

    /**
     * Positions a consumer at the status topic's end now (before the action is published, so that its outcome
     * cannot be missed); an exception says why outcomes cannot be followed.
     */
    Outcomes(String bootstrap, String topic, String cluster, Properties extra,
             Function<Properties, Consumer<byte[], byte[]>> consumers) {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG, "250");
        p.put(ConsumerConfig.ALLOW_AUTO_CREATE_TOPICS_CONFIG, "false");
        p.put(ConsumerConfig.CLIENT_ID_CONFIG, "safepoint-outcomes-" + cluster);
        p.putAll(extra);
        consumer = consumers.apply(p);
        try {
            List<PartitionInfo> infos = consumer.partitionsFor(topic, Duration.ofSeconds(10));
            List<TopicPartition> tps = new ArrayList<>();
            if (infos != null) {
                for (PartitionInfo i : infos) {
                    tps.add(new TopicPartition(topic, i.partition()));
                }
            }
            if (tps.isEmpty()) {
                throw new SafepointException("the status topic " + topic + " cannot be read: it has no partitions");
            }
            Map<TopicPartition, Long> ends = consumer.endOffsets(tps, Duration.ofSeconds(10));
            consumer.assign(tps);
            for (TopicPartition tp : tps) {
                consumer.seek(tp, ends.get(tp));
            }
        } catch (RuntimeException e) {
            consumer.close(CloseOptions.timeout(Duration.ZERO));
            throw e instanceof SafepointException ? e
                    : new SafepointException("the status topic " + topic + " cannot be read: " + e, e);
        }
        key = escapeId(cluster).getBytes(StandardCharsets.UTF_8);
    }

    void watch(String actionId) {
        watched.add(actionId);
    }

    /** Reads what the status topic has (waiting up to wait) and returns the watched actions' new or changed outcomes. */
    List<Outcome> poll(Duration wait) {
        List<Outcome> changed = new ArrayList<>();
        lastRead = false;
        for (ConsumerRecord<byte[], byte[]> rec : consumer.poll(wait)) {
            lastRead = true;
            if (rec.key() == null || !Arrays.equals(rec.key(), key) || rec.value() == null) {
                continue;
            }
            Map<String, Object> status;
            try {
                status = Json.parseObject(rec.value());
            } catch (Exception e) {
                continue; // not a record of the job's: not ours to judge here
            }
            if (!"cluster_status".equals(status.get("type")) || !(status.get("actions") instanceof List<?> actions)) {
                continue;
            }
            for (Object raw : actions) {
                if (!(raw instanceof Map<?, ?> a)) {
                    continue;
                }
                String id = Json.str(a.get("id"));
                String text = Json.canonicalString(a);
                if (!watched.contains(id) || text.equals(seen.get(id))) {
                    continue;
                }
                seen.put(id, text);
                changed.add(new Outcome(id, Json.str(a.get("type")), Json.str(a.get("holder")),
                        Json.str(a.get("outcome")), Json.str(a.get("reason")), Json.str(a.get("detail"))));
            }
        }
        return changed;
    }

    /** Whether the last poll read any record of the topic. */
    boolean lastPollRead() {
        return lastRead;
    }

    /** The outcome of actionId, waiting up to timeout for the job to report it (null: not in time). */
    Outcome await(String actionId, Duration timeout) {
        watch(actionId);
        long deadline = System.nanoTime() + timeout.toNanos();
        while (true) {
            long left = deadline - System.nanoTime();
            for (Outcome o : poll(Duration.ofNanos(Math.max(0, Math.min(500_000_000L, left))))) {
                if (o.id().equals(actionId)) {
                    return o;
                }
            }
            if (deadline - System.nanoTime() <= 0) {
                return null;
            }
        }
    }

    @Override
    public void close() {
        consumer.close(CloseOptions.timeout(Duration.ofSeconds(2)));
    }
}
