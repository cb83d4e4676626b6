package dev.safepoint.client;

import java.nio.charset.StandardCharsets;
import java.security.SecureRandom;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.ReentrantLock;
import java.util.function.Consumer;
import java.util.function.LongSupplier;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Pins a cluster's history at ts by name (a backup's, a changefeed's): set by {@link #start}, renewed in the
 * background before its TTL runs out, released by {@link #close}. Only its owner (its token) renews, moves and
 * releases it. start waits for the job's outcome on the status topic: a hold below what the job may already have
 * compacted is refused ({@link HoldRefusedException}); {@link #check} and onLost say when the job refuses or
 * expires it later. Made by {@link #builder}.
 */
public final class ServiceHold implements AutoCloseable {
    /** The topic of operators' and holders' control events. */
    public static final String DEFAULT_CONTROL_TOPIC = "safepoint.control";
    /** The topic the job writes each cluster's status to, with its control actions' outcomes. */
    public static final String DEFAULT_STATUS_TOPIC = Outcomes.DEFAULT_STATUS_TOPIC;

    private static final Logger LOG = LoggerFactory.getLogger(ServiceHold.class);
    private static final SecureRandom RANDOM = new SecureRandom();

    public final String cluster;
    public final String holder;
    public final String ownerToken;

    private final Builder cfg;
    private final ReentrantLock mu = new ReentrantLock();
    private final ReentrantLock polling = new ReentrantLock();
    private long ts;
    private final long ttlMs;
    private final KafkaProducer<byte[], byte[]> producer;
    private Outcomes outcomes;
    private final List<String> mine = new ArrayList<>();
    private Outcome last;
    private Outcome lost;
    private final CountDownLatch stop = new CountDownLatch(1);
    private Thread renewer;
    private long renewals;
    private long failures;
    private boolean closed;
    private boolean started;

    /** A hold's renewals and the renewals that failed (retried at the next one). */
    public record Stats(long renewals, long failures) {}

    /** The settings of the hold of holder on cluster at ts for ttl. */
    public static Builder builder(String bootstrap, String cluster, String holder, long ts, Duration ttl) {
        return new Builder(bootstrap, cluster, holder, ts, ttl);
    }

    /** A hold's settings. */
    public static final class Builder {
        final String bootstrap;
        final String cluster;
        final String holder;
        final long ts;
        final Duration ttl;
        String topic = DEFAULT_CONTROL_TOPIC;
        String statusTopic = DEFAULT_STATUS_TOPIC;
        Duration outcomeTimeout = Duration.ofSeconds(30);
        Consumer<Outcome> onLost;
        String label = "";
        String controlKey = "";
        String ownerToken = "";
        Duration renewEvery;
        LongSupplier wallClock = System::currentTimeMillis;
        final Properties kafka = new Properties();

        Builder(String bootstrap, String cluster, String holder, long ts, Duration ttl) {
            this.bootstrap = bootstrap;
            this.cluster = cluster;
            this.holder = holder;
            this.ts = ts;
            this.ttl = ttl;
            this.renewEvery = ttl.dividedBy(3);
        }

        /** The control topic (default safepoint.control). */
        public Builder controlTopic(String t) { topic = t; return this; }
        /** Follows the job's outcomes on this status topic (default safepoint.status; "" follows none). */
        public Builder statusTopic(String t) { statusTopic = t == null ? "" : t; return this; }
        /** How long start waits for the job's outcome (default 30 s; past it the hold is renewed meanwhile). */
        public Builder outcomeTimeout(Duration d) { outcomeTimeout = d; return this; }
        /** Called (from the renewing thread) when the job refuses or expires the hold after start. */
        public Builder onLost(Consumer<Outcome> f) { onLost = f; return this; }
        /** What the hold is for (shown in the status). */
        public Builder label(String l) { label = l == null ? "" : l; return this; }
        /** Signs the hold's control events with the cluster's control key. */
        public Builder controlKey(String k) { controlKey = k == null ? "" : k; return this; }
        /** Makes the hold this token's (a process taking over a hold after a restart passes it back). */
        public Builder ownerToken(String t) { ownerToken = t == null ? "" : t; return this; }
        /** How often the hold is renewed (default a third of its TTL). */
        public Builder renewEvery(Duration d) { renewEvery = d; return this; }
        /** Replaces the wall clock in ms (tests). */
        public Builder wallClock(LongSupplier f) { wallClock = f; return this; }
        /** A setting of kafka-clients (TLS, SASL...), for the producer and the status consumer. */
        public Builder kafka(String key, Object value) { kafka.put(key, value); return this; }

        public ServiceHold build() {
            return new ServiceHold(this);
        }
    }

    private ServiceHold(Builder cfg) {
        if (cfg.ttl.toMillis() < 1) {
            throw new IllegalArgumentException("safepoint: a hold's TTL must be at least 1 ms, got " + cfg.ttl);
        }
        this.cfg = cfg;
        this.cluster = cfg.cluster;
        this.holder = cfg.holder;
        this.ts = cfg.ts;
        this.ttlMs = cfg.ttl.toMillis();
        this.ownerToken = cfg.ownerToken.isEmpty() ? randomHex(16) : cfg.ownerToken;
        producer = new KafkaProducer<>(Reporter.producerSettings(cfg.bootstrap, "safepoint-hold-" + cfg.holder, cfg.kafka),
                new ByteArraySerializer(), new ByteArraySerializer());
    }

    static String randomHex(int n) {
        byte[] b = new byte[n];
        RANDOM.nextBytes(b);
        return HexFormat.of().formatHex(b);
    }

    private String publish(String kind, Duration timeout) {
        String actionId = randomHex(16);
        Map<String, Object> event;
        mu.lock();
        try {
            event = Json.obj("v", 1, "type", kind, "cluster", cluster, "wall_ms", cfg.wallClock.getAsLong(),
                    "action_id", actionId, "holder", holder);
            if (kind.equals("service_hold")) {
                event.put("ts", ts);
                event.put("ttl_ms", ttlMs);
                event.put("owner", Signing.ownerDigest(ownerToken));
                if (!cfg.label.isEmpty()) {
                    event.put("label", cfg.label);
                }
                mine.add(actionId); // the newest actions' outcomes are watched
                if (mine.size() > 16) {
                    mine.subList(0, mine.size() - 16).clear();
                }
            } else {
                event.put("owner_token", ownerToken);
            }
        } finally {
            mu.unlock();
        }
        if (!cfg.controlKey.isEmpty()) {
            event.put("sig", Signing.signControl(event, cfg.controlKey));
        }
        byte[] value = Json.canonical(event);
        try {
            producer.send(new ProducerRecord<>(cfg.topic, null, cluster.getBytes(StandardCharsets.UTF_8), value,
                    Reporter.clusterHeader(cluster)))
                    .get(timeout.toMillis(), TimeUnit.MILLISECONDS);
        } catch (ExecutionException e) {
            throw new SafepointException("safepoint: the " + kind + " event was not acknowledged: " + e.getCause(),
                    e.getCause());
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new SafepointException("safepoint: interrupted publishing the " + kind + " event", e);
        } catch (java.util.concurrent.TimeoutException e) {
            throw new SafepointException("safepoint: the " + kind + " event was not acknowledged in " + timeout, e);
        } catch (RuntimeException e) {
            throw new SafepointException("safepoint: the " + kind + " event was not published: " + e, e);
        }
        return actionId;
    }

    /**
     * Sets the hold and waits for the job's outcome ({@link HoldRefusedException} when refused; past the outcome
     * timeout, or without a status topic, once the broker has it), then renews it in the background.
     */
    public ServiceHold start() {
        if (!cfg.statusTopic.isEmpty()) {
            try {
                outcomes = new Outcomes(cfg.bootstrap, cfg.statusTopic, cluster, cfg.kafka); // before publishing
            } catch (RuntimeException e) {
                LOG.warn("safepoint: the job's outcomes cannot be followed for hold {}; publishing without them: {}",
                        holder, e.getMessage());
            }
        }
        String actionId;
        try {
            actionId = publish("service_hold", Duration.ofSeconds(60));
        } catch (RuntimeException e) {
            closeOutcomes();
            throw e;
        }
        if (following()) {
            Outcome o;
            polling.lock();
            try {
                o = outcomes.await(actionId, cfg.outcomeTimeout);
            } finally {
                polling.unlock();
            }
            if (o == null) {
                LOG.warn("safepoint: no outcome from the job in {} (is it running?) for hold {}; renewing meanwhile",
                        cfg.outcomeTimeout, holder);
            } else if (o.lost()) {
                closeOutcomes();
                mu.lock();
                try {
                    closed = true;
                    last = o;
                } finally {
                    mu.unlock();
                }
                producer.close(Duration.ofSeconds(5));
                throw new HoldRefusedException(o);
            } else {
                mu.lock();
                try {
                    last = o;
                } finally {
                    mu.unlock();
                }
            }
        }
        mu.lock();
        try {
            started = true;
        } finally {
            mu.unlock();
        }
        renewer = new Thread(this::renew, "safepoint-hold-" + holder);
        renewer.setDaemon(true);
        renewer.start();
        return this;
    }

    /** Reads the outcomes of the hold's newest actions (up to wait); a refusal or expiry is kept, logged, handed on once. */
    private void watchOutcomes(Duration wait) {
        List<Outcome> changed;
        polling.lock();
        try {
            if (outcomes == null) {
                return;
            }
            mu.lock();
            try {
                for (String id : mine) {
                    outcomes.watch(id);
                }
            } finally {
                mu.unlock();
            }
            changed = outcomes.poll(wait);
        } catch (RuntimeException e) {
            LOG.warn("safepoint: reading the outcomes of hold {}: {}", holder, e.toString());
            return;
        } finally {
            polling.unlock();
        }
        for (Outcome o : changed) {
            if (!o.type().equals("service_hold")) {
                continue;
            }
            boolean first;
            mu.lock();
            try {
                last = o;
                first = o.lost() && lost == null;
                if (first) {
                    lost = o;
                }
            } finally {
                mu.unlock();
            }
            if (first) {
                LOG.error("safepoint: service hold {} lost: {} ({})", holder, o.outcome(), o.detail());
                if (cfg.onLost != null) {
                    cfg.onLost.accept(o);
                }
            }
        }
    }

    private void renew() {
        long every = cfg.renewEvery.toNanos();
        long next = System.nanoTime() + every;
        while (true) {
            long step = Math.min(1_000_000_000L, next - System.nanoTime());
            if (step > 0) {
                if (following()) {
                    watchOutcomes(Duration.ofNanos(step));
                } else {
                    try {
                        if (stop.await(step, TimeUnit.NANOSECONDS)) {
                            return;
                        }
                    } catch (InterruptedException e) {
                        return;
                    }
                }
            }
            if (stop.getCount() == 0) {
                return;
            }
            if (System.nanoTime() < next) {
                continue;
            }
            next = System.nanoTime() + every;
            try {
                publish("service_hold", Duration.ofSeconds(15));
                mu.lock();
                try {
                    renewals++;
                } finally {
                    mu.unlock();
                }
            } catch (RuntimeException e) {
                mu.lock();
                try {
                    failures++; // the TTL is the margin for a broker away for a while: tried again next time
                } finally {
                    mu.unlock();
                }
                LOG.warn("safepoint: renewal of service hold {} failed: {}", holder, e.toString());
            }
        }
    }

    /** A {@link HoldLostException} if the job refused or expired this hold since it was set. */
    public void check() {
        watchOutcomes(Duration.ofMillis(10));
        mu.lock();
        try {
            if (lost != null) {
                throw new HoldLostException(lost);
            }
        } finally {
            mu.unlock();
        }
    }

    /** The job's outcome of the hold's newest action it reported (null: none yet). */
    public Outcome lastOutcome() {
        mu.lock();
        try {
            return last;
        } finally {
            mu.unlock();
        }
    }

    /** The hold's renewals and failed renewals so far. */
    public Stats stats() {
        mu.lock();
        try {
            return new Stats(renewals, failures);
        } finally {
            mu.unlock();
        }
    }

    /** Moves the hold to ts (it protects what is at or above it) and renews it now. */
    public void advance(long newTs) {
        mu.lock();
        try {
            ts = newTs;
        } finally {
            mu.unlock();
        }
        publish("service_hold", Duration.ofSeconds(60));
    }

    private boolean following() {
        polling.lock();
        try {
            return outcomes != null;
        } finally {
            polling.unlock();
        }
    }

    private void closeOutcomes() {
        polling.lock();
        try {
            if (outcomes != null) {
                outcomes.close();
                outcomes = null;
            }
        } finally {
            polling.unlock();
        }
    }

    /** Stops renewing and releases the hold. Idempotent. */
    @Override
    public void close() {
        boolean wasStarted;
        mu.lock();
        try {
            if (closed) {
                return;
            }
            closed = true;
            wasStarted = started;
        } finally {
            mu.unlock();
        }
        stop.countDown();
        if (wasStarted && renewer != null) {
            try {
                renewer.join();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
        try {
            publish("service_release", Duration.ofSeconds(30));
        } finally {
            closeOutcomes();
            producer.close(Duration.ofSeconds(5));
        }
    }
}
