package dev.safepoint.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.OptionalLong;
import org.junit.jupiter.api.Test;

class RulesTest {
    @Test
    void lazyRegistration() {
        LazyRegistration l = new LazyRegistration(100L);
        assertFalse(l.deferOpen(5000), "a hold waited before the reporter's first heartbeat");
        assertEquals(900L, l.heartbeatBound(1000));
        assertTrue(l.deferOpen(900) && l.deferOpen(950) && !l.deferOpen(899), "a hold waits exactly at or above the bound");
        assertEquals(850L, l.heartbeatBound(950));
        assertEquals(900L, l.bound, "a clock that stepped back lowered the kept bound");
        assertFalse(l.jobRetention(100) || l.jobRetention(200), "a job's retention not below the reporter's made it eager");
        assertTrue(l.jobRetention(50));
        assertFalse(l.deferOpen(5000), "a job's shorter retention must publish every hold from now on");
        assertNull(l.heartbeatBound(2000), "an eager reporter's heartbeat carries a bound");
        assertFalse(new LazyRegistration(null).deferOpen(1), "without a retention nothing waits");
    }

    /** The cuts Python's snapshot_parts makes of the same entries. */
    @Test
    void snapshotPartsAsPython() {
        List<Map<String, Object>> readers = new ArrayList<>();
        for (int i = 0; i < 6; i++) {
            readers.add(Json.obj("reader_id", "r" + i, "ts", 100 + i, "label", "é".repeat(i)));
        }
        List<Map<String, Object>> txs = new ArrayList<>();
        for (int i = 0; i < 3; i++) {
            txs.add(Json.obj("tx_id", "t" + i, "ts", 200 + i));
        }
        Map<Integer, String> want = Map.of(1, "r0/|r1/|r2/|r3/|r4/|r5/|/t0|/t1|/t2",
                60, "r0/|r1/|r2/|r3/|r4/|r5/|/t0 t1|/t2",
                100, "r0 r1/|r2 r3/|r4 r5/|/t0 t1 t2",
                10000, "r0 r1 r2 r3 r4 r5/t0 t1 t2");
        want.forEach((size, cuts) -> {
            List<String> got = new ArrayList<>();
            for (List<List<Map<String, Object>>> p : Reporter.snapshotParts(readers, txs, size)) {
                got.add(ids(p.get(0), "reader_id") + "/" + ids(p.get(1), "tx_id"));
            }
            assertEquals(cuts, String.join("|", got), "part size " + size);
        });
    }

    private static String ids(List<Map<String, Object>> entries, String field) {
        List<String> out = new ArrayList<>();
        for (Map<String, Object> e : entries) {
            out.add((String) e.get(field));
        }
        return String.join(" ", out);
    }

    @Test
    void historyThinnedAsPython() {
        List<long[]> raw = new ArrayList<>();
        for (long i = 0; i < 65; i++) {
            raw.add(new long[] {i, i});
        }
        List<Map<String, Object>> points = Reporter.historyPoints(raw);
        assertEquals(64, points.size());
        assertEquals(31L, points.get(31).get("ts"));
        assertEquals(33L, points.get(32).get("ts"), "65 points thinned unlike Python's round (half to even)");
        assertEquals(3, Reporter.historyPoints(raw.subList(0, 3)).size());
    }

    @Test
    void compactUpToTakesTheOldestLocalHold() throws Exception {
        Directive d = Directive.parse(Json.parseObject("{\"cluster\":\"c1\",\"seq\":1,\"safe_ts\":500,"
                + "\"namespace_safe_ts\":400,\"namespaces\":{\"t1\":450}}"));
        assertEquals(500, Directive.compactUpTo(d, ""));
        assertEquals(300, Directive.compactUpTo(d, OptionalLong.of(300), ""));
        assertEquals(500, Directive.compactUpTo(d, OptionalLong.of(600), ""));
        assertEquals(450, Directive.compactUpTo(d, OptionalLong.empty(), "t1"));
        assertEquals(400, Directive.compactUpTo(d, "t9"));
    }

    // -- the listener's rules

    static DirectiveListener listenerFor(String keys) {
        DirectiveListener.Builder b = DirectiveListener.builder("unused:9092", "c1").node("n1");
        if (!keys.isEmpty()) {
            b.directiveKeys(keys);
        }
        DirectiveListener l = new DirectiveListener(b, false);
        l.caughtUp = true;
        return l;
    }

    record Rec(long offset, String value) {}

    static Rec record(long offset, String value) {
        return new Rec(offset, value);
    }

    static Rec compaction(long offset, long seq, long safeTs, String generation) {
        String gen = generation.isEmpty() ? "" : ",\"generation\":\"" + generation + "\"";
        return record(offset, "{\"v\":1,\"type\":\"compaction\",\"cluster\":\"c1\",\"seq\":" + seq + ",\"safe_ts\":"
                + safeTs + ",\"catalog_floor\":" + safeTs + ",\"cluster_wall_ms\":1" + gen + "}");
    }

