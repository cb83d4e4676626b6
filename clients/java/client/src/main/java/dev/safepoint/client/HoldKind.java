package dev.safepoint.client;

/** What a {@link Handle} is. */
public enum HoldKind {
    READER("reader"),
    TX("tx");

    private final String wire;

    HoldKind(String wire) {
        this.wire = wire;
    }

    /** Its name in the contract's events ("reader", "tx"). */
    public String wire() {
        return wire;
    }
}
