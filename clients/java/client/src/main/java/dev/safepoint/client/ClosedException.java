package dev.safepoint.client;

/** A reporter, listener or hold that was closed. */
public class ClosedException extends SafepointException {
    public ClosedException() {
        super("safepoint: closed");
    }
}
