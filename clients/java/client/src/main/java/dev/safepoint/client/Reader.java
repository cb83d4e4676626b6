package dev.safepoint.client;

import java.util.Map;

/** One snapshot reader: opened by {@link Reporter#reader} (reader_open), closed by {@link #close} (reader_close). */
public final class Reader extends Hold implements AutoCloseable {
    Reader(Reporter r, String id, HoldOptions o) {
        super(r, id, o);
    }

    @Override public HoldKind kind() { return HoldKind.READER; }

    @Override
    Map<String, Object> entry() {
        Map<String, Object> e = Json.obj("reader_id", id, "read_ts", ts);
        optional(e);
        if (openedWall != null) {
            e.put("opened_wall_ms", openedWall);
        }
        return e;
    }

    /** Publishes reader_close. Idempotent. */
    @Override
    public void close() {
        r.closeReader(this);
    }

    /** An operation boundary: after an expiry it releases the reader and throws an {@link ExpiredException}. */
    @Override
    public void check() {
        r.enforceExpiry(this);
    }
}
