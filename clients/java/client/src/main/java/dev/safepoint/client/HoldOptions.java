package dev.safepoint.client;

import java.util.List;

/** A reader's or a transaction's optional settings: {@code HoldOptions.of().ts(900).label("report")}. */
public final class HoldOptions {
    Long ts;
    String id = "";
    String label = "";
    List<String> groups;
    String namespace = "";
    ExpireCallback onExpire;

    public static HoldOptions of() {
        return new HoldOptions();
    }

    /** The read_ts or begin_ts (default: the node's MVCC clock when it opens). */
    public HoldOptions ts(Long ts) { this.ts = ts; return this; }
    /** Its reader_id or tx_id (default: a new one). */
    public HoldOptions id(String id) { this.id = id == null ? "" : id; return this; }
    public HoldOptions label(String label) { this.label = label == null ? "" : label; return this; }
    public HoldOptions groups(List<String> groups) { this.groups = groups; return this; }
    public HoldOptions namespace(String ns) { this.namespace = ns == null ? "" : ns; return this; }
    /** Overrides the reporter's expiry callback for this hold. */
    public HoldOptions onExpire(ExpireCallback f) { this.onExpire = f; return this; }
}
