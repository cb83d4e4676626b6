package safepoint

// The client against a Kafka that misbehaves: franz-go's kfake cluster (in this process, on 127.0.0.1),
// stopped, faulted or slowed. Each test is one defect a database team found by reading or running the
// client; each failed on the client before its fix (a hang, a panic, a lost failure, a setting undone).

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

const (
	eventsTopic  = "t.events"
	controlTopic = "t.control"
	statusTopic  = "t.status"
)

func newCluster(t *testing.T) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, eventsTopic, controlTopic, statusTopic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func bootstrapOf(c *kfake.Cluster) string { return strings.Join(c.ListenAddrs(), ",") }

// within fails the test when f does not return in d (a call that blocks forever).
func within(t *testing.T, d time.Duration, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(d):
		buf := make([]byte, 1<<20)
		t.Fatalf("%s did not return within %s; the goroutines:\n%s", what, d, buf[:runtime.Stack(buf, true)])
	}
}

// readAll is every value of the topic's partition 0 so far.
func readAll(t *testing.T, c *kfake.Cluster, topic string) []Event {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {0: kgo.NewOffset().AtStart()}}))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var out []Event
	for ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			e, err := decodeObject(r.Value)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, e)
		})
	}
	return out
}

func TestTheClientsOwnKafkaSettingsCannotBeOverridden(t *testing.T) {
	refused := map[string]kgo.Opt{
		"DisableIdempotentWrite": kgo.DisableIdempotentWrite(),
		"RequiredAcks":           kgo.RequiredAcks(kgo.LeaderAck()),
		"MaxBufferedRecords":     kgo.MaxBufferedRecords(10),
		"RecordPartitioner":      kgo.RecordPartitioner(kgo.RoundRobinPartitioner()),
		"RecordDeliveryTimeout":  kgo.RecordDeliveryTimeout(time.Second),
		"DefaultProduceTopic":    kgo.DefaultProduceTopic("elsewhere"),
	}
	for name, opt := range refused {
		_, err := NewReporter("127.0.0.1:1", "n1", func() int64 { return 1 }, WithHeartbeat(0), WithKafkaOptions(opt))
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("a reporter took kafka option %s: %v", name, err)
		}
		_, err = NewServiceHold("127.0.0.1:1", "c1", "backup", 1, time.Minute, WithKafkaOptions(opt))
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("a service hold took kafka option %s: %v", name, err)
		}
	}
	_, err := NewDirectiveListener("127.0.0.1:1", "c1", WithKafkaOptions(kgo.ConsumerGroup("g")))
	if err == nil || !strings.Contains(err.Error(), "ConsumerGroup") {
		t.Errorf("a listener took a consumer group: %v", err)
	}
	r, err := NewReporter("127.0.0.1:1", "n1", func() int64 { return 1 }, WithHeartbeat(0),
		WithKafkaOptions(kgo.ClientID("db-7"), kgo.DialTimeout(time.Second)))
	if err != nil {
		t.Fatalf("a reporter refused options that are the user's: %v", err)
	}
	if got := r.client.OptValue(kgo.ClientID); got != "db-7" {
		t.Errorf("the user's client id was not applied: %v", got)
	}
	if err := r.Close(context.Background()); err != nil {
		t.Error(err)
	}
}

