package safepoint

import (
	"context"
	"encoding/json"
	"fmt"
)

// Directive is a compaction directive of the job (the contract's Outputs).
type Directive struct {
	Cluster         string
	Seq             int64
	SafeTS          int64
	CatalogFloor    *int64
	ClusterWallMS   int64
	Generation      string // "" where the job gives none
	Retention       *int64
	NamespaceSafeTS *int64
	Namespaces      map[string]int64
	// Raw is the record's value as the job wrote it (a copy: the fields above are what the client read)
	Raw json.RawMessage
}

// ExpireDirective is a forced expiry of one reader (ReaderID) or transaction (TxID) on Node.
type ExpireDirective struct {
	Cluster, Node, ReaderID, TxID, Reason, Mode string
	Seq                                         int64
	ClusterWallMS                               *int64
	Generation                                  string
	Raw                                         json.RawMessage // the record's value, a copy
}

func num(v any) (int64, bool) {
	switch n := v.(type) {
	case json.Number:
		i, err := n.Int64()
		return i, err == nil
	case int64:
		return n, true
	case int:
		return int64(n), true
	case float64:
		return int64(n), float64(int64(n)) == n
	}
	return 0, false
}

func optNum(v any) *int64 {
	if n, ok := num(v); ok {
		return &n
	}
	return nil
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

func parseDirective(obj Event, value []byte) (Directive, error) {
	seq, ok1 := num(obj["seq"])
	safe, ok2 := num(obj["safe_ts"])
	wall, _ := num(obj["cluster_wall_ms"])
	if !ok1 || !ok2 {
		return Directive{}, fmt.Errorf("a compaction directive needs an integer seq and safe_ts")
	}
	d := Directive{Cluster: str(obj["cluster"]), Seq: seq, SafeTS: safe, CatalogFloor: optNum(obj["catalog_floor"]),
		ClusterWallMS: wall, Generation: str(obj["generation"]), Retention: optNum(obj["retention"]),
		NamespaceSafeTS: optNum(obj["namespace_safe_ts"]), Raw: append(json.RawMessage(nil), value...)}
	if ns, ok := obj["namespaces"].(map[string]any); ok {
		d.Namespaces = map[string]int64{}
		for k, v := range ns {
			if n, ok := num(v); ok {
				d.Namespaces[k] = n
			}
		}
	}
	return d, nil
}

func parseExpire(obj Event, value []byte) (ExpireDirective, error) {
	seq, ok := num(obj["seq"])
	if !ok || str(obj["node"]) == "" || (str(obj["mode"]) != "graceful" && str(obj["mode"]) != "hard") {
		return ExpireDirective{}, fmt.Errorf("an expire directive needs a seq, a node and a mode graceful or hard")
	}
	return ExpireDirective{Cluster: str(obj["cluster"]), Node: str(obj["node"]), ReaderID: str(obj["reader_id"]),
		TxID: str(obj["tx_id"]), Reason: str(obj["reason"]), Mode: str(obj["mode"]), Seq: seq,
		ClusterWallMS: optNum(obj["cluster_wall_ms"]), Generation: str(obj["generation"]),
		Raw: append(json.RawMessage(nil), value...)}, nil
}

// Bound is what a hold of namespace may compact up to (SafeTS for no namespace, or a cluster without
// namespaced holds).
func (d Directive) Bound(namespace string) int64 {
	if namespace == "" || d.NamespaceSafeTS == nil {
		return d.SafeTS
	}
	if b, ok := d.Namespaces[namespace]; ok {
		return b
	}
	return *d.NamespaceSafeTS
}

// CompactUpTo is the contract's apply rule: compact up to min(the directive's bound, the node's own
// oldest local hold); oldestLocalHold nil: the node serves no hold of its own.
func CompactUpTo(d Directive, oldestLocalHold *int64, namespace string) int64 {
	bound := d.Bound(namespace)
	if oldestLocalHold != nil && *oldestLocalHold < bound {
		return *oldestLocalHold
	}
	return bound
}

// Expire applies a forced-expiry directive to the open handle it names (a DirectiveListener with the
// reporter does this). It returns the handle, or nil when the directive is a no-op: another node, an id not
// open here, a directive older than the handle, a prepared transaction, or a repeat.
func (r *Reporter) Expire(ctx context.Context, d ExpireDirective) Handle {
	kind, id := KindReader, d.ReaderID
	if id == "" {
		kind, id = KindTx, d.TxID
	}
	r.mu.Lock()
	if d.Cluster != r.cluster || d.Node != r.node {
		r.stats.ExpiriesIgnored++
		r.mu.Unlock()
		return nil
	}
	var h *hold
	var handle Handle
	prepared := false
	if kind == KindReader {
		if x, ok := r.readers[id]; ok {
			h, handle = &x.hold, x
		}
	} else if x, ok := r.txs[id]; ok {
		h, handle, prepared = &x.hold, x, x.state == "prepared"
	}
	ignored := h == nil ||
		(d.ClusterWallMS != nil && h.openedWall != nil && *d.ClusterWallMS < *h.openedWall) ||
		prepared ||
		(h.expiry != nil && (h.expiry.Mode == "hard" || d.Mode == "graceful"))
	if ignored {
		r.stats.ExpiriesIgnored++
		r.mu.Unlock()
		return nil
	}
	dd := d
	h.expiry = &dd
	r.stats.Expired++
	callback := h.onExpire
	if callback == nil {
		callback = r.cfg.onExpire
	}
	r.mu.Unlock()
	r.log.Warn("safepoint: expired by the safe-point service", "kind", kind, "id", id, "mode", d.Mode,
		"reason", d.Reason, "seq", d.Seq)
	if callback != nil {
		r.expireCallback(ctx, callback, handle, d)
	}
	if d.Mode == "hard" {
		r.mu.Lock()
		r.releaseExpired(ctx, h, kind)
		r.mu.Unlock()
	}
	return handle
}

// expireCallback calls an ExpireFunc; a panic in it is logged and counted, and the expiry goes on.
func (r *Reporter) expireCallback(ctx context.Context, f ExpireFunc, h Handle, d ExpireDirective) {
	defer func() {
		if p := recover(); p != nil {
			r.panics.Add(1)
			r.log.Error("safepoint: the on-expire callback panicked; the expiry goes on", "kind", h.Kind(), "id", h.ID(),
				"panic", p)
		}
	}()
	f(ctx, h, d)
}

// releaseExpired releases an expired handle still open: reader_close, or tx_end abort; call with r.mu held.
func (r *Reporter) releaseExpired(ctx context.Context, h *hold, kind HoldKind) {
	if h.state != "open" && h.state != "prepared" {
		return
	}
	h.state = "expired"
	if kind == KindReader {
		r.closeHold(ctx, KindReader, h.id, nil)
	} else {
		r.closeHold(ctx, KindTx, h.id, Event{"outcome": string(Abort)})
	}
}

func (r *Reporter) enforceExpiry(ctx context.Context, h *hold, kind HoldKind) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if h.expiry == nil {
		return nil
	}
	return r.enforceLocked(ctx, h, kind)
}

// enforceLocked is an operation boundary of an expired hold: released, and its *ExpiredError; r.mu held.
func (r *Reporter) enforceLocked(ctx context.Context, h *hold, kind HoldKind) error {
	r.releaseExpired(ctx, h, kind)
	return &ExpiredError{Kind: kind, ID: h.id, Mode: h.expiry.Mode, Reason: h.expiry.Reason, Seq: h.expiry.Seq}
}

// Find is the open reader (KindReader) or transaction (KindTx) of this reporter with that id, or nil.
func (r *Reporter) Find(kind HoldKind, id string) Handle {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch kind {
	case KindReader:
		if h, ok := r.readers[id]; ok {
			return h
		}
	case KindTx:
		if h, ok := r.txs[id]; ok {
			return h
		}
	}
	return nil
}
