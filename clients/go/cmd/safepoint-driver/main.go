// Command safepoint-driver runs one node of the Go client from JSON lines of operations on stdin, one
// answer a line on stdout: the protocol every client of safepoint shares for the test vectors (the
// project's docs/contract.md, "A client in another language"; the Python one is safepoint client-driver).
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	safepoint "safepoint.dev/client"
)

type driver struct {
	mu         sync.Mutex
	out        io.Writer
	mvccNow    int64
	figures    safepoint.Figures
	reporter   *safepoint.Reporter
	listener   *safepoint.DirectiveListener
	handles    map[string]safepoint.Handle
	holds      map[string]*safepoint.ServiceHold
	newHold    func(holder string, ts int64, ttl time.Duration, label string) (*safepoint.ServiceHold, error)
	order      []string
	seen       sync.Cond
	directives []safepoint.Event
	expired    map[string]bool
}

func (d *driver) say(reply map[string]any) {
	raw, _ := json.Marshal(reply)
	d.mu.Lock()
	defer d.mu.Unlock()
	fmt.Fprintf(d.out, "%s\n", raw)
}

func main() {
	bootstrap := flag.String("bootstrap", "", "Kafka bootstrap servers HOST:PORT")
	cluster := flag.String("cluster", "", "the node's cluster")
	node := flag.String("node", "", "the node id")
	incarnation := flag.Int64("incarnation", -1, "the node's incarnation")
	heartbeatMS := flag.Int("heartbeat-ms", 0, "heartbeat interval (0: only when an operation asks)")
	retention := flag.Int64("retention", -1, "lazy registration with this retention (MVCC units)")
	nodeKey := flag.String("node-key", "", "sign every event with this node key")
	directiveKey := flag.String("directive-key", "", "verify directives with these public keys (comma-separated)")
	eventsTopic := flag.String("events-topic", safepoint.DefaultEventsTopic, "the events topic")
	directivesTopic := flag.String("directives-topic", safepoint.DefaultDirectivesTopic, "the directives topic")
	partBytes := flag.Int("snapshot-part-bytes", 0, "the size a snapshot's part may reach")
	controlTopic := flag.String("control-topic", safepoint.DefaultControlTopic, "where service holds are set")
	statusTopic := flag.String("status-topic", safepoint.DefaultStatusTopic, "where the job's outcomes of them are read")
	flag.Parse()
	if *bootstrap == "" || *cluster == "" || *node == "" || *incarnation < 0 {
		fmt.Fprintln(os.Stderr, "safepoint-driver: --bootstrap, --cluster, --node and --incarnation are required")
		os.Exit(2)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	d := &driver{out: os.Stdout, handles: map[string]safepoint.Handle{}, holds: map[string]*safepoint.ServiceHold{},
		expired: map[string]bool{}}
	d.newHold = func(holder string, ts int64, ttl time.Duration, label string) (*safepoint.ServiceHold, error) {
		return safepoint.NewServiceHold(*bootstrap, *cluster, holder, ts, ttl, safepoint.WithControlTopic(*controlTopic),
			safepoint.WithStatusTopic(*statusTopic), safepoint.WithHoldLabel(label), safepoint.WithLogger(logger))
	}
	d.seen.L = &sync.Mutex{}
	opts := []safepoint.ReporterOption{safepoint.WithCluster(*cluster), safepoint.WithIncarnation(*incarnation),
		safepoint.WithEventsTopic(*eventsTopic), safepoint.WithHeartbeat(time.Duration(*heartbeatMS) * time.Millisecond),
		safepoint.WithFigures(d.currentFigures), safepoint.WithOnExpire(d.onExpire), safepoint.WithLogger(logger)}
	if *retention >= 0 {
		opts = append(opts, safepoint.WithRetention(*retention))
	}
	if *nodeKey != "" {
		opts = append(opts, safepoint.WithNodeKey(*nodeKey))
	}
	if *partBytes > 0 {
		opts = append(opts, safepoint.WithSnapshotPartBytes(*partBytes))
	}
	reporter, err := safepoint.NewReporter(*bootstrap, *node, d.clock, opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "safepoint-driver:", err)
		os.Exit(1)
	}
	d.reporter = reporter
	lopts := []safepoint.ListenerOption{safepoint.WithDirectivesTopic(*directivesTopic), safepoint.WithReporter(reporter),
		safepoint.WithOnDirective(d.onDirective), safepoint.WithLogger(logger)}
	if *directiveKey != "" {
		keys, err := safepoint.ParseDirectiveKeys(*directiveKey)
		if err != nil {
			fmt.Fprintln(os.Stderr, "safepoint-driver:", err)
			os.Exit(2)
		}
		lopts = append(lopts, safepoint.WithDirectiveKeys(keys))
	}
	listener, err := safepoint.NewDirectiveListener(*bootstrap, *cluster, lopts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "safepoint-driver:", err)
		os.Exit(1)
	}
	if err := listener.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "safepoint-driver:", err)
		os.Exit(1)
	}
	d.listener = listener
	scanner := bufio.NewScanner(os.Stdin)
	scanner.Buffer(make([]byte, 1<<20), 1<<24)
	for scanner.Scan() {
		if len(scanner.Bytes()) == 0 {
			continue
		}
		d.say(d.step(scanner.Bytes()))
	}
	d.finish()
}

