package dev.safepoint.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.nio.charset.StandardCharsets;
import java.security.PublicKey;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

/** The values below are what the Python client and the job compute (core/signing.py) for the same input. */
class SigningTest {
    static final String PY_NODE_KEY = "8c9a150e8fce5a8307bdf88869e4c21132d1b702e536f97ee7d77166feffe47c";
    static final String PY_NODE_SIG = "hmac-sha256:56b4935ed4c3860689269f556f8e2fa4de488de7a767e1597330d1a97bc30a0a";
    static final String PY_CTL_SIG = "hmac-sha256:df72f929b4efcd73d9586971ec16374836b491c63edba6bd554717ed50877282";
    static final String PY_OWNER = "1a7674eb4ee78df7e1ac439a93c3fa8e3c945784d4dec9fd8e3011738b2f1d62";
    /** Of the private key 11 * 32. */
    static final String PY_PUBLIC = "d04ab232742bb4ab3a1368bd4615e4e6d0224ab71a016baf8520a332c9778737";
    static final String PY_DIR_SIG = "ed25519:26b7124ab033ca9d7fef832b210de1ac93db5aaa2ca6986cac60c121778f1150d5f6ac6d00c0c3fb479f8b4ff8eb05d"
            + "669b31192f8bf5f0818cc1d3c540fde08";

    @Test
    void nodeSignatureIsThePythonOne() {
        Map<String, Object> event = CanonicalJsonTest.tricky();
        event.put("log_ms", 5); // the job's log time is not signed
        assertEquals(PY_NODE_SIG, Signing.signNode(event, PY_NODE_KEY));
    }

    @Test
    void controlSignatureCoversItsFields() {
        Map<String, Object> event = Json.obj("type", "service_hold", "cluster", "c1", "holder", "backup", "ts", 500,
                "ttl_ms", 60000, "action_id", "a1", "wall_ms", 1700000000000L, "v", 1, "label", "nightly é");
        assertEquals(PY_CTL_SIG, Signing.signControl(event, "k1"));
        event.put("extra", "not covered");
        assertEquals(PY_CTL_SIG, Signing.signControl(event, "k1"));
        assertEquals(PY_OWNER, Signing.ownerDigest("tok"));
    }

    static Map<String, Object> directive() throws Exception {
        return Json.parseObject(("{\"v\":1,\"type\":\"compaction\",\"cluster\":\"c1\",\"safe_ts\":1000,\"seq\":5,"
                + "\"catalog_ts\":900,\"cluster_wall_ms\":1700000000000,\"generation\":\"g-1\",\"namespaces\":{\"t0\":950}}")
                .getBytes(StandardCharsets.UTF_8));
    }

    @Test
    void directiveSignedByTheJobVerifies() throws Exception {
        List<PublicKey> keys = Signing.parseDirectiveKeys(" " + PY_PUBLIC + " ");
        Map<String, Object> d = directive();
        assertEquals("unsigned", Signing.verifyDirective(d, keys));
        d.put("sig", PY_DIR_SIG);
        assertEquals("", Signing.verifyDirective(d, keys));
        d.put("safe_ts", 1001L);
        assertEquals("bad_signature", Signing.verifyDirective(d, keys));
        List<PublicKey> other = Signing.parseDirectiveKeys("aa" + PY_PUBLIC.substring(2));
        d.put("safe_ts", 1000L);
        assertEquals("bad_signature", Signing.verifyDirective(d, other));
        List<PublicKey> rotated = Signing.parseDirectiveKeys("aa" + PY_PUBLIC.substring(2) + "," + PY_PUBLIC);
        assertEquals("", Signing.verifyDirective(d, rotated));
    }

    @Test
    void signingWithTheJobsPrivateKeyGivesThePythonSignature() throws Exception {
        // Ed25519 is deterministic: the private key "11" * 32 (hex) signs this directive as the job does
        assertEquals(PY_DIR_SIG, Signing.signDirective(directive(), "11".repeat(32)));
    }

    @Test
    void directiveKeysMustBeEd25519PublicKeys() {
        for (String bad : List.of("xyz", PY_PUBLIC.substring(0, 62), PY_PUBLIC + "00")) {
            assertThrows(IllegalArgumentException.class, () -> Signing.parseDirectiveKeys(bad), bad);
        }
    }

    @Test
    void crc32PartitionerPlacesKeysAsLibrdkafka() {
        // zlib.crc32(key) % n, librdkafka's consistent placement of a keyed record
        Map<String, int[]> want = Map.of("c1/n1", new int[] {2, 10}, "c1/n2", new int[] {0, 0},
                "prod/db-7", new int[] {1, 5}, "x", new int[] {3, 3});
        want.forEach((key, parts) -> {
            assertEquals(parts[0], Crc32Partitioner.partitionOf(key.getBytes(StandardCharsets.UTF_8), 4), key);
            assertEquals(parts[1], Crc32Partitioner.partitionOf(key.getBytes(StandardCharsets.UTF_8), 12), key);
        });
    }
}
