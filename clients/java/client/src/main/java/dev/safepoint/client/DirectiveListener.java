package dev.safepoint.client;

import java.security.PublicKey;
import java.time.Duration;
import java.util.ArrayList;
import java.util.EnumMap;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.OptionalLong;
import java.util.Properties;
import java.util.concurrent.ExecutorService;
import java.util.function.Consumer;
import org.apache.kafka.clients.consumer.CloseOptions;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Follows one cluster's directives: it reads the compacted directives topic from its start without a consumer
 * group, delivers of its backlog only the newest directive, then each one whose seq advances; a directive of a new
 * generation of the job (which started on empty state and numbers from 1 again) is taken once its safe_ts is not
 * below the one delivered. With a reporter it feeds it every safe point, hands it the node's expiries and answers
 * the job's snapshot requests. Made by {@link #builder}; {@link #start} runs it in a thread of its own.
 */
public final class DirectiveListener implements AutoCloseable {
    /** The compacted topic the job writes directives to. */
    public static final String DEFAULT_DIRECTIVES_TOPIC = "safepoint.directives";
    /** How often a refused directive is logged at most (each one is counted). */
    static final long REFUSED_LOG_EVERY_MS = 60_000;

    private static final Logger LOG = LoggerFactory.getLogger(DirectiveListener.class);

    private final String cluster;

    final Config cfg;
    private KafkaConsumer<byte[], byte[]> consumer;
    private final Object mu = new Object();
    Map<Integer, Long> ends;
    final Map<Integer, Long> read = new HashMap<>();
    boolean caughtUp;
    long idleSince = System.nanoTime();
    private Directive backlogBest;
    private boolean backlogSnapshotAsk;
    private long lastSeq;
    private Directive last;
    private Long safeTs;
    private String generation = "";
    private String nodeGeneration = "";
    private boolean nodeGenerationKnown;
    private long lastExpireSeq;
    private long lastBandSeq;
    private long refusedLogged = Long.MIN_VALUE;
    private long lastAssignTry = Long.MIN_VALUE;
    /** The counters, guarded by mu. */
    private final EnumMap<Stat, Long> stats = new EnumMap<>(Stat.class);
    private volatile boolean stopping;
    /** The listener's thread (start), reading and handing on. */
    private ExecutorService thread;
    private boolean started;
    private boolean closed;

    /** The cluster followed. */
    public String cluster() { return cluster; }

    /** A listener's counters. */
    enum Stat { RECEIVED, DELIVERED, REPEATS, SUPERSEDED, OTHER_CLUSTERS, INVALID, EXPIRES_DELIVERED,
        SNAPSHOT_REQUESTS, UNSIGNED, BAD_SIGNATURES, GENERATIONS, HELD_BACK, CALLBACK_FAILURES }

    /**
     * A listener's counters since it was made; callbackFailures counts the callbacks that threw (each logged: an
     * onDirective is retried, an onExpire's records after it are handled).
     */
    public record Stats(long received, long delivered, long repeats, long superseded, long otherClusters,
                        long invalid, long expiresDelivered, long snapshotRequests, long unsigned, long badSignatures,
                        long generations, long heldBack, long callbackFailures) {}

    /** A listener's settings, copied from its builder when it is built. */
    record Config(String bootstrap, String cluster, String topic, Reporter reporter, String node, List<PublicKey> keys,
                  DirectiveCallback onDirective, Consumer<ExpireDirective> onExpire, Duration backoff,
                  Properties kafka) {}

    /** A directive callback; an exception is retried every second until it succeeds or a newer directive supersedes it. */
    @FunctionalInterface
    public interface DirectiveCallback {
        void onDirective(Directive d) throws Exception;
    }

    /** The settings of the listener of cluster's directives on the brokers of bootstrap. */
    public static Builder builder(String bootstrap, String cluster) {
        return new Builder(bootstrap, cluster);
    }

    /** A listener's settings. */
    public static final class Builder {
        final String bootstrap;
        final String cluster;
        String topic = DEFAULT_DIRECTIVES_TOPIC;
        Reporter reporter;
        String node = "";
        List<PublicKey> keys = List.of();
        DirectiveCallback onDirective;
        Consumer<ExpireDirective> onExpire;
        Duration backoff = Duration.ofSeconds(1);
        final Properties kafka = new Properties();

        Builder(String bootstrap, String cluster) {
            this.bootstrap = bootstrap;
            this.cluster = cluster;
        }

