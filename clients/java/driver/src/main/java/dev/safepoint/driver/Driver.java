package dev.safepoint.driver;

import dev.safepoint.client.DirectiveListener;
import dev.safepoint.client.ExpireDirective;
import dev.safepoint.client.ExpiredException;
import dev.safepoint.client.Figures;
import dev.safepoint.client.Group;
import dev.safepoint.client.Handle;
import dev.safepoint.client.HoldOptions;
import dev.safepoint.client.HoldRefusedException;
import dev.safepoint.client.Json;
import dev.safepoint.client.Reader;
import dev.safepoint.client.RefusedException;
import dev.safepoint.client.Reporter;
import dev.safepoint.client.ServiceHold;
import dev.safepoint.client.Signing;
import dev.safepoint.client.Transaction;
import dev.safepoint.client.TxOutcome;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * Runs one node of the Java client from JSON lines of operations on stdin, one answer a line on stdout: the
 * protocol every client of safepoint shares for the test vectors (docs/contract.md, "A client in another
 * language"). Logs go to stderr.
 */
public final class Driver {
    private final Object out = new Object();
    private final PrintStream stdout;
    private final Object state = new Object(); // mvccNow, figures
    private long mvccNow;
    private Figures figures = Figures.NONE;
    private Reporter reporter;
    private DirectiveListener listener;
    private final Map<String, Handle> handles = new HashMap<>();
    private final List<String> order = new ArrayList<>();
    private final Map<String, ServiceHold> holds = new LinkedHashMap<>();
    private final Object seen = new Object(); // directives, expired
    private final List<Map<String, Object>> directives = new ArrayList<>();
    private final Set<String> expired = new HashSet<>();
    private Map<String, String> flags;

    /** An operation named a ref that is not open. */
    static final class UnknownException extends RuntimeException {
        UnknownException(String ref) {
            super("no open reader, transaction or service hold \"" + ref + "\"");
        }
    }

    private Driver(PrintStream stdout) {
        this.stdout = stdout;
    }

    void say(Map<String, Object> reply) {
        String line = Json.canonicalString(reply);
        synchronized (out) {
            stdout.print(line);
            stdout.print('\n');
            stdout.flush();
        }
    }

    private static final List<String> FLAGS = List.of("bootstrap", "cluster", "node", "incarnation", "heartbeat-ms",
            "retention", "node-key", "directive-key", "events-topic", "directives-topic", "snapshot-part-bytes",
            "control-topic", "status-topic");

    static Map<String, String> parseFlags(String[] args) {
        Map<String, String> f = new HashMap<>();
        f.put("incarnation", "-1");
        f.put("heartbeat-ms", "0");
        f.put("retention", "-1");
        f.put("node-key", "");
        f.put("directive-key", "");
        f.put("events-topic", Reporter.DEFAULT_EVENTS_TOPIC);
        f.put("directives-topic", DirectiveListener.DEFAULT_DIRECTIVES_TOPIC);
        f.put("snapshot-part-bytes", "0");
        f.put("control-topic", ServiceHold.DEFAULT_CONTROL_TOPIC);
        f.put("status-topic", ServiceHold.DEFAULT_STATUS_TOPIC);
        f.put("bootstrap", "");
        f.put("cluster", "");
        f.put("node", "");
        for (int i = 0; i < args.length; i++) {
            String a = args[i];
            if (!a.startsWith("-")) {
                throw new IllegalArgumentException("unexpected argument " + a);
            }
            String name = a.replaceFirst("^--?", "");
            String value;
            int eq = name.indexOf('=');
            if (eq >= 0) {
                value = name.substring(eq + 1);
                name = name.substring(0, eq);
            } else {
                if (i + 1 >= args.length) {
                    throw new IllegalArgumentException("flag needs an argument: " + a);
                }
                value = args[++i];
            }
            if (!FLAGS.contains(name)) {
                throw new IllegalArgumentException("flag provided but not defined: -" + name);
            }
            f.put(name, value);
        }
        return f;
    }

    public static void main(String[] args) throws Exception {
        System.setProperty("org.slf4j.simpleLogger.logFile", "System.err");
        if (System.getProperty("org.slf4j.simpleLogger.defaultLogLevel") == null) {
            System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn");
        }
        System.setProperty("org.slf4j.simpleLogger.showDateTime", "true");
        PrintStream stdout = new PrintStream(new java.io.FileOutputStream(java.io.FileDescriptor.out), false,
                StandardCharsets.UTF_8);
        System.setOut(System.err); // nothing but the protocol on stdout
        Map<String, String> f;
        long incarnation;
        try {
            f = parseFlags(args);
            incarnation = Long.parseLong(f.get("incarnation"));
            Long.parseLong(f.get("heartbeat-ms"));
            Long.parseLong(f.get("retention"));
            Integer.parseInt(f.get("snapshot-part-bytes"));
        } catch (IllegalArgumentException e) {
            System.err.println("safepoint-driver: " + e.getMessage());
            System.exit(2);
            return;
        }
        if (f.get("bootstrap").isEmpty() || f.get("cluster").isEmpty() || f.get("node").isEmpty() || incarnation < 0) {
            System.err.println("safepoint-driver: --bootstrap, --cluster, --node and --incarnation are required");
            System.exit(2);
            return;
        }
        Driver d = new Driver(stdout);
        d.flags = f;
        int code = d.run(incarnation);
        stdout.flush();
        System.exit(code);
    }

    private int run(long incarnation) throws Exception {
        Reporter.Builder rb = Reporter.builder(flags.get("bootstrap"), flags.get("node"), this::clock)
                .cluster(flags.get("cluster")).incarnation(incarnation).eventsTopic(flags.get("events-topic"))
                .heartbeat(Duration.ofMillis(Long.parseLong(flags.get("heartbeat-ms")))).figures(this::currentFigures)
                .onExpire(this::onExpire);
        long retention = Long.parseLong(flags.get("retention"));
        if (retention >= 0) {
            rb.retention(retention);
        }
        if (!flags.get("node-key").isEmpty()) {
            rb.nodeKey(flags.get("node-key"));
        }
        int partBytes = Integer.parseInt(flags.get("snapshot-part-bytes"));
        if (partBytes > 0) {
            rb.snapshotPartBytes(partBytes);
        }
        try {
            reporter = rb.build();
        } catch (RuntimeException e) {
            System.err.println("safepoint-driver: " + e.getMessage());
            return 1;
        }
        DirectiveListener.Builder lb = DirectiveListener.builder(flags.get("bootstrap"), flags.get("cluster"))
                .topic(flags.get("directives-topic")).reporter(reporter).onDirective(this::onDirective);
        if (!flags.get("directive-key").isEmpty()) {
            try {
                lb.directiveKeys(Signing.parseDirectiveKeys(flags.get("directive-key")));
            } catch (IllegalArgumentException e) {
                System.err.println("safepoint-driver: " + e.getMessage());
                return 2;
            }
        }
        listener = lb.build().start();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        for (String line = in.readLine(); line != null; line = in.readLine()) {
            if (line.isEmpty()) {
                continue;
            }
            say(step(line));
        }
        finish();
        return 0;
    }

    private long clock() {
        synchronized (state) {
            return mvccNow;
        }
    }

    private Figures currentFigures() {
        synchronized (state) {
            return figures;
        }
    }

    private void onExpire(Handle h, ExpireDirective e) {
        say(Json.obj("op", "expired", "ref", h.id(), "mode", e.mode()));
        synchronized (seen) {
            expired.add(h.id());
        }
    }

    private void onDirective(dev.safepoint.client.Directive dir) {
        synchronized (seen) {
            directives.add(dir.raw());
        }
    }

    Map<String, Object> step(String line) {
        Map<String, Object> op;
        try {
            op = Json.parseObject(line);
        } catch (Exception e) {
            return Json.obj("op", null, "error", "invalid", "detail", "not an operation: " + e.getMessage());
        }
        Map<String, Object> reply = new LinkedHashMap<>();
        Object name = op.get("op");
        reply.put("op", name instanceof String ? name : "");
        String ref = null;
        if (op.get("ref") instanceof String s) {
            ref = s;
            reply.put("ref", s);
        }
        try {
            Map<String, Object> extra = apply(name instanceof String s ? s : "", ref, op);
            if (extra != null) {
                reply.putAll(extra);
            } else {
                reply.put("ok", true);
            }
        } catch (RefusedException e) {
            reply.put("error", "refused");
        } catch (ExpiredException e) {
            reply.put("error", "expired");
        } catch (HoldRefusedException e) {
            reply.put("error", "refused");
            reply.put("detail", e.getMessage());
        } catch (UnknownException e) {
            reply.put("error", "unknown");
            reply.put("detail", e.getMessage());
        } catch (RuntimeException e) {
            reply.put("error", "invalid");
            reply.put("detail", String.valueOf(e.getMessage()));
        }
        return reply;
    }

    private static Long integer(Map<String, Object> op, String field) {
        Object v = op.get(field);
        if (v == null) {
            return null;
        }
        Long n = Json.integer(v);
        if (n == null) {
            throw new IllegalArgumentException("json: " + field + " must be an integer, got " + Json.canonicalString(v));
        }
        return n;
    }

    private static String string(Map<String, Object> op, String field) {
        Object v = op.get(field);
        if (v == null) {
            return "";
        }
        if (!(v instanceof String s)) {
            throw new IllegalArgumentException("json: " + field + " must be a string, got " + Json.canonicalString(v));
        }
        return s;
    }

    private static List<String> strings(Map<String, Object> op, String field) {
        Object v = op.get(field);
        if (v == null) {
            return null;
        }
        if (!(v instanceof List<?> l)) {
            throw new IllegalArgumentException("json: " + field + " must be a list of strings");
        }
        List<String> out = new ArrayList<>();
        for (Object o : l) {
            if (!(o instanceof String s)) {
                throw new IllegalArgumentException("json: " + field + " must be a list of strings");
            }
            out.add(s);
        }
        return out;
    }

    private void put(String ref, Handle h) {
        if (!handles.containsKey(ref)) {
            order.add(ref);
        }
        handles.put(ref, h);
    }

    private Handle pop(String ref) {
        Handle h = handles.remove(ref);
        if (h == null) {
            throw new UnknownException(ref);
        }
        order.remove(ref);
        return h;
    }

    private Map<String, Object> apply(String name, String ref, Map<String, Object> op) {
        String r = ref == null ? "" : ref;
        switch (name) {
            case "clock": {
                Long now = integer(op, "mvcc_now");
                if (now == null) {
                    throw new IllegalArgumentException("clock needs mvcc_now");
                }
                synchronized (state) {
                    mvccNow = now;
                }
                return null;
            }
            case "reader":
                put(r, reporter.reader(holdOptions(r, op)));
                return null;
            case "tx":
                put(r, reporter.begin(holdOptions(r, op)));
                return null;
            case "prepare": {
                if (!(handles.get(r) instanceof Transaction tx)) {
                    throw new UnknownException(r);
                }
                tx.prepare(string(op, "coordinator"), strings(op, "participants"));
                return null;
            }
            case "end": {
                String outcome = string(op, "outcome");
                if (!(pop(r) instanceof Transaction tx)) {
                    throw new UnknownException(r);
                }
                tx.end(outcome.isEmpty() || outcome.equals("commit") ? TxOutcome.COMMIT : outcome.equals("abort") ? TxOutcome.ABORT : null);
                return null;
            }
            case "close": {
                if (!(pop(r) instanceof Reader reader)) {
                    throw new UnknownException(r);
                }
                reader.close();
                return null;
            }
            case "check": {
                Handle h = handles.get(r);
                if (h == null) {
                    throw new UnknownException(r);
                }
                h.check();
                return null;
            }
            case "heartbeat":
                takeFigures(op);
                reporter.heartbeat();
                return null;
            case "snapshot":
                reporter.snapshot();
                return null;
            case "hold": {
                Long ts = integer(op, "ts");
                Long ttl = integer(op, "ttl_ms");
                if (ts == null || ttl == null || ttl < 1) {
                    throw new IllegalArgumentException("hold needs ts and ttl_ms");
                }
                ServiceHold h = ServiceHold.builder(flags.get("bootstrap"), flags.get("cluster"), r, ts,
                                Duration.ofMillis(ttl)).controlTopic(flags.get("control-topic"))
                        .statusTopic(flags.get("status-topic")).label(string(op, "label")).build();
                h.start();
                holds.put(r, h);
                return null;
            }
            case "release": {
                ServiceHold h = holds.remove(r);
                if (h == null) {
                    throw new UnknownException(r);
                }
                h.close();
                return null;
            }
            case "publish":
                return publish(r, integer(op, "readers"));
            case "sleep": {
                Long ms = integer(op, "ms");
                try {
                    Thread.sleep(ms == null ? 0 : ms);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
                return null;
            }
            case "wait": {
                Long timeout = integer(op, "timeout_ms");
                return await(op, System.nanoTime() + Duration.ofMillis(timeout == null ? 30_000 : timeout).toNanos());
            }
            default:
                throw new IllegalArgumentException("unknown operation \"" + name + "\"");
        }
    }

    /**
     * A benchmark's load: opens and closes that many readers as fast as the client goes, then flushes, and says the
     * events published and the time taken.
     */
    private Map<String, Object> publish(String ref, Long readers) {
        long n = readers == null ? 0 : readers;
        long sent = reporter.stats().sent();
        long start = System.nanoTime();
        for (long i = 0; i < n; i++) {
            reporter.reader(HoldOptions.of().id(ref + "-" + i)).close();
        }
        try {
            reporter.flush(Duration.ofSeconds(120));
        } catch (RuntimeException e) {
            throw new IllegalStateException("the events were not all delivered in 120 s: " + e.getMessage(), e);
        }
        return Json.obj("events", reporter.stats().sent() - sent, "ms", (System.nanoTime() - start) / 1_000_000);
    }

    private static HoldOptions holdOptions(String ref, Map<String, Object> op) {
        return HoldOptions.of().ts(integer(op, "ts")).id(ref).label(string(op, "label")).groups(strings(op, "groups"))
                .namespace(string(op, "namespace"));
    }

    /** Keeps the figures a heartbeat operation gives (they stand for later heartbeats too). */
    private void takeFigures(Map<String, Object> op) {
        Figures f = currentFigures();
        if (op.containsKey("pinned_bytes")) {
            f = f.withPinnedBytes(required(op, "pinned_bytes"));
        }
        if (op.containsKey("debt_bytes")) {
            f = f.withDebtBytes(required(op, "debt_bytes"));
        }
        if (op.containsKey("groups")) {
            if (!(op.get("groups") instanceof List<?> l)) {
                throw new IllegalArgumentException("json: groups must be a list of groups");
            }
            List<Group> groups = new ArrayList<>();
            for (Object o : l) {
                if (!(o instanceof Map<?, ?> m)) {
                    throw new IllegalArgumentException("json: groups must be a list of groups");
                }
                Long pub = Json.integer(m.get("published_min_tx_time"));
                groups.add(new Group(Json.str(m.get("group")), Boolean.TRUE.equals(m.get("leader")),
                        pub == null ? 0 : pub));
            }
            f = f.withGroups(groups);
        }
        if (op.containsKey("history_above")) {
            if (!(op.get("history_above") instanceof List<?> l)) {
                throw new IllegalArgumentException("json: history_above must be a list of [ts, bytes]");
            }
            List<long[]> points = new ArrayList<>();
            for (Object o : l) {
                if (!(o instanceof List<?> p) || p.size() != 2 || Json.integer(p.get(0)) == null
                        || Json.integer(p.get(1)) == null) {
                    throw new IllegalArgumentException("json: history_above must be a list of [ts, bytes]");
                }
                points.add(new long[] {Json.integer(p.get(0)), Json.integer(p.get(1))});
            }
            f = f.withHistoryAbove(points);
        }
        synchronized (state) {
            figures = f;
        }
    }

    private static Long required(Map<String, Object> op, String field) {
        Long n = integer(op, field);
        if (n == null) {
            throw new IllegalArgumentException("json: " + field + " must be an integer");
        }
        return n;
    }

    private Map<String, Object> await(Map<String, Object> op, long deadline) {
        while (true) {
            Map<String, Object> found = found(op);
            if (found != null) {
                return found;
            }
            if (System.nanoTime() - deadline > 0) {
                return Json.obj("timeout", true);
            }
            try {
                Thread.sleep(20); // snapshot requests are counted by the listener, unannounced
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return Json.obj("timeout", true);
            }
        }
    }

    private Map<String, Object> found(Map<String, Object> op) {
        if (op.get("expired") != null) {
            String ref = string(op, "expired");
            synchronized (seen) {
                return expired.contains(ref) ? Json.obj("expired", ref) : null;
            }
        }
        if (op.get("snapshot_requests") != null) {
            long want = required(op, "snapshot_requests");
            long n = listener.stats().snapshotRequests();
            return n >= want ? Json.obj("snapshot_requests", n) : null;
        }
        if (op.get("safe_ts_at_least") != null) {
            long atLeast = required(op, "safe_ts_at_least");
            synchronized (seen) {
                for (Map<String, Object> dir : directives) {
                    Long ts = Json.integer(dir.get("safe_ts"));
                    if (ts != null && ts >= atLeast) {
                        return Json.obj("directive", dir);
                    }
                }
            }
        }
        return null;
    }

    /** Closes the readers still open, aborts the transactions, flushes and stops. */
    private void finish() {
        for (String ref : new ArrayList<>(order)) {
            Handle h = handles.get(ref);
            try {
                if (h instanceof Reader reader) {
                    reader.close();
                } else if (h instanceof Transaction tx) {
                    tx.end(TxOutcome.ABORT);
                }
            } catch (RuntimeException e) {
                // expired or closed: nothing more to publish
            }
        }
        for (ServiceHold h : holds.values()) {
            try {
                h.close();
            } catch (RuntimeException e) {
                System.err.println("safepoint-driver: releasing " + h.holder() + ": " + e.getMessage());
            }
        }
        listener.close();
        try {
            reporter.close(Duration.ofSeconds(30));
        } catch (RuntimeException e) {
            System.err.println("safepoint-driver: flushing at the end: " + e.getMessage());
        }
    }
}
