package dev.safepoint.client;

import java.time.Duration;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;

/**
 * The client's background work runs on executors of one named daemon thread each (a listener's reading, a hold's
 * renewing, a retired producer's close): none keeps the JVM alive, and each is named in a thread dump.
 */
final class Daemons {
    private Daemons() {}

    /** An executor of one daemon thread called name. */
    static ExecutorService single(String name) {
        return Executors.newSingleThreadExecutor(task -> {
            Thread t = new Thread(task, name);
            t.setDaemon(true);
            return t;
        });
    }

    /** Runs task once on a daemon thread of its own called name; the thread ends with it. */
    static void once(String name, Runnable task) {
        ExecutorService e = single(name);
        e.execute(task);
        e.shutdown();
    }

    /**
     * Stops taking work and waits up to timeout for what runs (not interrupted: a loop ends on its own flag);
     * whether it ended.
     */
    static boolean await(ExecutorService e, Duration timeout) {
        e.shutdown();
        try {
            return e.awaitTermination(Math.max(1, timeout.toNanos()), TimeUnit.NANOSECONDS);
        } catch (InterruptedException ex) {
            Thread.currentThread().interrupt();
            return false;
        }
    }
}