        /** The directives topic (default safepoint.directives). */
        public Builder topic(String t) { topic = t; return this; }
        /**
         * Feeds every new safe point to the reporter (readers below it are refused), hands it the node's expiries
         * and answers the job's snapshot requests with its snapshot.
         */
        public Builder reporter(Reporter r) { reporter = r; return this; }
        /** Limits expiries to this node (default: the reporter's). */
        public Builder node(String n) { node = n == null ? "" : n; return this; }
        /**
         * Acts on no directive that none of keys signed (the job's public keys, {@link Signing#parseDirectiveKeys}):
         * each is counted, logged at most once a minute, and the newest valid directive stays in force.
         */
        public Builder directiveKeys(List<PublicKey> k) { keys = List.copyOf(k); return this; }
        /** directiveKeys(Signing.parseDirectiveKeys(hex)); null or blank: no keys (every directive is taken). */
        public Builder directiveKeys(String hex) {
            keys = hex == null ? List.of() : Signing.parseDirectiveKeys(hex);
            return this;
        }
        /**
         * Called, from the listener's thread ({@link #start}), with each directive whose seq advances; an exception is
         * logged, counted and retried every second until it succeeds or a newer directive supersedes it.
         */
        public Builder onDirective(DirectiveCallback f) { onDirective = f; return this; }
        /**
         * Called with each expiry of the node (after the reporter's handle, if any), in the thread reading the
         * directives (the listener's, or {@link #poll}'s caller); an exception is logged and counted, and the records
         * after it are handled.
         */
        public Builder onExpire(Consumer<ExpireDirective> f) { onExpire = f; return this; }
        /**
         * A consumer setting of kafka-clients (TLS, SASL, client id, timeouts). What it reads and from where (the
         * bootstrap, a group, offsets, commits, deserializers) is the client's own: an IllegalArgumentException names
         * one.
         */
        public Builder kafka(String key, Object value) {
            KafkaSettings.put(kafka, key, value, KafkaSettings.CONSUMER_OWNED);
            return this;
        }

        public DirectiveListener build() {
            return new DirectiveListener(this, true);
        }
    }

