package safepoint

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// DefaultEventsTopic is the topic nodes publish their events to.
const DefaultEventsTopic = "safepoint.events"

// DefaultSnapshotPartBytes is a snapshot part's size: half the broker's default message limit.
const DefaultSnapshotPartBytes = 500_000

// MinSnapshotPartBytes is the least part size a reporter takes.
const MinSnapshotPartBytes = 10_000

// maxHistoryPoints is the most points of history_above a heartbeat carries (more are thinned evenly).
const maxHistoryPoints = 64

// Figures are what a heartbeat may carry besides the node's clock; nil fields are left out.
type Figures struct {
	PinnedBytes  *int64
	DebtBytes    *int64
	Groups       []Group
	HistoryAbove [][2]int64 // (ts, bytes): the bytes of history only a read below ts needs
	CompactedTS  *int64
}

// Group is a replication group the node takes part in, as a heartbeat reports it.
type Group struct {
	Group              string
	Leader             bool
	PublishedMinTxTime int64
}

// ExpireFunc is called when the job expires one of the node's readers or transactions: cancel its work.
// It runs in the goroutine that handed the directive on (the DirectiveListener's, or Reporter.Expire's
// caller), with that goroutine's ctx; a panic in it is recovered, logged and counted
// (ReporterStats.CallbackPanics), and the expiry still takes effect.
type ExpireFunc func(ctx context.Context, h Handle, d ExpireDirective)

type reporterConfig struct {
	cluster           string
	topic             string
	incarnation       int64
	incarnationSet    bool
	stateDir          string
	heartbeat         time.Duration
	figures           func() Figures
	retention         *int64
	nodeKey           string
	snapshotPartBytes int
	onExpire          ExpireFunc
	wallClock         func() int64
	bufferLimit       int         // the producer's MaxBufferedRecords (maxBufferedRecords; tests make it small)
	shared            *kgo.Client // WithClient: the caller's producer
	common
}

// WithClient publishes the node's events through the caller's franz-go client instead of one of the
// reporter's own (one producer for the database and its reporter). NewReporter refuses a client whose
// settings would undo the reporter's guarantees, naming the setting: acks from all in-sync replicas,
// idempotence, the CRC-32 key partitioner (RecordPartitioner(CRC32Partitioner())), a delivery bound
// (RecordDeliveryTimeout), no manual flushing, no transactional id. The client stays the caller's: Close
// flushes it (the caller's own records too) but does not close it, and after a failed delivery the
// reporter keeps it (the repair snapshot restates the node) where it would make a new producer of its
// own. WithKafkaOptions does not go with it.
func WithClient(cl *kgo.Client) ReporterOption {
	return reporterOpt(func(c *reporterConfig) { c.shared = cl })
}

// WithCluster sets the node's cluster (default "default").
func WithCluster(cluster string) ReporterOption {
	return reporterOpt(func(c *reporterConfig) { c.cluster = cluster })
}

// WithEventsTopic sets the events topic (default safepoint.events).
func WithEventsTopic(topic string) ReporterOption {
	return reporterOpt(func(c *reporterConfig) { c.topic = topic })
}

// WithIncarnation sets the process's incarnation (default: the wall clock in ms at start, or one more
// than the last one WithStateDir kept).
func WithIncarnation(n int64) ReporterOption {
	return reporterOpt(func(c *reporterConfig) { c.incarnation, c.incarnationSet = n, true })
}

// WithStateDir keeps the incarnation in dir, so that it grows across restarts whatever the clock does.
func WithStateDir(dir string) ReporterOption {
	return reporterOpt(func(c *reporterConfig) { c.stateDir = dir })
}

// WithHeartbeat sets the heartbeat interval (default 1 s; 0: heartbeats only when Heartbeat is called).
func WithHeartbeat(every time.Duration) ReporterOption {
	return reporterOpt(func(c *reporterConfig) { c.heartbeat = every })
}

// WithFigures gives what each heartbeat carries besides the node's clock.
func WithFigures(f func() Figures) ReporterOption {
	return reporterOpt(func(c *reporterConfig) { c.figures = f })
}

// WithRetention turns on lazy registration: a hold is published only once it can hold history back
// (below mvcc_now - retention of a heartbeat, prepared, or in a snapshot). At most the job's retention.
func WithRetention(r int64) ReporterOption {
	return reporterOpt(func(c *reporterConfig) { c.retention = &r })
}

