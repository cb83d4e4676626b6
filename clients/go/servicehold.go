package safepoint

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// DefaultControlTopic is the topic of operators' and holders' control events.
const DefaultControlTopic = "safepoint.control"

type holdConfig struct {
	topic          string
	statusTopic    string
	outcomeTimeout time.Duration
	onLost         func(context.Context, Outcome)
	label          string
	controlKey     string
	ownerToken     string
	renewEvery     time.Duration
	wallClock      func() int64
	common
}

// WithControlTopic sets the control topic (default safepoint.control).
func WithControlTopic(topic string) HoldOption {
	return holdOpt(func(c *holdConfig) { c.topic = topic })
}

// WithStatusTopic follows the job's outcomes of the hold's actions on this status topic (default
// safepoint.status; "" follows none: Start then returns once the broker has the hold).
func WithStatusTopic(topic string) HoldOption {
	return holdOpt(func(c *holdConfig) { c.statusTopic = topic })
}

// WithOutcomeTimeout sets how long Start waits for the job's outcome (default 30 s; past it the hold is
// renewed meanwhile, and the wait logged).
func WithOutcomeTimeout(d time.Duration) HoldOption {
	return holdOpt(func(c *holdConfig) { c.outcomeTimeout = d })
}

// WithOnLost is called, from the hold's renewing goroutine with its ctx (cancelled by Close), once: when
// the job refuses or expires the hold after Start, or when the status topic could not be read for a whole
// TTL (Outcome "unknown", Reason "status_unreadable": the job may have expired the hold unseen). A panic in
// it is recovered, logged and counted (HoldStats.CallbackPanics); the renewing goes on.
func WithOnLost(f func(context.Context, Outcome)) HoldOption {
	return holdOpt(func(c *holdConfig) { c.onLost = f })
}

// WithHoldLabel says what the hold is for (shown in the status).
func WithHoldLabel(label string) HoldOption { return holdOpt(func(c *holdConfig) { c.label = label }) }

// WithControlKey signs the hold's control events with the cluster's control key.
func WithControlKey(key string) HoldOption {
	return holdOpt(func(c *holdConfig) { c.controlKey = key })
}

// WithOwnerToken makes the hold this token's (a process that takes over a hold after a restart passes
// the token back); default: a new random token.
func WithOwnerToken(token string) HoldOption {
	return holdOpt(func(c *holdConfig) { c.ownerToken = token })
}

// WithRenewEvery sets how often the hold is renewed (default a third of its TTL).
func WithRenewEvery(d time.Duration) HoldOption {
	return holdOpt(func(c *holdConfig) { c.renewEvery = d })
}

// renewTimeout bounds one renewal: the next one tries again.
const renewTimeout = 15 * time.Second

// ServiceHold pins a cluster's history at TS by name (a backup's, a changefeed's): set by Start, renewed
// in the background before its TTL runs out, released by Close. Only its owner (its token) renews, moves
// and releases it. Start waits for the job's outcome on the status topic: a hold below what the job may
// already have compacted is refused (HoldRefusedError); Check and WithOnLost say when the job refuses or
// expires it later. Every call is bounded: by its ctx, or when ctx has no deadline by the close timeout
// (WithCloseTimeout, default 30 s).
type ServiceHold struct {
	cluster, holder, ownerToken string

	mu       sync.Mutex
	polling  sync.Mutex
	ts       int64
	ttlMS    int64
	cfg      holdConfig
	seeds    []string
	client   *kgo.Client
	outcomes *outcomes
	mine     []string
	last     *Outcome
	lost     *Outcome
	told     bool      // onLost was called (or is being called) with lost
	failing  time.Time // when the status topic's reads began to fail
	lastFail time.Time
	failErr  error
	bg       context.Context // the renewer's; cancelled by Close
	stopBG   context.CancelFunc
	done     chan struct{}
	stats    HoldStats
	state    holdState

	closing *closer
}

// holdState is where a hold is in its life.
type holdState int

const (
	holdNew holdState = iota
	holdStarting
	holdStarted
	holdClosed
)

// HoldStats counts a hold's renewals, the renewals that failed (retried at the next one), the status
// reads that failed, and the panics of its callback.
type HoldStats struct{ Renewals, Failures, StatusReadFailures, CallbackPanics int64 }

// Cluster is the hold's cluster.
func (h *ServiceHold) Cluster() string { return h.cluster }

// Holder is the hold's name.
func (h *ServiceHold) Holder() string { return h.holder }

// OwnerToken is the secret that makes this process the hold's owner (pass it back with WithOwnerToken to
// take the hold over after a restart).
func (h *ServiceHold) OwnerToken() string { return h.ownerToken }

