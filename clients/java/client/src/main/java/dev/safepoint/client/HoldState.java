package dev.safepoint.client;

import java.util.Locale;

/** Where a reader or a transaction is in its life (the reporter's, guarded by its lock). */
enum HoldState {
    /** Made, not yet opened. */
    NEW,
    /** Opened (published, or waiting under lazy registration). */
    OPEN,
    /** A transaction prepared: in doubt until its coordinator ends it; never expired. */
    PREPARED,
    /** A reader closed. */
    CLOSED,
    /** A transaction ended. */
    ENDED,
    /** Released after the job expired it. */
    EXPIRED;

    /** Open or prepared: it still holds history back. */
    boolean live() {
        return this == OPEN || this == PREPARED;
    }

    @Override
    public String toString() {
        return name().toLowerCase(Locale.ROOT);
    }
}
