package dev.safepoint.client;

/**
 * A reader or transaction asked for a timestamp the cluster may already have compacted (below the safe point the
 * node learnt of). Nothing was published.
 */
public class RefusedException extends SafepointException {
    private final String kind;
    private final String id;
    private final long ts;
    private final long bound;

    public RefusedException(String kind, String id, long ts, long bound, String whose) {
        super("safepoint: " + kind + " " + id + " at " + ts + " refused: it is below " + whose + " " + bound
                + ", so versions it needs may already be compacted; retry with a timestamp >= " + bound);
        this.kind = kind;
        this.id = id;
        this.ts = ts;
        this.bound = bound;
    }

    /** "reader" or "transaction". */
    public String kind() { return kind; }
    public String id() { return id; }
    public long ts() { return ts; }
    /** The least timestamp the node may open a hold at now. */
    public long bound() { return bound; }
}
