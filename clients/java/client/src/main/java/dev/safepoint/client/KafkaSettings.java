package dev.safepoint.client;

import java.util.Properties;
import java.util.Set;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.producer.ProducerConfig;

/**
 * The kafka-clients settings a builder's {@code kafka(key, value)} takes (TLS, SASL, client id, timeouts), and
 * those it refuses: the ones the client's guarantees rest on.
 */
final class KafkaSettings {
    /** What a producer's delivery guarantees and bounds rest on. */
    static final Set<String> PRODUCER_OWNED = Set.of(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, ProducerConfig.ACKS_CONFIG,
            ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, ProducerConfig.PARTITIONER_CLASS_CONFIG,
            ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, ProducerConfig.MAX_BLOCK_MS_CONFIG, ProducerConfig.RETRIES_CONFIG,
            ProducerConfig.MAX_IN_FLIGHT_REQUESTS_PER_CONNECTION, ProducerConfig.TRANSACTIONAL_ID_CONFIG,
            ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG);
    /** What a consumer reads and from where. */
    static final Set<String> CONSUMER_OWNED = Set.of(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, ConsumerConfig.GROUP_ID_CONFIG,
            ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, ConsumerConfig.AUTO_OFFSET_RESET_CONFIG,
            ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG);

    private KafkaSettings() {}

    /** Puts key = value into into, unless key is one of owned: then an IllegalArgumentException that names it. */
    @SafeVarargs
    static void put(Properties into, String key, Object value, Set<String>... owned) {
        for (Set<String> o : owned) {
            if (o.contains(key)) {
                throw new IllegalArgumentException("safepoint: the Kafka setting " + key + " is the client's own (its "
                        + "guarantees rest on it); leave it out");
            }
        }
        into.put(key, value);
    }

    /** A copy of p. */
    static Properties copy(Properties p) {
        Properties c = new Properties();
        c.putAll(p);
        return c;
    }
}
