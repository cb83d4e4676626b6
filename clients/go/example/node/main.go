// Command node is a database node using the Go client: it reports a long report reader and a stream of
// short transactions, heartbeats its MVCC clock, and follows the job's directives: it compacts up to what
// CompactUpTo allows and ends a reader the job expired. Run it beside `safepoint demo` (or any job):
//
//	go run ./example/node -bootstrap 127.0.0.1:9092 -cluster demo -node go-1 -for 30s
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync/atomic"
	"time"

	safepoint "safepoint.dev/client"
)

func main() {
	bootstrap := flag.String("bootstrap", "127.0.0.1:9092", "Kafka bootstrap servers")
	cluster := flag.String("cluster", "demo", "the node's cluster")
	node := flag.String("node", "go-1", "the node's id")
	directiveKey := flag.String("directive-key", os.Getenv("SAFEPOINT_DIRECTIVE_KEY"),
		"the job's public key(s): act only on directives it signed")
	runFor := flag.Duration("for", 0, "stop this long after the report opened (0: until interrupted)")
	flag.Parse()
	if err := run(*bootstrap, *cluster, *node, *directiveKey, *runFor); err != nil {
		fmt.Fprintln(os.Stderr, "node:", err)
		os.Exit(1)
	}
}

func run(bootstrap, cluster, node, directiveKey string, runFor time.Duration) (err error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	// The node's MVCC clock: here milliseconds since the epoch; a database passes its own.
	var mvcc atomic.Int64
	mvcc.Store(time.Now().UnixMilli())
	clock := func() int64 { return mvcc.Load() }

	reporter, err := safepoint.NewReporter(bootstrap, node, clock, safepoint.WithCluster(cluster),
		safepoint.WithStateDir(os.TempDir()), // the incarnation survives a restart
		safepoint.WithOnExpire(func(_ context.Context, h safepoint.Handle, d safepoint.ExpireDirective) {
			slog.Warn("the job expired a hold; it ends at its next operation boundary", "id", h.ID(), "mode", d.Mode)
		}))
	if err != nil {
		return err
	}
	defer func() { // Close is bounded: 30 s when its ctx has no deadline
		if cerr := reporter.Close(context.Background()); cerr != nil && err == nil {
			err = cerr
		}
	}()

	opts := []safepoint.ListenerOption{safepoint.WithReporter(reporter),
		safepoint.WithOnDirective(func(_ context.Context, d safepoint.Directive) error {
			oldest := oldestHold()
			upTo := safepoint.CompactUpTo(d, oldest, "")
			slog.Info("directive", "seq", d.Seq, "safe_ts", d.SafeTS, "compact_up_to", upTo)
			return nil // here the engine compacts its history below upTo; an error retries the directive
		})}
	if directiveKey != "" {
		keys, err := safepoint.ParseDirectiveKeys(directiveKey)
		if err != nil {
			return err
		}
		opts = append(opts, safepoint.WithDirectiveKeys(keys))
	}
	listener, err := safepoint.NewDirectiveListener(bootstrap, cluster, opts...)
	if err != nil {
		return err
	}
	if err := listener.Start(); err != nil {
		return err
	}
	defer func() {
		if cerr := listener.Close(context.Background()); cerr != nil && err == nil {
			err = cerr
		}
	}()

	report, err := reporter.Reader(ctx, safepoint.HoldOptions{Label: "nightly report"})
	if err != nil {
		return err // a *safepoint.RefusedError: its snapshot may already be compacted
	}
	oldest.Store(report.TS())
	if runFor > 0 { // the workload's time, however long connecting took
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, runFor)
		defer cancel()
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return endReport(report)
		case <-tick.C:
		}
		mvcc.Store(time.Now().UnixMilli())
		tx, err := reporter.Begin(ctx, safepoint.HoldOptions{})
		if err != nil {
			return err
		}
		if err := tx.End(ctx, safepoint.Commit); err != nil {
			return err
		}
		if report != nil && n%10 == 0 { // the report's operation boundary
			var expired *safepoint.ExpiredError
			if err := report.Check(ctx); errors.As(err, &expired) {
				slog.Warn("the report was expired; a retry would take a fresh snapshot", "err", err)
				report = nil // the client released it
				oldest.Store(-1)
			}
		}
	}
}

// oldest is the read_ts of the node's open report, -1 when none is open.
var oldest atomic.Int64

// oldestHold is the node's own oldest open snapshot (nil: none), which no directive may compact past.
func oldestHold() *int64 {
	if ts := oldest.Load(); ts >= 0 {
		return &ts
	}
	return nil
}

func endReport(report *safepoint.Reader) error {
	if report == nil {
		return nil
	}
	return report.Close(context.Background())
}