func (d *driver) clock() int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mvccNow
}

func (d *driver) currentFigures() safepoint.Figures {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.figures
}

func (d *driver) onExpire(_ context.Context, h safepoint.Handle, e safepoint.ExpireDirective) {
	d.say(map[string]any{"op": "expired", "ref": h.ID(), "mode": e.Mode})
	d.seen.L.Lock()
	d.expired[h.ID()] = true
	d.seen.L.Unlock()
	d.seen.Broadcast()
}

func (d *driver) onDirective(_ context.Context, dir safepoint.Directive) error {
	dec := json.NewDecoder(bytes.NewReader(dir.Raw))
	dec.UseNumber()
	var raw safepoint.Event
	if err := dec.Decode(&raw); err != nil {
		return fmt.Errorf("the directive's value: %w", err)
	}
	d.seen.L.Lock()
	d.directives = append(d.directives, raw)
	d.seen.L.Unlock()
	d.seen.Broadcast()
	return nil
}

type op struct {
	Op            string   `json:"op"`
	Ref           *string  `json:"ref"`
	TS            *int64   `json:"ts"`
	Label         string   `json:"label"`
	Groups        []string `json:"groups"`
	Namespace     string   `json:"namespace"`
	Coordinator   string   `json:"coordinator"`
	Participants  []string `json:"participants"`
	Outcome       string   `json:"outcome"`
	MVCCNow       *int64   `json:"mvcc_now"`
	MS            int64    `json:"ms"`
	SafeTSAtLeast *int64   `json:"safe_ts_at_least"`
	Expired       *string  `json:"expired"`
	SnapshotReqs  *int64   `json:"snapshot_requests"`
	TimeoutMS     *int64   `json:"timeout_ms"`
	TTLMS         int64    `json:"ttl_ms"`
	Readers       int64    `json:"readers"`
}

var errUnknown = errors.New("no open reader, transaction or service hold")

func (d *driver) step(line []byte) map[string]any {
	var o op
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(line, &raw); err != nil {
		return map[string]any{"op": nil, "error": "invalid", "detail": "not an operation: " + err.Error()}
	}
	// A heartbeat's groups are figures (objects), not a hold's groups: takeFigures reads them from raw.
	if err := json.Unmarshal(line, &o); err != nil && o.Op != "heartbeat" {
		return map[string]any{"op": o.Op, "error": "invalid", "detail": err.Error()}
	}
	reply := map[string]any{"op": o.Op}
	if o.Ref != nil {
		reply["ref"] = *o.Ref
	}
	extra, err := d.apply(o, raw)
	var refused *safepoint.RefusedError
	var expired *safepoint.ExpiredError
	var holdRefused *safepoint.HoldRefusedError
	switch {
	case err == nil && extra != nil:
		for k, v := range extra {
			reply[k] = v
		}
	case err == nil:
		reply["ok"] = true
	case errors.As(err, &refused):
		reply["error"] = "refused"
	case errors.As(err, &expired):
		reply["error"] = "expired"
	case errors.As(err, &holdRefused):
		reply["error"], reply["detail"] = "refused", err.Error()
	case errors.Is(err, errUnknown):
		reply["error"], reply["detail"] = "unknown", err.Error()
	default:
		reply["error"], reply["detail"] = "invalid", err.Error()
	}
	return reply
}

