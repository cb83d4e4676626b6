package dev.safepoint.client;

import java.util.List;

/**
 * What a heartbeat may carry besides the node's clock; null fields are left out.
 *
 * @param pinnedBytes the bytes of history the node keeps for its holds
 * @param debtBytes the bytes of compaction the node owes
 * @param groups the replication groups the node takes part in
 * @param historyAbove (ts, bytes) points: the bytes of history only a read below ts needs (thinned to 64)
 * @param compactedTs the timestamp the node compacted up to
 */
public record Figures(Long pinnedBytes, Long debtBytes, List<Group> groups, List<long[]> historyAbove,
                      Long compactedTs) {
    /** No figures. */
    public static final Figures NONE = new Figures(null, null, null, null, null);

    public Figures withPinnedBytes(Long v) { return new Figures(v, debtBytes, groups, historyAbove, compactedTs); }
    public Figures withDebtBytes(Long v) { return new Figures(pinnedBytes, v, groups, historyAbove, compactedTs); }
    public Figures withGroups(List<Group> v) { return new Figures(pinnedBytes, debtBytes, v, historyAbove, compactedTs); }
    public Figures withHistoryAbove(List<long[]> v) { return new Figures(pinnedBytes, debtBytes, groups, v, compactedTs); }
    public Figures withCompactedTs(Long v) { return new Figures(pinnedBytes, debtBytes, groups, historyAbove, v); }
}
