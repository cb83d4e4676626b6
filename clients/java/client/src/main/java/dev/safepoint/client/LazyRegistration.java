package dev.safepoint.client;

/**
 * When a node's holds must be published: a hold at or above the bound of the last heartbeat sent waits; it is
 * published before the heartbeat whose bound passes it, when it is prepared, or in a snapshot.
 */
final class LazyRegistration {
    final Long retention;
    Long bound;
    boolean eager;

    LazyRegistration(Long retention) {
        this.retention = retention;
        this.eager = retention == null;
    }

    /** Whether a hold opened now at ts can wait (never before this reporter's first heartbeat). */
    boolean deferOpen(long ts) {
        return !eager && bound != null && ts >= bound;
    }

    /** The bound the heartbeat carrying now sets (null when publishing eagerly); the bound kept never goes lower. */
    Long heartbeatBound(long now) {
        if (eager) {
            return null;
        }
        long b = now - retention;
        if (bound == null || b > bound) {
            bound = b;
        }
        return b;
    }

    /** Takes the job's retention: true when it is below the reporter's, from now on every hold is published. */
    boolean jobRetention(long jobRetention) {
        if (eager || retention == null || jobRetention >= retention) {
            return false;
        }
        eager = true;
        return true;
    }
}