func (d *driver) put(ref string, h safepoint.Handle) {
	if _, ok := d.handles[ref]; !ok {
		d.order = append(d.order, ref)
	}
	d.handles[ref] = h
}

func (d *driver) pop(ref string) (safepoint.Handle, error) {
	h, ok := d.handles[ref]
	if !ok {
		return nil, fmt.Errorf("%w %q", errUnknown, ref)
	}
	delete(d.handles, ref)
	for i, r := range d.order {
		if r == ref {
			d.order = append(d.order[:i], d.order[i+1:]...)
			break
		}
	}
	return h, nil
}

func (d *driver) apply(o op, raw map[string]json.RawMessage) (map[string]any, error) {
	ctx := context.Background()
	ref := ""
	if o.Ref != nil {
		ref = *o.Ref
	}
	hold := safepoint.HoldOptions{TS: o.TS, ID: ref, Label: o.Label, Groups: o.Groups, Namespace: o.Namespace}
	switch o.Op {
	case "clock":
		if o.MVCCNow == nil {
			return nil, errors.New("clock needs mvcc_now")
		}
		d.mu.Lock()
		d.mvccNow = *o.MVCCNow
		d.mu.Unlock()
	case "reader":
		h, err := d.reporter.Reader(ctx, hold)
		if err != nil {
			return nil, err
		}
		d.put(ref, h)
	case "tx":
		h, err := d.reporter.Begin(ctx, hold)
		if err != nil {
			return nil, err
		}
		d.put(ref, h)
	case "prepare":
		tx, ok := d.handles[ref].(*safepoint.Transaction)
		if !ok {
			return nil, fmt.Errorf("%w %q", errUnknown, ref)
		}
		return nil, tx.Prepare(ctx, o.Coordinator, o.Participants)
	case "end":
		h, err := d.pop(ref)
		if err != nil {
			return nil, err
		}
		tx, ok := h.(*safepoint.Transaction)
		if !ok {
			return nil, fmt.Errorf("%w %q", errUnknown, ref)
		}
		outcome := safepoint.TxOutcome(o.Outcome)
		if outcome == "" {
			outcome = safepoint.Commit
		}
		return nil, tx.End(ctx, outcome)
	case "close":
		h, err := d.pop(ref)
		if err != nil {
			return nil, err
		}
		reader, ok := h.(*safepoint.Reader)
		if !ok {
			return nil, fmt.Errorf("%w %q", errUnknown, ref)
		}
		return nil, reader.Close(ctx)
	case "check":
		h, ok := d.handles[ref]
		if !ok {
			return nil, fmt.Errorf("%w %q", errUnknown, ref)
		}
		return nil, h.Check(ctx)
	case "heartbeat":
		if err := d.takeFigures(raw); err != nil {
			return nil, err
		}
		return nil, d.reporter.Heartbeat(ctx)
	case "snapshot":
		return nil, d.reporter.Snapshot(ctx)
	case "hold":
		if o.TS == nil || o.TTLMS < 1 {
			return nil, errors.New("hold needs ts and ttl_ms")
		}
		h, err := d.newHold(ref, *o.TS, time.Duration(o.TTLMS)*time.Millisecond, o.Label)
		if err != nil {
			return nil, err
		}
		if err := h.Start(ctx); err != nil {
			return nil, err
		}
		d.holds[ref] = h
	case "release":
		h, ok := d.holds[ref]
		if !ok {
			return nil, fmt.Errorf("%w %q", errUnknown, ref)
		}
		delete(d.holds, ref)
		return nil, h.Close(ctx)
	case "publish":
		return d.publish(ctx, ref, o.Readers)
	case "sleep":
		time.Sleep(time.Duration(o.MS) * time.Millisecond)
	case "wait":
		timeout := int64(30_000)
		if o.TimeoutMS != nil {
			timeout = *o.TimeoutMS
		}
		return d.wait(o, time.Now().Add(time.Duration(timeout)*time.Millisecond)), nil
	default:
		return nil, fmt.Errorf("unknown operation %q", o.Op)
	}
	return nil, nil
}

