package safepoint

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
)

const (
	hmacPrefix      = "hmac-sha256:"
	directivePrefix = "ed25519:"
)

// signedControlFields are the fields a control event's signature covers (those the event has).
var signedControlFields = []string{"type", "cluster", "holder", "ts", "ttl_ms", "label", "reason", "gap", "action_id",
	"wall_ms", "owner", "owner_token", "force", "by"}

func hmacHex(key string, body []byte) string {
	mac := hmac.New(sha256.New, []byte(key))
	mac.Write(body)
	return hex.EncodeToString(mac.Sum(nil))
}

// signNode is a node event's sig with the node's own key: HMAC-SHA256 of every field but sig and log_ms.
func signNode(event Event, key string) (string, error) {
	body := make(Event, len(event))
	for k, v := range event {
		if k != "sig" && k != "log_ms" {
			body[k] = v
		}
	}
	raw, err := compactJSON(body)
	if err != nil {
		return "", err
	}
	return hmacPrefix + hmacHex(key, raw), nil
}

// signControl is a control event's sig with a control key: HMAC-SHA256 of its signed fields.
func signControl(event Event, key string) (string, error) {
	body := Event{}
	for _, k := range signedControlFields {
		if v, ok := event[k]; ok {
			body[k] = v
		}
	}
	raw, err := compactJSON(body)
	if err != nil {
		return "", err
	}
	return hmacPrefix + hmacHex(key, raw), nil
}

// OwnerDigest is a hold's owner as the control events carry it: the SHA-256 (hex) of its owner token.
func OwnerDigest(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// ParseDirectiveKeys reads the job's public keys (64 hex digits each; a comma-separated list during a
// rotation) that directives must be signed with.
func ParseDirectiveKeys(text string) ([]ed25519.PublicKey, error) {
	var keys []ed25519.PublicKey
	for _, part := range strings.Split(text, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		raw, err := hex.DecodeString(part)
		if err != nil || len(raw) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("safepoint: a directive key is an Ed25519 public key of 64 hex digits, not %q", part)
		}
		keys = append(keys, ed25519.PublicKey(raw))
	}
	return keys, nil
}

// verifyDirective says why a directive is not signed by one of keys ("unsigned", "bad_signature"), or "".
func verifyDirective(obj Event, keys []ed25519.PublicKey) string {
	sig, ok := obj["sig"].(string)
	if !ok || !strings.HasPrefix(sig, directivePrefix) {
		return "unsigned"
	}
	raw, err := hex.DecodeString(sig[len(directivePrefix):])
	if err != nil {
		return "bad_signature"
	}
	body := make(Event, len(obj))
	for k, v := range obj {
		if k != "sig" {
			body[k] = v
		}
	}
	canonical, err := compactJSON(body)
	if err != nil {
		return "bad_signature"
	}
	for _, key := range keys {
		if ed25519.Verify(key, canonical, raw) {
			return ""
		}
	}
	return "bad_signature"
}
