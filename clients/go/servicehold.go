package safepoint

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
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
	onLost         func(Outcome)
	label          string
	controlKey     string
	ownerToken     string
	renewEvery     time.Duration
	kafka          []kgo.Opt
	logger         *slog.Logger
	wallClock      func() int64
}

// HoldOption sets one of a ServiceHold's settings.
type HoldOption func(*holdConfig)

// WithControlTopic sets the control topic (default safepoint.control).
func WithControlTopic(topic string) HoldOption { return func(c *holdConfig) { c.topic = topic } }

// WithStatusTopic follows the job's outcomes of the hold's actions on this status topic (default
// safepoint.status; "" follows none: Start then returns once the broker has the hold).
func WithStatusTopic(topic string) HoldOption { return func(c *holdConfig) { c.statusTopic = topic } }

// WithOutcomeTimeout sets how long Start waits for the job's outcome (default 30 s; past it the hold is
// renewed meanwhile, and the wait logged).
func WithOutcomeTimeout(d time.Duration) HoldOption {
	return func(c *holdConfig) { c.outcomeTimeout = d }
}

// WithOnLost is called (from the renewing goroutine) when the job refuses or expires the hold after Start.
func WithOnLost(f func(Outcome)) HoldOption { return func(c *holdConfig) { c.onLost = f } }

// WithHoldLogger sets the logger (default slog.Default()).
func WithHoldLogger(l *slog.Logger) HoldOption { return func(c *holdConfig) { c.logger = l } }

// WithHoldLabel says what the hold is for (shown in the status).
func WithHoldLabel(label string) HoldOption { return func(c *holdConfig) { c.label = label } }

// WithControlKey signs the hold's control events with the cluster's control key.
func WithControlKey(key string) HoldOption { return func(c *holdConfig) { c.controlKey = key } }

// WithOwnerToken makes the hold this token's (a process that takes over a hold after a restart passes
// the token back); default: a new random token.
func WithOwnerToken(token string) HoldOption { return func(c *holdConfig) { c.ownerToken = token } }

// WithRenewEvery sets how often the hold is renewed (default a third of its TTL).
func WithRenewEvery(d time.Duration) HoldOption { return func(c *holdConfig) { c.renewEvery = d } }

// WithHoldKafkaOptions adds franz-go options (TLS, SASL).
func WithHoldKafkaOptions(opts ...kgo.Opt) HoldOption {
	return func(c *holdConfig) { c.kafka = append(c.kafka, opts...) }
}

// ServiceHold pins a cluster's history at TS by name (a backup's, a changefeed's): set by Start, renewed
// in the background before its TTL runs out, released by Close. Only its owner (its token) renews, moves
// and releases it. Start waits for the job's outcome on the status topic: a hold below what the job may
// already have compacted is refused (HoldRefusedError); Check and WithOnLost say when the job refuses or
// expires it later.
type ServiceHold struct {
	Cluster, Holder string
	OwnerToken      string

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
	stop     chan struct{}
	done     chan struct{}
	renewals int64
	failures int64
	closed   bool
	started  bool
}

// HoldStats counts a hold's renewals and the renewals that failed (retried at the next one).
type HoldStats struct{ Renewals, Failures int64 }

// NewServiceHold makes the hold of holder on cluster at ts for ttl; Start sets it.
func NewServiceHold(bootstrap, cluster, holder string, ts int64, ttl time.Duration, opts ...HoldOption) (*ServiceHold, error) {
	cfg := holdConfig{topic: DefaultControlTopic, statusTopic: DefaultStatusTopic, outcomeTimeout: 30 * time.Second,
		renewEvery: ttl / 3, wallClock: func() int64 { return time.Now().UnixMilli() }}
	for _, o := range opts {
		o(&cfg)
	}
	if ttl < time.Millisecond {
		return nil, fmt.Errorf("safepoint: a hold's TTL must be at least 1 ms, got %v", ttl)
	}
	if cfg.ownerToken == "" {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		cfg.ownerToken = hex.EncodeToString(b)
	}
	if cfg.logger == nil {
		cfg.logger = slog.Default()
	}
	seeds := strings.Split(bootstrap, ",")
	client, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(seeds...), kgo.DefaultProduceTopic(cfg.topic),
		kgo.RequiredAcks(kgo.AllISRAcks()), kgo.RecordPartitioner(CRC32Partitioner()), kgo.AllowAutoTopicCreation()},
		cfg.kafka...)...)
	if err != nil {
		return nil, err
	}
	return &ServiceHold{Cluster: cluster, Holder: holder, OwnerToken: cfg.ownerToken, ts: ts, ttlMS: ttl.Milliseconds(),
		cfg: cfg, seeds: seeds, client: client, stop: make(chan struct{}), done: make(chan struct{})}, nil
}

