package safepoint

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// DefaultCloseTimeout bounds a Close whose context has no deadline of its own (WithCloseTimeout changes it).
const DefaultCloseTimeout = 30 * time.Second

// ReporterOption sets one of a Reporter's settings.
type ReporterOption interface{ applyReporter(*reporterConfig) }

// ListenerOption sets one of a DirectiveListener's settings.
type ListenerOption interface{ applyListener(*listenerConfig) }

// HoldOption sets one of a ServiceHold's settings.
type HoldOption interface{ applyHold(*holdConfig) }

// Option is a setting all three take: the Kafka options, the logger and the close bound.
type Option interface {
	ReporterOption
	ListenerOption
	HoldOption
}

type reporterOpt func(*reporterConfig)

func (o reporterOpt) applyReporter(c *reporterConfig) { o(c) }

type listenerOpt func(*listenerConfig)

func (o listenerOpt) applyListener(c *listenerConfig) { o(c) }

type holdOpt func(*holdConfig)

func (o holdOpt) applyHold(c *holdConfig) { o(c) }

// common are the settings of Option, in each of the three configurations.
type common struct {
	kafka        []kgo.Opt
	logger       *slog.Logger
	closeTimeout time.Duration
}

type commonOpt func(*common)

func (o commonOpt) applyReporter(c *reporterConfig) { o(&c.common) }
func (o commonOpt) applyListener(c *listenerConfig) { o(&c.common) }
func (o commonOpt) applyHold(c *holdConfig)         { o(&c.common) }

// WithKafkaOptions adds franz-go options (TLS, SASL, client id, timeouts) to the client's Kafka clients.
// The settings the client's guarantees rest on are its own: an option that sets one of them (acks,
// idempotence, the partitioner, the delivery bound, the buffer, the topics it produces to or reads) is
// refused by the constructor with an error that names it.
func WithKafkaOptions(opts ...kgo.Opt) Option {
	copied := append([]kgo.Opt(nil), opts...)
	return commonOpt(func(c *common) { c.kafka = append(c.kafka, copied...) })
}

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return commonOpt(func(c *common) { c.logger = l }) }

// WithCloseTimeout bounds a Close whose context has no deadline (default DefaultCloseTimeout).
func WithCloseTimeout(d time.Duration) Option {
	return commonOpt(func(c *common) { c.closeTimeout = d })
}

func (c *common) defaults() {
	if c.logger == nil {
		c.logger = slog.Default()
	}
	if c.closeTimeout <= 0 {
		c.closeTimeout = DefaultCloseTimeout
	}
}

// ownedOption is a franz-go setting the client sets itself, by the name OptValues knows it by.
type ownedOption struct {
	name string
	opt  any
}

// producerOwned: what a producer's delivery guarantees rest on (the idempotent producer with acks from all
// in-sync replicas, the node's partition, the bounds that keep every call bounded).
var producerOwned = []ownedOption{
	{"RequiredAcks", kgo.RequiredAcks}, {"DisableIdempotentWrite", kgo.DisableIdempotentWrite},
	{"RecordPartitioner", kgo.RecordPartitioner}, {"RecordDeliveryTimeout", kgo.RecordDeliveryTimeout},
	{"MaxBufferedRecords", kgo.MaxBufferedRecords}, {"MaxBufferedBytes", kgo.MaxBufferedBytes},
	{"DefaultProduceTopic", kgo.DefaultProduceTopic}, {"ManualFlushing", kgo.ManualFlushing},
	{"TransactionalID", kgo.TransactionalID},
}

// consumerOwned: what a consumer reads and from where.
var consumerOwned = []ownedOption{
	{"ConsumeTopics", kgo.ConsumeTopics}, {"ConsumePartitions", kgo.ConsumePartitions},
	{"ConsumeRegex", kgo.ConsumeRegex}, {"ConsumerGroup", kgo.ConsumerGroup},
	{"ConsumeResetOffset", kgo.ConsumeResetOffset},
}

