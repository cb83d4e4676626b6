package safepoint

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

func ptr(n int64) *int64 { return &n }

func TestLazyRegistration(t *testing.T) {
	l := lazyRegistration{retention: ptr(100)}
	if l.deferOpen(5000) {
		t.Fatal("a hold waited before the reporter's first heartbeat")
	}
	if bound, ok := l.heartbeatBound(1000); !ok || bound != 900 {
		t.Fatalf("bound %d %v, want 900", bound, ok)
	}
	if !l.deferOpen(900) || !l.deferOpen(950) || l.deferOpen(899) {
		t.Fatal("a hold waits exactly when at or above the bound")
	}
	if bound, _ := l.heartbeatBound(950); bound != 850 || *l.bound != 900 {
		t.Fatalf("a clock that stepped back lowered the kept bound: %d, kept %d", bound, *l.bound)
	}
	if l.jobRetention(100) || l.jobRetention(200) {
		t.Fatal("a job's retention not below the reporter's made it eager")
	}
	if !l.jobRetention(50) || l.deferOpen(5000) {
		t.Fatal("a job's shorter retention must publish every hold from now on")
	}
	if _, ok := l.heartbeatBound(2000); ok {
		t.Fatal("an eager reporter's heartbeat carries a bound")
	}
	eager := lazyRegistration{eager: true}
	if eager.deferOpen(1) {
		t.Fatal("without a retention nothing waits")
	}
}

// The cuts Python's snapshot_parts makes of the same entries.
func TestSnapshotPartsAsPython(t *testing.T) {
	var readers, txs []Event
	for i := 0; i < 6; i++ {
		readers = append(readers, Event{"reader_id": fmt.Sprintf("r%d", i), "ts": 100 + i, "label": strings.Repeat("é", i)})
	}
	for i := 0; i < 3; i++ {
		txs = append(txs, Event{"tx_id": fmt.Sprintf("t%d", i), "ts": 200 + i})
	}
	want := map[int]string{
		1:     "r0/|r1/|r2/|r3/|r4/|r5/|/t0|/t1|/t2",
		60:    "r0/|r1/|r2/|r3/|r4/|r5/|/t0 t1|/t2",
		100:   "r0 r1/|r2 r3/|r4 r5/|/t0 t1 t2",
		10000: "r0 r1 r2 r3 r4 r5/t0 t1 t2",
	}
	for size, cuts := range want {
		parts, err := snapshotParts(readers, txs, size)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, p := range parts {
			got = append(got, ids(p[0], "reader_id")+"/"+ids(p[1], "tx_id"))
		}
		if strings.Join(got, "|") != cuts {
			t.Errorf("part size %d: %s, want %s", size, strings.Join(got, "|"), cuts)
		}
	}
}

func ids(entries []Event, field string) string {
	var out []string
	for _, e := range entries {
		out = append(out, e[field].(string))
	}
	return strings.Join(out, " ")
}

func TestHistoryThinnedAsPython(t *testing.T) {
	var raw [][2]int64
	for i := int64(0); i < 65; i++ {
		raw = append(raw, [2]int64{i, i})
	}
	points := historyPoints(raw)
	if len(points) != 64 || points[31]["ts"] != int64(31) || points[32]["ts"] != int64(33) {
		t.Fatalf("65 points thinned unlike Python's round (half to even): %v", points[30:34])
	}
	if pyRound(0.5) != 0 || pyRound(1.5) != 2 || pyRound(2.5) != 2 || pyRound(2.6) != 3 {
		t.Fatal("pyRound is not half to even")
	}
}

func listenerFor(t *testing.T, keys string) *DirectiveListener {
	t.Helper()
	cfg := listenerConfig{node: "n1"}
	if keys != "" {
		parsed, err := ParseDirectiveKeys(keys)
		if err != nil {
			t.Fatal(err)
		}
		cfg.keys = parsed
	}
	return &DirectiveListener{cluster: "c1", cfg: cfg, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		read: map[int32]int64{}, caughtUp: true}
}

func record(offset int64, value string) *kgo.Record {
	return &kgo.Record{Offset: offset, Value: []byte(value)}
}

func compactionRecord(offset, seq, safeTS int64, generation string) *kgo.Record {
	gen := ""
	if generation != "" {
		gen = fmt.Sprintf(`,"generation":%q`, generation)
	}
	return record(offset, fmt.Sprintf(`{"v":1,"type":"compaction","cluster":"c1","seq":%d,"safe_ts":%d,`+
		`"catalog_floor":%d,"cluster_wall_ms":1%s}`, seq, safeTS, safeTS, gen))
}