func TestAHoldWhoseBrokersAreGoneClosesWithinItsBoundAndSaysSo(t *testing.T) {
	c := newCluster(t)
	h, err := NewServiceHold(bootstrapOf(c), "c1", "backup", 100, time.Minute, WithControlTopic(controlTopic),
		WithStatusTopic(""), WithLogger(quiet), WithCloseTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	c.Close()
	var closeErr error
	start := time.Now()
	within(t, 10*time.Second, "ServiceHold.Close(context.Background()) with the brokers gone", func() {
		closeErr = h.Close(context.Background())
	})
	if closeErr == nil || !strings.Contains(closeErr.Error(), "could not be released") ||
		!strings.Contains(closeErr.Error(), "TTL") {
		t.Fatalf("the close did not say the hold was not released: %v", closeErr)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("the close took %s, its bound is 1 s", took)
	}
	if err := h.Close(context.Background()); err == nil || err.Error() != closeErr.Error() {
		t.Errorf("a second Close returned %v, not the first one's error", err)
	}
}

func TestAReporterWhoseBrokersAreGoneClosesWithinItsBound(t *testing.T) {
	c := newCluster(t)
	r, err := NewReporter(bootstrapOf(c), "n1", func() int64 { return 1000 }, WithEventsTopic(eventsTopic),
		WithHeartbeat(20*time.Millisecond), WithLogger(quiet), WithCloseTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if _, err := r.Reader(context.Background(), HoldOptions{}); err != nil { // buffered: it cannot be delivered
		t.Fatal(err)
	}
	var closeErr error
	within(t, 10*time.Second, "Reporter.Close(context.Background()) with the brokers gone", func() {
		closeErr = r.Close(context.Background())
	})
	if closeErr == nil || !strings.Contains(closeErr.Error(), "not yet delivered") {
		t.Fatalf("the close did not say what was not delivered: %v", closeErr)
	}
	if _, err := r.Reader(context.Background(), HoldOptions{}); !errors.Is(err, ErrClosed) {
		t.Errorf("a closed reporter opened a reader: %v", err)
	}
}

func TestCloseIsSafeFromManyGoroutines(t *testing.T) {
	c := newCluster(t)
	r, err := NewReporter(bootstrapOf(c), "n1", func() int64 { return 1000 }, WithEventsTopic(eventsTopic),
		WithHeartbeat(5*time.Millisecond), WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	h, err := NewServiceHold(bootstrapOf(c), "c1", "backup", 100, time.Minute, WithControlTopic(controlTopic),
		WithStatusTopic(""), WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	l, err := NewDirectiveListener(bootstrapOf(c), "c1", WithDirectivesTopic(eventsTopic), WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Start(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 24)
	for i := 0; i < 8; i++ {
		wg.Add(3)
		go func() { defer wg.Done(); errs <- r.Close(context.Background()) }()
		go func() { defer wg.Done(); errs <- h.Close(context.Background()) }()
		go func() { defer wg.Done(); errs <- l.Close(context.Background()) }()
	}
	within(t, 20*time.Second, "24 concurrent Close calls", wg.Wait)
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

func TestStartTwiceIsRefusedPlainly(t *testing.T) {
	c := newCluster(t)
	h, err := NewServiceHold(bootstrapOf(c), "c1", "backup", 100, time.Minute, WithControlTopic(controlTopic),
		WithStatusTopic(""), WithLogger(quiet), WithRenewEvery(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := h.Start(context.Background()); !errors.Is(err, ErrStarted) {
		t.Fatalf("a second Start of a hold: %v", err)
	}
	time.Sleep(50 * time.Millisecond) // renewals run: one renewer, not two
	if err := h.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := h.Start(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("a Start after Close: %v", err)
	}
	l, err := NewDirectiveListener(bootstrapOf(c), "c1", WithDirectivesTopic(eventsTopic), WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Start(); err != nil {
		t.Fatal(err)
	}
	if err := l.Start(); !errors.Is(err, ErrStarted) {
		t.Fatalf("a second Start of a listener: %v", err)
	}
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestACallbackThatPanicsIsCountedAndTheRestIsHandedOn(t *testing.T) {
	r, err := NewReporter("127.0.0.1:1", "n1", func() int64 { return 1000 }, WithCluster("c1"), WithHeartbeat(0),
		WithLogger(quiet), WithCloseTimeout(100*time.Millisecond),
		WithOnExpire(func(context.Context, Handle, ExpireDirective) { panic("the database's handler failed") }))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Close(context.Background()) }()
	ctx := context.Background()
	a, _ := r.Reader(ctx, HoldOptions{ID: "a"})
	b, _ := r.Reader(ctx, HoldOptions{ID: "b"})
	for i, id := range []string{"a", "b"} {
		if r.Expire(ctx, ExpireDirective{Cluster: "c1", Node: "n1", ReaderID: id, Mode: "graceful", Seq: int64(i + 1)}) == nil {
			t.Fatalf("expiry of %s not applied", id)
		}
	}
	var expired *ExpiredError
	if !errors.As(a.Check(ctx), &expired) || !errors.As(b.Check(ctx), &expired) {
		t.Fatal("an expiry whose callback panicked did not take effect")
	}
	if n := r.Stats().CallbackPanics; n != 2 {
		t.Fatalf("CallbackPanics %d, want 2", n)
	}

	l := listenerFor(t, "")
	var handed []string
	l.cfg.onExpire = func(_ context.Context, e ExpireDirective) {
		if e.ReaderID == "r1" {
			panic("the database's handler failed")
		}
		handed = append(handed, e.ReaderID)
	}
	for i, id := range []string{"r1", "r2"} {
		l.handle(ctx, record(int64(i), `{"v":1,"type":"expire","cluster":"c1","node":"n1","reader_id":"`+id+
			`","mode":"graceful","reason":"pressure","seq":`+string(rune('1'+i))+`}`))
	}
	if len(handed) != 1 || handed[0] != "r2" || l.Stats().CallbackPanics != 1 {
		t.Fatalf("after a panicking callback: handed %v, panics %d", handed, l.Stats().CallbackPanics)
	}
	l.cfg.onDirective = func(context.Context, Directive) error { panic("the engine's compaction failed") }
	if err := l.deliver(ctx, Directive{Seq: 1}); err == nil || !strings.Contains(err.Error(), "panicked") {
		t.Fatalf("a panicking on-directive callback: %v", err)
	}
}

// statusRecord is the job's status of cluster c1 with one action's outcome.
// expireAsTheJob publishes, as the job would, the outcome "expired" of the hold's first action; its id.
func expireAsTheJob(t *testing.T, c *kfake.Cluster, h *ServiceHold) string {
	t.Helper()
	h.mu.Lock()
	id := h.mine[0]
	h.mu.Unlock()
	job, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer job.Close()
	if err := job.ProduceSync(context.Background(), statusRecord(id, "expired")).FirstErr(); err != nil {
		t.Fatal(err)
	}
	return id
}

func statusRecord(actionID, outcome string) *kgo.Record {
	v := `{"v":1,"type":"cluster_status","cluster":"c1","actions":[{"id":"` + actionID +
		`","type":"service_hold","holder":"backup","outcome":"` + outcome + `","reason":"ttl","detail":"its TTL ran out"}]}`
	return &kgo.Record{Topic: statusTopic, Key: []byte("c1"), Value: []byte(v)}
}

func TestOnLostRunsOnTheRenewerNotInCheck(t *testing.T) {
	c := newCluster(t)
	called := make(chan Outcome, 1)
	release := make(chan struct{})
	h, err := NewServiceHold(bootstrapOf(c), "c1", "backup", 100, time.Minute, WithControlTopic(controlTopic),
		WithStatusTopic(statusTopic), WithOutcomeTimeout(100*time.Millisecond), WithLogger(quiet),
		WithOnLost(func(_ context.Context, o Outcome) {
			called <- o
			<-release // a callback that takes its time must not hold up Check
		}))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() { close(release); _ = h.Close(context.Background()) }()
	id := expireAsTheJob(t, c, h)
	var lostErr *HoldLostError
	deadline := time.Now().Add(5 * time.Second)
	for !errors.As(h.Check(), &lostErr) {
		if time.Now().After(deadline) {
			t.Fatal("Check did not say the hold was lost")
		}
	}
	select {
	case o := <-called:
		if o.Outcome != "expired" || o.ID != id {
			t.Fatalf("onLost got %+v", o)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the renewer did not call onLost")
	}
	within(t, 2*time.Second, "Check while onLost runs", func() {
		if !errors.As(h.Check(), &lostErr) {
			t.Error("Check forgot the lost hold")
		}
	})
}

func TestAStatusTopicThatCannotBeReadIsSaidAndAfterATTLReportedLost(t *testing.T) {
	c := newCluster(t)
	lostCh := make(chan Outcome, 1)
	h, err := NewServiceHold(bootstrapOf(c), "c1", "backup", 100, 600*time.Millisecond, WithControlTopic(controlTopic),
		WithStatusTopic(statusTopic), WithOutcomeTimeout(50*time.Millisecond), WithLogger(quiet),
		WithOnLost(func(_ context.Context, o Outcome) { lostCh <- o }))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.Close(context.Background()) }()
	c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Fetch}, Err: kerr.TopicAuthorizationFailed, Count: -1}) // the hold's one fetcher
	select {
	case o := <-lostCh:
		if o.Outcome != "unknown" || o.Reason != "status_unreadable" || !strings.Contains(o.Detail, statusTopic) {
			t.Fatalf("onLost got %+v", o)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a status topic that could not be read for the hold's TTL was never reported")
	}
	var lostErr *HoldLostError
	if !errors.As(h.Check(), &lostErr) || h.Stats().StatusReadFailures == 0 {
		t.Fatalf("Check %v, status read failures %d", h.Check(), h.Stats().StatusReadFailures)
	}
}

func TestAFailedDeliveryIsRepairedWithANewProducerAndASnapshot(t *testing.T) {
	c := newCluster(t)
	r, err := NewReporter(bootstrapOf(c), "n1", func() int64 { return 1000 }, WithCluster("c1"),
		WithEventsTopic(eventsTopic), WithHeartbeat(0), WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Close(context.Background()) }()
	ctx := context.Background()
	c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: eventsTopic, Err: kerr.InvalidRecord})
	if _, err := r.Reader(ctx, HoldOptions{ID: "kept"}); err != nil {
		t.Fatal(err)
	}
	if err := r.Flush(ctx); err != nil { // the failed delivery: no error here, a repair is due
		t.Fatal(err)
	}
	if err := r.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	var types []string
	var snapshot Event
	for _, e := range readAll(t, c, eventsTopic) {
		types = append(types, str(e["type"]))
		if e["type"] == "snapshot" {
			snapshot = e
		}
	}
	if strings.Join(types, ",") != "snapshot,heartbeat" || snapshot == nil {
		t.Fatalf("the events after a failed delivery: %v", types)
	}
	readers, _ := snapshot["readers"].([]any)
	if len(readers) != 1 || str(readers[0].(map[string]any)["reader_id"]) != "kept" {
		t.Fatalf("the repair snapshot lists %v", snapshot["readers"])
	}
	s := r.Stats()
	if s.DeliveryFailures != 1 || s.ProducerRestarts != 1 || s.RepairSnapshots != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestAFullSendQueueWaitsOnlyAsLongAsTheCallersContext(t *testing.T) {
	c := newCluster(t)
	r, err := NewReporter(bootstrapOf(c), "n1", func() int64 { return 1000 }, WithEventsTopic(eventsTopic),
		WithHeartbeat(0), WithLogger(quiet), WithCloseTimeout(200*time.Millisecond),
		reporterOpt(func(c *reporterConfig) { c.bufferLimit = 3 }))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Close(context.Background()) }()
	c.Close() // nothing is delivered: the queue fills
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		if _, err := r.Reader(ctx, HoldOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	var openErr error
	within(t, 5*time.Second, "a reader opened on a full queue", func() { _, openErr = r.Reader(short, HoldOptions{ID: "late"}) })
	if openErr == nil || !strings.Contains(openErr.Error(), "send queue") {
		t.Fatalf("a full queue: %v", openErr)
	}
	if r.Find(KindReader, "late") != nil || r.Stats().Sent != 3 {
		t.Fatal("a reader refused for a full queue was kept or counted as sent")
	}
}

func TestTheCallersSlicesAreCopied(t *testing.T) {
	r, err := NewReporter("127.0.0.1:1", "n1", func() int64 { return 1000 }, WithHeartbeat(0), WithLogger(quiet),
		WithCloseTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Close(context.Background()) }()
	ctx := context.Background()
	groups := []string{"g1"}
	reader, _ := r.Reader(ctx, HoldOptions{Groups: groups})
	tx, _ := r.Begin(ctx, HoldOptions{})
	parts := []string{"p1", "p2"}
	if err := tx.Prepare(ctx, "coord", parts); err != nil {
		t.Fatal(err)
	}
	groups[0], parts[0] = "changed", "changed"
	if reader.entry()["groups"].([]string)[0] != "g1" || tx.entry()["participants"].([]string)[0] != "p1" {
		t.Fatal("the reporter kept the caller's slices")
	}
}

func TestAReporterPublishesThroughTheCallersClientAndLeavesItOpen(t *testing.T) {
	c := newCluster(t)
	refused := map[string]kgo.Opt{
		"RequiredAcks":          kgo.RequiredAcks(kgo.LeaderAck()),
		"RecordPartitioner":     kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)), // murmur2: another partition
		"RecordDeliveryTimeout": kgo.ClientID("no-delivery-bound"),                    // franz-go's default: none
		"ManualFlushing":        kgo.ManualFlushing(),
	}
	for name, opt := range refused {
		opts := []kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(CRC32Partitioner())}
		if name != "RecordDeliveryTimeout" {
			opts = append(opts, kgo.RecordDeliveryTimeout(time.Minute))
		}
		opts = append(opts, opt)
		if name == "RequiredAcks" {
			opts = append(opts, kgo.DisableIdempotentWrite()) // franz-go refuses acks=1 with idempotence
		}
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			t.Fatal(err)
		}
		_, err = NewReporter("", "n1", func() int64 { return 1 }, WithHeartbeat(0), WithClient(cl))
		cl.Close()
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("a reporter took a client with %s: %v", name, err)
		}
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(CRC32Partitioner()),
		kgo.RecordDeliveryTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := NewReporter("", "n1", func() int64 { return 1 }, WithClient(cl),
		WithKafkaOptions(kgo.ClientID("x"))); err == nil {
		t.Error("WithKafkaOptions went with WithClient")
	}
	ctx := context.Background()
	r, err := NewReporter("", "n1", func() int64 { return 1000 }, WithCluster("c1"), WithEventsTopic(eventsTopic),
		WithHeartbeat(0), WithLogger(quiet), WithClient(cl))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reader(ctx, HoldOptions{ID: "through-the-callers-client"}); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(ctx); err != nil {
		t.Fatal(err)
	}
	events := readAll(t, c, eventsTopic)
	if len(events) != 1 || str(events[0]["reader_id"]) != "through-the-callers-client" {
		t.Fatalf("the events published through the caller's client: %v", events)
	}
	// the client is still the caller's, and open
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: eventsTopic, Key: []byte("app"), Value: []byte("{}")}).FirstErr(); err != nil {
		t.Fatalf("the caller's client after the reporter's close: %v", err)
	}
}