// checkOwned refuses user options that set one of owned: each is compared, as franz-go reports it, on a
// client made of the user's options alone and on one made of none (neither connects to anything).
func checkOwned(user []kgo.Opt, owned ...[]ownedOption) error {
	if len(user) == 0 {
		return nil
	}
	mine, err := kgo.NewClient(user...)
	if err != nil { // acks other than all refused by franz-go as they are by idempotence: named below
		var again error
		if mine, again = kgo.NewClient(append(user, kgo.DisableIdempotentWrite())...); again != nil {
			return fmt.Errorf("safepoint: the Kafka options given are refused by franz-go: %w", err)
		}
	}
	defer mine.Close()
	bare, err := kgo.NewClient()
	if err != nil {
		return fmt.Errorf("safepoint: cannot make a Kafka client: %w", err)
	}
	defer bare.Close()
	for _, group := range owned {
		for _, o := range group {
			if !sameValues(mine.OptValues(o.opt), bare.OptValues(o.opt)) {
				return fmt.Errorf("safepoint: the Kafka option %s is the client's own (its guarantees rest on it); "+
					"leave it out of WithKafkaOptions", o.name)
			}
		}
	}
	return nil
}

// checkShared refuses a caller's client (WithClient) whose settings would undo a reporter's guarantees,
// naming the setting; the client's MaxBufferedRecords otherwise (the reporter waits for room below it).
func checkShared(cl *kgo.Client) (int, error) {
	refuse := func(name, want string) (int, error) {
		return 0, fmt.Errorf("safepoint: the client given to WithClient has %s other than %s: the reporter's "+
			"guarantees rest on it", name, want)
	}
	if !reflect.DeepEqual(cl.OptValue(kgo.RequiredAcks), kgo.AllISRAcks()) {
		return refuse("RequiredAcks", "AllISRAcks()")
	}
	if disabled, _ := cl.OptValue(kgo.DisableIdempotentWrite).(bool); disabled {
		return refuse("DisableIdempotentWrite", "idempotent writes")
	}
	if manual, _ := cl.OptValue(kgo.ManualFlushing).(bool); manual {
		return refuse("ManualFlushing", "flushing as records come")
	}
	if id, _ := cl.OptValue(kgo.TransactionalID).(string); id != "" {
		return refuse("TransactionalID", "none")
	}
	if d, _ := cl.OptValue(kgo.RecordDeliveryTimeout).(time.Duration); d <= 0 {
		return refuse("RecordDeliveryTimeout", "a bound (a record not delivered in it fails and is repaired)")
	}
	p, _ := cl.OptValue(kgo.RecordPartitioner).(kgo.Partitioner)
	if p == nil || !crc32Keyed(p) {
		return refuse("RecordPartitioner", "CRC32Partitioner() (the partition of a node's key every client computes)")
	}
	limit, _ := cl.OptValue(kgo.MaxBufferedRecords).(int64)
	if limit <= 0 {
		limit = maxBufferedRecords
	}
	return int(limit), nil
}

// crc32Keyed: whether p puts a keyed record where CRC32Partitioner does, tried on keys and partition counts
// (a partitioner is a function: its results are what can be compared).
func crc32Keyed(p kgo.Partitioner) bool {
	want := CRC32Partitioner().ForTopic("t")
	got := p.ForTopic("t")
	for _, key := range []string{"n1", "db-7", "node-with-a-longer-name", "x"} {
		for _, n := range []int{2, 3, 5, 7, 12, 64} {
			r := &kgo.Record{Topic: "t", Key: []byte(key)}
			if !got.RequiresConsistency(r) || got.Partition(r, n) != want.Partition(r, n) {
				return false
			}
		}
	}
	return true
}

// sameValues compares two settings as franz-go reports them; a function or a pointer (a partitioner)
// by its type: franz-go makes a new one per client.
func sameValues(a, b []any) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := reflect.ValueOf(a[i]), reflect.ValueOf(b[i])
		if x.IsValid() && y.IsValid() && x.Type() == y.Type() {
			switch x.Kind() {
			case reflect.Func, reflect.Pointer, reflect.Interface:
				continue
			}
		}
		if !reflect.DeepEqual(a[i], b[i]) {
			return false
		}
	}
	return true
}

// closer runs a Close's work once: the first caller does it, the others wait for it (or their own ctx)
// and return its error.
type closer struct {
	once sync.Once
	done chan struct{}
	err  error
}

func newCloser() *closer { return &closer{done: make(chan struct{})} }

func (c *closer) close(ctx context.Context, what string, work func(context.Context) error) error {
	first := false
	c.once.Do(func() { first = true })
	if first {
		c.err = work(ctx)
		close(c.done)
		return c.err
	}
	select {
	case <-c.done:
		return c.err
	case <-ctx.Done():
		return fmt.Errorf("safepoint: the %s's close did not finish: %w", what, ctx.Err())
	}
}
