package dev.safepoint.client;

import java.util.List;
import java.util.Map;

/** What a reader and a transaction share: the state the reporter keeps of them (guarded by its lock). */
abstract sealed class Hold implements Handle permits Reader, Transaction {
    final Reporter r;
    final String id;
    long ts;
    final String label;
    final List<String> groups;
    final String namespace;
    final ExpireCallback onExpire;
    Long openedWall;
    boolean published;
    HoldState state = HoldState.NEW;
    ExpireDirective expiry;
    long order;

    Hold(Reporter r, String id, HoldOptions o) {
        this.r = r;
        this.id = id;
        this.label = o.label;
        this.groups = o.groups == null ? null : List.copyOf(o.groups);
        this.namespace = o.namespace;
        this.onExpire = o.onExpire;
        if (o.ts != null) {
            this.ts = o.ts;
        }
    }

    void optional(Map<String, Object> event) {
        if (groups != null) {
            event.put("groups", groups);
        }
        if (!namespace.isEmpty()) {
            event.put("namespace", namespace);
        }
        if (!label.isEmpty()) {
            event.put("label", label);
        }
    }

    abstract Map<String, Object> entry();

    @Override public String id() { return id; }
    @Override public long ts() { return ts; }
    /** Its namespace ("" for none). */
    public String namespace() { return namespace; }
    /** Its label ("" for none). */
    public String label() { return label; }
}
