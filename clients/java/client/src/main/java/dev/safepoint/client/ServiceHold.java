package dev.safepoint.client;

import java.nio.charset.StandardCharsets;
import java.security.SecureRandom;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.ReentrantLock;
import java.util.function.Consumer;
import java.util.function.LongSupplier;
import java.util.function.Function;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.Producer;
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

    private final Config cfg;
    private final String ownerToken;
    private final ReentrantLock mu = new ReentrantLock();
    private final ReentrantLock polling = new ReentrantLock();
    private long ts;
    private final long ttlMs;
    private final Producer<byte[], byte[]> producer;
    private Outcomes outcomes;
    private final List<String> mine = new ArrayList<>();
    private Outcome last;
    private Outcome lost;
    /** Whether onLost was handed lost (the renewer does it, once). */
    private boolean told;
    private long failingSince = -1;
    private long lastFailure;
    private final CountDownLatch stop = new CountDownLatch(1);
    /** The renewing thread (start): renewals, the job's outcomes, onLost. */
    private ExecutorService renewer;
    private long renewals;
    private long failures;
    private long statusReadFailures;
    private long callbackFailures;
    /** new, starting, started, closed. */
    private enum State { NEW, STARTING, STARTED, CLOSED }

    private State state = State.NEW;
    private final CloseOnce closing = new CloseOnce();

    /** How long without a failed read of the status topic ends an episode of failures. */
    static final long STATUS_QUIET_MS = 5_000;

    /**
     * A hold's counters: its renewals, the renewals that failed (retried at the next one), the reads of the status
     * topic that failed, and the onLost callbacks that threw (each logged; the renewing goes on).
     */
    public record Stats(long renewals, long failures, long statusReadFailures, long callbackFailures) {}

    /** A hold's settings, copied from its builder when it is built. */
    private record Config(String bootstrap, String cluster, String holder, long ts, Duration ttl, String topic,
                          String statusTopic, Duration outcomeTimeout, Consumer<Outcome> onLost, String label,
                          String controlKey, String ownerToken, Duration renewEvery, LongSupplier wallClock,
                          Properties kafka, Function<Properties, Producer<byte[], byte[]>> producers,
                          Function<Properties, org.apache.kafka.clients.consumer.Consumer<byte[], byte[]>> consumers) {}

    /** The hold's cluster. */
    public String cluster() { return cfg.cluster(); }

    /** The hold's name. */
    public String holder() { return cfg.holder(); }

    /** The secret that makes this process the hold's owner (pass it back with ownerToken to take it over). */
    public String ownerToken() { return ownerToken; }

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
        /** Make the producer and the status consumer from their settings (tests replace them). */
        Function<Properties, Producer<byte[], byte[]>> producers =
                p -> new KafkaProducer<>(p, new ByteArraySerializer(), new ByteArraySerializer());
        Function<Properties, org.apache.kafka.clients.consumer.Consumer<byte[], byte[]>> consumers = Outcomes.KAFKA;

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
        /**
         * Called from the renewing thread, once, when the job refuses or expires the hold after start, or when the
         * status topic could not be read for a whole TTL (an Outcome "unknown", reason "status_unreadable": the job
         * may have expired it unseen); never from {@link #check}. What it throws is logged and counted.
         */
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
        /**
         * A setting of kafka-clients (TLS, SASL, client id, timeouts), for the producer and the status consumer; the
         * ones the client's guarantees rest on are refused with an IllegalArgumentException that names it.
         */
        public Builder kafka(String key, Object value) {
            KafkaSettings.put(kafka, key, value, KafkaSettings.PRODUCER_OWNED, KafkaSettings.CONSUMER_OWNED);
            return this;
        }

        /** The hold (not set yet: {@link ServiceHold#start}); the builder may be used again. */
        public ServiceHold build() {
            return new ServiceHold(new Config(bootstrap, cluster, holder, ts, ttl, topic, statusTopic, outcomeTimeout,
                    onLost, label, controlKey, ownerToken, renewEvery, wallClock, KafkaSettings.copy(kafka), producers,
                    consumers));
        }
    }

    private ServiceHold(Config cfg) {
        if (cfg.ttl().toMillis() < 1) {
            throw new IllegalArgumentException("safepoint: a hold's TTL must be at least 1 ms, got " + cfg.ttl());
        }
        this.cfg = cfg;
        this.ts = cfg.ts();
        this.ttlMs = cfg.ttl().toMillis();
        this.ownerToken = cfg.ownerToken().isEmpty() ? randomHex(16) : cfg.ownerToken();
        producer = cfg.producers().apply(Reporter.producerSettings(cfg.bootstrap(), "safepoint-hold-" + cfg.holder(),
                cfg.kafka()));
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
            event = Json.obj("v", 1, "type", kind, "cluster", cfg.cluster(), "wall_ms", cfg.wallClock().getAsLong(),
                    "action_id", actionId, "holder", cfg.holder());
            if (kind.equals("service_hold")) {
                event.put("ts", ts);
                event.put("ttl_ms", ttlMs);
                event.put("owner", Signing.ownerDigest(ownerToken));
                if (!cfg.label().isEmpty()) {
                    event.put("label", cfg.label());
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
        if (!cfg.controlKey().isEmpty()) {
            event.put("sig", Signing.signControl(event, cfg.controlKey()));
        }
        byte[] value = Json.canonical(event);
        try {
            producer.send(new ProducerRecord<>(cfg.topic(), null, cfg.cluster().getBytes(StandardCharsets.UTF_8), value,
                    Reporter.clusterHeader(cfg.cluster())))
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
     * timeout, or without a status topic, once the broker has it), then renews it in the background. A second
     * start is an IllegalStateException, a start after close a {@link ClosedException}; a start that failed may be
     * tried again.
     */
    public ServiceHold start() {
        mu.lock();
        try {
            if (state == State.CLOSED) {
                throw new ClosedException();
            }
            if (state != State.NEW) {
                throw new IllegalStateException("safepoint: service hold " + cfg.holder() + " is already started");
            }
            state = State.STARTING;
        } finally {
            mu.unlock();
        }
        boolean ok = false;
        try {
            set();
            ok = true;
        } finally {
            mu.lock();
            try {
                if (ok && state == State.STARTING) {
                    state = State.STARTED;
                    renewer = Daemons.single("safepoint-hold-" + cfg.holder());
                    renewer.execute(this::renew);
                } else if (state == State.STARTING) {
                    state = State.NEW;
                }
            } finally {
                mu.unlock();
            }
        }
        mu.lock();
        try {
            if (state == State.CLOSED) {
                throw new ClosedException();
            }
        } finally {
            mu.unlock();
        }
        return this;
    }

    /**
     * {@link #start} in a thread of its own: the future completes with the hold once the job took it (or the
     * outcome timeout passed), or exceptionally with what start threw ({@link HoldRefusedException}).
     */
    public CompletableFuture<ServiceHold> startAsync() {
        CompletableFuture<ServiceHold> f = new CompletableFuture<>();
        Daemons.once("safepoint-hold-start-" + cfg.holder(), () -> {
            try {
                f.complete(start());
            } catch (RuntimeException e) {
                f.completeExceptionally(e);
            }
        });
        return f;
    }

    private void set() {
        if (!cfg.statusTopic().isEmpty() && !following()) {
            try {
                // before publishing: its outcome cannot be missed
                Outcomes o = new Outcomes(cfg.bootstrap(), cfg.statusTopic(), cfg.cluster(), cfg.kafka(), cfg.consumers());
                polling.lock();
                try {
                    outcomes = o;
                } finally {
                    polling.unlock();
                }
            } catch (RuntimeException e) {
                LOG.warn("safepoint: the job's outcomes cannot be followed for hold {}; publishing without them: {}",
                        cfg.holder(), e.getMessage());
            }
        }
        String actionId = publish("service_hold", Duration.ofSeconds(60));
        if (!following()) {
            return;
        }
        Outcome o;
        polling.lock();
        try {
            o = outcomes.await(actionId, cfg.outcomeTimeout());
        } finally {
            polling.unlock();
        }
        if (o == null) {
            LOG.warn("safepoint: no outcome from the job in {} (is it running?) for hold {}; renewing meanwhile",
                    cfg.outcomeTimeout(), cfg.holder());
        } else if (o.lost()) {
            closeOutcomes();
            mu.lock();
            try {
                state = State.CLOSED;
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

    /**
     * Reads the outcomes of the hold's newest actions (up to wait); a refusal or expiry is kept and logged (the
     * renewer hands it to onLost). A read that fails is counted, logged once per episode, and after a whole TTL of
     * failures taken as the hold lost.
     */
    private void watchOutcomes(Duration wait) {
        List<Outcome> changed;
        RuntimeException failed = null;
        boolean read = false;
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
            read = outcomes.lastPollRead();
        } catch (RuntimeException e) {
            changed = List.of();
            failed = e;
        } finally {
            polling.unlock();
        }
        mu.lock();
        try {
            statusRead(read, failed);
            for (Outcome o : changed) {
                if (!o.type().equals("service_hold")) {
                    continue;
                }
                last = o;
                if (o.lost() && lost == null) {
                    lost = o;
                    LOG.error("safepoint: service hold {} lost: {} ({})", cfg.holder(), o.outcome(), o.detail());
                }
            }
        } finally {
            mu.unlock();
        }
    }

    /** Keeps what a read of the status topic gave; mu held. */
    private void statusRead(boolean read, RuntimeException failed) {
        long now = System.currentTimeMillis();
        if (failed == null) {
            if (failingSince >= 0 && (read || now - lastFailure >= STATUS_QUIET_MS)) {
                LOG.info("safepoint: the status topic is read again for hold {}", cfg.holder());
                failingSince = -1;
            }
            return;
        }
        statusReadFailures++;
        if (failingSince < 0) {
            failingSince = now;
            LOG.warn("safepoint: the status topic {} cannot be read; the job's outcomes of hold {} are unknown: {}",
                    cfg.statusTopic(), cfg.holder(), failed.toString());
        }
        lastFailure = now;
        if (lost == null && now - failingSince >= ttlMs) {
            lost = new Outcome("", "service_hold", cfg.holder(), "unknown", "status_unreadable", "the status topic "
                    + cfg.statusTopic() + " could not be read for " + (now - failingSince) + " ms, the hold's TTL ("
                    + failed + "): the job may have expired the hold");
            LOG.error("safepoint: service hold {} lost: {}", cfg.holder(), lost.detail());
        }
    }

    /** Hands a lost hold to onLost, once; the renewer calls it. */
    private void tell() {
        Outcome o;
        mu.lock();
        try {
            if (lost == null || told || cfg.onLost() == null) {
                return;
            }
            told = true;
            o = lost;
        } finally {
            mu.unlock();
        }
        try {
            cfg.onLost().accept(o);
        } catch (RuntimeException e) {
            mu.lock();
            try {
                callbackFailures++;
            } finally {
                mu.unlock();
            }
            LOG.error("safepoint: the on-lost callback of hold {} threw; renewing goes on: {}", cfg.holder(),
                    e.toString());
        }
    }

    private void renew() {
        long every = cfg.renewEvery().toNanos();
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
            tell();
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
                LOG.warn("safepoint: renewal of service hold {} failed: {}", cfg.holder(), e.toString());
            }
        }
    }

    /**
     * A {@link HoldLostException} if the job refused or expired this hold since it was set, or its status could not
     * be read for a TTL. It reads the status topic briefly in the calling thread; onLost is the renewer's to call.
     */
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

    /** The job's outcome of the hold's newest action it reported (empty: none yet). */
    public Optional<Outcome> lastOutcome() {
        mu.lock();
        try {
            return Optional.ofNullable(last);
        } finally {
            mu.unlock();
        }
    }

    /** The hold's counters so far. */
    public Stats stats() {
        mu.lock();
        try {
            return new Stats(renewals, failures, statusReadFailures, callbackFailures);
        } finally {
            mu.unlock();
        }
    }

    /** Moves the hold to ts (it protects what is at or above it) and renews it now. */
    public void advance(long newTs) {
        mu.lock();
        try {
            if (state == State.CLOSED) {
                throw new ClosedException();
            }
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

    /** close(30 s). */
    @Override
    public void close() {
        close(Duration.ofSeconds(30));
    }

    /**
     * Stops renewing and releases the hold, all within timeout. A release the broker did not acknowledge in time is
     * a SafepointException that says so: the job then ends the hold when its TTL runs out after the last renewal.
     * Safe to call more than once and from several threads: each waits, up to its own timeout, for the first.
     */
    public void close(Duration timeout) {
        closing.close(timeout, "the close of service hold " + cfg.holder(), this::shutDown);
    }

    private static Duration left(long deadline) {
        return Duration.ofNanos(Math.max(1_000_000, deadline - System.nanoTime()));
    }

    private void shutDown(long deadline) {
        boolean refused;
        ExecutorService r;
        mu.lock();
        try {
            refused = state == State.CLOSED; // refused at start: its producer is closed, nothing to release
            state = State.CLOSED;
            r = renewer;
        } finally {
            mu.unlock();
        }
        stop.countDown();
        if (r != null) {
            Daemons.await(r, left(deadline));
        }
        SafepointException notReleased = null;
        if (!refused) {
            try {
                publish("service_release", left(deadline));
            } catch (SafepointException e) {
                notReleased = new SafepointException("safepoint: service hold " + cfg.holder() + " could not be "
                        + "released (" + e.getMessage() + "); the job ends it when its TTL (" + ttlMs + " ms) runs out "
                        + "after the last renewal", e);
            }
        }
        closeOutcomes();
        if (!refused) {
            producer.close(left(deadline));
        }
        if (notReleased != null) {
            throw notReleased;
        }
    }
}
