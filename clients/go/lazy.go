package safepoint

// lazyRegistration says when a node's holds must be published (the Python client's
// connectors/registration.py): a hold at or above the bound of the last heartbeat sent waits; it is
// published before the heartbeat whose bound passes it, when it is prepared, or in a snapshot.
type lazyRegistration struct {
	retention *int64
	bound     *int64
	eager     bool
}

// deferOpen says whether a hold opened now at ts can wait (never before this reporter's first heartbeat:
// the job may still hold the previous process's bound).
func (l *lazyRegistration) deferOpen(ts int64) bool {
	return !l.eager && l.bound != nil && ts >= *l.bound
}

// heartbeatBound is the bound the heartbeat carrying now sets (false when publishing eagerly); the bound
// kept never goes lower (a clock that stepped back).
func (l *lazyRegistration) heartbeatBound(now int64) (int64, bool) {
	if l.eager {
		return 0, false
	}
	bound := now - *l.retention
	if l.bound == nil || bound > *l.bound {
		l.bound = &bound
	}
	return bound, true
}

// jobRetention takes the job's retention from a directive: true when it is below the reporter's, from
// now on every hold is published (the caller publishes what waits).
func (l *lazyRegistration) jobRetention(retention int64) bool {
	if l.eager || l.retention == nil || retention >= *l.retention {
		return false
	}
	l.eager = true
	return true
}
