package dev.safepoint.client;

import java.time.Duration;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A reporter's heartbeat schedule: one daemon thread ({@code safepoint-heartbeat-NODE}) running a heartbeat every
 * interval, none while the last is still sending. A heartbeat that fails is logged and tried again at the next
 * interval; one refused because the reporter closed ends the schedule.
 */
final class Heartbeats {
    private static final Logger LOG = LoggerFactory.getLogger(Heartbeats.class);

    private final ScheduledExecutorService exec;
    private final Runnable beat;
    private final Duration every;
    private volatile boolean stopped;

    private Heartbeats(String node, Duration every, Runnable beat) {
        this.every = every;
        this.beat = beat;
        this.exec = Executors.newSingleThreadScheduledExecutor(task -> {
            Thread t = new Thread(task, "safepoint-heartbeat-" + node);
            t.setDaemon(true);
            return t;
        });
    }

    /** The schedule of beat every interval, started now; null for a zero or negative interval (no schedule). */
    static Heartbeats start(String node, Duration every, Runnable beat) {
        if (every.isZero() || every.isNegative()) {
            return null;
        }
        Heartbeats h = new Heartbeats(node, every, beat);
        h.exec.scheduleAtFixedRate(h::run, 0, every.toNanos(), TimeUnit.NANOSECONDS);
        return h;
    }

    private void run() {
        try {
            beat.run();
        } catch (ClosedException e) {
            exec.shutdown();
        } catch (RuntimeException e) {
            if (!stopped) {
                LOG.warn("safepoint: heartbeat failed; retrying every {} ms: {}", every.toMillis(), e.toString());
            }
        }
    }

    /** Ends the schedule; a heartbeat still waiting for the broker (room, metadata) is interrupted. */
    void stopNow() {
        stopped = true;
        exec.shutdownNow();
    }
}
