package safepoint

import (
	"errors"
	"fmt"
)

// ErrClosed is returned by a reporter, listener or hold that was closed.
var ErrClosed = errors.New("safepoint: closed")

// RefusedError: a reader or transaction asked for a timestamp the cluster may already have
// compacted (below the safe point the node learnt of). Nothing was published.
type RefusedError struct {
	Kind  string // "reader" or "transaction"
	ID    string
	TS    int64
	Bound int64
	Whose string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("safepoint: %s %s at %d refused: it is below %s %d, so versions it needs may already be "+
		"compacted; retry with a timestamp >= %d", e.Kind, e.ID, e.TS, e.Whose, e.Bound, e.Bound)
}

// ExpiredError: the safe-point service expired this reader or transaction under history pressure. It
// is returned at the handle's operation boundaries (Check, Prepare, a commit); the operation may be
// retried with a fresh snapshot.
type ExpiredError struct {
	Kind   HoldKind
	ID     string
	Mode   string // "graceful" or "hard"
	Reason string
	Seq    int64
}

func (e *ExpiredError) Error() string {
	return fmt.Sprintf("safepoint: %s %s was expired by the safe-point service (%s expiry, directive seq %d): %s; "+
		"retry with a fresh snapshot", e.Kind, e.ID, e.Mode, e.Seq, e.Reason)
}

// Code is a stable code for a database's error mapping (transient, resource pressure).
func (e *ExpiredError) Code() string { return "snapshot_expired" }

// Outcome is the job's outcome of one control action (its cluster_status record's "actions").
type Outcome struct {
	ID      string // the action_id
	Type    string // service_hold, service_release
	Holder  string
	Outcome string // applied, refused, ignored, expired
	Reason  string // below_safe_ts, not_owner, ttl... ("" where none)
	Detail  string
}

// HoldRefusedError: the job refused a service hold as it was set (its history may already be compacted:
// below_safe_ts; or ttl_too_long, not_owner, a bad signature). The hold is not renewed.
type HoldRefusedError struct{ Outcome Outcome }

func (e *HoldRefusedError) Error() string {
	return fmt.Sprintf("safepoint: service hold %s %s by the job (%s): %s", e.Outcome.Holder, e.Outcome.Outcome,
		e.Outcome.Reason, e.Outcome.Detail)
}

// HoldLostError: the job refused or expired a service hold after it was set (ServiceHold.Check).
type HoldLostError struct{ Outcome Outcome }

func (e *HoldLostError) Error() string {
	return fmt.Sprintf("safepoint: service hold %s was %s by the job (%s): %s", e.Outcome.Holder, e.Outcome.Outcome,
		e.Outcome.Reason, e.Outcome.Detail)
}
