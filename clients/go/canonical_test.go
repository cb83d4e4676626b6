package safepoint

import (
	"encoding/hex"
	"testing"
)

// tricky is an event whose canonical form exercises what JSON encoders differ in: key order across
// scripts (code point order, as Python sorts), U+2028, an astral character, HTML characters, controls.
func tricky() Event {
	return Event{"v": 1, "type": "reader_open", "cluster": "c1", "node": "n1", "seq": 3,
		"reader_id": "r\u2028é\U0001F600/<>&\"\\\n\t\x01\x7f", "ts": 100, "wall_ms": int64(1700000000000),
		"groups": []string{"b", "a"}, "label": nil, "ok": true,
		"z": map[string]any{"é": 1, "e": 2, "\uff01": 3, "\U0001F600": 4}}
}

// Python's json.dumps(tricky, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode().
const trickyCanonical = "7b22636c7573746572223a226331222c2267726f757073223a5b2262222c2261225d2c226c6162656c223a6e756c6c2c" +
	"226e6f6465223a226e31222c226f6b223a747275652c227265616465725f6964223a2272e280a8c3a9f09f98802f3c3e265c225c5c5c6e5c74" +
	"5c75303030317f222c22736571223a332c227473223a3130302c2274797065223a227265616465725f6f70656e222c2276223a312c227761" +
	"6c6c5f6d73223a313730303030303030303030302c227a223a7b2265223a322c22c3a9223a312c22efbc81223a332c22f09f9880223a347d7d"

func TestCompactJSONIsPythons(t *testing.T) {
	got, err := compactJSON(tricky())
	if err != nil {
		t.Fatal(err)
	}
	if hex.EncodeToString(got) != trickyCanonical {
		t.Fatalf("canonical form differs from Python's:\n got %s", got)
	}
}

func TestUnescapeSeparatorsLeavesOtherEscapes(t *testing.T) {
	cases := map[string]string{
		`"a\u2028b"`:   "\"a\u2028b\"",
		`"a\u2029"`:    "\"a\u2029\"",
		`"a\\u2028"`:   `"a\\u2028"`, // an escaped backslash followed by the letters u2028
		`"\u0001x"`:    `"\u0001x"`,
		`"plain text"`: `"plain text"`,
	}
	for in, want := range cases {
		if got := string(unescapeSeparators([]byte(in))); got != want {
			t.Errorf("unescapeSeparators(%s) = %s, want %s", in, got, want)
		}
	}
}

func TestDecodeObjectKeepsNumbersAsWritten(t *testing.T) {
	obj, err := decodeObject([]byte(`{"safe_ts":9007199254740993,"seq":1}`))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := compactJSON(obj)
	if string(raw) != `{"safe_ts":9007199254740993,"seq":1}` {
		t.Fatalf("a number beyond float64's precision changed: %s", raw)
	}
}
