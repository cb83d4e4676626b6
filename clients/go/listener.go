package safepoint

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// DefaultDirectivesTopic is the compacted topic the job writes directives to.
const DefaultDirectivesTopic = "safepoint.directives"

// refusedLogEvery is how often a refused directive is logged at most (each one is counted).
const refusedLogEvery = time.Minute

// ListenerStats are a listener's counters since it was made.
type ListenerStats struct {
	Received, Delivered, Repeats, Superseded, OtherClusters, Invalid, ExpiresDelivered, SnapshotRequests int64
	Unsigned, BadSignatures, Generations, HeldBack, CallbackPanics                                       int64
}

type listenerConfig struct {
	topic       string
	reporter    *Reporter
	node        string
	keys        []ed25519.PublicKey
	onDirective func(context.Context, Directive) error
	onExpire    func(context.Context, ExpireDirective)
	backoff     time.Duration
	common
}

// WithDirectivesTopic sets the directives topic (default safepoint.directives).
func WithDirectivesTopic(topic string) ListenerOption {
	return listenerOpt(func(c *listenerConfig) { c.topic = topic })
}

// WithReporter feeds every new safe point to the reporter (readers below it are refused), hands it the
// node's expiries and answers the job's snapshot requests with its snapshot.
func WithReporter(r *Reporter) ListenerOption {
	return listenerOpt(func(c *listenerConfig) { c.reporter = r })
}

// WithDirectiveKeys makes the listener act on no directive that none of keys signed (the job's public
// keys, ParseDirectiveKeys): each is counted, logged at most once a minute, and the newest valid
// directive stays in force.
func WithDirectiveKeys(keys []ed25519.PublicKey) ListenerOption {
	copied := append([]ed25519.PublicKey(nil), keys...)
	return listenerOpt(func(c *listenerConfig) { c.keys = copied })
}

// WithOnDirective is called, from the listener's goroutine (Start) with its ctx, cancelled by Close, with
// each directive whose seq advances; an error is retried every second until it succeeds or a newer
// directive supersedes it. A panic is recovered, logged and counted (ListenerStats.CallbackPanics) and
// retried as an error is.
func WithOnDirective(f func(context.Context, Directive) error) ListenerOption {
	return listenerOpt(func(c *listenerConfig) { c.onDirective = f })
}

// WithOnExpireDirective is called with each expiry of the node (after the reporter's handle, if any), in
// the goroutine that reads the directives (the listener's, or Poll's caller) with its ctx. A panic is
// recovered, logged and counted, and the records after it are handled as if it had returned.
func WithOnExpireDirective(f func(context.Context, ExpireDirective)) ListenerOption {
	return listenerOpt(func(c *listenerConfig) { c.onExpire = f })
}

// WithListenerNode limits expiries to this node (default: the reporter's).
func WithListenerNode(node string) ListenerOption {
	return listenerOpt(func(c *listenerConfig) { c.node = node })
}

// DirectiveListener follows one cluster's directives: it reads the compacted directives topic from its
// start without a consumer group, delivers of its backlog only the newest directive, then each one whose
// seq advances; a directive of a new generation of the job (which started on empty state and numbers
// from 1 again) is taken once its safe_ts is not below the one delivered.
type DirectiveListener struct {
	cluster string

	cfg    listenerConfig
	client *kgo.Client
	admin  *kadm.Client
	log    *slog.Logger

	mu                  sync.Mutex
	ends                map[int32]int64
	read                map[int32]int64
	caughtUp            bool
	idleSince           time.Time
	backlogBest         *Directive
	backlogSnapshotAsk  bool
	lastSeq             int64
	last                *Directive
	safeTS              *int64
	generation          string
	nodeGeneration      string
	nodeGenerationKnown bool
	lastExpireSeq       int64
	lastBandSeq         int64
	refusedLogged       time.Time
	stats               ListenerStats

	started bool
	closed  bool
	cancel  context.CancelFunc
	done    chan struct{}
	closing *closer
}

// Cluster is the cluster whose directives the listener follows.
func (l *DirectiveListener) Cluster() string { return l.cluster }

