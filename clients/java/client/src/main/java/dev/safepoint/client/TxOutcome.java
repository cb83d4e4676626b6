package dev.safepoint.client;

/** How a transaction ends ({@link Transaction#end}). */
public enum TxOutcome {
    COMMIT("commit"),
    ABORT("abort");

    private final String wire;

    TxOutcome(String wire) {
        this.wire = wire;
    }

    /** Its name in the contract's tx_end ("commit", "abort"). */
    public String wire() {
        return wire;
    }
}
