package dev.safepoint.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTimeoutPreemptively;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.net.ServerSocket;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.OptionalLong;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.MockConsumer;
import org.apache.kafka.clients.consumer.internals.AutoOffsetResetStrategy;
import org.apache.kafka.clients.producer.MockProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.TopicAuthorizationException;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.junit.jupiter.api.Test;

/**
 * The client against a Kafka that misbehaves: a broker that is not there (a port nobody listens on), or
 * kafka-clients' MockProducer and MockConsumer told to fail or never answer. Each test is one defect a database
 * team found by reading or running the client: a call that blocked past its bound, a failure lost, a setting
 * undone, a builder that changed a reporter built before.
 */
class FailuresTest {
    static final Node BROKER = new Node(1, "127.0.0.1", 1);

    static int deadPort() throws IOException {
        try (ServerSocket s = new ServerSocket(0, 1, java.net.InetAddress.getLoopbackAddress())) {
            return s.getLocalPort(); // closed again: nothing listens there
        }
    }

    static MockProducer<byte[], byte[]> mockProducer(boolean autoComplete) {
        return new MockProducer<>(autoComplete, new Crc32Partitioner(), new ByteArraySerializer(),
                new ByteArraySerializer());
    }

    Reporter.Builder reporter(MockProducer<byte[], byte[]> producer) {
        Reporter.Builder b = Reporter.builder("unused:9092", "n1", () -> 1000).cluster("c1").incarnation(7)
                .heartbeat(Duration.ZERO);
        b.producers = p -> producer;
        return b;
    }