func (h *ServiceHold) publish(ctx context.Context, kind string) (string, error) {
	h.mu.Lock()
	actionID := newActionID()
	event := Event{"v": 1, "type": kind, "cluster": h.Cluster, "wall_ms": h.cfg.wallClock(), "action_id": actionID,
		"holder": h.Holder}
	if kind == "service_hold" {
		event["ts"], event["ttl_ms"], event["owner"] = h.ts, h.ttlMS, OwnerDigest(h.OwnerToken)
		if h.cfg.label != "" {
			event["label"] = h.cfg.label
		}
	} else {
		event["owner_token"] = h.OwnerToken
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
	res := h.client.ProduceSync(ctx, &kgo.Record{Key: []byte(h.Cluster), Value: value, Headers: clusterHeader(h.Cluster)})
	if err := res.FirstErr(); err != nil {
		return "", fmt.Errorf("safepoint: the %s event was not acknowledged: %w", kind, err)
	}
	return actionID, nil
}

func newActionID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Start sets the hold and waits for the job's outcome (HoldRefusedError when refused; past the outcome
// timeout, or without a status topic, once the broker has it), then renews it in the background.
func (h *ServiceHold) Start(ctx context.Context) error {
	if h.cfg.statusTopic != "" {
		o, err := newOutcomes(ctx, h.seeds, h.cfg.statusTopic, h.Cluster, h.cfg.kafka) // before publishing
		if err != nil {
			h.cfg.logger.Warn("safepoint: the job's outcomes cannot be followed; publishing without them",
				"holder", h.Holder, "why", err)
		} else {
			h.outcomes = o
		}
	}
	actionID, err := h.publish(ctx, "service_hold")
	if err != nil {
		h.closeOutcomes()
		return err
	}
	if h.outcomes != nil {
		h.polling.Lock()
		outcome, ok := h.outcomes.wait(ctx, actionID, h.cfg.outcomeTimeout)
		h.polling.Unlock()
		switch {
		case !ok:
			h.cfg.logger.Warn("safepoint: no outcome from the job in time (is it running?); renewing meanwhile",
				"holder", h.Holder, "waited", h.cfg.outcomeTimeout)
		case lost(outcome):
			h.closeOutcomes()
			h.mu.Lock()
			h.closed, h.last = true, &outcome
			h.mu.Unlock()
			h.client.Close()
			return &HoldRefusedError{Outcome: outcome}
		default:
			h.mu.Lock()
			h.last = &outcome
			h.mu.Unlock()
		}
	}
	h.mu.Lock()
	h.started = true
	h.mu.Unlock()
	go h.renew()
	return nil
}

// watchOutcomes reads the outcomes of the hold's newest actions (waiting up to wait); a refusal or an
// expiry ends the hold's protection: kept, logged and handed to the WithOnLost callback once.
func (h *ServiceHold) watchOutcomes(wait time.Duration) {
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
	changed := h.outcomes.poll(context.Background(), wait)
	h.polling.Unlock()
	for _, o := range changed {
		if o.Type != "service_hold" {
			continue
		}
		h.mu.Lock()
		h.last = &o
		first := lost(o) && h.lost == nil
		if first {
			h.lost = &o
		}
		h.mu.Unlock()
		if first {
			h.cfg.logger.Error("safepoint: service hold lost", "holder", h.Holder, "outcome", o.Outcome, "detail", o.Detail)
			if h.cfg.onLost != nil {
				h.cfg.onLost(o)
			}
		}
	}
}

func (h *ServiceHold) renew() {
	defer close(h.done)
	next := time.Now().Add(h.cfg.renewEvery)
	for {
		step := min(time.Second, time.Until(next))
		if h.following() && step > 0 {
			h.watchOutcomes(step)
		} else if step > 0 {
			select {
			case <-h.stop:
				return
			case <-time.After(step):
			}
		}
		select {
		case <-h.stop:
			return
		default:
		}
		if time.Now().Before(next) {
			continue
		}
		next = time.Now().Add(h.cfg.renewEvery)
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		_, err := h.publish(ctx, "service_hold")
		cancel()
		h.mu.Lock()
		if err != nil {
			h.failures++ // the TTL is the margin for a broker away for a while: tried again next time
			h.cfg.logger.Warn("safepoint: renewal of a service hold failed", "holder", h.Holder, "err", err)
		} else {
			h.renewals++
		}
		h.mu.Unlock()
	}
}

// Check returns HoldLostError if the job refused or expired this hold since it was set.
func (h *ServiceHold) Check() error {
	h.watchOutcomes(10 * time.Millisecond)
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

// Stats is the hold's renewals and failed renewals so far.
func (h *ServiceHold) Stats() HoldStats {
	h.mu.Lock()
	defer h.mu.Unlock()
	return HoldStats{Renewals: h.renewals, Failures: h.failures}
}

// Advance moves the hold to ts (it protects what is at or above it) and renews it now.
func (h *ServiceHold) Advance(ctx context.Context, ts int64) error {
	h.mu.Lock()
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

// Close stops renewing and releases the hold. Idempotent.
func (h *ServiceHold) Close(ctx context.Context) error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	started := h.started
	h.mu.Unlock()
	close(h.stop)
	if started {
		<-h.done
	}
	_, err := h.publish(ctx, "service_release")
	h.closeOutcomes()
	h.client.Close()
	return err
}