func delivered(l *DirectiveListener, recs ...*kgo.Record) []int64 {
	var out []int64
	for _, rec := range recs {
		if d := l.handle(context.Background(), rec); d != nil {
			out = append(out, d.SafeTS)
		}
	}
	return out
}

func TestListenerDeliversSeqsThatAdvance(t *testing.T) {
	l := listenerFor(t, "")
	got := delivered(l, compactionRecord(0, 1, 100, "g1"), compactionRecord(1, 1, 100, "g1"),
		compactionRecord(2, 3, 300, "g1"), compactionRecord(3, 2, 200, "g1"),
		record(4, `{"v":1,"type":"compaction","cluster":"c2","seq":9,"safe_ts":900}`))
	if !reflect.DeepEqual(got, []int64{100, 300}) {
		t.Fatalf("delivered %v", got)
	}
	s := l.Stats()
	if s.Repeats != 2 || s.OtherClusters != 1 || s.Received != 5 {
		t.Fatalf("stats %+v", s)
	}
}

func TestListenerTakesANewGenerationNotBelowItsSafePoint(t *testing.T) {
	l := listenerFor(t, "")
	got := delivered(l, compactionRecord(0, 7, 500, "g1"),
		compactionRecord(1, 1, 400, "g2"), // the new job is behind: held back
		compactionRecord(2, 2, 500, "g2"), // caught up: taken, its seq counts again
		compactionRecord(3, 3, 600, "g2"),
		compactionRecord(4, 9, 900, ""), // no generation never supersedes one
	)
	if !reflect.DeepEqual(got, []int64{500, 500, 600}) {
		t.Fatalf("delivered %v", got)
	}
	if s := l.Stats(); s.HeldBack != 1 || s.Generations != 1 || s.Repeats != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestBacklogDeliversOnlyItsNewest(t *testing.T) {
	l := listenerFor(t, "")
	l.caughtUp, l.ends = false, map[int32]int64{0: 3}
	if got := delivered(l, compactionRecord(0, 4, 400, "g1"), compactionRecord(1, 5, 500, "g1"),
		compactionRecord(2, 1, 100, "g2")); got != nil {
		t.Fatalf("the backlog delivered %v before its end", got)
	}
	d := l.checkCaughtUp(context.Background(), true)
	if d == nil || d.SafeTS != 100 || d.Generation != "g2" {
		t.Fatalf("the backlog's newest is the latest generation's: %+v", d)
	}
}

func TestSignedListenerRefusesUnsignedAndForged(t *testing.T) {
	l := listenerFor(t, pyPublic)
	signed := `{"v":1,"type":"compaction","cluster":"c1","safe_ts":1000,"seq":5,"catalog_ts":900,` +
		`"cluster_wall_ms":1700000000000,"generation":"g-1","namespaces":{"t0":950},"sig":"` + pyDirSig + `"}`
	forged := strings.Replace(signed, `"safe_ts":1000`, `"safe_ts":999999`, 1)
	got := delivered(l, compactionRecord(0, 1, 5000, "g-1"), record(1, forged), record(2, signed))
	if !reflect.DeepEqual(got, []int64{1000}) {
		t.Fatalf("delivered %v", got)
	}
	if s := l.Stats(); s.Unsigned != 1 || s.BadSignatures != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestExpiriesOfAnotherNodeOrRepeatedAreNotHanded(t *testing.T) {
	var handed []string
	l := listenerFor(t, "")
	l.cfg.onExpire = func(_ context.Context, e ExpireDirective) { handed = append(handed, e.ReaderID) }
	expire := func(offset int64, node, reader string, seq int) *kgo.Record {
		return record(offset, fmt.Sprintf(`{"v":1,"type":"expire","cluster":"c1","node":%q,"reader_id":%q,`+
			`"reason":"pressure","mode":"hard","seq":%d,"generation":"g1"}`, node, reader, seq))
	}
	delivered(l, expire(0, "n1", "a", 1), expire(1, "n1", "a", 1), expire(2, "n2", "b", 2), expire(3, "n1", "c", 3))
	if !reflect.DeepEqual(handed, []string{"a", "c"}) {
		t.Fatalf("handed %v", handed)
	}
}
