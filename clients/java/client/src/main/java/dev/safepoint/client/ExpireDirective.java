package dev.safepoint.client;

import java.util.Collections;
import java.util.Map;
import java.util.OptionalLong;

/**
 * A forced expiry of one reader (readerId) or transaction (txId) on node; mode "graceful" or "hard".
 *
 * @param clusterWallMs the job's wall clock when it decided, where it gives one (a hold opened after it is not
 *     the one expired)
 * @param raw the directive as read (unmodifiable)
 */
public record ExpireDirective(String cluster, String node, String readerId, String txId, String reason, String mode,
                              long seq, OptionalLong clusterWallMs, String generation, Map<String, Object> raw) {

    static ExpireDirective parse(Map<String, Object> obj) {
        Long seq = Json.integer(obj.get("seq"));
        String mode = Json.str(obj.get("mode"));
        if (seq == null || Json.str(obj.get("node")).isEmpty() || (!mode.equals("graceful") && !mode.equals("hard"))) {
            throw new IllegalArgumentException("an expire directive needs a seq, a node and a mode graceful or hard");
        }
        return new ExpireDirective(Json.str(obj.get("cluster")), Json.str(obj.get("node")),
                Json.str(obj.get("reader_id")), Json.str(obj.get("tx_id")), Json.str(obj.get("reason")), mode, seq,
                Directive.optional(obj.get("cluster_wall_ms")), Json.str(obj.get("generation")),
                Collections.unmodifiableMap(obj));
    }
}
