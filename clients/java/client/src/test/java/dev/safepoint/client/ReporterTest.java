package dev.safepoint.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.OptionalLong;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.producer.MockProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.errors.NetworkException;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.junit.jupiter.api.Test;

/** The reporter's events on a MockProducer: what it publishes, in order, and its repair after a failure. */
class ReporterTest {
    final AtomicLong clock = new AtomicLong(1000);
    final List<MockProducer<byte[], byte[]>> producers = new ArrayList<>();

    Reporter.Builder builder(boolean autoComplete) {
        Reporter.Builder b = Reporter.builder("unused:9092", "n1", clock::get).cluster("c1").incarnation(7)
                .heartbeat(Duration.ZERO).wallClock(() -> 1_700_000_000_000L);
        b.producers = p -> {
            MockProducer<byte[], byte[]> m = new MockProducer<>(autoComplete, new Crc32Partitioner(),
                    new ByteArraySerializer(), new ByteArraySerializer());
            producers.add(m);
            return m;
        };
        return b;
    }

    List<Map<String, Object>> events() throws Exception {
        List<Map<String, Object>> out = new ArrayList<>();
        for (MockProducer<byte[], byte[]> m : producers) {
            for (ProducerRecord<byte[], byte[]> r : m.history()) {
                out.add(Json.parseObject(r.value()));
            }
        }
        return out;
    }

    static List<String> kinds(List<Map<String, Object>> events) {
        List<String> out = new ArrayList<>();
        for (Map<String, Object> e : events) {
            out.add(e.get("type") + "#" + e.get("seq"));
        }
        return out;
    }

    @Test
    void publishesHoldsAndHeartbeatsInSeqOrder() throws Exception {
        try (Reporter r = builder(true).build()) {
            Reader reader = r.reader(HoldOptions.of().ts(900L).id("r-1").label("é").groups(List.of("g1")));
            r.heartbeat();
            Transaction tx = r.begin(HoldOptions.of().id("t-1"));
            tx.prepare("n2", List.of("n1", "n2"));
            tx.end(TxOutcome.COMMIT);
            reader.close();
            reader.close(); // idempotent
            List<Map<String, Object>> ev = events();
            assertEquals(List.of("reader_open#0", "heartbeat#1", "tx_begin#2", "tx_prepare#3", "tx_end#4",
                    "reader_close#5"), kinds(ev));
            assertEquals("{\"cluster\":\"c1\",\"groups\":[\"g1\"],\"incarnation\":7,\"label\":\"é\",\"node\":\"n1\","
                    + "\"read_ts\":900,\"reader_id\":\"r-1\",\"seq\":0,\"type\":\"reader_open\",\"v\":1,"
                    + "\"wall_ms\":1700000000000}", Json.canonicalString(ev.get(0)));
            assertEquals(1000L, ev.get(2).get("begin_ts"));
            assertEquals("commit", ev.get(4).get("outcome"));
            assertEquals(new String(producers.get(0).history().get(0).key(), java.nio.charset.StandardCharsets.UTF_8),
                    "n1");
            for (ProducerRecord<byte[], byte[]> rec : producers.get(0).history()) { // each names its cluster
                org.apache.kafka.common.header.Header[] hs = rec.headers().toArray();
                assertEquals(1, hs.length);
                assertEquals(Reporter.CLUSTER_HEADER, hs[0].key());
                assertEquals("c1", new String(hs[0].value(), java.nio.charset.StandardCharsets.UTF_8));
            }
        }
    }

    @Test
    void refusedBelowTheSafePointPublishesNothing() throws Exception {
        try (Reporter r = builder(true).build()) {
            r.observe(Directive.parse(Json.obj("cluster", "c1", "seq", 1, "safe_ts", 950)));
            RefusedException e = assertThrows(RefusedException.class, () -> r.reader(HoldOptions.of().ts(900L)));
            assertEquals(950, e.bound());
            r.reader(HoldOptions.of().ts(950L).id("ok"));
            assertEquals(List.of("reader_open#0"), kinds(events()));
        }
    }

    @Test
    void lazyRegistrationPublishesAHoldOnceItCanHoldHistoryBack() throws Exception {
        try (Reporter r = builder(true).retention(100).build()) {
            r.heartbeat(); // bound 900
            r.reader(HoldOptions.of().ts(950L).id("late"));
            r.reader(HoldOptions.of().ts(990L).id("short")).close(); // never published
            assertEquals(List.of("heartbeat#0"), kinds(events()));
            clock.set(1100); // bound 1000: the reader at 950 goes out before the heartbeat
            r.heartbeat();
            List<Map<String, Object>> ev = events();
            assertEquals(List.of("heartbeat#0", "reader_open#1", "heartbeat#2"), kinds(ev));
            assertEquals(1_700_000_000_000L, ev.get(1).get("opened_wall_ms"));
        }
    }

    @Test
    void aFailedDeliveryMakesANewProducerAndASnapshot() throws Exception {
        Reporter r = builder(false).build();
        r.reader(HoldOptions.of().ts(900L).id("r-1"));
        r.heartbeat();
        producers.get(0).completeNext();
        producers.get(0).errorNext(new NetworkException("gone"));
        assertEquals(1, r.stats().deliveryFailures());
        r.heartbeat();
        assertEquals(2, producers.size(), "a new producer");
        List<Map<String, Object>> ev = events();
        assertEquals(List.of("reader_open#0", "heartbeat#1", "snapshot#2", "heartbeat#3"), kinds(ev));
        assertEquals("r-1", ((Map<?, ?>) ((List<?>) ev.get(2).get("readers")).get(0)).get("reader_id"));
        Reporter.Stats s = r.stats();
        assertEquals(1, s.producerRestarts());
        assertEquals(1, s.repairSnapshots());
        producers.get(1).completeNext();
        producers.get(1).completeNext();
        r.close(Duration.ofSeconds(1));
    }

    @Test
    void signsEveryEventWithTheNodeKey() throws Exception {
        try (Reporter r = builder(true).nodeKey(SigningTest.PY_NODE_KEY).build()) {
            r.heartbeat();
            Map<String, Object> e = events().get(0);
            String sig = (String) e.remove("sig");
            assertEquals(Signing.signNode(e, SigningTest.PY_NODE_KEY), sig);
        }
    }

    @Test
    void expiryReachesTheHandleAndTheNextBoundaryReleasesIt() throws Exception {
        List<String> called = new ArrayList<>();
        try (Reporter r = builder(true).onExpire((h, d) -> called.add(h.id() + ":" + d.mode())).build()) {
            Reader reader = r.reader(HoldOptions.of().ts(900L).id("r-1"));
            ExpireDirective d = new ExpireDirective("c1", "n1", "r-1", "", "pressure", "graceful", 4, OptionalLong.empty(), "g",
                    Map.of());
            assertTrue(r.expire(d) != null);
            assertEquals(null, r.expire(d), "a repeat is a no-op");
            assertEquals(List.of("r-1:graceful"), called);
            ExpiredException e = assertThrows(ExpiredException.class, reader::check);
            assertEquals("snapshot_expired", e.code());
            assertEquals(List.of("reader_open#0", "reader_close#1"), kinds(events()));
            Transaction tx = r.begin(HoldOptions.of().ts(950L).id("t-1"));
            tx.prepare("n1", null);
            assertEquals(null, r.expire(new ExpireDirective("c1", "n1", "", "t-1", "p", "hard", 5, OptionalLong.empty(), "g",
                    Map.of())), "a prepared transaction is never expired");
            assertFalse(r.find(HoldKind.TX, "t-1").isEmpty());
        }
    }
}