// TestCloseIsSafeFromManyGoroutines with the reporter's Close calls released at once, many times over: the
// race of two Close calls on one stop channel is met only when they start together.
func TestCloseCallsReleasedTogetherNeverCloseTwice(t *testing.T) {
	for n := 0; n < 200; n++ {
		r, err := NewReporter("127.0.0.1:1", "n1", func() int64 { return 1000 }, WithHeartbeat(0),
			WithLogger(quiet)) // nothing sent: a Close has nothing to wait for but the other Close calls
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		gate := make(chan struct{})
		for i := 0; i < 16; i++ {
			wg.Add(1)
			go func() { defer wg.Done(); <-gate; _ = r.Close(context.Background()) }()
		}
		close(gate)
		within(t, 10*time.Second, "16 Close calls released together", wg.Wait)
	}
}

// TestOnLostRunsOnTheRenewerNotInCheck with the renewer out of the race for the outcome (stopped first), so
// that Check is the one that reads it: Check says the hold is lost and does not call onLost itself.
func TestCheckReadsTheOutcomeButLeavesOnLostToTheRenewer(t *testing.T) {
	c := newCluster(t)
	called := make(chan string, 4)
	h, err := NewServiceHold(bootstrapOf(c), "c1", "backup", 100, time.Minute, WithControlTopic(controlTopic),
		WithStatusTopic(statusTopic), WithOutcomeTimeout(100*time.Millisecond), WithLogger(quiet),
		WithOnLost(func(_ context.Context, o Outcome) { called <- o.Outcome; time.Sleep(time.Hour) }))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.Close(context.Background()) }()
	h.stopBG() // the renewer ends: only Check reads the status topic from now on
	<-h.done
	expireAsTheJob(t, c, h)
	var lostErr *HoldLostError
	within(t, 10*time.Second, "Check until the hold is lost", func() {
		deadline := time.Now().Add(5 * time.Second)
		for !errors.As(h.Check(), &lostErr) {
			if time.Now().After(deadline) {
				t.Error("Check did not say the hold was lost")
				return
			}
		}
	})
	if len(called) != 0 {
		t.Fatalf("Check called onLost (%s): it is the renewer's", <-called)
	}
}
