package safepoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// DefaultStatusTopic is the topic the job writes each cluster's status to, with its control actions' outcomes.
const DefaultStatusTopic = "safepoint.status"

// escapeID is one part of an id as the job keys records: % and / escaped.
func escapeID(part string) string {
	return strings.NewReplacer("%", "%25", "/", "%2F").Replace(part)
}

// outcomes follows the status topic from where it ends when made, for the outcomes of watched actions.
type outcomes struct {
	client  *kgo.Client
	key     []byte
	watched map[string]bool
	seen    map[string]string
}

// newOutcomes positions a consumer at the status topic's end now (before the action is published, so
// that its outcome cannot be missed); an error says why outcomes cannot be followed.
func newOutcomes(ctx context.Context, seeds []string, topic, cluster string, extra []kgo.Opt) (*outcomes, error) {
	probe, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(seeds...)}, extra...)...)
	if err != nil {
		return nil, err
	}
	ctx, cancel := bounded(ctx, DefaultCloseTimeout) // a ctx without a deadline: still bounded
	defer cancel()
	ends, err := kadm.NewClient(probe).ListEndOffsets(ctx, topic)
	probe.Close()
	if err != nil {
		return nil, fmt.Errorf("the status topic %s cannot be read: %w", topic, err)
	}
	at := map[int32]kgo.Offset{}
	var listErr error
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			listErr = o.Err
			return
		}
		at[o.Partition] = kgo.NewOffset().At(o.Offset)
	})
	if listErr != nil || len(at) == 0 {
		return nil, fmt.Errorf("the status topic %s cannot be read: %v", topic, listErr)
	}
	client, err := kgo.NewClient(append(append([]kgo.Opt{kgo.SeedBrokers(seeds...)}, extra...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: at}), kgo.FetchMaxWait(250*time.Millisecond))...)
	if err != nil {
		return nil, err
	}
	return &outcomes{client: client, key: []byte(escapeID(cluster)), watched: map[string]bool{}, seen: map[string]string{}}, nil
}

func (o *outcomes) watch(actionID string) { o.watched[actionID] = true }

// poll reads what the status topic has (waiting up to wait for it) and returns the outcomes of watched
// actions that are new or changed, whether any record was read, and the error of a fetch that failed.
func (o *outcomes) poll(ctx context.Context, wait time.Duration) ([]Outcome, bool, error) {
	pollCtx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	var changed []Outcome
	fetches := o.client.PollFetches(pollCtx)
	var failed error
	fetches.EachError(func(topic string, partition int32, err error) {
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			failed = fmt.Errorf("reading %s[%d]: %w", topic, partition, err)
		}
	})
	read := false
	fetches.EachRecord(func(rec *kgo.Record) {
		read = true
		if string(rec.Key) != string(o.key) || rec.Value == nil {
			return
		}
		var status struct {
			Type    string            `json:"type"`
			Actions []json.RawMessage `json:"actions"`
		}
		if json.Unmarshal(rec.Value, &status) != nil || status.Type != "cluster_status" {
			return // not a record of the job's: not ours to judge here
		}
		for _, raw := range status.Actions {
			var a struct {
				ID      string  `json:"id"`
				Type    string  `json:"type"`
				Holder  *string `json:"holder"`
				Outcome string  `json:"outcome"`
				Reason  *string `json:"reason"`
				Detail  string  `json:"detail"`
			}
			if json.Unmarshal(raw, &a) != nil || !o.watched[a.ID] || o.seen[a.ID] == string(raw) {
				continue
			}
			o.seen[a.ID] = string(raw)
			out := Outcome{ID: a.ID, Type: a.Type, Outcome: a.Outcome, Detail: a.Detail}
			if a.Holder != nil {
				out.Holder = *a.Holder
			}
			if a.Reason != nil {
				out.Reason = *a.Reason
			}
			changed = append(changed, out)
		}
	})
	return changed, read, failed
}

// wait is the outcome of actionID, waiting up to timeout for the job to report it (false: not in time).
func (o *outcomes) wait(ctx context.Context, actionID string, timeout time.Duration) (Outcome, bool) {
	o.watch(actionID)
	deadline := time.Now().Add(timeout)
	for {
		got, _, _ := o.poll(ctx, min(500*time.Millisecond, time.Until(deadline))) // an error: waited out as no outcome
		for _, out := range got {
			if out.ID == actionID {
				return out, true
			}
		}
		if time.Until(deadline) <= 0 || ctx.Err() != nil {
			return Outcome{}, false
		}
	}
}

func (o *outcomes) close() { o.client.Close() }

// lost says whether an outcome ends a hold.
func lost(o Outcome) bool { return o.Outcome == "refused" || o.Outcome == "expired" }