// WithNodeKey signs every event with the node's own key (safepoint node-key CLUSTER NODE).
func WithNodeKey(key string) ReporterOption {
	return reporterOpt(func(c *reporterConfig) { c.nodeKey = key })
}

// WithSnapshotPartBytes sets the size a snapshot's part may reach (default 500,000; at least 10,000).
func WithSnapshotPartBytes(n int) ReporterOption {
	return reporterOpt(func(c *reporterConfig) { c.snapshotPartBytes = n })
}

// WithOnExpire sets the callback of an expiry that reaches a handle without one of its own.
func WithOnExpire(f ExpireFunc) ReporterOption {
	return reporterOpt(func(c *reporterConfig) { c.onExpire = f })
}

// WithWallClock replaces the wall clock in ms (tests).
func WithWallClock(f func() int64) ReporterOption {
	return reporterOpt(func(c *reporterConfig) { c.wallClock = f })
}

// CRC32Partitioner places a record by the CRC-32 of its key, as librdkafka's default partitioner does,
// so a node's events land on the partition the Python client puts them on.
func CRC32Partitioner() kgo.Partitioner {
	return kgo.StickyKeyPartitioner(func(key []byte, n int) int { return int(crc32.ChecksumIEEE(key) % uint32(n)) })
}

// Reporter publishes one database node's events: its readers, transactions, heartbeats and snapshots.
// Safe for concurrent use; events reach the partition in seq order. Every call that waits is bounded:
// by its ctx, and a call that waits for room in a full send queue by 30 s at most; Close by its ctx or
// the close timeout.
type Reporter struct {
	node, cluster string
	incarnation   int64

	cfg      reporterConfig
	clock    func() int64
	seeds    []string
	log      *slog.Logger
	mu       sync.Mutex
	client   *kgo.Client
	seq      int64
	lastWall int64
	readers  map[string]*Reader
	txs      map[string]*Transaction
	safeTS   *int64
	nsBase   *int64
	nsBounds map[string]int64
	lazy     lazyRegistration
	// needSnap and rebuild are set by delivery callbacks, which never take r.mu: a call waiting for room
	// holds it
	needSnap                     atomic.Bool
	rebuild                      atomic.Bool
	closed                       bool
	bg                           context.Context // the heartbeats'; cancelled by Close
	stopBG                       context.CancelFunc
	done                         chan struct{} // closed when the heartbeat goroutine ended
	closing                      *closer
	stats                        ReporterStats // but Delivered, DeliveryFailures and CallbackPanics, lock-free
	nDelivered, deliveryFailures atomic.Int64
	panics                       atomic.Int64
	// holdOrder numbers the holds as they open: a snapshot lists them in that order
	holdOrder int64
}

// ReporterStats are a reporter's counters since it was made.
type ReporterStats struct {
	Sent, Delivered, DeliveryFailures, ProducerRestarts, RepairSnapshots, Expired, ExpiriesIgnored int64
	CallbackPanics                                                                                 int64
}

// Node is the node's id.
func (r *Reporter) Node() string { return r.node }

// Cluster is the node's cluster.
func (r *Reporter) Cluster() string { return r.cluster }

// Incarnation is this process's incarnation.
func (r *Reporter) Incarnation() int64 { return r.incarnation }