// NewServiceHold makes the hold of holder on cluster at ts for ttl; Start sets it.
func NewServiceHold(bootstrap, cluster, holder string, ts int64, ttl time.Duration, opts ...HoldOption) (*ServiceHold, error) {
	cfg := holdConfig{topic: DefaultControlTopic, statusTopic: DefaultStatusTopic, outcomeTimeout: 30 * time.Second,
		renewEvery: ttl / 3, wallClock: func() int64 { return time.Now().UnixMilli() }}
	for _, o := range opts {
		o.applyHold(&cfg)
	}
	cfg.defaults()
	if ttl < time.Millisecond {
		return nil, fmt.Errorf("safepoint: a hold's TTL must be at least 1 ms, got %v", ttl)
	}
	if err := checkOwned(cfg.kafka, producerOwned, consumerOwned); err != nil {
		return nil, err
	}
	if cfg.ownerToken == "" {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		cfg.ownerToken = hex.EncodeToString(b)
	}
	seeds := strings.Split(bootstrap, ",")
	client, err := kgo.NewClient(append(append([]kgo.Opt{kgo.SeedBrokers(seeds...)}, cfg.kafka...),
		kgo.DefaultProduceTopic(cfg.topic), kgo.RequiredAcks(kgo.AllISRAcks()), kgo.RecordPartitioner(CRC32Partitioner()),
		kgo.RecordDeliveryTimeout(deliveryTimeout), kgo.AllowAutoTopicCreation())...)
	if err != nil {
		return nil, err
	}
	bg, stopBG := context.WithCancel(context.Background())
	return &ServiceHold{cluster: cluster, holder: holder, ownerToken: cfg.ownerToken, ts: ts, ttlMS: ttl.Milliseconds(),
		cfg: cfg, seeds: seeds, client: client, bg: bg, stopBG: stopBG, done: make(chan struct{}), state: holdNew,
		closing: newCloser()}, nil
}

// publish sends one of the hold's control events and waits for the broker's acknowledgement, within ctx
// or the close timeout.
func (h *ServiceHold) publish(ctx context.Context, kind string) (string, error) {
	h.mu.Lock()
	actionID := newActionID()
	event := Event{"v": 1, "type": kind, "cluster": h.cluster, "wall_ms": h.cfg.wallClock(), "action_id": actionID,
		"holder": h.holder}
	if kind == "service_hold" {
		event["ts"], event["ttl_ms"], event["owner"] = h.ts, h.ttlMS, OwnerDigest(h.ownerToken)
		if h.cfg.label != "" {
			event["label"] = h.cfg.label
		}
	} else {
		event["owner_token"] = h.ownerToken
	}
	if kind == "service_hold" { // the newest actions' outcomes are watched
		h.mine = append(h.mine, actionID)
		if len(h.mine) > 16 {
			h.mine = h.mine[len(h.mine)-16:]
		}
	}
	h.mu.Unlock()
	if h.cfg.controlKey != "" {
		sig, err := signControl(event, h.cfg.controlKey)
		if err != nil {
			return "", err
		}
		event["sig"] = sig
	}
	value, err := compactJSON(event)
	if err != nil {
		return "", err
	}
	ctx, cancel := bounded(ctx, h.cfg.closeTimeout)
	defer cancel()
	// not ProduceSync: franz-go waits out a record already handed to a broker whatever its ctx says
	acked := make(chan error, 1)
	h.client.TryProduce(context.Background(), &kgo.Record{Key: []byte(h.cluster), Value: value,
		Headers: clusterHeader(h.cluster)}, func(_ *kgo.Record, err error) { acked <- err })
	select {
	case err := <-acked:
		if err != nil {
			return "", fmt.Errorf("safepoint: the %s event was not acknowledged: %w", kind, err)
		}
	case <-ctx.Done():
		return "", fmt.Errorf("safepoint: the %s event was not acknowledged in time: %w", kind, ctx.Err())
	}
	return actionID, nil
}

func newActionID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Start sets the hold and waits for the job's outcome (HoldRefusedError when refused; past the outcome
// timeout, or without a status topic, once the broker has it), then renews it in the background. A
// second Start returns ErrStarted, a Start after Close ErrClosed; a Start that failed may be tried again.
func (h *ServiceHold) Start(ctx context.Context) error {
	h.mu.Lock()
	switch h.state {
	case holdClosed:
		h.mu.Unlock()
		return ErrClosed
	case holdStarting, holdStarted:
		h.mu.Unlock()
		return ErrStarted
	}
	h.state = holdStarting
	h.mu.Unlock()
	err := h.start(ctx)
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.state == holdClosed: // closed while it started
		if err == nil {
			err = ErrClosed
		}
	case err == nil:
		h.state = holdStarted
		go h.renew()
	default:
		var refused *HoldRefusedError
		if errors.As(err, &refused) {
			h.state = holdClosed
		} else {
			h.state = holdNew
		}
	}
	return err
}