    @Test
    void aReporterWhoseBrokerIsGoneClosesWithinItsBound() throws Exception {
        // a heartbeat blocked on the missing broker's metadata (up to max.block.ms, 30 s) holds the reporter's lock
        Reporter r = Reporter.builder("127.0.0.1:" + deadPort(), "n1", () -> 1000).cluster("c1")
                .heartbeat(Duration.ofMillis(50)).build();
        Thread.sleep(300);
        long start = System.nanoTime();
        assertTimeoutPreemptively(Duration.ofSeconds(10), () -> r.close(Duration.ofSeconds(2)));
        long took = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - start);
        assertTrue(took < 5_000, "close(2 s) took " + took + " ms");
        assertThrows(ClosedException.class, () -> r.reader(), "a closed reporter opened a reader");
    }

    @Test
    void whatACloseCouldNotDeliverIsSaid() {
        MockProducer<byte[], byte[]> producer = mockProducer(false); // nothing is ever acknowledged
        Reporter r = reporter(producer).build();
        r.reader();
        SafepointException e = assertTimeoutPreemptively(Duration.ofSeconds(10),
                () -> assertThrows(SafepointException.class, () -> r.close(Duration.ofMillis(500))));
        assertTrue(e.getMessage().contains("1 events not yet delivered") && e.getMessage().contains("node lease"),
                e.getMessage());
    }

    @Test
    void flushWithATimeoutLeavesNoThreadBehind() {
        CountDownLatch never = new CountDownLatch(1);
        MockProducer<byte[], byte[]> stuck = new MockProducer<>(false, new Crc32Partitioner(), new ByteArraySerializer(),
                new ByteArraySerializer()) {
            @Override
            public synchronized void flush() {
                try {
                    never.await(); // a broker that never answers
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            }
        };
        Reporter r = reporter(stuck).build();
        r.reader();
        SafepointException e = assertThrows(SafepointException.class, () -> r.flush(Duration.ofMillis(200)));
        assertTrue(e.getMessage().contains("1 events not yet delivered"), e.getMessage());
        for (Thread t : Thread.getAllStackTraces().keySet()) {
            assertFalse(t.getName().startsWith("safepoint-flush") && t.isAlive(), "a flush thread outlived its timeout");
        }
        never.countDown();
        stuck.completeNext();
        r.close(Duration.ofSeconds(1));
    }

    @Test
    void aBuilderUsedAgainChangesNoReporterBuiltBefore() throws Exception {
        MockProducer<byte[], byte[]> producer = mockProducer(true);
        Reporter.Builder b = reporter(producer).eventsTopic("t.events");
        try (Reporter r = b.build()) {
            b.eventsTopic("other").cluster("c9").nodeKey("k");
            r.heartbeat();
            ProducerRecord<byte[], byte[]> rec = producer.history().get(0);
            assertEquals("t.events", rec.topic());
            Map<String, Object> event = Json.parseObject(rec.value());
            assertEquals("c1", event.get("cluster"));
            assertFalse(event.containsKey("sig"));
        }
    }

    @Test
    void theClientsOwnKafkaSettingsAreRefusedByName() {
        for (String key : List.of("acks", "enable.idempotence", "partitioner.class", "delivery.timeout.ms",
                "max.block.ms", "retries", "transactional.id")) {
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                    () -> Reporter.builder("b:9092", "n1", () -> 1).kafka(key, "1"));
            assertTrue(e.getMessage().contains(key), e.getMessage());
            assertThrows(IllegalArgumentException.class,
                    () -> ServiceHold.builder("b:9092", "c1", "h", 1, Duration.ofMinutes(1)).kafka(key, "1"));
        }
        assertThrows(IllegalArgumentException.class, () -> DirectiveListener.builder("b:9092", "c1").kafka("group.id", "g"));
        assertThrows(IllegalArgumentException.class,
                () -> ServiceHold.builder("b:9092", "c1", "h", 1, Duration.ofMinutes(1)).kafka("auto.offset.reset", "x"));
        Reporter.builder("b:9092", "n1", () -> 1).kafka("security.protocol", "SSL").kafka("client.id", "db-7");
    }

    @Test
    void closeIsSafeFromManyThreads() throws Exception {
        MockProducer<byte[], byte[]> producer = mockProducer(true);
        Reporter r = reporter(producer).heartbeat(Duration.ofMillis(5)).build();
        ExecutorService pool = Executors.newFixedThreadPool(8);
        List<Future<?>> done = new ArrayList<>();
        for (int i = 0; i < 8; i++) {
            done.add(pool.submit(() -> r.close(Duration.ofSeconds(5))));
        }
        for (Future<?> f : done) {
            f.get(10, TimeUnit.SECONDS); // none threw
        }
        pool.shutdown();
        assertTrue(producer.closed());
    }

    @Test
    void aTransactionLeftOpenIsAbortedAtClose() throws Exception {
        MockProducer<byte[], byte[]> producer = mockProducer(true);
        try (Reporter r = reporter(producer).build()) {
            try (Transaction tx = r.begin()) {
                tx.prepare("n2", List.of("n1", "n2"));
            }
            try (Transaction tx = r.begin()) {
                tx.commit();
            }
        }
        List<String> ends = new ArrayList<>();
        for (ProducerRecord<byte[], byte[]> rec : producer.history()) {
            Map<String, Object> e = Json.parseObject(rec.value());
            if ("tx_end".equals(e.get("type"))) {
                ends.add((String) e.get("outcome"));
            }
        }
        assertEquals(List.of("abort", "commit"), ends);
    }

    @Test
    void anOnExpireThatThrowsLeavesTheRestOfTheBatchHandled() {
        List<String> handed = new ArrayList<>();
        DirectiveListener.Builder b = DirectiveListener.builder("unused:9092", "c1").node("n1").onExpire(e -> {
            if (e.readerId().equals("r1")) {
                throw new IllegalStateException("the database's handler failed");
            }
            handed.add(e.readerId());
        });
        DirectiveListener l = new DirectiveListener(b, false);
        l.caughtUp = true;
        for (int i = 1; i <= 2; i++) {
            String v = "{\"v\":1,\"type\":\"expire\",\"cluster\":\"c1\",\"node\":\"n1\",\"reader_id\":\"r" + i
                    + "\",\"mode\":\"graceful\",\"reason\":\"pressure\",\"seq\":" + i + "}";
            l.handle(0, i, v.getBytes(StandardCharsets.UTF_8));
        }
        assertEquals(List.of("r2"), handed);
        assertEquals(1, l.stats().callbackFailures());
    }

    @Test
    void aReportersExpiryCallbackThatThrowsIsCountedAndTheExpiryGoesOn() {
        MockProducer<byte[], byte[]> producer = mockProducer(true);
        try (Reporter r = reporter(producer).onExpire((h, d) -> {
            throw new IllegalStateException("the database's handler failed");
        }).build()) {
            Reader a = r.reader(HoldOptions.of().id("a"));
            r.expire(new ExpireDirective("c1", "n1", "a", "", "pressure", "graceful", 1, OptionalLong.empty(), "",
                    Map.of()));
            assertThrows(ExpiredException.class, a::check);
            assertEquals(1, r.stats().callbackFailures());
        }
    }

    // -- service holds, on a MockProducer and a MockConsumer of the status topic

    static final String STATUS = "t.status";

    /** A status consumer whose topic has one partition at offset 0; failing: every poll throws. */
    static final class StatusConsumer extends MockConsumer<byte[], byte[]> {
        volatile KafkaException failing;

        StatusConsumer() {
            super(AutoOffsetResetStrategy.EARLIEST.name());
            updatePartitions(STATUS, List.of(new PartitionInfo(STATUS, 0, BROKER, new Node[0], new Node[0])));
            updateEndOffsets(Map.of(new TopicPartition(STATUS, 0), 0L));
        }

        @Override
        public synchronized ConsumerRecords<byte[], byte[]> poll(Duration timeout) {
            KafkaException e = failing;
            if (e != null) {
                throw e;
            }
            ConsumerRecords<byte[], byte[]> got = super.poll(Duration.ZERO);
            if (got.isEmpty()) {
                try {
                    wait(Math.min(20, Math.max(1, timeout.toMillis())));
                } catch (InterruptedException ex) {
                    Thread.currentThread().interrupt();
                }
            }
            return got;
        }

        /** The job's status of cluster c1 with one action's outcome. */
        synchronized void outcome(String actionId, String outcome) {
            String v = "{\"v\":1,\"type\":\"cluster_status\",\"cluster\":\"c1\",\"actions\":[{\"id\":\"" + actionId
                    + "\",\"type\":\"service_hold\",\"holder\":\"backup\",\"outcome\":\"" + outcome
                    + "\",\"reason\":\"ttl\",\"detail\":\"its TTL ran out\"}]}";
            long offset = position(new TopicPartition(STATUS, 0));
            addRecord(new ConsumerRecord<>(STATUS, 0, offset, "c1".getBytes(StandardCharsets.UTF_8),
                    v.getBytes(StandardCharsets.UTF_8)));
        }
    }

    ServiceHold.Builder hold(MockProducer<byte[], byte[]> producer, StatusConsumer status, Duration ttl) {
        ServiceHold.Builder b = ServiceHold.builder("unused:9092", "c1", "backup", 100, ttl).statusTopic(STATUS)
                .outcomeTimeout(Duration.ofMillis(50)).renewEvery(Duration.ofMillis(30));
        b.producers = p -> producer;
        b.consumers = p -> status;
        return b;
    }

    static String firstActionId(MockProducer<byte[], byte[]> producer) throws Exception {
        return (String) Json.parseObject(producer.history().get(0).value()).get("action_id");
    }

    /** Calls h.check() until it says the hold was lost, with the outcome "expired". */
    static void checkUntilExpired(ServiceHold h) throws InterruptedException {
        while (true) {
            try {
                h.check();
            } catch (HoldLostException e) {
                assertEquals("expired", e.outcome().outcome());
                return;
            }
            Thread.sleep(10);
        }
    }

    @Test
    void anOnLostThatThrowsDoesNotStopTheRenewerAndCheckNeverCallsIt() throws Exception {
        MockProducer<byte[], byte[]> producer = mockProducer(true);
        StatusConsumer status = new StatusConsumer();
        CountDownLatch called = new CountDownLatch(1);
        CountDownLatch release = new CountDownLatch(1);
        List<String> threads = new CopyOnWriteArrayList<>();
        ServiceHold h = hold(producer, status, Duration.ofMinutes(1)).onLost(o -> {
            threads.add(Thread.currentThread().getName());
            called.countDown();
            try {
                release.await(); // a callback that takes its time must not hold up check()
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            throw new IllegalStateException("the backup's handler failed");
        }).build().start();
        status.outcome(firstActionId(producer), "expired");
        assertTimeoutPreemptively(Duration.ofSeconds(10), () -> {
            checkUntilExpired(h);
            assertTrue(called.await(5, TimeUnit.SECONDS), "the renewer never called onLost");
            assertThrows(HoldLostException.class, h::check); // while onLost runs
        });
        assertEquals(List.of("safepoint-hold-backup"), threads);
        release.countDown();
        long renewals = h.stats().renewals();
        Thread.sleep(300);
        assertTrue(h.stats().renewals() > renewals, "the renewer stopped after onLost threw");
        assertEquals(1, h.stats().callbackFailures());
        h.close(Duration.ofSeconds(2));
    }

    /**
     * The test above with the renewer out of the race for the outcome (stopped first: it nearly always reads the
     * outcome before check() does), so that check() is the one that reads it: it says the hold is lost and leaves
     * onLost to the renewer. White-box: the renewer's stop latch and executor are the hold's own.
     */
    @Test
    void checkReadsTheOutcomeButLeavesOnLostToTheRenewer() throws Exception {
        MockProducer<byte[], byte[]> producer = mockProducer(true);
        StatusConsumer status = new StatusConsumer();
        List<String> threads = new CopyOnWriteArrayList<>();
        ServiceHold h = hold(producer, status, Duration.ofMinutes(1)).onLost(o -> {
            threads.add(Thread.currentThread().getName());
            try {
                Thread.sleep(60_000); // on check()'s thread this would hold it up
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }).build().start();
        java.lang.reflect.Field stop = ServiceHold.class.getDeclaredField("stop");
        stop.setAccessible(true);
        ((CountDownLatch) stop.get(h)).countDown();
        java.lang.reflect.Field renewer = ServiceHold.class.getDeclaredField("renewer");
        renewer.setAccessible(true);
        ExecutorService r = (ExecutorService) renewer.get(h);
        r.shutdown();
        assertTrue(r.awaitTermination(5, TimeUnit.SECONDS), "the renewer did not stop");
        status.outcome(firstActionId(producer), "expired");
        assertTimeoutPreemptively(Duration.ofSeconds(10), () -> checkUntilExpired(h), "check() until the hold is lost");
        assertEquals(List.of(), threads, "check() called onLost: it is the renewer's");
        h.close(Duration.ofSeconds(2));
    }

    @Test
    void aStatusTopicThatCannotBeReadIsSaidAndAfterATtlReportedLost() throws Exception {
        MockProducer<byte[], byte[]> producer = mockProducer(true);
        StatusConsumer status = new StatusConsumer();
        CountDownLatch lost = new CountDownLatch(1);
        List<Outcome> got = new CopyOnWriteArrayList<>();
        ServiceHold h = hold(producer, status, Duration.ofMillis(400)).onLost(o -> {
            got.add(o);
            lost.countDown();
        }).build().start();
        status.failing = new TopicAuthorizationException("not authorized to read " + STATUS);
        assertTrue(lost.await(10, TimeUnit.SECONDS), "a status topic unreadable for a TTL was never reported");
        assertEquals("unknown", got.get(0).outcome());
        assertEquals("status_unreadable", got.get(0).reason());
        assertThrows(HoldLostException.class, h::check);
        assertTrue(h.stats().statusReadFailures() > 0);
        h.close(Duration.ofSeconds(2));
    }

    @Test
    void aHoldWhoseBrokerIsGoneClosesWithinItsBoundAndSaysSo() throws Exception {
        MockProducer<byte[], byte[]> producer = mockProducer(false); // nothing is ever acknowledged
        ServiceHold h = hold(producer, new StatusConsumer(), Duration.ofMinutes(1)).statusTopic("").build();
        Thread ack = new Thread(() -> { // the broker acknowledges the hold, then goes away
            while (!producer.completeNext()) {
                Thread.onSpinWait();
            }
        });
        ack.start();
        h.start();
        ack.join();
        long start = System.nanoTime();
        SafepointException e = assertTimeoutPreemptively(Duration.ofSeconds(10),
                () -> assertThrows(SafepointException.class, () -> h.close(Duration.ofMillis(500))));
        assertTrue(TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - start) < 3_000);
        assertTrue(e.getMessage().contains("could not be released") && e.getMessage().contains("TTL"), e.getMessage());
        SafepointException again = assertThrows(SafepointException.class, () -> h.close(Duration.ofMillis(100)));
        assertEquals(e.getMessage(), again.getMessage(), "a second close says what the first did");
    }

    @Test
    void aSecondStartIsRefused() {
        AtomicInteger n = new AtomicInteger();
        MockProducer<byte[], byte[]> producer = mockProducer(true);
        ServiceHold h = hold(producer, new StatusConsumer(), Duration.ofMinutes(1)).statusTopic("").build().start();
        assertThrows(IllegalStateException.class, h::start);
        h.close(Duration.ofSeconds(2));
        assertThrows(ClosedException.class, h::start);
        n.incrementAndGet();
    }
}