// NewReporter makes the reporter of node, publishing to the brokers of bootstrap ("host:port,..."),
// with clock the node's current MVCC time. With a heartbeat interval it starts heartbeating now.
func NewReporter(bootstrap, node string, clock func() int64, opts ...ReporterOption) (*Reporter, error) {
	cfg := reporterConfig{cluster: "default", topic: DefaultEventsTopic, heartbeat: time.Second,
		snapshotPartBytes: DefaultSnapshotPartBytes, wallClock: func() int64 { return time.Now().UnixMilli() },
		bufferLimit: maxBufferedRecords}
	for _, o := range opts {
		o.applyReporter(&cfg)
	}
	cfg.defaults()
	if err := checkID("node", node); err != nil {
		return nil, err
	}
	if cfg.snapshotPartBytes < MinSnapshotPartBytes {
		return nil, fmt.Errorf("safepoint: snapshot part bytes must be at least %d, got %d", MinSnapshotPartBytes,
			cfg.snapshotPartBytes)
	}
	if cfg.retention != nil && *cfg.retention < 0 {
		return nil, fmt.Errorf("safepoint: retention must be >= 0, got %d", *cfg.retention)
	}
	if err := checkOwned(cfg.kafka, producerOwned); err != nil {
		return nil, err
	}
	if cfg.shared != nil {
		if len(cfg.kafka) > 0 {
			return nil, errors.New("safepoint: WithKafkaOptions does not go with WithClient: the client's options are its own")
		}
		limit, err := checkShared(cfg.shared)
		if err != nil {
			return nil, err
		}
		cfg.bufferLimit = limit
	}
	incarnation := cfg.incarnation
	if !cfg.incarnationSet {
		var err error
		if incarnation, err = defaultIncarnation(cfg.stateDir, cfg.cluster, node, cfg.wallClock()); err != nil {
			return nil, err
		}
	}
	bg, stopBG := context.WithCancel(context.Background())
	r := &Reporter{node: node, cluster: cfg.cluster, incarnation: incarnation, cfg: cfg, clock: clock,
		seeds: strings.Split(bootstrap, ","), log: cfg.logger.With("node", node), readers: map[string]*Reader{},
		txs: map[string]*Transaction{}, lazy: lazyRegistration{retention: cfg.retention, eager: cfg.retention == nil},
		bg: bg, stopBG: stopBG, done: make(chan struct{}), closing: newCloser()}
	if err := r.newClient(); err != nil {
		stopBG()
		return nil, err
	}
	if cfg.heartbeat > 0 {
		go r.heartbeats()
	} else {
		close(r.done)
	}
	return r, nil
}

func (r *Reporter) newClient() error {
	if r.cfg.shared != nil {
		r.client = r.cfg.shared
		return nil
	}
	// the user's options first, the client's own last (checkOwned refused any that sets one of them):
	// idempotent with acks from all in-sync replicas (franz-go's defaults, said again); a record not
	// delivered in 5 minutes fails (librdkafka's message.timeout.ms, as the Python client has it)
	opts := append(append([]kgo.Opt{kgo.SeedBrokers(r.seeds...)}, r.cfg.kafka...),
		kgo.DefaultProduceTopic(r.cfg.topic), kgo.RequiredAcks(kgo.AllISRAcks()), kgo.ProducerLinger(5*time.Millisecond),
		kgo.RecordDeliveryTimeout(deliveryTimeout), kgo.MaxBufferedRecords(r.cfg.bufferLimit),
		kgo.AllowAutoTopicCreation(), // where the broker allows it, as librdkafka's producer does
		kgo.RecordPartitioner(CRC32Partitioner()))
	client, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("safepoint: cannot make the producer for %v: %w", r.seeds, err)
	}
	r.client = client
	return nil
}

func (r *Reporter) heartbeats() {
	defer close(r.done)
	ticker := time.NewTicker(r.cfg.heartbeat)
	defer ticker.Stop()
	for {
		if err := r.Heartbeat(r.bg); err != nil {
			if errors.Is(err, ErrClosed) || r.bg.Err() != nil {
				return
			}
			r.log.Warn("safepoint: heartbeat failed; retrying", "every", r.cfg.heartbeat, "err", err)
		}
		select {
		case <-r.bg.Done():
			return
		case <-ticker.C:
		}
	}
}

const (
	deliveryTimeout    = 5 * time.Minute
	maxBufferedRecords = 100_000
	// produceTimeout bounds the wait for room in the producer's buffer (the Python client's produce_timeout_s)
	produceTimeout = 30 * time.Second
)

