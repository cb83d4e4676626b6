package dev.safepoint.client;

import java.util.List;
import java.util.Map;

/**
 * One read-write transaction: begun by {@link Reporter#begin} (tx_begin), prepared (tx_prepare), ended by
 * {@link #end} (tx_end).
 */
public final class Transaction extends Hold {
    String coordinator;
    List<String> participants;

    Transaction(Reporter r, String id, HoldOptions o) {
        super(r, id, o);
    }

    @Override public String kind() { return "tx"; }

    @Override
    Map<String, Object> entry() {
        Map<String, Object> e = Json.obj("tx_id", id, "begin_ts", ts);
        optional(e);
        if (openedWall != null) {
            e.put("opened_wall_ms", openedWall);
        }
        if ("prepared".equals(state)) {
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
     * Publishes tx_end with the decision ("commit" or "abort"). On an expired transaction a commit is published as
     * an abort and an {@link ExpiredException} thrown.
     */
    public void end(String outcome) {
        r.end(this, outcome);
    }

    /** end("commit"). */
    public void commit() { end("commit"); }

    /** end("abort"). */
    public void abort() { end("abort"); }
}