    static List<Long> delivered(DirectiveListener l, Rec... recs) {
        List<Long> out = new ArrayList<>();
        for (Rec r : recs) {
            Directive d = l.handle(0, r.offset, r.value.getBytes(StandardCharsets.UTF_8));
            if (d != null) {
                out.add(d.safeTs());
            }
        }
        return out;
    }

    @Test
    void listenerDeliversSeqsThatAdvance() {
        DirectiveListener l = listenerFor("");
        List<Long> got = delivered(l, compaction(0, 1, 100, "g1"), compaction(1, 1, 100, "g1"),
                compaction(2, 3, 300, "g1"), compaction(3, 2, 200, "g1"),
                record(4, "{\"v\":1,\"type\":\"compaction\",\"cluster\":\"c2\",\"seq\":9,\"safe_ts\":900}"));
        assertEquals(List.of(100L, 300L), got);
        DirectiveListener.Stats s = l.stats();
        assertEquals(2, s.repeats());
        assertEquals(1, s.otherClusters());
        assertEquals(5, s.received());
    }

    @Test
    void listenerTakesANewGenerationNotBelowItsSafePoint() {
        DirectiveListener l = listenerFor("");
        List<Long> got = delivered(l, compaction(0, 7, 500, "g1"),
                compaction(1, 1, 400, "g2"), // the new job is behind: held back
                compaction(2, 2, 500, "g2"), // caught up: taken, its seq counts again
                compaction(3, 3, 600, "g2"),
                compaction(4, 9, 900, "")); // no generation never supersedes one
        assertEquals(List.of(500L, 500L, 600L), got);
        DirectiveListener.Stats s = l.stats();
        assertEquals(1, s.heldBack());
        assertEquals(1, s.generations());
        assertEquals(1, s.repeats());
    }

    @Test
    void backlogDeliversOnlyItsNewest() {
        DirectiveListener l = listenerFor("");
        l.caughtUp = false;
        l.ends = new HashMap<>(Map.of(0, 3L));
        assertEquals(List.of(), delivered(l, compaction(0, 4, 400, "g1"), compaction(1, 5, 500, "g1"),
                compaction(2, 1, 100, "g2")), "the backlog delivered before its end");
        Directive d = l.checkCaughtUp(true);
        assertNotNull(d);
        assertEquals(100, d.safeTs());
        assertEquals("g2", d.generation(), "the backlog's newest is the latest generation's");
    }

    @Test
    void signedListenerRefusesUnsignedAndForged() {
        DirectiveListener l = listenerFor(SigningTest.PY_PUBLIC);
        String signed = "{\"v\":1,\"type\":\"compaction\",\"cluster\":\"c1\",\"safe_ts\":1000,\"seq\":5,\"catalog_ts\":900,"
                + "\"cluster_wall_ms\":1700000000000,\"generation\":\"g-1\",\"namespaces\":{\"t0\":950},\"sig\":\""
                + SigningTest.PY_DIR_SIG + "\"}";
        String forged = signed.replace("\"safe_ts\":1000", "\"safe_ts\":999999");
        assertEquals(List.of(1000L), delivered(l, compaction(0, 1, 5000, "g-1"), record(1, forged), record(2, signed)));
        DirectiveListener.Stats s = l.stats();
        assertEquals(1, s.unsigned());
        assertEquals(1, s.badSignatures());
    }

    @Test
    void expiriesOfAnotherNodeOrRepeatedAreNotHanded() {
        List<String> handed = new ArrayList<>();
        DirectiveListener.Builder b = DirectiveListener.builder("unused:9092", "c1").node("n1")
                .onExpire(e -> handed.add(e.readerId()));
        DirectiveListener l = new DirectiveListener(b, false);
        l.caughtUp = true;
        java.util.function.Function<Object[], Rec> expire = a -> record((Integer) a[0],
                "{\"v\":1,\"type\":\"expire\",\"cluster\":\"c1\",\"node\":\"" + a[1] + "\",\"reader_id\":\"" + a[2]
                        + "\",\"reason\":\"pressure\",\"mode\":\"hard\",\"seq\":" + a[3] + ",\"generation\":\"g1\"}");
        delivered(l, expire.apply(new Object[] {0, "n1", "a", 1}), expire.apply(new Object[] {1, "n1", "a", 1}),
                expire.apply(new Object[] {2, "n2", "b", 2}), expire.apply(new Object[] {3, "n1", "c", 3}));
        assertEquals(List.of("a", "c"), handed);
    }

    @Test
    void escapePathAsPythonsQuote() {
        assertEquals("c1.n%2F1%20%C3%A9", IncarnationStore.escapePath("c1") + "." + IncarnationStore.escapePath("n/1 é"));
    }
}
