"""Signed control events: only who holds a control key steers a cluster.

Any producer allowed to write the control topic (``core/origin.py``: ACLs give it to operators and
holders; with ``control_on_events_topic``, the events topic, which every database node writes) could
otherwise publish a ``service_release`` of an operator's hold or a ``pause``: nothing in an event
says who sent it. With
``control_keys`` set (the top level, or a cluster's ``[clusters.NAME]`` table) every control event
of the cluster must carry ``sig``, an HMAC-SHA256 over its canonical fields with one of the keys
(two or more are accepted at once while a key is rotated: publishers sign with the first).

* **Canonical fields**: the event's ``SIGNED`` fields that it has, as JSON with sorted keys and no
  spaces (``canonical``). A field outside them (none of the contract's control fields is) is not
  covered.
* **Refused**: an event without ``sig`` (``unsigned``), with one no key gives (``bad_signature``),
  or whose ``wall_ms`` lies more than ``control_signature_window_ms`` from its log time
  (``stale_signature``: a signed event sent again later, whose ``action_id`` the job may have
  forgotten, cannot act twice). The job records the refusal as the action's outcome, counts it and
  raises a critical ``control_refused`` alert naming the event; the next accepted signed event of
  the cluster clears it.

**Node events** may be signed too, each by its own node (``node_key_secret``: the job derives
node N's key of cluster C as ``HMAC(secret, "C/N")`` and checks that the node an event names signed
it; ``sign_node``, ``verify_node``): a node then speaks only for itself. Its signature covers every
field but ``sig`` and the ``log_ms`` the job adds.

**Directives** are signed by the job (``directive_keys``: Ed25519 private keys, the first signs), so
that whoever may write the directives topic but holds no key cannot make a node compact: a node, an
agent or a listener holds only the public keys (``verify_directive``), which sign nothing, so a
compromised node cannot sign one either. The signature covers every field but ``sig``, as
``directive_canonical`` writes them; Ed25519 is deterministic, so replay signs what the job signs.

What a signature does not protect against: a holder of a key (it signs anything), a replay within
the window of an action the job still remembers (ignored as ``repeated``) or forgotten (after 256
newer actions of the cluster within the window), events dropped or delayed on their way (a missing
release leaves a hold to its TTL), and a node that misreports its own readers and transactions
(its key signs whatever it says of itself).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import msgspec

__all__ = ["DIRECTIVE_PREFIX", "PREFIX", "SIGNED", "canonical", "directive_canonical", "node_key", "owner_digest",
           "public_key_of", "sign", "sign_directive", "sign_node", "verify", "verify_directive", "verify_node"]

PREFIX = "hmac-sha256:"
SIGNED = ("type", "cluster", "holder", "ts", "ttl_ms", "label", "reason", "gap", "action_id", "wall_ms", "owner",
          "owner_token", "force", "by")
"""The fields a signature covers (those the event has)."""


def canonical(event: Mapping[str, Any]) -> bytes:
    return json.dumps({k: event[k] for k in SIGNED if k in event}, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode()


NOT_SIGNED = frozenset({"sig", "log_ms"})
"""A node event's fields its signature does not cover: the signature, and the log time the job adds."""


@lru_cache(maxsize=65_536)
def node_key(secret: str, cluster: str, node: str) -> str:
    """Node ``node``'s own key, derived from the cluster's ``node_key_secret``: the job holds one
    secret, each node only its key (``safepoint node-key``), so a node cannot sign for another."""
    return hmac.digest(secret.encode(), f"{cluster}/{node}".encode(), "sha256").hex()


_SORTED = msgspec.json.Encoder(order="sorted")


def node_canonical(event: Mapping[str, Any]) -> bytes:
    """A node event's signed form: every field but ``sig`` and ``log_ms``, as compact UTF-8 JSON with
    sorted keys (msgspec's; the same bytes as Python's ``json.dumps(sort_keys=True, separators=(",",
    ":"), ensure_ascii=False)`` for the contract's node events, whose numbers are integers, at a
    seventh of its cost: the job checks every node event)."""
    return _SORTED.encode({k: v for k, v in event.items() if k not in NOT_SIGNED})


