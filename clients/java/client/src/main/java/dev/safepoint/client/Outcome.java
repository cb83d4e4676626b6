package dev.safepoint.client;

/**
 * The job's outcome of one control action (its cluster_status record's "actions").
 *
 * @param id the action_id
 * @param type service_hold, service_release
 * @param holder the hold's holder
 * @param outcome applied, refused, ignored, expired
 * @param reason below_safe_ts, not_owner, ttl... ("" where none)
 * @param detail what the job says of it
 */
public record Outcome(String id, String type, String holder, String outcome, String reason, String detail) {
    /** Whether this outcome ends a hold. */
    public boolean lost() {
        return "refused".equals(outcome) || "expired".equals(outcome);
    }
}
