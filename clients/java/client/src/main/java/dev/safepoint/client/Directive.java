package dev.safepoint.client;

import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * A compaction directive of the job (the contract's Outputs).
 *
 * @param generation "" where the job gives none
 * @param raw the directive as read
 */
public record Directive(String cluster, long seq, long safeTs, Long catalogFloor, long clusterWallMs,
                        String generation, Long retention, Long namespaceSafeTs, Map<String, Long> namespaces,
                        Map<String, Object> raw) {

    static Directive parse(Map<String, Object> obj) {
        Long seq = Json.integer(obj.get("seq"));
        Long safe = Json.integer(obj.get("safe_ts"));
        Long wall = Json.integer(obj.get("cluster_wall_ms"));
        if (seq == null || safe == null) {
            throw new IllegalArgumentException("a compaction directive needs an integer seq and safe_ts");
        }
        Map<String, Long> ns = null;
        if (obj.get("namespaces") instanceof Map<?, ?> m) {
            ns = new LinkedHashMap<>();
            for (Map.Entry<?, ?> e : m.entrySet()) {
                Long n = Json.integer(e.getValue());
                if (n != null) {
                    ns.put(String.valueOf(e.getKey()), n);
                }
            }
            ns = Collections.unmodifiableMap(ns);
        }
        return new Directive(Json.str(obj.get("cluster")), seq, safe, Json.integer(obj.get("catalog_floor")),
                wall == null ? 0 : wall, Json.str(obj.get("generation")), Json.integer(obj.get("retention")),
                Json.integer(obj.get("namespace_safe_ts")), ns, obj);
    }

    /** What a hold of namespace may compact up to (safeTs for no namespace, or a cluster without namespaced holds). */
    public long bound(String namespace) {
        if (namespace == null || namespace.isEmpty() || namespaceSafeTs == null) {
            return safeTs;
        }
        Long b = namespaces == null ? null : namespaces.get(namespace);
        return b != null ? b : namespaceSafeTs;
    }

    /**
     * The contract's apply rule: compact up to min(the directive's bound, the node's own oldest local hold);
     * oldestLocalHold null: the node serves no hold of its own.
     */
    public static long compactUpTo(Directive d, Long oldestLocalHold, String namespace) {
        long bound = d.bound(namespace);
        return oldestLocalHold != null && oldestLocalHold < bound ? oldestLocalHold : bound;
    }
}
