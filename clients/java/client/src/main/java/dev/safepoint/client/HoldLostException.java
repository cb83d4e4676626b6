package dev.safepoint.client;

/** The job refused or expired a service hold after it was set ({@link ServiceHold#check}). */
public class HoldLostException extends SafepointException {
    private final Outcome outcome;

    public HoldLostException(Outcome o) {
        super("safepoint: service hold " + o.holder() + " was " + o.outcome() + " by the job (" + o.reason() + "): "
                + o.detail());
        this.outcome = o;
    }

    public Outcome outcome() { return outcome; }
}
