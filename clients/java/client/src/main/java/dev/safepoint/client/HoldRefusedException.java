package dev.safepoint.client;

/**
 * The job refused a service hold as it was set (its history may already be compacted: below_safe_ts; or
 * ttl_too_long, not_owner, a bad signature). The hold is not renewed.
 */
public class HoldRefusedException extends SafepointException {
    private final Outcome outcome;

    public HoldRefusedException(Outcome o) {
        super("safepoint: service hold " + o.holder() + " " + o.outcome() + " by the job (" + o.reason() + "): "
                + o.detail());
        this.outcome = o;
    }

    public Outcome outcome() { return outcome; }
}
