package dev.safepoint.client;

import java.nio.file.Path;
import java.time.Duration;
import java.util.Properties;
import java.util.function.Function;
import java.util.function.LongSupplier;
import java.util.function.Supplier;
import org.apache.kafka.clients.producer.Producer;

/**
 * A reporter's settings, copied from its builder when it is built: a builder used again makes another reporter
 * and changes none made before. {@code kafka()} returns a copy.
 */
record ReporterConfig(String bootstrap, String node, LongSupplier clock, String cluster, String topic, Long incarnation,
                      Path stateDir, Duration heartbeat, Supplier<Figures> figures, Long retention, String nodeKey,
                      int snapshotPartBytes, ExpireCallback onExpire, LongSupplier wallClock, Properties kafka,
                      Function<Properties, Producer<byte[], byte[]>> producers) {
    ReporterConfig {
        kafka = KafkaSettings.copy(kafka);
    }

    @Override
    public Properties kafka() {
        return KafkaSettings.copy(kafka);
    }
}