// NewDirectiveListener makes the listener of cluster's directives on the brokers of bootstrap.
func NewDirectiveListener(bootstrap, cluster string, opts ...ListenerOption) (*DirectiveListener, error) {
	cfg := listenerConfig{topic: DefaultDirectivesTopic, backoff: time.Second}
	for _, o := range opts {
		o.applyListener(&cfg)
	}
	cfg.defaults()
	if cfg.node == "" && cfg.reporter != nil {
		cfg.node = cfg.reporter.node
	}
	if err := checkOwned(cfg.kafka, consumerOwned); err != nil {
		return nil, err
	}
	kopts := append(append([]kgo.Opt{kgo.SeedBrokers(strings.Split(bootstrap, ",")...)}, cfg.kafka...),
		kgo.ConsumeTopics(cfg.topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(200*time.Millisecond))
	client, err := kgo.NewClient(kopts...)
	if err != nil {
		return nil, err
	}
	return &DirectiveListener{cluster: cluster, cfg: cfg, client: client, admin: kadm.NewClient(client),
		log: cfg.logger.With("cluster", cluster), read: map[int32]int64{}, done: make(chan struct{}), closing: newCloser()}, nil
}

// ErrStarted is returned by a second Start of a listener or a service hold.
var ErrStarted = errors.New("safepoint: already started")

// Start runs the listener in a goroutine of its own, calling the WithOnDirective callback, until Close.
// A second Start returns ErrStarted, a Start after Close ErrClosed.
func (l *DirectiveListener) Start() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.closed:
		return ErrClosed
	case l.started:
		return ErrStarted
	}
	l.started = true
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	go func() {
		defer close(l.done)
		l.run(ctx)
	}()
	return nil
}

func (l *DirectiveListener) run(ctx context.Context) {
	var pending *Directive
	for ctx.Err() == nil {
		d, err := l.Poll(ctx, 200*time.Millisecond)
		if err != nil && ctx.Err() == nil {
			l.log.Warn("safepoint: directive listener", "err", err)
			sleep(ctx, l.cfg.backoff)
			continue
		}
		if d != nil {
			pending = d
		}
		if pending == nil || l.cfg.onDirective == nil {
			pending = nil
			continue
		}
		if err := l.deliver(ctx, *pending); err != nil {
			l.log.Error("safepoint: on-directive failed; retrying", "seq", pending.Seq, "err", err)
			sleep(ctx, l.cfg.backoff)
			continue
		}
		pending = nil
	}
}

// deliver calls the WithOnDirective callback; a panic in it is an error.
func (l *DirectiveListener) deliver(ctx context.Context, d Directive) (err error) {
	defer func() {
		if p := recover(); p != nil {
			l.count(func(s *ListenerStats) { s.CallbackPanics++ })
			err = fmt.Errorf("the on-directive callback panicked: %v", p)
		}
	}()
	return l.cfg.onDirective(ctx, d)
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// Close stops the listener (waiting for its goroutine, within ctx or the close timeout) and its consumer.
// Safe to call more than once and from several goroutines.
func (l *DirectiveListener) Close(ctx context.Context) error {
	return l.closing.close(ctx, "listener", l.close)
}

func (l *DirectiveListener) close(ctx context.Context) error {
	l.mu.Lock()
	l.closed = true
	started := l.started
	l.mu.Unlock()
	var err error
	if started {
		l.cancel()
		bound, cancel := bounded(ctx, l.cfg.closeTimeout)
		defer cancel()
		select {
		case <-l.done:
		case <-bound.Done():
			err = fmt.Errorf("safepoint: the listener's goroutine did not end (is a callback stuck?): %w", bound.Err())
		}
	}
	l.client.Close()
	return err
}

// Poll returns the next directive of the cluster whose seq advances, or nil after wait. Expiries and
// snapshot requests met on the way are handled in the calling goroutine. (Not while Start runs.)
func (l *DirectiveListener) Poll(ctx context.Context, wait time.Duration) (*Directive, error) {
	if l.ends == nil {
		if err := l.loadEnds(ctx); err != nil {
			return nil, err
		}
	}
	pollCtx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	fetches := l.client.PollFetches(pollCtx)
	var out *Directive
	var failed error
	fetches.EachError(func(_ string, _ int32, err error) {
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			failed = err
		}
	})
	got := false
	fetches.EachRecord(func(rec *kgo.Record) {
		got = true
		if d := l.handle(ctx, rec); d != nil {
			out = d
		}
	})
	if d := l.checkCaughtUp(ctx, got); d != nil {
		out = d
	}
	if out == nil && failed != nil {
		return nil, failed
	}
	return out, nil
}

// loadEnds reads each partition's end offset now: the backlog to read before delivering.
func (l *DirectiveListener) loadEnds(ctx context.Context) error {
	listed, err := l.admin.ListEndOffsets(ctx, l.cfg.topic)
	if err != nil {
		return err
	}
	ends := map[int32]int64{}
	listed.Each(func(o kadm.ListedOffset) {
		if o.Err == nil {
			ends[o.Partition] = o.Offset
		}
	})
	l.mu.Lock()
	l.ends, l.idleSince = ends, time.Now()
	l.mu.Unlock()
	return nil
}

