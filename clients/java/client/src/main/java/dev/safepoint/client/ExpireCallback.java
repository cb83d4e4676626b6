package dev.safepoint.client;

/** Called when the job expires one of the node's readers or transactions: cancel its work. */
@FunctionalInterface
public interface ExpireCallback {
    void onExpire(Handle handle, ExpireDirective directive);
}
