package dev.safepoint.example;

import dev.safepoint.client.Directive;
import dev.safepoint.client.DirectiveListener;
import dev.safepoint.client.ExpiredException;
import dev.safepoint.client.HoldOptions;
import dev.safepoint.client.Reader;
import dev.safepoint.client.Reporter;
import dev.safepoint.client.Transaction;
import java.nio.file.Path;
import java.time.Duration;
import java.util.OptionalLong;
import java.util.concurrent.atomic.AtomicLong;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A database node using the Java client: it reports a long report reader and a stream of short transactions,
 * heartbeats its MVCC clock, and follows the job's directives: it compacts up to what
 * {@link Directive#compactUpTo} allows and ends a reader the job expired. Run it beside a safepoint job:
 *
 * <pre>java -jar example/target/safepoint-example-0.1.0.jar -bootstrap 127.0.0.1:9092 -cluster demo -node java-1 -for 30s</pre>
 */
public final class ExampleNode {
    private ExampleNode() {}

    /** The read_ts of the node's open report, -1 when none is open. */
    private static final AtomicLong OLDEST = new AtomicLong(-1);

    public static void main(String[] args) throws Exception {
        System.setProperty("org.slf4j.simpleLogger.logFile", "System.err");
        System.setProperty("org.slf4j.simpleLogger.log.org.apache.kafka", "warn");
        String bootstrap = "127.0.0.1:9092";
        String cluster = "demo";
        String node = "java-1";
        String directiveKey = System.getenv().getOrDefault("SAFEPOINT_DIRECTIVE_KEY", "");
        Duration runFor = Duration.ZERO;
        for (int i = 0; i + 1 < args.length; i += 2) {
            String value = args[i + 1];
            switch (args[i].replaceFirst("^--?", "")) {
                case "bootstrap" -> bootstrap = value;
                case "cluster" -> cluster = value;
                case "node" -> node = value;
                case "directive-key" -> directiveKey = value;
                case "for" -> runFor = parseDuration(value);
                default -> {
                    System.err.println("node: unknown flag " + args[i]);
                    System.exit(2);
                }
            }
        }
        try {
            run(bootstrap, cluster, node, directiveKey, runFor);
        } catch (Exception e) {
            System.err.println("node: " + e);
            System.exit(1);
        }
        System.exit(0);
    }

    static void run(String bootstrap, String cluster, String node, String directiveKey, Duration runFor)
            throws InterruptedException {
        Logger log = LoggerFactory.getLogger("node");
        // The node's MVCC clock: here milliseconds since the epoch; a database passes its own.
        AtomicLong mvcc = new AtomicLong(System.currentTimeMillis());
        String tmp = System.getenv().getOrDefault("TMPDIR", System.getProperty("java.io.tmpdir"));
        try (Reporter reporter = Reporter.builder(bootstrap, node, mvcc::get).cluster(cluster)
                .stateDir(Path.of(tmp)) // the incarnation survives a restart
                .onExpire((h, d) -> log.warn("the job expired {}; it ends at its next operation boundary ({})", h.id(),
                        d.mode()))
                .build()) {
            DirectiveListener.Builder lb = DirectiveListener.builder(bootstrap, cluster).reporter(reporter)
                    .onDirective(d -> {
                        long oldest = OLDEST.get();
                        long upTo = Directive.compactUpTo(d, oldest >= 0 ? OptionalLong.of(oldest) : OptionalLong.empty(),
                                "");
                        log.info("directive seq {} safe_ts {} compact_up_to {}", d.seq(), d.safeTs(), upTo);
                        // here the engine compacts its history below upTo; an exception retries the directive
                    });
            if (!directiveKey.isEmpty()) {
                lb.directiveKeys(directiveKey);
            }
            DirectiveListener listener = lb.build().start();
            try {
                // a RefusedException here: its snapshot may already be compacted
                Reader report = reporter.reader(HoldOptions.of().label("nightly report"));
                OLDEST.set(report.ts());
                // the workload's time, however long connecting took
                long deadline = runFor.isZero() ? Long.MAX_VALUE : System.nanoTime() + runFor.toNanos();
                for (int n = 0; System.nanoTime() < deadline; n++) {
                    Thread.sleep(100);
                    mvcc.set(System.currentTimeMillis());
                    Transaction tx = reporter.begin();
                    tx.commit();
                    if (report != null && n % 10 == 0) { // the report's operation boundary
                        try {
                            report.check();
                        } catch (ExpiredException e) {
                            log.warn("the report was expired; a retry would take a fresh snapshot: {}", e.getMessage());
                            report = null; // the client released it
                            OLDEST.set(-1);
                        }
                    }
                }
                if (report != null) {
                    report.close();
                }
            } finally {
                listener.close();
            }
        }
    }

    /** A duration as Go writes one: 30s, 1m30s, 500ms, 2h. */
    static Duration parseDuration(String text) {
        Matcher m = Pattern.compile("(\\d+(?:\\.\\d+)?)(ms|s|m|h)").matcher(text);
        double ms = 0;
        int end = 0;
        while (m.find() && m.start() == end) {
            double v = Double.parseDouble(m.group(1));
            ms += switch (m.group(2)) {
                case "ms" -> v;
                case "s" -> v * 1000;
                case "m" -> v * 60_000;
                default -> v * 3_600_000;
            };
            end = m.end();
        }
        if (end != text.length() || text.isEmpty()) {
            if (text.equals("0")) {
                return Duration.ZERO;
            }
            throw new IllegalArgumentException("not a duration: " + text);
        }
        return Duration.ofMillis((long) ms);
    }
}