// checkCaughtUp delivers the backlog's newest directive once every partition was read to where it ended
// at the start (or, past markers that are no record, after a second without one).
func (l *DirectiveListener) checkCaughtUp(ctx context.Context, got bool) *Directive {
	l.mu.Lock()
	if l.caughtUp {
		l.mu.Unlock()
		return nil
	}
	if got {
		l.idleSince = time.Now()
	}
	done := true
	for p, end := range l.ends {
		if l.read[p] < end {
			done = false
		}
	}
	if !done && time.Since(l.idleSince) < time.Second {
		l.mu.Unlock()
		return nil
	}
	l.caughtUp = true
	best, ask := l.backlogBest, l.backlogSnapshotAsk
	l.backlogBest, l.backlogSnapshotAsk = nil, false
	l.mu.Unlock()
	if ask {
		l.answerSnapshotRequest(ctx)
	}
	if best != nil {
		return l.accept(ctx, *best)
	}
	return nil
}

// handle reads one record; a compaction directive to deliver, or nil.
func (l *DirectiveListener) handle(ctx context.Context, rec *kgo.Record) *Directive {
	l.mu.Lock()
	l.stats.Received++
	if rec.Offset+1 > l.read[rec.Partition] {
		l.read[rec.Partition] = rec.Offset + 1
	}
	l.mu.Unlock()
	if rec.Value == nil {
		return nil // a tombstone
	}
	obj, err := decodeObject(rec.Value)
	if err != nil {
		return l.invalid(rec, "not a JSON object")
	}
	if str(obj["cluster"]) != l.cluster {
		l.count(func(s *ListenerStats) { s.OtherClusters++ })
		return nil
	}
	if len(l.cfg.keys) > 0 {
		if why := verifyDirective(obj, l.cfg.keys); why != "" {
			l.refused(rec, obj, why)
			return nil
		}
	}
	kind := str(obj["type"])
	switch kind {
	case "members":
		return nil
	case "compaction":
		d, err := parseDirective(obj, rec.Value)
		if err != nil {
			return l.invalid(rec, err.Error())
		}
		return l.compaction(ctx, d)
	case "expire", "snapshot_request", "band":
	default:
		return l.invalid(rec, "unknown directive type "+kind)
	}
	l.mu.Lock()
	if gen := str(obj["generation"]); !l.nodeGenerationKnown || gen != l.nodeGeneration {
		l.nodeGeneration, l.nodeGenerationKnown = gen, true
		l.lastExpireSeq, l.lastBandSeq = 0, 0
	}
	l.mu.Unlock()
	switch kind {
	case "expire":
		e, err := parseExpire(obj, rec.Value)
		if err != nil {
			return l.invalid(rec, err.Error())
		}
		l.expire(ctx, e)
	case "snapshot_request":
		l.snapshotRequest(ctx, obj)
	case "band":
		seq, _ := num(obj["seq"])
		l.mu.Lock()
		if seq > l.lastExpireSeq {
			l.lastExpireSeq = seq
		}
		if str(obj["node"]) == l.cfg.node && seq > l.lastBandSeq {
			l.lastBandSeq = seq // (no admission control in this client: a band changes nothing here)
		}
		l.mu.Unlock()
	}
	return nil
}

// newerInBacklog: a directive read after best in the backlog supersedes it when it is a higher seq of the
// same generation, or of another generation written later, but never one without a generation over one with it.
func newerInBacklog(d Directive, best *Directive) bool {
	if best == nil {
		return true
	}
	if d.Generation == best.Generation {
		return d.Seq > best.Seq
	}
	return d.Generation != ""
}

func (l *DirectiveListener) compaction(ctx context.Context, d Directive) *Directive {
	l.mu.Lock()
	if !l.caughtUp {
		if newerInBacklog(d, l.backlogBest) {
			if l.backlogBest != nil {
				l.stats.Superseded++
			}
			l.backlogBest = &d
		} else {
			l.stats.Repeats++
		}
		l.mu.Unlock()
		return nil
	}
	if l.last != nil && d.Generation != l.generation {
		if d.Generation == "" { // a job that gives no generation (an older version's): stale here
			l.stats.Repeats++
			l.mu.Unlock()
			return nil
		}
		if l.safeTS != nil && d.SafeTS < *l.safeTS {
			l.stats.HeldBack++
			l.mu.Unlock()
			return nil
		}
		l.log.Warn("safepoint: the job's generation changed (it started on empty state); taking its directives",
			"from", l.generation, "to", d.Generation, "seq", d.Seq)
		l.stats.Generations++
		l.lastSeq = 0
	}
	if d.Seq <= l.lastSeq {
		l.stats.Repeats++
		l.mu.Unlock()
		return nil
	}
	l.mu.Unlock()
	return l.accept(ctx, d)
}

