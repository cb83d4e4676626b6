package dev.safepoint.client;

import java.util.Map;

/** A forced expiry of one reader (readerId) or transaction (txId) on node; mode "graceful" or "hard". */
public record ExpireDirective(String cluster, String node, String readerId, String txId, String reason, String mode,
                              long seq, Long clusterWallMs, String generation, Map<String, Object> raw) {

    static ExpireDirective parse(Map<String, Object> obj) {
        Long seq = Json.integer(obj.get("seq"));
        String mode = Json.str(obj.get("mode"));
        if (seq == null || Json.str(obj.get("node")).isEmpty() || (!mode.equals("graceful") && !mode.equals("hard"))) {
            throw new IllegalArgumentException("an expire directive needs a seq, a node and a mode graceful or hard");
        }
        return new ExpireDirective(Json.str(obj.get("cluster")), Json.str(obj.get("node")),
                Json.str(obj.get("reader_id")), Json.str(obj.get("tx_id")), Json.str(obj.get("reason")), mode, seq,
                Json.integer(obj.get("cluster_wall_ms")), Json.str(obj.get("generation")), obj);
    }
}
