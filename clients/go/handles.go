package safepoint

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sort"
)

// HoldOptions are a reader's or a transaction's optional settings.
type HoldOptions struct {
	// TS is the read_ts or begin_ts (nil: the node's MVCC clock when it opens).
	TS *int64
	// ID is its reader_id or tx_id (empty: a new one).
	ID        string
	Label     string
	Groups    []string
	Namespace string
	// OnExpire overrides the reporter's expiry callback for this hold.
	OnExpire ExpireFunc
}

// HoldKind is what a Handle is: KindReader or KindTx.
type HoldKind string

// The kinds of Handle.
const (
	KindReader HoldKind = "reader"
	KindTx     HoldKind = "tx"
)

// TxOutcome is how a transaction ends (Transaction.End): Commit or Abort.
type TxOutcome string

// The outcomes of a transaction.
const (
	Commit TxOutcome = "commit"
	Abort  TxOutcome = "abort"
)

// Handle is a Reader or a Transaction.
type Handle interface {
	// Kind is KindReader or KindTx.
	Kind() HoldKind
	// ID is the reader_id or tx_id.
	ID() string
	// TS is the read_ts or begin_ts.
	TS() int64
	// Check is an operation boundary: an *ExpiredError once the job expired the hold.
	Check(ctx context.Context) error
}

type hold struct {
	r          *Reporter
	id         string
	ts         int64
	label      string
	groups     []string
	namespace  string
	onExpire   ExpireFunc
	openedWall *int64
	published  bool
	state      string // new, open, prepared, closed, ended, expired
	expiry     *ExpireDirective
	order      int64
}

