package safepoint

import (
	"bytes"
	"encoding/json"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Event is one JSON object on the wire: an event the reporter publishes, a directive it reads.
type Event = map[string]any

// compactJSON writes v as compact UTF-8 JSON: objects' keys sorted (Go sorts a map's keys), nothing
// escaped but what JSON must escape, so that it equals Python's
// json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False) for the contract's values
// (integers, strings, booleans, null, lists and objects of them): the form signatures are taken over.
func compactJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return unescapeSeparators(bytes.TrimRight(buf.Bytes(), "\n")), nil
}

// unescapeSeparators puts back U+2028 and U+2029, which Go's encoder writes as \u2028 and \u2029 (for
// JavaScript) and Python writes as they are.
func unescapeSeparators(b []byte) []byte {
	if !bytes.Contains(b, []byte(`\u202`)) {
		return b
	}
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); i++ {
		if b[i] == '\\' && i+5 < len(b) && b[i+1] == 'u' && b[i+2] == '2' && b[i+3] == '0' && b[i+4] == '2' &&
			(b[i+5] == '8' || b[i+5] == '9') {
			if b[i+5] == '8' {
				out = append(out, "\u2028"...)
			} else {
				out = append(out, "\u2029"...)
			}
			i += 5
			continue
		}
		out = append(out, b[i])
		if b[i] == '\\' && i+1 < len(b) { // an escape's second character is never the start of another
			i++
			out = append(out, b[i])
		}
	}
	return out
}

// decodeObject reads one JSON object, its numbers kept as written (json.Number), so that a directive's
// canonical form is the one its signer took.
func decodeObject(raw []byte) (Event, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var obj Event
	if err := dec.Decode(&obj); err != nil {
		return nil, err
	}
	return obj, nil
}

// ClusterHeader is the Kafka record header in which every event this client publishes names its
// cluster: the job groups the record by it without reading the value.
const ClusterHeader = "safepoint-cluster"

// clusterHeader is a record's headers naming cluster (a slice of its own per record: franz-go keeps
// the record until it is delivered).
func clusterHeader(cluster string) []kgo.RecordHeader {
	return []kgo.RecordHeader{{Key: ClusterHeader, Value: []byte(cluster)}}
}