    DirectiveListener(Builder b, boolean connect) {
        this.cluster = b.cluster;
        this.cfg = new Config(b.bootstrap, b.cluster, b.topic, b.reporter,
                b.node.isEmpty() && b.reporter != null ? b.reporter.node() : b.node, List.copyOf(b.keys), b.onDirective,
                b.onExpire, b.backoff, KafkaSettings.copy(b.kafka));
        if (connect) {
            Properties p = new Properties();
            p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, cfg.bootstrap());
            p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
            p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
            p.put(ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG, "200");
            p.put(ConsumerConfig.ALLOW_AUTO_CREATE_TOPICS_CONFIG, "false");
            p.put(ConsumerConfig.CLIENT_ID_CONFIG, "safepoint-listener-" + cfg.cluster());
            p.putAll(cfg.kafka());
            consumer = new KafkaConsumer<>(p, new ByteArrayDeserializer(), new ByteArrayDeserializer());
        }
    }

    /**
     * Runs the listener in a thread of its own, calling the onDirective callback, until {@link #close}. A second
     * start, or a start after close, is an IllegalStateException.
     */
    public DirectiveListener start() {
        synchronized (mu) {
            if (closed) {
                throw new IllegalStateException("safepoint: the listener is closed");
            }
            if (started) {
                throw new IllegalStateException("safepoint: the listener is already started");
            }
            started = true;
        }
        thread = Daemons.single("safepoint-directives-" + cluster);
        thread.execute(this::run);
        return this;
    }

    private void run() {
        Directive pending = null;
        while (!stopping) {
            Directive d;
            try {
                d = poll(Duration.ofMillis(200));
            } catch (WakeupException e) {
                break;
            } catch (RuntimeException e) {
                if (stopping) {
                    break;
                }
                LOG.warn("safepoint: directive listener: {}", e.toString());
                pause(cfg.backoff());
                continue;
            }
            if (d != null) {
                pending = d;
            }
            if (pending == null || cfg.onDirective() == null) {
                pending = null;
                continue;
            }
            try {
                cfg.onDirective().onDirective(pending);
                pending = null;
            } catch (Exception e) {
                count(Stat.CALLBACK_FAILURES);
                LOG.error("safepoint: on-directive failed for seq {}; retrying: {}", pending.seq(), e.toString());
                pause(cfg.backoff());
            }
        }
    }

    private void pause(Duration d) {
        try {
            Thread.sleep(d.toMillis());
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            stopping = true;
        }
    }

    /** close(10 s). */
    @Override
    public void close() {
        close(Duration.ofSeconds(10));
    }

    /**
     * Stops the listener, waiting up to timeout for its thread (a callback that does not return is left to it), and
     * closes its consumer. Safe to call more than once and from several threads.
     */
    public void close(Duration timeout) {
        long deadline = System.nanoTime() + timeout.toNanos();
        synchronized (mu) {
            if (closed) {
                return;
            }
            closed = true;
        }
        stopping = true;
        if (thread != null) {
            consumer.wakeup();
            if (!Daemons.await(thread, timeout)) {
                LOG.warn("safepoint: the listener's thread did not end in {} (is a callback stuck?)", timeout);
            }
        }
        if (consumer != null) {
            try {
                consumer.close(CloseOptions.timeout(Duration.ofNanos(Math.max(0, deadline - System.nanoTime()))));
            } catch (RuntimeException e) {
                LOG.debug("safepoint: closing the directives consumer: {}", e.toString());
            }
        }
    }

    /**
     * The next directive of the cluster whose seq advances, or null after wait. Expiries and snapshot requests met
     * on the way are handled in the calling thread. (Not while {@link #start} runs.)
     */
    public Directive poll(Duration wait) {
        if (ends == null || consumer.assignment().isEmpty()) {
            if (!assign()) {
                sleepQuietly(wait);
                Directive d = checkCaughtUp(false);
                return d;
            }
        }
        ConsumerRecords<byte[], byte[]> records = consumer.poll(wait);
        Directive out = null;
        boolean got = false;
        for (ConsumerRecord<byte[], byte[]> rec : records) {
            got = true;
            Directive d = handle(rec.partition(), rec.offset(), rec.value());
            if (d != null) {
                out = d;
            }
        }
        Directive d = checkCaughtUp(got);
        return d != null ? d : out;
    }

    private static void sleepQuietly(Duration d) {
        try {
            Thread.sleep(Math.max(1, d.toMillis()));
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    /** Assigns every partition of the topic from its start and reads their end offsets now (the backlog). */
    private boolean assign() {
        long now = System.nanoTime();
        if (ends != null && lastAssignTry != Long.MIN_VALUE && now - lastAssignTry < 1_000_000_000L) {
            return false;
        }
        lastAssignTry = now;
        List<PartitionInfo> infos = consumer.partitionsFor(cfg.topic(), Duration.ofSeconds(10));
        List<TopicPartition> tps = new ArrayList<>();
        if (infos != null) {
            for (PartitionInfo i : infos) {
                tps.add(new TopicPartition(cfg.topic(), i.partition()));
            }
        }
        if (tps.isEmpty()) {
            synchronized (mu) {
                if (ends == null) {
                    ends = new HashMap<>(); // nothing to read yet: caught up
                    idleSince = System.nanoTime();
                }
            }
            return false;
        }
        Map<TopicPartition, Long> listed = consumer.endOffsets(tps, Duration.ofSeconds(10));
        consumer.assign(tps);
        consumer.seekToBeginning(tps);
        synchronized (mu) {
            if (ends == null) {
                Map<Integer, Long> e = new HashMap<>();
                listed.forEach((tp, off) -> e.put(tp.partition(), off));
                ends = e;
                idleSince = System.nanoTime();
            }
        }
        return true;
    }

    /**
     * Delivers the backlog's newest directive once every partition was read to where it ended at the start (or,
     * past markers that are no record, after a second without one).
     */
    Directive checkCaughtUp(boolean got) {
        Directive best;
        boolean ask;
        synchronized (mu) {
            if (caughtUp || ends == null) {
                return null;
            }
            if (got) {
                idleSince = System.nanoTime();
            }
            boolean done = true;
            for (Map.Entry<Integer, Long> e : ends.entrySet()) {
                if (read.getOrDefault(e.getKey(), 0L) < e.getValue()) {
                    done = false;
                }
            }
            if (!done && System.nanoTime() - idleSince < 1_000_000_000L) {
                return null;
            }
            caughtUp = true;
            best = backlogBest;
            ask = backlogSnapshotAsk;
            backlogBest = null;
            backlogSnapshotAsk = false;
        }
        if (ask) {
            answerSnapshotRequest();
        }
        return best != null ? accept(best) : null;
    }

    /** Reads one record; a compaction directive to deliver, or null. */
    Directive handle(int partition, long offset, byte[] value) {
        synchronized (mu) {
            bump(Stat.RECEIVED);
            if (offset + 1 > read.getOrDefault(partition, 0L)) {
                read.put(partition, offset + 1);
            }
        }
        if (value == null) {
            return null; // a tombstone
        }
        Map<String, Object> obj;
        try {
            obj = Json.parseObject(value);
        } catch (Exception e) {
            return invalid(partition, offset, "not a JSON object");
        }
        if (!Json.str(obj.get("cluster")).equals(cluster)) {
            count(Stat.OTHER_CLUSTERS);
            return null;
        }
        if (!cfg.keys().isEmpty()) {
            String why = Signing.verifyDirective(obj, cfg.keys());
            if (!why.isEmpty()) {
                refused(partition, offset, obj, why);
                return null;
            }
        }
        String kind = Json.str(obj.get("type"));
        switch (kind) {
            case "members":
                return null;
            case "compaction": {
                Directive d;
                try {
                    d = Directive.parse(obj);
                } catch (IllegalArgumentException e) {
                    return invalid(partition, offset, e.getMessage());
                }
                return compaction(d);
            }
            case "expire":
            case "snapshot_request":
            case "band":
                break;
            default:
                return invalid(partition, offset, "unknown directive type " + kind);
        }
        synchronized (mu) {
            String gen = Json.str(obj.get("generation"));
            if (!nodeGenerationKnown || !gen.equals(nodeGeneration)) {
                nodeGeneration = gen;
                nodeGenerationKnown = true;
                lastExpireSeq = 0;
                lastBandSeq = 0;
            }
        }
        switch (kind) {
            case "expire": {
                ExpireDirective e;
                try {
                    e = ExpireDirective.parse(obj);
                } catch (IllegalArgumentException ex) {
                    return invalid(partition, offset, ex.getMessage());
                }
                expire(e);
                break;
            }
            case "snapshot_request":
                snapshotRequest(obj);
                break;
            default: { // band
                Long seq = Json.integer(obj.get("seq"));
                long s = seq == null ? 0 : seq;
                synchronized (mu) {
                    if (s > lastExpireSeq) {
                        lastExpireSeq = s;
                    }
                    if (Json.str(obj.get("node")).equals(cfg.node()) && s > lastBandSeq) {
                        lastBandSeq = s; // (no admission control in this client: a band changes nothing here)
                    }
                }
            }
        }
        return null;
    }

    /**
     * A directive read after best in the backlog supersedes it when it is a higher seq of the same generation, or of
     * another generation written later, but never one without a generation over one with it.
     */
    static boolean newerInBacklog(Directive d, Directive best) {
        if (best == null) {
            return true;
        }
        if (d.generation().equals(best.generation())) {
            return d.seq() > best.seq();
        }
        return !d.generation().isEmpty();
    }

    private Directive compaction(Directive d) {
        synchronized (mu) {
            if (!caughtUp) {
                if (newerInBacklog(d, backlogBest)) {
                    if (backlogBest != null) {
                        bump(Stat.SUPERSEDED);
                    }
                    backlogBest = d;
                } else {
                    bump(Stat.REPEATS);
                }
                return null;
            }
            if (last != null && !d.generation().equals(generation)) {
                if (d.generation().isEmpty()) { // a job that gives no generation (an older version's): stale here
                    bump(Stat.REPEATS);
                    return null;
                }
                if (safeTs != null && d.safeTs() < safeTs) {
                    bump(Stat.HELD_BACK);
                    return null;
                }
                LOG.warn("safepoint: the job's generation changed (it started on empty state) from {} to {} at seq {};"
                        + " taking its directives", generation, d.generation(), d.seq());
                bump(Stat.GENERATIONS);
                lastSeq = 0;
            }
            if (d.seq() <= lastSeq) {
                bump(Stat.REPEATS);
                return null;
            }
        }
        return accept(d);
    }

    private Directive accept(Directive d) {
        long safe;
        synchronized (mu) {
            lastSeq = d.seq();
            last = d;
            generation = d.generation();
            if (safeTs == null || d.safeTs() >= safeTs) {
                safeTs = d.safeTs();
            } else {
                LOG.warn("safepoint: a directive's safe_ts is below the previous one; keeping the previous (seq {}, "
                        + "safe_ts {}, kept {})", d.seq(), d.safeTs(), safeTs);
            }
            safe = safeTs;
            bump(Stat.DELIVERED);
        }
        Reporter r = cfg.reporter();
        if (r != null) {
            try {
                r.observe(d);
            } catch (RuntimeException e) {
                LOG.warn("safepoint: the reporter could not take the safe point: {}", e.toString());
            }
        }
        return d;
    }

    private void expire(ExpireDirective e) {
        boolean upToDate;
        synchronized (mu) {
            if (e.seq() <= lastExpireSeq) {
                bump(Stat.REPEATS);
                return;
            }
            lastExpireSeq = e.seq();
            upToDate = caughtUp;
        }
        if (!cfg.node().isEmpty() && !e.node().equals(cfg.node())) {
            return;
        }
        Reporter r = cfg.reporter();
        if (r != null && (!e.node().equals(r.node()) || !e.cluster().equals(r.cluster()))) {
            r = null;
        }
        if (r != null && !upToDate) {
            HoldKind kind = e.readerId().isEmpty() ? HoldKind.TX : HoldKind.READER;
            String id = e.readerId().isEmpty() ? e.txId() : e.readerId();
            if (r.find(kind, id).isEmpty()) {
                return; // of the backlog: it names a hold of an earlier process
            }
        }
        count(Stat.EXPIRES_DELIVERED);
        if (r != null) {
            r.expire(e);
        }
        if (cfg.onExpire() != null) {
            try {
                cfg.onExpire().accept(e);
            } catch (RuntimeException ex) {
                count(Stat.CALLBACK_FAILURES);
                LOG.error("safepoint: the on-expire callback threw for seq {}; the directives after it are handled: {}",
                        e.seq(), ex.toString());
            }
        }
    }

    private void snapshotRequest(Map<String, Object> obj) {
        Long seq = Json.integer(obj.get("seq"));
        long s = seq == null ? 0 : seq;
        synchronized (mu) {
            if (s > lastExpireSeq) {
                lastExpireSeq = s;
            }
            String target = cfg.node();
            if (target.isEmpty() || !Json.str(obj.get("node")).equals(target)) {
                return;
            }
            if (!caughtUp) {
                backlogSnapshotAsk = true; // answered once the backlog is read
                return;
            }
        }
        answerSnapshotRequest();
    }

    private void answerSnapshotRequest() {
        Reporter r = cfg.reporter();
        if (r == null) {
            LOG.info("safepoint: the job asks node {} for a snapshot; publish one (no reporter given)", cfg.node());
            return;
        }
        try {
            r.snapshot();
        } catch (RuntimeException e) {
            LOG.error("safepoint: the reporter failed to publish the snapshot the job asked for: {}", e.toString());
            return;
        }
        count(Stat.SNAPSHOT_REQUESTS);
    }

    private void refused(int partition, long offset, Map<String, Object> obj, String why) {
        synchronized (mu) {
            bump(why.equals("unsigned") ? Stat.UNSIGNED : Stat.BAD_SIGNATURES);
            long now = System.currentTimeMillis();
            if (refusedLogged == Long.MIN_VALUE || now - refusedLogged >= REFUSED_LOG_EVERY_MS) {
                refusedLogged = now;
                LOG.warn("safepoint: refused a directive not signed by the job's key ({}: type {}, partition {}, "
                        + "offset {}; unsigned {}, bad signatures {}); the newest valid directive stays in force", why,
                        Json.str(obj.get("type")), partition, offset, stats.getOrDefault(Stat.UNSIGNED, 0L),
                        stats.getOrDefault(Stat.BAD_SIGNATURES, 0L));
            }
        }
    }

    private Directive invalid(int partition, long offset, String why) {
        count(Stat.INVALID);
        LOG.warn("safepoint: skipped a record of the directives topic (partition {}, offset {}): {}", partition, offset,
                why);
        return null;
    }

    private void count(Stat s) {
        synchronized (mu) {
            bump(s);
        }
    }

    /** One more of s; mu held. */
    private void bump(Stat s) {
        stats.merge(s, 1L, Long::sum);
    }

    /** The listener's counters. */
    public Stats stats() {
        synchronized (mu) {
            return new Stats(n(Stat.RECEIVED), n(Stat.DELIVERED), n(Stat.REPEATS), n(Stat.SUPERSEDED),
                    n(Stat.OTHER_CLUSTERS), n(Stat.INVALID), n(Stat.EXPIRES_DELIVERED), n(Stat.SNAPSHOT_REQUESTS),
                    n(Stat.UNSIGNED), n(Stat.BAD_SIGNATURES), n(Stat.GENERATIONS), n(Stat.HELD_BACK),
                    n(Stat.CALLBACK_FAILURES));
        }
    }

    private long n(Stat s) {
        return stats.getOrDefault(s, 0L);
    }

    /** The newest safe point delivered (empty before the first). */
    public OptionalLong safeTs() {
        synchronized (mu) {
            return safeTs == null ? OptionalLong.empty() : OptionalLong.of(safeTs);
        }
    }

    /** Whether the backlog the topic held at start was read. */
    public boolean caughtUp() {
        synchronized (mu) {
            return caughtUp;
        }
    }
}
