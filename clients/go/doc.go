// Package safepoint is the node client of safepoint, the service that says how much MVCC history a
// distributed database may compact without breaking a reader.
//
// A database node makes one Reporter, which publishes its snapshot readers, transactions, heartbeats and
// snapshots to Kafka, and one DirectiveListener, which follows the job's compaction directives and
// hands the node its expiries. CompactUpTo is the contract's rule for how far the node may compact. A
// ServiceHold pins a cluster's history by name (a backup's) until it is closed or its TTL runs out.
//
// # Bounds
//
// Every call that waits is bounded. Calls that publish take a context.Context and wait for room in a
// full send queue until it ends, at most 30 s. Close (of each type) waits until its ctx ends or, when
// ctx has no deadline, for the close timeout (WithCloseTimeout, default DefaultCloseTimeout, 30 s); what
// could not be delivered or released by then is said in its error. Close is safe to call more than once
// and from several goroutines; a second Start returns ErrStarted.
//
// # Callbacks
//
// WithOnDirective runs in the listener's goroutine (Start), WithOnExpireDirective and a Reporter's
// ExpireFunc in the goroutine that reads the directives, WithOnLost in the hold's renewing goroutine;
// each gets that goroutine's ctx, cancelled by Close. A panic in a callback is recovered, logged and
// counted (the Stats of each type), and the records after it are handled.
//
// # Kafka settings
//
// WithKafkaOptions passes franz-go options (TLS, SASL, timeouts) to the client's Kafka clients. The
// settings the client's guarantees rest on (acks from all in-sync replicas, idempotence, the CRC-32
// partitioner, the delivery bound, the buffer, the topics) are its own: an option that sets one is
// refused by the constructor with an error naming it. WithClient hands a Reporter a franz-go client of
// the caller's instead: it is refused, the setting named, unless it keeps those guarantees, and the
// reporter flushes it at Close but leaves it open.
package safepoint
