package dev.safepoint.client;

import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.security.SecureRandom;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.OptionalLong;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.ReentrantLock;
import java.util.function.LongSupplier;
import java.util.function.Supplier;
import java.util.function.Function;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.Producer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Publishes one database node's events: its readers, transactions, heartbeats and snapshots. Safe for concurrent
 * use; events reach the partition in seq order. Made by {@link #builder}.
 */
public final class Reporter implements AutoCloseable {
    /** The topic nodes publish their events to. */
    public static final String DEFAULT_EVENTS_TOPIC = "safepoint.events";
    /**
     * The Kafka record header in which every event this client publishes names its cluster (UTF-8):
     * the job groups the record by it without reading the value.
     */
    public static final String CLUSTER_HEADER = "safepoint-cluster";
    /** A snapshot part's size: half the broker's default message limit. */
    public static final int DEFAULT_SNAPSHOT_PART_BYTES = 500_000;
    /** The least part size a reporter takes. */
    public static final int MIN_SNAPSHOT_PART_BYTES = 10_000;
    /** The most points of history_above a heartbeat carries (more are thinned evenly). */
    static final int MAX_HISTORY_POINTS = 64;
    /** A record not delivered in 5 minutes fails (the Python client's message.timeout.ms). */
    static final int DELIVERY_TIMEOUT_MS = 300_000;
    /** The longest a send waits for room in the producer's buffer (or for the topic's metadata). */
    static final int MAX_BLOCK_MS = 30_000;

    private static final Logger LOG = LoggerFactory.getLogger(Reporter.class);
    private static final SecureRandom RANDOM = new SecureRandom();

    private final String node;
    private final String cluster;
    private final long incarnation;

    private final ReporterConfig cfg;
    private final LongSupplier clock;
    private final ReentrantLock mu = new ReentrantLock();
    private final Sender sender;
    private final HoldRegistry holds;
    private final LazyRegistration lazy;
    /** Set by close before it takes the lock: a call that comes after it is refused. */
    private volatile boolean closed;
    private Heartbeats heartbeats;
    private final CloseOnce closing = new CloseOnce();
    private final AtomicLong callbackFailures = new AtomicLong();
    private long repairSnapshots;
    private long expired;
    private long expiriesIgnored;

    /**
     * A reporter's counters since it was made; callbackFailures counts the expiry callbacks that threw (each
     * logged; the expiry went on).
     */
    public record Stats(long sent, long delivered, long deliveryFailures, long producerRestarts, long repairSnapshots,
                        long expired, long expiriesIgnored, long callbackFailures) {}

    /** The node's id. */
    public String node() { return node; }

    /** The node's cluster. */
    public String cluster() { return cluster; }

    /** This process's incarnation. */
    public long incarnation() { return incarnation; }

    /** The settings of a reporter of node, publishing to bootstrap ("host:port,..."), clock its MVCC time. */
    public static Builder builder(String bootstrap, String node, LongSupplier clock) {
        return new Builder(bootstrap, node, clock);
    }

    /**
     * A reporter's settings. {@link #build} copies them: the builder may be used again, and changes no reporter
     * built before.
     */
    public static final class Builder {
        final String bootstrap;
        final String node;
        final LongSupplier clock;
        String cluster = "default";
        String topic = DEFAULT_EVENTS_TOPIC;
        Long incarnation;
        Path stateDir;
        Duration heartbeat = Duration.ofSeconds(1);
        Supplier<Figures> figures;
        Long retention;
        String nodeKey = "";
        int snapshotPartBytes = DEFAULT_SNAPSHOT_PART_BYTES;
        ExpireCallback onExpire;
        LongSupplier wallClock = System::currentTimeMillis;
        final Properties kafka = new Properties();
        /** Makes the producer from its settings (tests replace it). */
        Function<Properties, Producer<byte[], byte[]>> producers =
                p -> new KafkaProducer<>(p, new ByteArraySerializer(), new ByteArraySerializer());

        Builder(String bootstrap, String node, LongSupplier clock) {
            this.bootstrap = bootstrap;
            this.node = node;
            this.clock = clock;
        }

        /** The node's cluster (default "default"). */
        public Builder cluster(String c) { cluster = c; return this; }
        /** The events topic (default safepoint.events). */
        public Builder eventsTopic(String t) { topic = t; return this; }
        /** The process's incarnation (default: the wall clock in ms at start, or one more than the stateDir kept). */
        public Builder incarnation(long n) { incarnation = n; return this; }
        /** Keeps the incarnation in dir, so that it grows across restarts whatever the clock does. */
        public Builder stateDir(Path dir) { stateDir = dir; return this; }
        /** The heartbeat interval (default 1 s; zero: heartbeats only when {@link #heartbeat} is called). */
        public Builder heartbeat(Duration every) { heartbeat = every; return this; }
        /** What each heartbeat carries besides the node's clock. */
        public Builder figures(Supplier<Figures> f) { figures = f; return this; }
        /**
         * Lazy registration: a hold is published only once it can hold history back (below mvcc_now - retention of
         * a heartbeat, prepared, or in a snapshot). At most the job's retention.
         */
        public Builder retention(long r) { retention = r; return this; }
        /** Signs every event with the node's own key (safepoint node-key CLUSTER NODE). */
        public Builder nodeKey(String key) { nodeKey = key == null ? "" : key; return this; }
        /** The size a snapshot's part may reach (default 500,000; at least 10,000). */
        public Builder snapshotPartBytes(int n) { snapshotPartBytes = n; return this; }
        /**
         * The callback of an expiry that reaches a handle without one of its own. It runs in the thread that hands
         * the directive on (the listener's); what it throws is logged and counted, and the expiry goes on.
         */
        public Builder onExpire(ExpireCallback f) { onExpire = f; return this; }
        /** Replaces the wall clock in ms (tests). */
        public Builder wallClock(LongSupplier f) { wallClock = f; return this; }
        /**
         * A producer setting of kafka-clients (TLS, SASL, client id, timeouts). The settings the client's guarantees
         * rest on (acks, idempotence, the partitioner, the delivery and blocking bounds, retries, in-flight requests,
         * transactions, serializers, the bootstrap) are its own: an IllegalArgumentException names one.
         */
        public Builder kafka(String key, Object value) {
            KafkaSettings.put(kafka, key, value, KafkaSettings.PRODUCER_OWNED);
            return this;
        }

        /** The reporter; with a heartbeat interval it starts heartbeating now. */
        public Reporter build() {
            Reporter r = new Reporter(new ReporterConfig(bootstrap, node, clock, cluster, topic, incarnation, stateDir,
                    heartbeat, figures, retention, nodeKey, snapshotPartBytes, onExpire, wallClock, kafka, producers));
            r.heartbeats = Heartbeats.start(r.node, r.cfg.heartbeat(), r::heartbeat);
            return r;
        }
    }

    private Reporter(ReporterConfig cfg) {
        checkId("node", cfg.node());
        if (cfg.snapshotPartBytes() < MIN_SNAPSHOT_PART_BYTES) {
            throw new IllegalArgumentException("safepoint: snapshot part bytes must be at least "
                    + MIN_SNAPSHOT_PART_BYTES + ", got " + cfg.snapshotPartBytes());
        }
        if (cfg.retention() != null && cfg.retention() < 0) {
            throw new IllegalArgumentException("safepoint: retention must be >= 0, got " + cfg.retention());
        }
        this.cfg = cfg;
        this.node = cfg.node();
        this.cluster = cfg.cluster();
        this.clock = cfg.clock();
        this.incarnation = cfg.incarnation() != null ? cfg.incarnation()
                : IncarnationStore.next(cfg.stateDir(), cfg.cluster(), cfg.node(), cfg.wallClock().getAsLong());
        this.lazy = new LazyRegistration(cfg.retention());
        this.holds = new HoldRegistry(node);
        this.sender = new Sender(cfg, incarnation);
    }

    /**
     * The producer settings of every client of the project (the Python client's): idempotent, acks from all
     * in-sync replicas, a send blocking at most 30 s, a record failed after 5 minutes, a key's partition by its
     * CRC-32; then the caller's own settings (TLS, SASL).
     */
    static Properties producerSettings(String bootstrap, String clientId, Properties own) {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, Integer.toString(DELIVERY_TIMEOUT_MS));
        p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, Integer.toString(MAX_BLOCK_MS));
        p.put(ProducerConfig.PARTITIONER_CLASS_CONFIG, Crc32Partitioner.class.getName());
        p.put(ProducerConfig.CLIENT_ID_CONFIG, clientId);
        p.putAll(own);
        return p;
    }

    /** Stamps and publishes one event; call with mu held. Returns its seq; nothing published on an exception. */
    private long send(String kind, Map<String, Object> fields) {
        if (closed) {
            throw new ClosedException();
        }
        return sender.send(kind, fields);
    }

    /** Publishes one heartbeat now (the background thread does this every interval); a repair snapshot goes first. */
    public void heartbeat() {
        Figures figures = cfg.figures() != null ? cfg.figures().get() : null;
        if (figures == null) {
            figures = Figures.NONE;
        }
        mu.lock();
        try {
            if (closed) {
                throw new ClosedException();
            }
            repair();
            long now = clock.getAsLong();
            Long bound = lazy.heartbeatBound(now);
            if (bound != null) {
                publishWaiting(bound);
            }
            Map<String, Object> event = Json.obj("mvcc_now", now, "active_readers", holds.readerCount(),
                    "active_txs", holds.txCount());
            if (figures.groups() != null) {
                List<Object> groups = new ArrayList<>();
                for (Group g : figures.groups()) {
                    groups.add(Json.obj("group", g.group(), "leader", g.leader(), "published_min_tx_time",
                            g.publishedMinTxTime()));
                }
                event.put("groups", groups);
            }
            if (figures.pinnedBytes() != null) {
                event.put("pinned_bytes", figures.pinnedBytes());
            }
            if (figures.debtBytes() != null) {
                event.put("debt_bytes", figures.debtBytes());
            }
            if (figures.historyAbove() != null) {
                event.put("history_above", historyPoints(figures.historyAbove()));
            }
            if (figures.compactedTs() != null) {
                event.put("compacted_ts", figures.compactedTs());
            }
            send("heartbeat", event);
        } finally {
            mu.unlock();
        }
    }

    static List<Map<String, Object>> historyPoints(List<long[]> raw) {
        List<Map<String, Object>> points = new ArrayList<>(raw.size());
        for (long[] p : raw) {
            points.add(Json.obj("ts", p[0], "bytes", p[1]));
        }
        if (points.size() <= MAX_HISTORY_POINTS) {
            return points;
        }
        double step = (double) (points.size() - 1) / (MAX_HISTORY_POINTS - 1);
        List<Map<String, Object>> thinned = new ArrayList<>(MAX_HISTORY_POINTS);
        for (int i = 0; i < MAX_HISTORY_POINTS; i++) {
            thinned.add(points.get((int) Math.rint(i * step))); // half to even, as Python's round
        }
        return thinned;
    }

    /** Publishes the node's complete set of readers and transactions (it replaces what the job holds). */
    public void snapshot() {
        mu.lock();
        try {
            publishSnapshot();
        } finally {
            mu.unlock();
        }
    }

    /** Publishes the active set, in parts when larger than the part size (each the next seq); mu held. */
    private void publishSnapshot() {
        long cut = clock.getAsLong();
        List<Map<String, Object>> re = new ArrayList<>();
        for (Hold h : holds.inOrder(HoldKind.READER)) {
            re.add(h.entry());
        }
        List<Map<String, Object>> te = new ArrayList<>();
        for (Hold h : holds.inOrder(HoldKind.TX)) {
            te.add(h.entry());
        }
        List<List<List<Map<String, Object>>>> parts = snapshotParts(re, te, cfg.snapshotPartBytes());
        for (int k = 0; k < parts.size(); k++) {
            Map<String, Object> event = Json.obj("cut", cut, "readers", parts.get(k).get(0), "txs", parts.get(k).get(1));
            if (parts.size() > 1) {
                event.put("part", k);
                event.put("parts", parts.size());
            }
            send("snapshot", event);
        }
        sender.repairDue(false);
        holds.allPublished();
    }

    /** Cuts the entries into parts of at most about partBytes of JSON each: each part is [readers, txs]. */
    static List<List<List<Map<String, Object>>>> snapshotParts(List<Map<String, Object>> readers,
            List<Map<String, Object>> txs, int partBytes) {
        List<List<List<Map<String, Object>>>> parts = new ArrayList<>();
        parts.add(List.of(new ArrayList<>(), new ArrayList<>()));
        int size = 0;
        List<List<Map<String, Object>>> both = List.of(readers, txs);
        for (int index = 0; index < 2; index++) {
            for (Map<String, Object> entry : both.get(index)) {
                int n = Json.canonical(entry).length + 1;
                List<List<Map<String, Object>>> last = parts.get(parts.size() - 1);
                if (size + n > partBytes && (!last.get(0).isEmpty() || !last.get(1).isEmpty())) {
                    parts.add(List.of(new ArrayList<>(), new ArrayList<>()));
                    size = 0;
                }
                parts.get(parts.size() - 1).get(index).add(entry);
                size += n;
            }
        }
        return parts;
    }

    /** Republishes the active set after a failure (a new producer first where it failed); mu held. */
    private void repair() {
        sender.rebuildIfDue();
        if (sender.repairDue()) {
            repairSnapshots++;
            publishSnapshot();
        }
    }

    /**
     * Takes a compaction directive (a DirectiveListener with the reporter does this): the cluster's safe point (it
     * only moves forward), the namespaces' bounds, and the job's retention (lazy registration goes eager above it).
     */
    public void observe(Directive d) {
        mu.lock();
        try {
            holds.observe(d.safeTs(), d.namespaceSafeTs().isPresent() ? d.namespaceSafeTs().getAsLong() : null,
                    d.namespaces());
            if (d.retention().isPresent() && lazy.jobRetention(d.retention().getAsLong()) && !closed) {
                LOG.warn("safepoint: the reporter's retention is larger than the job's ({}); publishing every hold "
                        + "from now on", d.retention().getAsLong());
                publishWaiting(null);
            }
        } finally {
            mu.unlock();
        }
    }

    /** The newest safe point this node learnt of (empty before the first). */
    public OptionalLong safeTs() {
        mu.lock();
        try {
            return holds.safeTs();
        } finally {
            mu.unlock();
        }
    }

    /** The reporter's counters. */
    public Stats stats() {
        mu.lock();
        try {
            return new Stats(sender.sent(), sender.delivered(), sender.deliveryFailures(), sender.producerRestarts(),
                    repairSnapshots, expired, expiriesIgnored, callbackFailures.get());
        } finally {
            mu.unlock();
        }
    }

    /** Waits until every event is delivered or failed (a repair snapshot first, where one is due): unbounded. */
    public void flush() {
        flushing();
        sender.flush();
    }

    /**
     * Waits up to timeout, in the calling thread, until every event is delivered or failed (a repair snapshot
     * first, where one is due); a SafepointException saying how many are still on their way.
     */
    public void flush(Duration timeout) {
        flushing();
        sender.flush(timeout);
    }

    private void flushing() {
        mu.lock();
        try {
            if (!closed) {
                repair();
            }
        } finally {
            mu.unlock();
        }
    }

    /** close(30 s). */
    @Override
    public void close() {
        close(Duration.ofSeconds(30));
    }

    /**
     * Stops the heartbeats, delivers what was sent and closes the producer, all within timeout: a heartbeat still
     * waiting for the broker is stopped, and what was not delivered by then is failed and said in a
     * SafepointException (the job's node lease then ends the node's holds). Safe to call more than once and from
     * several threads: each waits, up to its own timeout, for the first. Readers and transactions still open are
     * not closed: the next incarnation of the node drops them.
     */
    public void close(Duration timeout) {
        closing.close(timeout, "the reporter's close", this::shutDown);
    }

    private static Duration left(long deadline) {
        return Duration.ofNanos(Math.max(0, deadline - System.nanoTime()));
    }

    private void shutDown(long deadline) {
        // No repair snapshot here: a send may wait up to max.block.ms (30 s) for a broker that is gone, past the
        // close's bound. A repair still due is the next incarnation's (its first snapshot restates the node).
        closed = true;
        Heartbeats hb = heartbeats;
        if (hb != null) {
            hb.stopNow(); // a heartbeat still waiting for room or metadata gives up now
        }
        SafepointException undelivered = null;
        try {
            sender.flush(left(deadline));
        } catch (SafepointException e) {
            undelivered = new SafepointException(e.getMessage() + " (the reporter's close timeout); the job's node "
                    + "lease ends the node's holds", e);
        }
        sender.close(left(deadline));
        if (undelivered != null) {
            throw undelivered;
        }
    }

    // -- handles

    static String newId(String prefix) {
        byte[] b = new byte[6];
        RANDOM.nextBytes(b);
        return prefix + "-" + HexFormat.of().formatHex(b);
    }

    static void checkId(String name, String value) {
        if (value == null || value.isEmpty() || value.codePointCount(0, value.length()) > 256) {
            throw new IllegalArgumentException("safepoint: " + name
                    + " must be a non-empty string of at most 256 characters, got \"" + value + "\"");
        }
    }

    /** Opens a reader (reader_open, or later with lazy registration): a {@link RefusedException} below the safe point. */
    public Reader reader(HoldOptions o) {
        return open(new Reader(this, holdId(o, "r", "reader_id"), o), o.ts == null);
    }

    /** A reader at the node's clock now. */
    public Reader reader() {
        return reader(HoldOptions.of());
    }

    /** Begins a transaction (tx_begin, or later with lazy registration): a {@link RefusedException} below the safe point. */
    public Transaction begin(HoldOptions o) {
        return open(new Transaction(this, holdId(o, "t", "tx_id"), o), o.ts == null);
    }

    /** A transaction at the node's clock now. */
    public Transaction begin() {
        return begin(HoldOptions.of());
    }

    /** A new hold's id: the one its options give, or a new one with prefix; checked as the contract's field. */
    private static String holdId(HoldOptions o, String prefix, String field) {
        String id = o.id.isEmpty() ? newId(prefix) : o.id;
        checkId(field, id);
        return id;
    }

    /** Publishes a new hold's open (or defers it) and keeps it; nothing kept on an exception. */
    private <H extends Hold> H open(H h, boolean atClock) {
        mu.lock();
        try {
            holds.checkNew(h);
            if (closed) {
                throw new ClosedException();
            }
            if (atClock) {
                h.ts = clock.getAsLong();
            }
            String what = h.kind() == HoldKind.READER ? "reader" : "transaction";
            HoldRegistry.Bound bound = holds.boundOf(h.namespace);
            if (bound != null && h.ts < bound.ts()) {
                throw new RefusedException(what, h.id, h.ts, bound.ts(), bound.whose());
            }
            if (lazy.deferOpen(h.ts)) {
                h.openedWall = cfg.wallClock().getAsLong();
            } else {
                publishOpen(h);
            }
            h.state = HoldState.OPEN;
            holds.add(h);
            return h;
        } finally {
            mu.unlock();
        }
    }

    private void publishOpen(Hold h) {
        Map<String, Object> event = new LinkedHashMap<>();
        String name;
        if (h.kind() == HoldKind.READER) {
            event.put("reader_id", h.id);
            event.put("read_ts", h.ts);
            name = "reader_open";
        } else {
            event.put("tx_id", h.id);
            event.put("begin_ts", h.ts);
            name = "tx_begin";
        }
        h.optional(event);
        if (h.openedWall != null) {
            event.put("opened_wall_ms", h.openedWall);
        }
        send(name, event);
        if (h.openedWall == null) {
            h.openedWall = sender.lastWall();
        }
        h.published = true;
    }

    /** Publishes the holds that waited (all, or those below below), lowest ts first; mu held. */
    private void publishWaiting(Long below) {
        for (Hold h : holds.waiting(below)) {
            publishOpen(h);
        }
    }

    /** Forgets a hold and publishes its end (when its open was published); mu held. */
    private void closeHold(Hold held, Map<String, Object> extra) {
        HoldKind kind = held.kind();
        Hold h = holds.remove(kind, held.id);
        if (h == null || closed || !h.published) {
            return;
        }
        boolean reader = kind == HoldKind.READER;
        Map<String, Object> event = reader ? Json.obj("reader_id", h.id) : Json.obj("tx_id", h.id);
        if (extra != null) {
            event.putAll(extra);
        }
        try {
            send(reader ? "reader_close" : "tx_end", event);
        } catch (RuntimeException e) {
            sender.repairDue(true);
            LOG.error("safepoint: could not publish the end of {} {}: {}", kind.wire(), h.id, e.toString());
        }
    }

    void closeReader(Reader h) {
        mu.lock();
        try {
            if (h.state != HoldState.OPEN) {
                return;
            }
            h.state = HoldState.CLOSED;
            closeHold(h, null);
        } finally {
            mu.unlock();
        }
    }

    void prepare(Transaction h, String coordinator, List<String> participants) {
        checkId("coordinator", coordinator);
        mu.lock();
        try {
            if (h.expiry != null) {
                enforceLocked(h);
            }
            if (h.state != HoldState.OPEN) {
                throw new IllegalStateException("safepoint: transaction " + h.id + " cannot be prepared: it is "
                        + h.state);
            }
            if (closed) {
                throw new ClosedException();
            }
            if (!h.published) {
                publishOpen(h);
            }
            List<String> parts = participants == null ? List.of() : List.copyOf(participants);
            send("tx_prepare", Json.obj("tx_id", h.id, "coordinator", coordinator, "participants", parts));
            h.coordinator = coordinator;
            h.participants = parts;
            h.state = HoldState.PREPARED;
        } finally {
            mu.unlock();
        }
    }

    void end(Transaction h, TxOutcome outcome) {
        if (outcome == null) {
            throw new IllegalArgumentException("safepoint: a transaction's outcome is COMMIT or ABORT, not null");
        }
        mu.lock();
        try {
            if (h.expiry != null) {
                if (outcome == TxOutcome.COMMIT) {
                    enforceLocked(h);
                }
                releaseExpired(h);
                return;
            }
            if (!h.state.live()) {
                return;
            }
            h.state = HoldState.ENDED;
            closeHold(h, Json.obj("outcome", outcome.wire()));
        } finally {
            mu.unlock();
        }
    }

    /** A transaction's close: aborted when still open or prepared (an expired one released). */
    void abortIfOpen(Transaction h) {
        mu.lock();
        try {
            if (closed || !h.state.live()) {
                return;
            }
        } finally {
            mu.unlock();
        }
        end(h, TxOutcome.ABORT);
    }

    // -- expiries

    /**
     * Applies a forced-expiry directive to the open handle it names (a DirectiveListener with the reporter does
     * this). Returns the handle, or null when the directive is a no-op: another node, an id not open here, a
     * directive older than the handle, a prepared transaction, or a repeat.
     */
    public Handle expire(ExpireDirective d) {
        HoldKind kind = d.readerId().isEmpty() ? HoldKind.TX : HoldKind.READER;
        String id = kind == HoldKind.READER ? d.readerId() : d.txId();
        Hold h;
        ExpireCallback callback;
        mu.lock();
        try {
            if (!d.cluster().equals(cluster) || !d.node().equals(node)) {
                expiriesIgnored++;
                return null;
            }
            h = holds.get(kind, id);
            boolean prepared = h != null && h.state == HoldState.PREPARED;
            boolean ignored = h == null
                    || (d.clusterWallMs().isPresent() && h.openedWall != null
                        && d.clusterWallMs().getAsLong() < h.openedWall)
                    || prepared
                    || (h.expiry != null && (h.expiry.mode().equals("hard") || d.mode().equals("graceful")));
            if (ignored) {
                expiriesIgnored++;
                return null;
            }
            h.expiry = d;
            expired++;
            callback = h.onExpire != null ? h.onExpire : cfg.onExpire();
        } finally {
            mu.unlock();
        }
        LOG.warn("safepoint: expired by the safe-point service: {} {} mode={} reason={} seq={}", kind.wire(), id, d.mode(),
                d.reason(), d.seq());
        if (callback != null) {
            try {
                callback.onExpire(h, d);
            } catch (RuntimeException e) {
                callbackFailures.incrementAndGet();
                LOG.error("safepoint: the expiry callback of {} {} threw; the expiry goes on: {}", kind.wire(), id,
                        e.toString());
            }
        }
        if (d.mode().equals("hard")) {
            mu.lock();
            try {
                releaseExpired(h);
            } finally {
                mu.unlock();
            }
        }
        return h;
    }

    /** Releases an expired handle still open: reader_close, or tx_end abort; mu held. */
    private void releaseExpired(Hold h) {
        if (!h.state.live()) {
            return;
        }
        h.state = HoldState.EXPIRED;
        closeHold(h, h.kind() == HoldKind.READER ? null : Json.obj("outcome", TxOutcome.ABORT.wire()));
    }

    void enforceExpiry(Hold h) {
        mu.lock();
        try {
            if (h.expiry != null) {
                enforceLocked(h);
            }
        } finally {
            mu.unlock();
        }
    }

    /** An operation boundary of an expired hold: released, and its ExpiredException thrown; mu held. */
    private void enforceLocked(Hold h) {
        releaseExpired(h);
        throw new ExpiredException(h.kind(), h.id, h.expiry.mode(), h.expiry.reason(), h.expiry.seq());
    }

    /** The open reader or transaction with that id. */
    public Optional<Handle> find(HoldKind kind, String id) {
        mu.lock();
        try {
            return Optional.ofNullable(holds.get(kind, id));
        } finally {
            mu.unlock();
        }
    }

    /** A record's headers naming {@code cluster} ({@link #CLUSTER_HEADER}). */
    static List<Header> clusterHeader(String cluster) {
        return List.of(new RecordHeader(CLUSTER_HEADER, cluster.getBytes(StandardCharsets.UTF_8)));
    }
}
