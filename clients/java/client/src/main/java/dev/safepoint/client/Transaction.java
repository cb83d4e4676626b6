package dev.safepoint.client;

import java.util.List;
import java.util.Map;

/**
 * One read-write transaction: begun by {@link Reporter#begin} (tx_begin), prepared (tx_prepare), ended by
 * {@link #end} (tx_end).
 */
public final class Transaction extends Hold implements AutoCloseable {
    String coordinator;
    List<String> participants;

    Transaction(Reporter r, String id, HoldOptions o) {
        super(r, id, o);
    }

    @Override public HoldKind kind() { return HoldKind.TX; }

    @Override
    Map<String, Object> entry() {
        Map<String, Object> e = Json.obj("tx_id", id, "begin_ts", ts);
        optional(e);
        if (openedWall != null) {
            e.put("opened_wall_ms", openedWall);
        }
        if (state == HoldState.PREPARED) {
            e.put("prepared", true);
            e.put("coordinator", coordinator);
            e.put("participants", participants);
        }
        return e;
    }

    /** An operation boundary: after an expiry it aborts the transaction and throws an {@link ExpiredException}. */
    @Override
    public void check() {
        r.enforceExpiry(this);
    }

    /**
     * Publishes tx_prepare (two-phase commit, in doubt until {@link #end}). An expired transaction is aborted and
     * an {@link ExpiredException} thrown instead.
     */
    public void prepare(String coordinator, List<String> participants) {
        r.prepare(this, coordinator, participants);
    }

    /**
     * Publishes tx_end with the decision. On an expired transaction a commit is published as an abort and an
     * {@link ExpiredException} thrown.
     */
    public void end(TxOutcome outcome) {
        r.end(this, outcome);
    }

    /** end(COMMIT). */
    public void commit() { end(TxOutcome.COMMIT); }

    /** end(ABORT). */
    public void abort() { end(TxOutcome.ABORT); }

    /**
     * Aborts the transaction if it was not ended (try-with-resources: a transaction left by an exception is
     * aborted, one committed stays committed).
     */
    @Override
    public void close() {
        r.abortIfOpen(this);
    }
}