func (h *ServiceHold) start(ctx context.Context) error {
	if h.cfg.statusTopic != "" && !h.following() {
		o, err := newOutcomes(ctx, h.seeds, h.cfg.statusTopic, h.cluster, h.cfg.kafka) // before publishing
		if err != nil {
			h.cfg.logger.Warn("safepoint: the job's outcomes cannot be followed; publishing without them",
				"holder", h.holder, "why", err)
		} else {
			h.polling.Lock()
			h.outcomes = o
			h.polling.Unlock()
		}
	}
	actionID, err := h.publish(ctx, "service_hold")
	if err != nil {
		return err
	}
	if !h.following() {
		return nil
	}
	h.polling.Lock()
	outcome, ok := h.outcomes.wait(ctx, actionID, h.cfg.outcomeTimeout)
	h.polling.Unlock()
	switch {
	case !ok:
		h.cfg.logger.Warn("safepoint: no outcome from the job in time (is it running?); renewing meanwhile",
			"holder", h.holder, "waited", h.cfg.outcomeTimeout)
	case lost(outcome):
		h.closeOutcomes()
		h.mu.Lock()
		h.last = &outcome
		h.mu.Unlock()
		h.client.Close()
		return &HoldRefusedError{Outcome: outcome}
	default:
		h.mu.Lock()
		h.last = &outcome
		h.mu.Unlock()
	}
	return nil
}

// watchOutcomes reads the outcomes of the hold's newest actions (waiting up to wait); a refusal or an
// expiry ends the hold's protection: kept and logged (the renewer hands it to WithOnLost). A status topic
// that cannot be read is logged once per episode, counted, and after a whole TTL taken as the hold lost.
func (h *ServiceHold) watchOutcomes(ctx context.Context, wait time.Duration) {
	h.polling.Lock()
	if h.outcomes == nil {
		h.polling.Unlock()
		return
	}
	h.mu.Lock()
	for _, id := range h.mine {
		h.outcomes.watch(id)
	}
	h.mu.Unlock()
	changed, read, err := h.outcomes.poll(ctx, wait)
	h.polling.Unlock()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.statusRead(read, err)
	for _, o := range changed {
		if o.Type != "service_hold" {
			continue
		}
		h.last = &o
		if lost(o) && h.lost == nil {
			h.lost = &o
			h.cfg.logger.Error("safepoint: service hold lost", "holder", h.holder, "outcome", o.Outcome, "detail", o.Detail)
		}
	}
}

// statusQuiet ends an episode of a status topic that could not be read: so long without a failed fetch
// (franz-go retries a failed partition after a backoff, and a poll between returns nothing at all).
const statusQuiet = 5 * time.Second

// statusRead keeps what a read of the status topic gave (read: records came; err: a fetch failed); call
// with h.mu held.
func (h *ServiceHold) statusRead(read bool, err error) {
	now := time.Now()
	if err == nil {
		if h.failErr != nil && (read || now.Sub(h.lastFail) >= statusQuiet) {
			h.cfg.logger.Info("safepoint: the status topic is read again", "holder", h.holder)
			h.failing, h.failErr = time.Time{}, nil
		}
		return
	}
	h.stats.StatusReadFailures++
	if h.failErr == nil {
		h.failing = now
		h.cfg.logger.Warn("safepoint: the status topic cannot be read; the job's outcomes of the hold are unknown",
			"holder", h.holder, "topic", h.cfg.statusTopic, "err", err)
	}
	h.failErr, h.lastFail = err, now
	ttl := time.Duration(h.ttlMS) * time.Millisecond
	if h.lost == nil && now.Sub(h.failing) >= ttl {
		h.lost = &Outcome{Type: "service_hold", Holder: h.holder, Outcome: "unknown", Reason: "status_unreadable",
			Detail: fmt.Sprintf("the status topic %s could not be read for %s, the hold's TTL (%v): the job may have "+
				"expired the hold", h.cfg.statusTopic, now.Sub(h.failing).Round(time.Millisecond), err)}
		h.cfg.logger.Error("safepoint: service hold lost", "holder", h.holder, "outcome", "unknown", "detail", h.lost.Detail)
	}
}

