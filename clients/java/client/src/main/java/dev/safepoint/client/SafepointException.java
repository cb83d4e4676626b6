package dev.safepoint.client;

/** The base of the client's exceptions. */
public class SafepointException extends RuntimeException {
    public SafepointException(String message) {
        super(message);
    }

    public SafepointException(String message, Throwable cause) {
        super(message, cause);
    }
}
