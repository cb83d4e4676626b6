package safepoint

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The values below are what the Python client and the job compute (core/signing.py) for the same input.
const (
	pyNodeKey = "8c9a150e8fce5a8307bdf88869e4c21132d1b702e536f97ee7d77166feffe47c" // node_key("secret", "c1", "n1")
	pyNodeSig = "hmac-sha256:56b4935ed4c3860689269f556f8e2fa4de488de7a767e1597330d1a97bc30a0a"
	pyCtlSig  = "hmac-sha256:df72f929b4efcd73d9586971ec16374836b491c63edba6bd554717ed50877282"
	pyOwner   = "1a7674eb4ee78df7e1ac439a93c3fa8e3c945784d4dec9fd8e3011738b2f1d62"
	pyPublic  = "d04ab232742bb4ab3a1368bd4615e4e6d0224ab71a016baf8520a332c9778737" // of the private key 11 * 32
	pyDirSig  = "ed25519:26b7124ab033ca9d7fef832b210de1ac93db5aaa2ca6986cac60c121778f1150d5f6ac6d00c0c3fb479f8b4ff8eb05d" +
		"669b31192f8bf5f0818cc1d3c540fde08"
)

func TestNodeSignatureIsThePythonOne(t *testing.T) {
	event := tricky()
	event["log_ms"] = 5 // the job's log time is not signed
	sig, err := signNode(event, pyNodeKey)
	if err != nil || sig != pyNodeSig {
		t.Fatalf("signNode = %q, %v; want %q", sig, err, pyNodeSig)
	}
}

func TestControlSignatureCoversItsFields(t *testing.T) {
	event := Event{"type": "service_hold", "cluster": "c1", "holder": "backup", "ts": 500, "ttl_ms": 60000,
		"action_id": "a1", "wall_ms": int64(1700000000000), "v": 1, "label": "nightly é"}
	sig, err := signControl(event, "k1")
	if err != nil || sig != pyCtlSig {
		t.Fatalf("signControl = %q, %v; want %q", sig, err, pyCtlSig)
	}
	event["extra"] = "not covered"
	if again, _ := signControl(event, "k1"); again != pyCtlSig {
		t.Fatal("a field outside the signed ones changed the signature")
	}
	if OwnerDigest("tok") != pyOwner {
		t.Fatal("owner digest differs from Python's")
	}
}

func directive() Event {
	obj, err := decodeObject([]byte(`{"v":1,"type":"compaction","cluster":"c1","safe_ts":1000,"seq":5,"catalog_ts":900,` +
		`"cluster_wall_ms":1700000000000,"generation":"g-1","namespaces":{"t0":950}}`))
	if err != nil {
		panic(err)
	}
	return obj
}

func TestDirectiveSignedByTheJobVerifies(t *testing.T) {
	keys, err := ParseDirectiveKeys(" " + pyPublic + " ")
	if err != nil {
		t.Fatal(err)
	}
	d := directive()
	if why := verifyDirective(d, keys); why != "unsigned" {
		t.Fatalf("an unsigned directive: %q", why)
	}
	d["sig"] = pyDirSig
	if why := verifyDirective(d, keys); why != "" {
		t.Fatalf("the job's signature refused: %q", why)
	}
	d["safe_ts"] = 1001
	if why := verifyDirective(d, keys); why != "bad_signature" {
		t.Fatalf("a changed directive: %q", why)
	}
	other, _ := ParseDirectiveKeys("aa" + pyPublic[2:])
	d["safe_ts"] = 1000
	if why := verifyDirective(d, other); why != "bad_signature" {
		t.Fatalf("another key: %q", why)
	}
	rotated, _ := ParseDirectiveKeys("aa" + pyPublic[2:] + "," + pyPublic)
	if why := verifyDirective(d, rotated); why != "" {
		t.Fatalf("the second key of a rotation: %q", why)
	}
}

func TestDirectiveKeysMustBeEd25519PublicKeys(t *testing.T) {
	for _, bad := range []string{"xyz", pyPublic[:62], pyPublic + "00"} {
		if _, err := ParseDirectiveKeys(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestCRC32PartitionerPlacesKeysAsLibrdkafka(t *testing.T) {
	// zlib.crc32(key) % n, librdkafka's consistent placement of a keyed record.
	want := map[string][2]int{"c1/n1": {2, 10}, "c1/n2": {0, 0}, "prod/db-7": {1, 5}, "x": {3, 3}}
	p := CRC32Partitioner().ForTopic("t")
	for key, parts := range want {
		for i, n := range []int{4, 12} {
			rec := &kgo.Record{Key: []byte(key)}
			if got := p.Partition(rec, n); got != parts[i] {
				t.Errorf("%s of %d partitions: %d, want %d", key, n, got, parts[i])
			}
		}
	}
}