// send stamps and publishes one event; call with r.mu held. It returns the event's seq. It waits for
// room while the producer's buffer is full, at most produceTimeout or until ctx ends: an error then,
// nothing published, seq unchanged.
func (r *Reporter) send(ctx context.Context, kind string, fields Event) (int64, error) {
	if r.closed {
		return 0, ErrClosed
	}
	if r.rebuild.Load() {
		r.recreate()
	}
	if err := r.room(ctx); err != nil {
		return 0, err
	}
	seq, wall := r.seq, r.cfg.wallClock()
	event := Event{"v": 1, "type": kind, "cluster": r.cluster, "wall_ms": wall, "node": r.node,
		"incarnation": r.incarnation, "seq": seq}
	for k, v := range fields {
		event[k] = v
	}
	if r.cfg.nodeKey != "" {
		sig, err := signNode(event, r.cfg.nodeKey)
		if err != nil {
			return 0, err
		}
		event["sig"] = sig
	}
	value, err := compactJSON(event)
	if err != nil {
		return 0, fmt.Errorf("safepoint: cannot encode a %s event: %w", kind, err)
	}
	r.seq, r.lastWall = seq+1, wall
	r.stats.Sent++
	// the record outlives the caller's ctx: it is the reporter's to deliver or to count as failed. TryProduce
	// never blocks (room waited for the one buffer limit that can fill): a record it cannot take fails at
	// once, as any failed delivery, and a snapshot repairs it
	r.client.TryProduce(context.Background(), &kgo.Record{Topic: r.cfg.topic, Key: []byte(r.node), Value: value,
		Headers: clusterHeader(r.cluster)}, r.delivered)
	return seq, nil
}

