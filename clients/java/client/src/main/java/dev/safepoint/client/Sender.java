package dev.safepoint.client;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.producer.Callback;
import org.apache.kafka.clients.producer.Producer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.errors.ApiException;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A reporter's producer and its sequence: stamps each event with the node's identity and the next seq, sends it,
 * counts its delivery, replaces the producer after a failed delivery and says when a repair snapshot is due.
 * {@link #send} and {@link #rebuildIfDue} run with the reporter's lock held; the delivery callbacks take no lock
 * (a send waiting for room holds it).
 */
final class Sender {
    private static final Logger LOG = LoggerFactory.getLogger(Sender.class);

    private final ReporterConfig cfg;
    private final long incarnation;
    private Slot slot;
    private long seq;
    private long lastWall;
    private long sent;
    private long producerRestarts;
    private final AtomicBoolean needSnap = new AtomicBoolean();
    private final AtomicBoolean rebuild = new AtomicBoolean();
    private final AtomicLong delivered = new AtomicLong();
    private final AtomicLong deliveryFailures = new AtomicLong();
    /** Records sent whose delivery is not known yet; {@link #flush(Duration)} waits for it to reach 0. */
    private final AtomicLong inFlight = new AtomicLong();
    private final Object settled = new Object();

    /** A producer and whether it was retired (its records' failures then say nothing of the sequence). */
    private static final class Slot {
        final Producer<byte[], byte[]> producer;
        volatile boolean retired;

        Slot(Producer<byte[], byte[]> producer) {
            this.producer = producer;
        }
    }

    Sender(ReporterConfig cfg, long incarnation) {
        this.cfg = cfg;
        this.incarnation = incarnation;
        this.slot = newSlot();
    }

    private Slot newSlot() {
        Properties own = new Properties();
        own.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        own.putAll(cfg.kafka());
        Properties p = Reporter.producerSettings(cfg.bootstrap(), "safepoint-reporter-" + cfg.node(), own);
        try {
            return new Slot(cfg.producers().apply(p));
        } catch (KafkaException e) {
            throw new SafepointException("safepoint: cannot make the producer for " + cfg.bootstrap() + ": " + e, e);
        }
    }

    /** One record's delivery: counted, taking no lock. */
    private final class Delivery implements Callback {
        final Slot of;
        final Thread sender = Thread.currentThread();
        volatile boolean sending = true;
        Exception syncError;

        Delivery(Slot of) {
            this.of = of;
        }

        @Override
        public void onCompletion(RecordMetadata md, Exception err) {
            try {
                if (sending && Thread.currentThread() == sender && err != null) {
                    syncError = err; // failed in send itself (no room, no metadata in time): nothing published
                    return;
                }
                if (err == null) {
                    delivered.incrementAndGet();
                    return;
                }
                deliveryFailures.incrementAndGet();
                boolean first = needSnap.compareAndSet(false, true); // said once until the repair snapshot goes out
                if (!of.retired) {
                    rebuild.set(true); // the idempotent producer's sequence is lost: a new producer, then a snapshot
                    if (first) {
                        LOG.warn("safepoint: an event was not delivered; a snapshot will repair the job's view: {}",
                                err.toString());
                    }
                }
            } finally {
                settle();
            }
        }
    }

    private void settle() {
        if (inFlight.decrementAndGet() == 0) {
            synchronized (settled) {
                settled.notifyAll();
            }
        }
    }

    /** Stamps and sends one event; returns its seq. Nothing published on an exception (seq unchanged). */
    long send(String kind, Map<String, Object> fields) {
        rebuildIfDue();
        long s = seq;
        long wall = cfg.wallClock().getAsLong();
        Map<String, Object> event = Json.obj("v", 1, "type", kind, "cluster", cfg.cluster(), "wall_ms", wall, "node",
                cfg.node(), "incarnation", incarnation, "seq", s);
        event.putAll(fields);
        if (!cfg.nodeKey().isEmpty()) {
            event.put("sig", Signing.signNode(event, cfg.nodeKey()));
        }
        byte[] value = Json.canonical(event);
        Slot current = slot;
        Delivery d = new Delivery(current);
        inFlight.incrementAndGet();
        try {
            current.producer.send(new ProducerRecord<>(cfg.topic(), null, cfg.node().getBytes(StandardCharsets.UTF_8),
                    value, Reporter.clusterHeader(cfg.cluster())), d);
        } catch (ApiException e) {
            settle();
            throw new SafepointException("safepoint: the " + kind + " event was not published: " + e, e);
        } catch (KafkaException | IllegalStateException e) {
            settle();
            // the producer is unusable (a fatal error, or closed): a new one at the next send, then a snapshot
            rebuild.set(true);
            needSnap.set(true);
            throw new SafepointException("safepoint: the " + kind + " event was not published: " + e, e);
        } finally {
            d.sending = false;
        }
        if (d.syncError != null) {
            String hint = d.syncError instanceof org.apache.kafka.common.errors.TimeoutException
                    ? " (the send queue stayed full, or the topic unknown, for " + Reporter.MAX_BLOCK_MS / 1000
                    + " s; is the broker up?)" : "";
            throw new SafepointException("safepoint: the " + kind + " event was not published" + hint + ": "
                    + d.syncError, d.syncError);
        }
        seq = s + 1;
        lastWall = wall;
        sent++;
        return s;
    }

    /** Replaces the producer after a failed delivery, if one is due. */
    void rebuildIfDue() {
        if (!rebuild.get()) {
            return;
        }
        Slot old = slot;
        try {
            slot = newSlot();
        } catch (RuntimeException e) {
            LOG.error("safepoint: cannot recreate the producer: {}", e.toString());
            return;
        }
        old.retired = true;
        rebuild.set(false);
        needSnap.set(true);
        producerRestarts++;
        Daemons.once("safepoint-producer-close", () -> old.producer.close(Duration.ofSeconds(5)));
    }

    /** Whether a repair snapshot is due (an event was not delivered, or could not be published). */
    boolean repairDue() {
        return needSnap.get();
    }

    /** A snapshot restated the node (or an end could not be published: one is due). */
    void repairDue(boolean due) {
        needSnap.set(due);
    }

    /** The wall clock of the newest event sent. */
    long lastWall() {
        return lastWall;
    }

    long sent() {
        return sent;
    }

    long producerRestarts() {
        return producerRestarts;
    }

    long delivered() {
        return delivered.get();
    }

    long deliveryFailures() {
        return deliveryFailures.get();
    }

    /** Sends what lingers now and waits until every event sent is delivered or failed. */
    void flush() {
        slot.producer.flush();
    }

    /**
     * Waits up to timeout until every event sent is delivered or failed, in the calling thread (the producer sends
     * what lingers within its 5 ms linger); a SafepointException saying how many are still on their way.
     */
    void flush(Duration timeout) {
        long deadline = System.nanoTime() + timeout.toNanos();
        synchronized (settled) {
            long left;
            while (inFlight.get() > 0 && (left = deadline - System.nanoTime()) > 0) {
                try {
                    settled.wait(Math.max(1, left / 1_000_000));
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    break;
                }
            }
        }
        long pending = inFlight.get();
        if (pending > 0) {
            throw new SafepointException("safepoint: " + pending + " events not yet delivered in " + timeout);
        }
    }

    /** Closes the producer, waiting up to timeout for what it still holds (then failed). */
    void close(Duration timeout) {
        slot.producer.close(timeout);
    }
}
