package dev.safepoint.client;

import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.function.LongConsumer;

/**
 * A close's work, run once: the first caller does it, the others wait for it, each up to its own timeout, and throw
 * what it threw. Safe from many threads.
 */
final class CloseOnce {
    private final AtomicBoolean started = new AtomicBoolean();
    private final CompletableFuture<Void> done = new CompletableFuture<>();

    /**
     * Runs work (given the close's deadline, in System.nanoTime) in the first caller, then waits up to timeout for
     * it; what names the close in the SafepointException of a timeout or an interruption.
     */
    void close(Duration timeout, String what, LongConsumer work) {
        long deadline = System.nanoTime() + timeout.toNanos();
        if (started.compareAndSet(false, true)) {
            try {
                work.accept(deadline);
                done.complete(null);
            } catch (RuntimeException e) {
                done.completeExceptionally(e);
            }
        }
        try {
            done.get(Math.max(0, deadline - System.nanoTime()), TimeUnit.NANOSECONDS);
        } catch (ExecutionException e) {
            throw (RuntimeException) e.getCause();
        } catch (TimeoutException e) {
            throw new SafepointException("safepoint: " + what + " did not finish in " + timeout, e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new SafepointException("safepoint: interrupted waiting for " + what, e);
        }
    }
}