// room waits until the producer's buffer has room for one more record; call with r.mu held.
func (r *Reporter) room(ctx context.Context) error {
	limit := int64(r.cfg.bufferLimit)
	if r.client.BufferedProduceRecords() < limit {
		return nil
	}
	deadline := time.NewTimer(produceTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for r.client.BufferedProduceRecords() >= limit {
		select {
		case <-ctx.Done():
			return fmt.Errorf("safepoint: gave up waiting for room in the reporter's send queue: %w", ctx.Err())
		case <-deadline.C:
			return fmt.Errorf("safepoint: the reporter's send queue stayed full (%d events) for %s; is the broker up?",
				limit, produceTimeout)
		case <-tick.C:
		}
	}
	return nil
}

// delivered counts a record's delivery; it takes no lock (a Produce waiting for room holds r.mu).
func (r *Reporter) delivered(_ *kgo.Record, err error) {
	if err == nil {
		r.nDelivered.Add(1)
		return
	}
	r.deliveryFailures.Add(1)
	first := r.needSnap.CompareAndSwap(false, true) // said once until the repair snapshot goes out
	if errors.Is(err, kgo.ErrMaxBuffered) {
		if first { // the producer is sound: the snapshot alone repairs it
			r.log.Warn("safepoint: the send queue was full; a snapshot will repair the job's view", "err", err)
		}
		return
	}
	if !errors.Is(err, kgo.ErrClientClosed) && !errors.Is(err, context.Canceled) {
		r.rebuild.Store(true) // the idempotent producer's sequence is lost: a new producer, then a snapshot
		if first {
			r.log.Warn("safepoint: an event was not delivered; a snapshot will repair the job's view", "err", err)
		}
	}
}

// recreate replaces the producer after a failure; call with r.mu held.
func (r *Reporter) recreate() {
	if r.cfg.shared != nil { // the caller's: kept, and the snapshot alone repairs the job's view
		r.rebuild.Store(false)
		r.needSnap.Store(true)
		return
	}
	old := r.client
	if err := r.newClient(); err != nil {
		r.log.Error("safepoint: cannot recreate the producer", "err", err)
		return
	}
	r.rebuild.Store(false)
	r.needSnap.Store(true)
	r.stats.ProducerRestarts++
	go old.Close()
}

// Heartbeat publishes one heartbeat now (the background loop does this every interval); a pending repair
// snapshot goes first.
func (r *Reporter) Heartbeat(ctx context.Context) error {
	var figures Figures
	if r.cfg.figures != nil {
		figures = r.cfg.figures()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return ErrClosed
	}
	if err := r.repair(ctx); err != nil {
		return err
	}
	now := r.clock()
	if bound, ok := r.lazy.heartbeatBound(now); ok {
		if err := r.publishWaiting(ctx, &bound); err != nil {
			return err
		}
	}
	event := Event{"mvcc_now": now, "active_readers": len(r.readers), "active_txs": len(r.txs)}
	if figures.Groups != nil {
		groups := make([]Event, 0, len(figures.Groups))
		for _, g := range figures.Groups {
			groups = append(groups, Event{"group": g.Group, "leader": g.Leader, "published_min_tx_time": g.PublishedMinTxTime})
		}
		event["groups"] = groups
	}
	if figures.PinnedBytes != nil {
		event["pinned_bytes"] = *figures.PinnedBytes
	}
	if figures.DebtBytes != nil {
		event["debt_bytes"] = *figures.DebtBytes
	}
	if figures.HistoryAbove != nil {
		event["history_above"] = historyPoints(figures.HistoryAbove)
	}
	if figures.CompactedTS != nil {
		event["compacted_ts"] = *figures.CompactedTS
	}
	_, err := r.send(ctx, "heartbeat", event)
	return err
}

func historyPoints(raw [][2]int64) []Event {
	points := make([]Event, 0, len(raw))
	for _, p := range raw {
		points = append(points, Event{"ts": p[0], "bytes": p[1]})
	}
	if len(points) <= maxHistoryPoints {
		return points
	}
	step := float64(len(points)-1) / float64(maxHistoryPoints-1)
	thinned := make([]Event, 0, maxHistoryPoints)
	for i := 0; i < maxHistoryPoints; i++ {
		thinned = append(thinned, points[pyRound(float64(i)*step)])
	}
	return thinned
}

// pyRound rounds half to even, as Python's round does.
func pyRound(x float64) int {
	f := float64(int(x))
	diff := x - f
	switch {
	case diff > 0.5:
		return int(f) + 1
	case diff < 0.5:
		return int(f)
	case int(f)%2 == 0:
		return int(f)
	default:
		return int(f) + 1
	}
}

// Snapshot publishes the node's complete set of readers and transactions (it replaces what the job holds).
func (r *Reporter) Snapshot(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.publishSnapshot(ctx)
}

// publishSnapshot publishes the active set, in parts when it is larger than the part size (each part
// takes the next seq, nothing between them); call with r.mu held.
func (r *Reporter) publishSnapshot(ctx context.Context) error {
	cut := r.clock()
	readers := make([]Event, 0, len(r.readers))
	for _, h := range sortedReaders(r.readers) {
		readers = append(readers, h.entry())
	}
	txs := make([]Event, 0, len(r.txs))
	for _, h := range sortedTxs(r.txs) {
		txs = append(txs, h.entry())
	}
	parts, err := snapshotParts(readers, txs, r.cfg.snapshotPartBytes)
	if err != nil {
		return err
	}
	for k, part := range parts {
		event := Event{"cut": cut, "readers": part[0], "txs": part[1]}
		if len(parts) > 1 {
			event["part"], event["parts"] = k, len(parts)
		}
		if _, err := r.send(ctx, "snapshot", event); err != nil {
			return err
		}
	}
	r.needSnap.Store(false)
	for _, h := range r.readers {
		h.published = true
	}
	for _, h := range r.txs {
		h.published = true
	}
	return nil
}

// snapshotParts cuts the entries into parts of at most about partBytes of JSON each.
func snapshotParts(readers, txs []Event, partBytes int) ([][2][]Event, error) {
	parts := [][2][]Event{{{}, {}}}
	size := 0
	for index, entries := range [2][]Event{readers, txs} {
		for _, entry := range entries {
			raw, err := compactJSON(entry)
			if err != nil {
				return nil, err
			}
			n := len(raw) + 1
			last := parts[len(parts)-1]
			if size+n > partBytes && (len(last[0]) > 0 || len(last[1]) > 0) {
				parts = append(parts, [2][]Event{{}, {}})
				size = 0
			}
			parts[len(parts)-1][index] = append(parts[len(parts)-1][index], entry)
			size += n
		}
	}
	return parts, nil
}

// repair republishes the active set after a failure (a new producer first where it failed); call with
// r.mu held.
func (r *Reporter) repair(ctx context.Context) error {
	if r.rebuild.Load() {
		r.recreate()
	}
	if r.needSnap.Load() {
		r.stats.RepairSnapshots++
		return r.publishSnapshot(ctx)
	}
	return nil
}

// ObserveSafeTS records the cluster's safe point from a directive (it only moves forward), the
// namespaces' bounds, and the job's retention (lazy registration goes eager above it).
func (r *Reporter) ObserveSafeTS(ctx context.Context, safeTS int64, retention *int64, nsBase *int64,
	namespaces map[string]int64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.safeTS == nil || safeTS > *r.safeTS {
		r.safeTS = &safeTS
	}
	if nsBase != nil {
		r.nsBase, r.nsBounds = nsBase, namespaces
	}
	if retention != nil && r.lazy.jobRetention(*retention) && !r.closed {
		r.log.Warn("safepoint: the reporter's retention is larger than the job's; publishing every hold from now on",
			"job_retention", *retention)
		return r.publishWaiting(ctx, nil)
	}
	return nil
}

// SafeTS is the newest safe point this node learnt of (false before the first).
func (r *Reporter) SafeTS() (int64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.safeTS == nil {
		return 0, false
	}
	return *r.safeTS, true
}

// Stats are the reporter's counters.
func (r *Reporter) Stats() ReporterStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.stats
	s.Delivered, s.DeliveryFailures, s.CallbackPanics = r.nDelivered.Load(), r.deliveryFailures.Load(), r.panics.Load()
	return s
}