// tell hands a lost hold to WithOnLost, once; the renewer calls it.
func (h *ServiceHold) tell(ctx context.Context) {
	h.mu.Lock()
	if h.lost == nil || h.told || h.cfg.onLost == nil {
		h.mu.Unlock()
		return
	}
	h.told = true
	o := *h.lost
	h.mu.Unlock()
	defer func() {
		if p := recover(); p != nil {
			h.mu.Lock()
			h.stats.CallbackPanics++
			h.mu.Unlock()
			h.cfg.logger.Error("safepoint: the on-lost callback panicked", "holder", h.holder, "panic", p)
		}
	}()
	h.cfg.onLost(ctx, o)
}

func (h *ServiceHold) renew() {
	defer close(h.done)
	ctx := h.bg
	next := time.Now().Add(h.cfg.renewEvery)
	for {
		step := min(time.Second, time.Until(next))
		if h.following() && step > 0 {
			h.watchOutcomes(ctx, step)
		} else if step > 0 {
			sleep(ctx, step)
		}
		if ctx.Err() != nil {
			return
		}
		h.tell(ctx)
		if time.Now().Before(next) {
			continue
		}
		next = time.Now().Add(h.cfg.renewEvery)
		rctx, cancel := context.WithTimeout(ctx, renewTimeout)
		_, err := h.publish(rctx, "service_hold")
		cancel()
		if ctx.Err() != nil {
			return
		}
		h.mu.Lock()
		if err != nil {
			h.stats.Failures++ // the TTL is the margin for a broker away for a while: tried again next time
			h.cfg.logger.Warn("safepoint: renewal of a service hold failed", "holder", h.holder, "err", err)
		} else {
			h.stats.Renewals++
		}
		h.mu.Unlock()
	}
}

// Check returns HoldLostError if the job refused or expired this hold since it was set, or its status
// could not be read for a TTL. It reads the status topic briefly in the calling goroutine; the WithOnLost
// callback is the renewer's to call, never Check's.
func (h *ServiceHold) Check() error {
	h.watchOutcomes(context.Background(), 10*time.Millisecond)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lost != nil {
		return &HoldLostError{Outcome: *h.lost}
	}
	return nil
}

// LastOutcome is the job's outcome of the hold's newest action it reported (false: none yet).
func (h *ServiceHold) LastOutcome() (Outcome, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.last == nil {
		return Outcome{}, false
	}
	return *h.last, true
}

// Stats is the hold's counters so far.
func (h *ServiceHold) Stats() HoldStats {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.stats
}

// Advance moves the hold to ts (it protects what is at or above it) and renews it now.
func (h *ServiceHold) Advance(ctx context.Context, ts int64) error {
	h.mu.Lock()
	if h.state == holdClosed {
		h.mu.Unlock()
		return ErrClosed
	}
	h.ts = ts
	h.mu.Unlock()
	_, err := h.publish(ctx, "service_hold")
	return err
}

func (h *ServiceHold) following() bool {
	h.polling.Lock()
	defer h.polling.Unlock()
	return h.outcomes != nil
}

func (h *ServiceHold) closeOutcomes() {
	h.polling.Lock()
	defer h.polling.Unlock()
	if h.outcomes != nil {
		h.outcomes.close()
		h.outcomes = nil
	}
}

// Close stops renewing and releases the hold, within ctx or, when ctx has no deadline, the close timeout
// (WithCloseTimeout, default 30 s). A release the broker did not acknowledge in time is an error that says
// so; the job then ends the hold when its TTL runs out after the last renewal. Safe to call more than once
// and from several goroutines: each waits for the first (or its own ctx) and returns its error.
func (h *ServiceHold) Close(ctx context.Context) error {
	return h.closing.close(ctx, "service hold", h.close)
}

func (h *ServiceHold) close(ctx context.Context) error {
	ctx, cancel := bounded(ctx, h.cfg.closeTimeout)
	defer cancel()
	h.mu.Lock()
	refused := h.state == holdClosed // refused at Start: its producer is closed, nothing to release
	started := h.state == holdStarted
	h.state = holdClosed
	h.mu.Unlock()
	h.stopBG()
	if started {
		select {
		case <-h.done:
		case <-ctx.Done():
		}
	}
	var err error
	if !refused {
		if _, perr := h.publish(ctx, "service_release"); perr != nil {
			err = fmt.Errorf("safepoint: service hold %s could not be released (%w); the job ends it when its TTL "+
				"(%d ms) runs out after the last renewal", h.holder, perr, h.ttlMS)
		}
	}
	h.closeOutcomes()
	h.client.Close()
	return err
}