// publish is a benchmark's load: it opens and closes readers readers as fast as the client goes, then
// flushes, and says the events published and the time taken.
func (d *driver) publish(ctx context.Context, ref string, readers int64) (map[string]any, error) {
	sent := d.reporter.Stats().Sent
	start := time.Now()
	for i := int64(0); i < readers; i++ {
		h, err := d.reporter.Reader(ctx, safepoint.HoldOptions{ID: fmt.Sprintf("%s-%d", ref, i)})
		if err != nil {
			return nil, err
		}
		if err := h.Close(ctx); err != nil {
			return nil, err
		}
	}
	flushCtx, cancel := context.WithTimeout(ctx, 120*time.Second)
	defer cancel()
	if err := d.reporter.Flush(flushCtx); err != nil {
		return nil, fmt.Errorf("the events were not all delivered in 120 s: %w", err)
	}
	return map[string]any{"events": d.reporter.Stats().Sent - sent, "ms": time.Since(start).Milliseconds()}, nil
}

// takeFigures keeps the figures a heartbeat operation gives (they stand for later heartbeats too).
func (d *driver) takeFigures(raw map[string]json.RawMessage) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if v, ok := raw["pinned_bytes"]; ok {
		var n int64
		if err := json.Unmarshal(v, &n); err != nil {
			return err
		}
		d.figures.PinnedBytes = &n
	}
	if v, ok := raw["debt_bytes"]; ok {
		var n int64
		if err := json.Unmarshal(v, &n); err != nil {
			return err
		}
		d.figures.DebtBytes = &n
	}
	if v, ok := raw["groups"]; ok {
		var groups []struct {
			Group              string `json:"group"`
			Leader             bool   `json:"leader"`
			PublishedMinTxTime int64  `json:"published_min_tx_time"`
		}
		if err := json.Unmarshal(v, &groups); err != nil {
			return err
		}
		d.figures.Groups = make([]safepoint.Group, 0, len(groups))
		for _, g := range groups {
			d.figures.Groups = append(d.figures.Groups, safepoint.Group{Group: g.Group, Leader: g.Leader,
				PublishedMinTxTime: g.PublishedMinTxTime})
		}
	}
	if v, ok := raw["history_above"]; ok {
		var points [][2]int64
		if err := json.Unmarshal(v, &points); err != nil {
			return err
		}
		d.figures.HistoryAbove = points
	}
	return nil
}

func (d *driver) wait(o op, deadline time.Time) map[string]any {
	d.seen.L.Lock()
	defer d.seen.L.Unlock()
	for {
		if found := d.found(o); found != nil {
			return found
		}
		if time.Now().After(deadline) {
			return map[string]any{"timeout": true}
		}
		d.seen.L.Unlock()
		time.Sleep(20 * time.Millisecond) // snapshot requests are counted by the listener, unannounced
		d.seen.L.Lock()
	}
}

func (d *driver) found(o op) map[string]any {
	switch {
	case o.Expired != nil:
		if d.expired[*o.Expired] {
			return map[string]any{"expired": *o.Expired}
		}
	case o.SnapshotReqs != nil:
		if n := d.listener.Stats().SnapshotRequests; n >= *o.SnapshotReqs {
			return map[string]any{"snapshot_requests": n}
		}
	case o.SafeTSAtLeast != nil:
		for _, dir := range d.directives {
			if ts, err := dir["safe_ts"].(json.Number).Int64(); err == nil && ts >= *o.SafeTSAtLeast {
				return map[string]any{"directive": dir}
			}
		}
	}
	return nil
}

// finish closes the readers still open, aborts the transactions, flushes and stops.
func (d *driver) finish() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, ref := range append([]string(nil), d.order...) {
		switch h := d.handles[ref].(type) {
		case *safepoint.Reader:
			_ = h.Close(ctx)
		case *safepoint.Transaction:
			_ = h.End(ctx, safepoint.Abort)
		}
	}
	for _, h := range d.holds {
		_ = h.Close(ctx)
	}
	if err := d.listener.Close(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "safepoint-driver:", err)
	}
	if err := d.reporter.Close(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "safepoint-driver: flushing at the end:", err)
	}
}