func newID(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

func (h *hold) optional(event Event) {
	if h.groups != nil {
		event["groups"] = h.groups
	}
	if h.namespace != "" {
		event["namespace"] = h.namespace
	}
	if h.label != "" {
		event["label"] = h.label
	}
}

// Reader is one snapshot reader: opened by Reporter.Reader (reader_open), closed by Close (reader_close).
type Reader struct{ hold }

// Kind is KindReader.
func (h *Reader) Kind() HoldKind { return KindReader }

// ID is the reader_id.
func (h *Reader) ID() string { return h.id }

// TS is the read_ts.
func (h *Reader) TS() int64 { return h.ts }

func (h *Reader) entry() Event {
	e := Event{"reader_id": h.id, "read_ts": h.ts}
	h.optional(e)
	if h.openedWall != nil {
		e["opened_wall_ms"] = *h.openedWall
	}
	return e
}

// Transaction is one read-write transaction: begun by Reporter.Begin (tx_begin), prepared (tx_prepare),
// ended by End (tx_end).
type Transaction struct {
	hold
	coordinator  string
	participants []string
}

// Kind is KindTx.
func (h *Transaction) Kind() HoldKind { return KindTx }

// ID is the tx_id.
func (h *Transaction) ID() string { return h.id }

// TS is the begin_ts.
func (h *Transaction) TS() int64 { return h.ts }

func (h *Transaction) entry() Event {
	e := Event{"tx_id": h.id, "begin_ts": h.ts}
	h.optional(e)
	if h.openedWall != nil {
		e["opened_wall_ms"] = *h.openedWall
	}
	if h.state == "prepared" {
		e["prepared"] = true
		e["coordinator"] = h.coordinator
		e["participants"] = h.participants
	}
	return e
}

func (r *Reporter) newHold(o HoldOptions, prefix string) (hold, error) {
	id := o.ID
	if id == "" {
		id = newID(prefix)
	}
	if err := checkID(prefix+"_id", id); err != nil {
		return hold{}, err
	}
	var groups []string // a copy: the caller's slice may change
	if o.Groups != nil {
		groups = append([]string{}, o.Groups...)
	}
	h := hold{r: r, id: id, label: o.Label, groups: groups, namespace: o.Namespace, onExpire: o.OnExpire, state: "new"}
	if o.TS != nil {
		h.ts = *o.TS
	}
	return h, nil
}

// Reader opens a reader (reader_open, or later with lazy registration). An *RefusedError below the safe
// point the node learnt of: nothing is published.
func (r *Reporter) Reader(ctx context.Context, o HoldOptions) (*Reader, error) {
	h, err := r.newHold(o, "r")
	if err != nil {
		return nil, err
	}
	reader := &Reader{hold: h}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.readers[reader.id]; ok {
		return nil, fmt.Errorf("safepoint: reader id %q is already open on node %s; ids must be unique", reader.id, r.node)
	}
	if err := r.open(ctx, &reader.hold, o.TS == nil, KindReader); err != nil {
		return nil, err
	}
	r.readers[reader.id] = reader
	return reader, nil
}

// Begin begins a transaction (tx_begin, or later with lazy registration). An *RefusedError below the
// safe point the node learnt of: nothing is published.
func (r *Reporter) Begin(ctx context.Context, o HoldOptions) (*Transaction, error) {
	h, err := r.newHold(o, "t")
	if err != nil {
		return nil, err
	}
	tx := &Transaction{hold: h}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.txs[tx.id]; ok {
		return nil, fmt.Errorf("safepoint: transaction id %q is already open on node %s; ids must be unique", tx.id, r.node)
	}
	if err := r.open(ctx, &tx.hold, o.TS == nil, KindTx); err != nil {
		return nil, err
	}
	r.txs[tx.id] = tx
	return tx, nil
}

// open publishes a hold's open (or defers it); call with r.mu held.
func (r *Reporter) open(ctx context.Context, h *hold, atClock bool, kind HoldKind) error {
	if r.closed {
		return ErrClosed
	}
	if atClock {
		h.ts = r.clock()
	}
	what := map[HoldKind]string{KindReader: "reader", KindTx: "transaction"}[kind]
	if bound, whose, ok := r.boundOf(h.namespace); ok && h.ts < bound {
		return &RefusedError{Kind: what, ID: h.id, TS: h.ts, Bound: bound, Whose: whose}
	}
	r.holdOrder++
	h.order = r.holdOrder
	h.state = "open"
	if r.lazy.deferOpen(h.ts) {
		wall := r.cfg.wallClock()
		h.openedWall = &wall
		return nil
	}
	return r.publishOpen(ctx, h, kind)
}

// boundOf is the newest bound a hold of namespace is protected at: its namespace's, or for a hold without
// one the highest of the safe point and every namespace's bound.
func (r *Reporter) boundOf(namespace string) (int64, string, bool) {
	if r.nsBase == nil {
		if r.safeTS == nil {
			return 0, "", false
		}
		return *r.safeTS, "the cluster's safe point", true
	}
	own, whose := *r.nsBase, "a namespace's bound (a hold without a namespace pins every namespace)"
	if namespace == "" {
		for _, b := range r.nsBounds {
			if b > own {
				own = b
			}
		}
	} else {
		whose = fmt.Sprintf("the bound of namespace %q", namespace)
		if b, ok := r.nsBounds[namespace]; ok {
			own = b
		}
	}
	if r.safeTS != nil && *r.safeTS > own {
		own = *r.safeTS
	}
	return own, whose, true
}

func (r *Reporter) publishOpen(ctx context.Context, h *hold, kind HoldKind) error {
	event := Event{}
	name := "reader_open"
	if kind == KindReader {
		event["reader_id"], event["read_ts"] = h.id, h.ts
	} else {
		event["tx_id"], event["begin_ts"] = h.id, h.ts
		name = "tx_begin"
	}
	h.optional(event)
	if h.openedWall != nil {
		event["opened_wall_ms"] = *h.openedWall
	}
	if _, err := r.send(ctx, name, event); err != nil {
		return err
	}
	if h.openedWall == nil {
		wall := r.lastWall
		h.openedWall = &wall
	}
	h.published = true
	return nil
}

// publishWaiting publishes the holds that waited (all, or those below *below), lowest ts first.
func (r *Reporter) publishWaiting(ctx context.Context, below *int64) error {
	type waiting struct {
		h    *hold
		kind HoldKind
	}
	var ws []waiting
	for _, h := range r.readers {
		if !h.published && (below == nil || h.ts < *below) {
			ws = append(ws, waiting{&h.hold, KindReader})
		}
	}
	for _, h := range r.txs {
		if !h.published && (below == nil || h.ts < *below) {
			ws = append(ws, waiting{&h.hold, KindTx})
		}
	}
	sort.Slice(ws, func(i, j int) bool {
		a, b := ws[i], ws[j]
		if a.h.ts != b.h.ts {
			return a.h.ts < b.h.ts
		}
		if a.kind != b.kind {
			return a.kind < b.kind
		}
		return a.h.id < b.h.id
	})
	for _, w := range ws {
		if err := r.publishOpen(ctx, w.h, w.kind); err != nil {
			return err
		}
	}
	return nil
}

// closeHold forgets a hold and publishes its end (when its open was published); call with r.mu held.
func (r *Reporter) closeHold(ctx context.Context, kind HoldKind, id string, extra Event) {
	var h *hold
	if kind == KindReader {
		if x, ok := r.readers[id]; ok {
			h = &x.hold
			delete(r.readers, id)
		}
	} else if x, ok := r.txs[id]; ok {
		h = &x.hold
		delete(r.txs, id)
	}
	if h == nil || r.closed || !h.published {
		return
	}
	event := Event{"reader_id": id}
	name := "reader_close"
	if kind == KindTx {
		event, name = Event{"tx_id": id}, "tx_end"
	}
	for k, v := range extra {
		event[k] = v
	}
	if _, err := r.send(ctx, name, event); err != nil {
		r.needSnap.Store(true)
		r.log.Error("safepoint: could not publish the end of a hold", "kind", kind, "id", id, "err", err)
	}
}

// Close publishes reader_close. Idempotent.
func (h *Reader) Close(ctx context.Context) error {
	r := h.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if h.state != "open" {
		return nil
	}
	h.state = "closed"
	r.closeHold(ctx, KindReader, h.id, nil)
	return nil
}

// Check is an operation boundary: after an expiry it releases the reader and returns an *ExpiredError.
func (h *Reader) Check(ctx context.Context) error { return h.r.enforceExpiry(ctx, &h.hold, KindReader) }

// Check is an operation boundary: after an expiry it aborts the transaction and returns an *ExpiredError.
func (h *Transaction) Check(ctx context.Context) error {
	return h.r.enforceExpiry(ctx, &h.hold, KindTx)
}

// Prepare publishes tx_prepare (two-phase commit, in doubt until End). An expired transaction is aborted
// and an *ExpiredError returned instead.
func (h *Transaction) Prepare(ctx context.Context, coordinator string, participants []string) error {
	if err := checkID("coordinator", coordinator); err != nil {
		return err
	}
	r := h.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if h.expiry != nil {
		return r.enforceLocked(ctx, &h.hold, KindTx)
	}
	if h.state != "open" {
		return fmt.Errorf("safepoint: transaction %s cannot be prepared: it is %s", h.id, h.state)
	}
	if r.closed {
		return ErrClosed
	}
	if !h.published {
		if err := r.publishOpen(ctx, &h.hold, KindTx); err != nil {
			return err
		}
	}
	parts := append([]string{}, participants...) // a copy: the caller's slice may change
	if _, err := r.send(ctx, "tx_prepare", Event{"tx_id": h.id, "coordinator": coordinator, "participants": parts}); err != nil {
		return err
	}
	h.coordinator, h.participants, h.state = coordinator, parts, "prepared"
	return nil
}

// End publishes tx_end with the decision (Commit or Abort). On an expired transaction a commit is
// published as an abort and an *ExpiredError returned.
func (h *Transaction) End(ctx context.Context, outcome TxOutcome) error {
	if outcome != Commit && outcome != Abort {
		return fmt.Errorf("safepoint: outcome must be Commit or Abort, got %q", outcome)
	}
	r := h.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if h.expiry != nil {
		if outcome == Commit {
			return r.enforceLocked(ctx, &h.hold, KindTx)
		}
		r.releaseExpired(ctx, &h.hold, KindTx)
		return nil
	}
	if h.state != "open" && h.state != "prepared" {
		return nil
	}
	h.state = "ended"
	r.closeHold(ctx, KindTx, h.id, Event{"outcome": string(outcome)})
	return nil
}
