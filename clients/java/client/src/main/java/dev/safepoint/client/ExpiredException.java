package dev.safepoint.client;

/**
 * The safe-point service expired this reader or transaction under history pressure. Thrown at the handle's
 * operation boundaries (check, prepare, a commit); the operation may be retried with a fresh snapshot.
 */
public class ExpiredException extends SafepointException {
    private final HoldKind kind;
    private final String id;
    private final String mode;
    private final String reason;
    private final long seq;

    public ExpiredException(HoldKind kind, String id, String mode, String reason, long seq) {
        super("safepoint: " + kind.wire() + " " + id + " was expired by the safe-point service (" + mode
                + " expiry, directive seq " + seq + "): " + reason + "; retry with a fresh snapshot");
        this.kind = kind;
        this.id = id;
        this.mode = mode;
        this.reason = reason;
        this.seq = seq;
    }

    /** A reader's or a transaction's. */
    public HoldKind kind() { return kind; }
    public String id() { return id; }
    /** "graceful" or "hard". */
    public String mode() { return mode; }
    public String reason() { return reason; }
    public long seq() { return seq; }
    /** A stable code for a database's error mapping (transient, resource pressure). */
    public String code() { return "snapshot_expired"; }
}
