package dev.safepoint.client;

import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.OptionalLong;

/**
 * A compaction directive of the job (the contract's Outputs).
 *
 * @param catalogFloor the cluster's catalog floor, where the job gives one
 * @param clusterWallMs the job's wall clock when it decided (0 where it gives none)
 * @param generation "" where the job gives none
 * @param retention the job's retention, where it gives one
 * @param namespaceSafeTs the bound of a namespace the directive does not name, where the cluster has namespaced holds
 * @param namespaces each named namespace's bound (empty where none)
 * @param raw the directive as read (unmodifiable)
 */
public record Directive(String cluster, long seq, long safeTs, OptionalLong catalogFloor, long clusterWallMs,
                        String generation, OptionalLong retention, OptionalLong namespaceSafeTs,
                        Map<String, Long> namespaces, Map<String, Object> raw) {

    static Directive parse(Map<String, Object> obj) {
        Long seq = Json.integer(obj.get("seq"));
        Long safe = Json.integer(obj.get("safe_ts"));
        Long wall = Json.integer(obj.get("cluster_wall_ms"));
        if (seq == null || safe == null) {
            throw new IllegalArgumentException("a compaction directive needs an integer seq and safe_ts");
        }
        Map<String, Long> ns = new LinkedHashMap<>();
        if (obj.get("namespaces") instanceof Map<?, ?> m) {
            for (Map.Entry<?, ?> e : m.entrySet()) {
                Long n = Json.integer(e.getValue());
                if (n != null) {
                    ns.put(String.valueOf(e.getKey()), n);
                }
            }
        }
        return new Directive(Json.str(obj.get("cluster")), seq, safe, optional(obj.get("catalog_floor")),
                wall == null ? 0 : wall, Json.str(obj.get("generation")), optional(obj.get("retention")),
                optional(obj.get("namespace_safe_ts")), Collections.unmodifiableMap(ns),
                Collections.unmodifiableMap(obj));
    }

    /** An integer field's value, empty when absent or not an integer. */
    static OptionalLong optional(Object v) {
        Long n = Json.integer(v);
        return n == null ? OptionalLong.empty() : OptionalLong.of(n);
    }

    /** What a hold of namespace may compact up to (safeTs for no namespace, or a cluster without namespaced holds). */
    public long bound(String namespace) {
        if (namespace == null || namespace.isEmpty() || namespaceSafeTs.isEmpty()) {
            return safeTs;
        }
        Long b = namespaces.get(namespace);
        return b != null ? b : namespaceSafeTs.getAsLong();
    }

    /**
     * The contract's apply rule: compact up to min(the directive's bound, the node's own oldest local hold);
     * oldestLocalHold empty: the node serves no hold of its own.
     */
    public static long compactUpTo(Directive d, OptionalLong oldestLocalHold, String namespace) {
        long bound = d.bound(namespace);
        return oldestLocalHold.isPresent() && oldestLocalHold.getAsLong() < bound ? oldestLocalHold.getAsLong() : bound;
    }

    /** compactUpTo for a node that serves no hold of its own: the directive's bound for namespace. */
    public static long compactUpTo(Directive d, String namespace) {
        return d.bound(namespace);
    }
}
