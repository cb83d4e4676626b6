package dev.safepoint.client;

/** A {@link Reader} or a {@link Transaction}. */
public interface Handle {
    /** {@link HoldKind#READER} or {@link HoldKind#TX}. */
    HoldKind kind();

    /** The reader_id or tx_id. */
    String id();

    /** The read_ts or begin_ts. */
    long ts();

    /** An operation boundary: an {@link ExpiredException} once the job expired the hold (it is released). */
    void check();
}