// Flush waits until every event is delivered (a repair snapshot first, where one is due), or until ctx
// ends: then an error that says how many events were still on their way.
func (r *Reporter) Flush(ctx context.Context) error {
	r.mu.Lock()
	if err := r.repair(ctx); err != nil {
		r.mu.Unlock()
		return err
	}
	client := r.client
	r.mu.Unlock()
	if err := client.Flush(ctx); err != nil {
		return fmt.Errorf("safepoint: %d events not yet delivered: %w", client.BufferedProduceRecords(), err)
	}
	return nil
}

// Close stops the heartbeats, flushes and closes the producer, within ctx or, when ctx has no deadline,
// the close timeout (WithCloseTimeout, default 30 s); what was not delivered by then is said in the error
// (the job's node lease then ends the node's holds). Safe to call more than once and from several
// goroutines: each waits for the first (or its own ctx) and returns its error. Readers and transactions
// still open are not closed: the next incarnation of the node drops them.
func (r *Reporter) Close(ctx context.Context) error {
	return r.closing.close(ctx, "reporter", r.close)
}

// close is Close's work, bounded by ctx or the close timeout.
func (r *Reporter) close(ctx context.Context) error {
	ctx, cancel := bounded(ctx, r.cfg.closeTimeout)
	defer cancel()
	r.stopBG() // a heartbeat waiting for room gives up now
	select {
	case <-r.done:
	case <-ctx.Done():
	}
	err := r.Flush(ctx)
	r.mu.Lock()
	r.closed = true
	client := r.client
	r.mu.Unlock()
	if r.cfg.shared == nil {
		client.Close() // fails what is still buffered (counted as delivery failures)
	}
	return err
}

// bounded is ctx, with a deadline of d from now when it has none of its own.
func bounded(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}

func checkID(name, value string) error {
	if len(value) < 1 || len([]rune(value)) > 256 {
		return fmt.Errorf("safepoint: %s must be a non-empty string of at most 256 characters, got %q", name, value)
	}
	return nil
}

// defaultIncarnation is the wall clock in ms at start, or with a state dir one more than the last one kept
// there (whichever is larger), kept for the next start.
func defaultIncarnation(dir, cluster, node string, now int64) (int64, error) {
	if dir == "" {
		return now, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, fmt.Errorf("safepoint: cannot keep the incarnation in %s: %w", dir, err)
	}
	path := filepath.Join(dir, fmt.Sprintf("%s.%s.incarnation", escapePath(cluster), escapePath(node)))
	value := now
	if raw, err := os.ReadFile(path); err == nil {
		if last, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64); err == nil && last+1 > value {
			value = last + 1
		}
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(strconv.FormatInt(value, 10)+"\n"), 0o644); err != nil {
		return 0, fmt.Errorf("safepoint: cannot keep the incarnation in %s: %w", dir, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return 0, fmt.Errorf("safepoint: cannot keep the incarnation in %s: %w", dir, err)
	}
	return value, nil
}

// escapePath quotes a name as Python's urllib.parse.quote(name, safe="") does, for the state file's name.
func escapePath(s string) string {
	var b strings.Builder
	for _, c := range []byte(s) {
		if c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-' || c == '~' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

func sortedReaders(m map[string]*Reader) []*Reader {
	out := make([]*Reader, 0, len(m))
	for _, h := range m {
		out = append(out, h)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].order < out[j].order })
	return out
}

func sortedTxs(m map[string]*Transaction) []*Transaction {
	out := make([]*Transaction, 0, len(m))
	for _, h := range m {
		out = append(out, h)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].order < out[j].order })
	return out
}