func (l *DirectiveListener) accept(ctx context.Context, d Directive) *Directive {
	l.mu.Lock()
	l.lastSeq, l.last, l.generation = d.Seq, &d, d.Generation
	if l.safeTS == nil || d.SafeTS >= *l.safeTS {
		safe := d.SafeTS
		l.safeTS = &safe
	} else {
		l.log.Warn("safepoint: a directive's safe_ts is below the previous one; keeping the previous",
			"seq", d.Seq, "safe_ts", d.SafeTS, "kept", *l.safeTS)
	}
	safe := *l.safeTS
	l.stats.Delivered++
	l.mu.Unlock()
	if r := l.cfg.reporter; r != nil {
		if err := r.ObserveSafeTS(ctx, safe, d.Retention, d.NamespaceSafeTS, d.Namespaces); err != nil {
			l.log.Warn("safepoint: the reporter could not take the safe point", "err", err)
		}
	}
	return &d
}

func (l *DirectiveListener) expire(ctx context.Context, e ExpireDirective) {
	l.mu.Lock()
	if e.Seq <= l.lastExpireSeq {
		l.stats.Repeats++
		l.mu.Unlock()
		return
	}
	l.lastExpireSeq = e.Seq
	caughtUp := l.caughtUp
	l.mu.Unlock()
	if l.cfg.node != "" && e.Node != l.cfg.node {
		return
	}
	r := l.cfg.reporter
	if r != nil && (e.Node != r.node || e.Cluster != r.cluster) {
		r = nil
	}
	if r != nil && !caughtUp {
		kind, id := KindReader, e.ReaderID
		if id == "" {
			kind, id = KindTx, e.TxID
		}
		if r.Find(kind, id) == nil {
			return // of the backlog: it names a hold of an earlier process
		}
	}
	l.count(func(s *ListenerStats) { s.ExpiresDelivered++ })
	if r != nil {
		r.Expire(ctx, e)
	}
	if l.cfg.onExpire != nil {
		l.expireCallback(ctx, e)
	}
}

func (l *DirectiveListener) expireCallback(ctx context.Context, e ExpireDirective) {
	defer func() {
		if p := recover(); p != nil {
			l.count(func(s *ListenerStats) { s.CallbackPanics++ })
			l.log.Error("safepoint: the on-expire callback panicked; the directives after it are handled",
				"seq", e.Seq, "panic", p)
		}
	}()
	l.cfg.onExpire(ctx, e)
}

func (l *DirectiveListener) snapshotRequest(ctx context.Context, obj Event) {
	seq, _ := num(obj["seq"])
	l.mu.Lock()
	if seq > l.lastExpireSeq {
		l.lastExpireSeq = seq
	}
	target := l.cfg.node
	if str(obj["node"]) != target || target == "" {
		l.mu.Unlock()
		return
	}
	if !l.caughtUp {
		l.backlogSnapshotAsk = true // answered once the backlog is read
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	l.answerSnapshotRequest(ctx)
}

func (l *DirectiveListener) answerSnapshotRequest(ctx context.Context) {
	r := l.cfg.reporter
	if r == nil {
		l.log.Info("safepoint: the job asks this node for a snapshot; publish one (no reporter given)", "node", l.cfg.node)
		return
	}
	if err := r.Snapshot(ctx); err != nil {
		l.log.Error("safepoint: the reporter failed to publish the snapshot the job asked for", "err", err)
		return
	}
	l.count(func(s *ListenerStats) { s.SnapshotRequests++ })
}

func (l *DirectiveListener) refused(rec *kgo.Record, obj Event, why string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if why == "unsigned" {
		l.stats.Unsigned++
	} else {
		l.stats.BadSignatures++
	}
	if time.Since(l.refusedLogged) >= refusedLogEvery {
		l.refusedLogged = time.Now()
		l.log.Warn("safepoint: refused a directive not signed by the job's key; the newest valid directive stays in force",
			"why", why, "type", str(obj["type"]), "partition", rec.Partition, "offset", rec.Offset,
			"unsigned", l.stats.Unsigned, "bad_signatures", l.stats.BadSignatures)
	}
}

func (l *DirectiveListener) invalid(rec *kgo.Record, why string) *Directive {
	l.count(func(s *ListenerStats) { s.Invalid++ })
	l.log.Warn("safepoint: skipped a record of the directives topic", "partition", rec.Partition, "offset", rec.Offset,
		"why", why)
	return nil
}

func (l *DirectiveListener) count(f func(*ListenerStats)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f(&l.stats)
}

// Stats are the listener's counters.
func (l *DirectiveListener) Stats() ListenerStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stats
}

// SafeTS is the newest safe point delivered (false before the first).
func (l *DirectiveListener) SafeTS() (int64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.safeTS == nil {
		return 0, false
	}
	return *l.safeTS, true
}

// CaughtUp says whether the backlog the topic held at start was read.
func (l *DirectiveListener) CaughtUp() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.caughtUp
}