def sign_node(event: Mapping[str, Any], key: str) -> str:
    """The ``sig`` of a node event with the node's key (``Reporter(node_key=...)``)."""
    return PREFIX + hmac.digest(key.encode(), node_canonical(event), "sha256").hex()


def verify_node(event: Mapping[str, Any], secret: str) -> str | None:
    """None when the node the event names signed it with its key, else ``unsigned_node_event`` or
    ``bad_node_signature`` (another node's key, or a changed field)."""
    sig = event.get("sig")
    if not isinstance(sig, str) or not sig:
        return "unsigned_node_event"
    key = node_key(secret, event.get("cluster", "default"), event["node"])
    if not hmac.compare_digest(sig, PREFIX + hmac.digest(key.encode(), node_canonical(event), "sha256").hex()):
        return "bad_node_signature"
    return None


DIRECTIVE_PREFIX = "ed25519:"
"""A directive's ``sig``: this, then the Ed25519 signature's 64 bytes in hex."""


def directive_canonical(value: Mapping[str, Any]) -> bytes:
    """A directive's signed form: every field but ``sig``, as compact UTF-8 JSON with every object's keys
    sorted (as Python's ``json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False)``)."""
    return _SORTED.encode({k: v for k, v in value.items() if k != "sig"})


@lru_cache(maxsize=128)
def _ed25519(key: str, private: bool) -> Any:
    """An Ed25519 key from its 64 hex digits: the job's private key, or a node's public one."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

    try:
        raw = bytes.fromhex(key.strip())
        return Ed25519PrivateKey.from_private_bytes(raw) if private else Ed25519PublicKey.from_public_bytes(raw)
    except ValueError as exc:
        which = "private" if private else "public"
        msg = f"a directive key is an Ed25519 {which} key: 64 hex digits (safepoint directive-key makes a pair)"
        raise ValueError(msg) from exc


def _private(key: str) -> Any:
    return _ed25519(key, True)


def _public(key: str) -> Any:
    return _ed25519(key, False)


def public_key_of(private: str) -> str:
    """The public key (64 hex digits) of an Ed25519 private key given as 64 hex digits."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return str(_private(private).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex())


def sign_directive(value: Mapping[str, Any], private: str) -> str:
    """The ``sig`` of a directive with the job's private key."""
    return DIRECTIVE_PREFIX + str(_private(private).sign(directive_canonical(value)).hex())


def verify_directive(value: Mapping[str, Any], public: Sequence[str]) -> str | None:
    """None when one of the ``public`` keys signed the directive, else ``unsigned`` or ``bad_signature``."""
    from cryptography.exceptions import InvalidSignature

    sig = value.get("sig")
    if not isinstance(sig, str) or not sig.startswith(DIRECTIVE_PREFIX):
        return "unsigned"
    try:
        raw = bytes.fromhex(sig[len(DIRECTIVE_PREFIX):])
    except ValueError:
        return "bad_signature"
    body = directive_canonical(value)
    for key in public:
        try:
            _public(key).verify(raw, body)
        except InvalidSignature:
            continue
        return None
    return "bad_signature"


def owner_digest(token: str) -> str:
    """A hold's ``owner``: the SHA-256 (hex) of its owner's token (``core/control.py``)."""
    return hashlib.sha256(token.encode()).hexdigest()


def sign(event: Mapping[str, Any], key: str) -> str:
    """The ``sig`` of ``event`` with ``key``."""
    return PREFIX + hmac.new(key.encode(), canonical(event), hashlib.sha256).hexdigest()


def verify(event: Mapping[str, Any], keys: Sequence[str], log_ms: int, window_ms: int) -> str | None:
    """None when one of ``keys`` signed ``event`` within ``window_ms`` of its log time ``log_ms``,
    else why not: ``unsigned``, ``bad_signature`` or ``stale_signature``."""
    sig = event.get("sig")
    if not isinstance(sig, str) or not sig:
        return "unsigned"
    body = canonical(event)
    if not any(hmac.compare_digest(sig, PREFIX + hmac.new(k.encode(), body, hashlib.sha256).hexdigest()) for k in keys):
        return "bad_signature"
    if window_ms and abs(event["wall_ms"] - log_ms) > window_ms:
        return "stale_signature"
    return None
