"""Fuzzing the event parser and the core through ``Engine.process``: random bytes, random JSON
values, and valid events mutated (fields dropped, retyped, negated, made huge, replaced by nested
junk or odd unicode, types swapped) among valid ones, so that the mutations meet real state.

For every message: no exception escapes; it is counted exactly once in ``Engine.counts`` as
``applied``, ``ignored:<known reason>`` or ``deadlettered`` (CONTRACT "Dead letters": nothing is
silently lost); a dead-lettered one yields exactly one dead letter of the contract's shape that
names its position and carries the original value (text, or base64 when not UTF-8); every output
validates against its schema and encodes to UTF-8 (the sink writes UTF-8); and the whole state
still goes through JSON (the job stores it so between micro-batches).

SAFEPOINT_FUZZ_EXAMPLES raises the number of examples for a deeper hunt.
"""

from __future__ import annotations

import base64
import json
import os
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from safepoint.core import DEADLETTER, Engine, Policy, Position
from safepoint.core.codec import encode
from safepoint.core.events import parse

from core_helpers import EVENTS_TOPIC, check_output, restore_engine

EXAMPLES = int(os.environ.get("SAFEPOINT_FUZZ_EXAMPLES", "200"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
T0 = 1_700_000_000_000
NODES = ("n1", "n2", "n3")
IDS = ("a", "b", "c")
IGNORE_REASONS = {"duplicate", "older_seq", "stale_incarnation", "stale_version"}

# A policy whose pressure rules fire at once, so fuzzed figures reach bands, in-doubt and expiry code.
TOUCHY = Policy(
    retention=10,
    node_lease_ms=1_000,
    max_message_bytes=600,
    pinned_warning_enter_bytes=100,
    pinned_warning_exit_bytes=80,
    pinned_critical_enter_bytes=400,
    pinned_critical_exit_bytes=320,
    band_enter_window_ms=0,
    band_exit_window_ms=0,
    reader_age_warning_ms=10,
    reader_age_critical_ms=20,
    stall_ms=100,
    in_doubt_timeout_ms=10,
    expire_after_ms=0,
    max_reader_lifetime_ms=0,
    expire_grace_ms=5,
)
policies = st.sampled_from([Policy(), Policy(retention=100, directive_interval_ms=500), TOUCHY])

# -- valid events ----------------------------------------------------------------------------------

small_ts = st.integers(-5, 3_000)
walls = st.integers(T0, T0 + 5_000)
ids = st.sampled_from(IDS)
labels = st.text(max_size=8)


def node_event(type_: str, **fields: Any) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            "v": st.just(1),
            "type": st.just(type_),
            "node": st.sampled_from(NODES),
            "incarnation": st.integers(0, 2),
            "seq": st.integers(0, 30),
            "wall_ms": walls,
            **fields,
        },
        optional={"cluster": st.sampled_from(["default", "c2"])},
    )


def cluster_event(type_: str, **fields: Any) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"v": st.just(1), "type": st.just(type_), "version": st.integers(0, 5), "wall_ms": walls, **fields},
        optional={"cluster": st.sampled_from(["default", "c2"])},
    )


group_entry = st.fixed_dictionaries(
    {"group": st.sampled_from(["g1", "g2"])},
    optional={"leader": st.booleans(), "published_min_tx_time": st.one_of(st.none(), small_ts)},
)
valid_events = st.one_of(
    node_event("reader_open", reader_id=ids, read_ts=small_ts, label=labels),
    node_event("reader_close", reader_id=ids),
    node_event("tx_begin", tx_id=ids, begin_ts=small_ts),
    node_event("tx_prepare", tx_id=ids, coordinator=st.sampled_from(NODES), participants=st.lists(st.sampled_from(NODES), max_size=3)),
    node_event("tx_end", tx_id=ids, outcome=st.sampled_from(["commit", "abort"])),
    node_event(
        "heartbeat",
        mvcc_now=small_ts,
        pinned_bytes=st.integers(0, 1_000),
        groups=st.lists(group_entry, max_size=2),
    ),
    node_event(
        "snapshot",
        cut=small_ts,
        readers=st.lists(st.fixed_dictionaries({"reader_id": ids, "read_ts": small_ts}), max_size=3),
        txs=st.lists(st.fixed_dictionaries({"tx_id": ids, "begin_ts": small_ts}, optional={"prepared": st.booleans()}), max_size=3),
    ),
    cluster_event("topology", nodes=st.dictionaries(st.sampled_from(NODES), st.lists(st.sampled_from(["g1", "g2"]), max_size=2))),
    cluster_event("catalog", catalog_version=st.integers(0, 5), activated_at=small_ts),
    cluster_event("index_build", index=ids, catalog_version=st.integers(0, 5), state=st.sampled_from(["started", "finished"])),
    cluster_event("rebalance", group=ids, catalog_version=st.integers(0, 5), state=st.sampled_from(["started", "finished"])),
)

# -- junk and mutations ---------------------------------------------------------------------------

odd_text = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["", " ", "\x00", "é", "日本語", "🙂", "\u202e", "a" * 300, "null", "1", "-0", "NaN", "\ud800", "x\udfff"]),
)
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    odd_text,
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(odd_text, inner, max_size=4)),
    max_leaves=12,
)
huge_ints = st.sampled_from([2**63, 2**63 - 1, -(2**63), -(2**63) - 1, 2**64, 10**30, -(10**30), 32_503_680_000_001])
retyped = st.one_of(json_values, huge_ints, st.sampled_from([1.5, 1.0, 1e300, -0.0, True, False, "12", [], {}, [1], {"x": 1}]))
MUTATIONS = ("drop", "retype", "negate", "huge", "junk_field", "swap_type", "unicode", "deep")


@st.composite
def mutated_events(draw: st.DrawFn) -> str:
    """A valid event with one to three mutations, as JSON text (``deep`` splices nesting no encoder writes)."""
    ev: dict[str, Any] = dict(draw(valid_events))
    deep = 0
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(MUTATIONS))
        key = draw(st.sampled_from(sorted(ev))) if ev else "v"
        if op == "drop":
            ev.pop(key, None)
        elif op == "retype":
            ev[key] = draw(retyped)
        elif op == "negate":
            value = ev.get(key)
            ev[key] = -value if isinstance(value, int) and not isinstance(value, bool) else -1
        elif op == "huge":
            ev[key] = draw(huge_ints)
        elif op == "junk_field":
            ev[draw(odd_text)] = draw(json_values)
        elif op == "swap_type":
            ev["type"] = draw(st.sampled_from(["reader_open", "heartbeat", "snapshot", "topology", "tx_prepare", "catalog", "Heartbeat", ""]))
        elif op == "unicode":
            ev[key] = draw(odd_text)
        elif op == "deep":
            deep = draw(st.sampled_from([50, 900, 5_000]))
    text = json.dumps(ev)
    if deep and text.endswith("}"):
        text = text[:-1] + (", " if len(ev) else "") + '"junk": ' + "[" * deep + "]" * deep + "}"
    return text


def as_wire(text: str, how: str) -> bytes | str:
    return text if how == "str" else text.encode("utf-8")


raw_messages = st.one_of(
    st.binary(max_size=200),
    st.binary(max_size=80).map(lambda b: b'{"v":1,"type":"heartbeat",' + b),
    st.sampled_from([b"", b"{}", b"[]", b"null", b"1", b'"x"', b"\xff", b"\xc3\x28", b"{" * 3000, b'{"v":1}', b"\x00" * 5]),
    st.none(),
)
messages = st.one_of(
    raw_messages,
    st.tuples(json_values.map(json.dumps), st.sampled_from(["bytes", "str"])).map(lambda t: as_wire(*t)),
    st.tuples(mutated_events(), st.sampled_from(["bytes", "bytes", "str"])).map(lambda t: as_wire(*t)),
    valid_events.map(lambda ev: json.dumps(ev).encode()),
    valid_events.map(lambda ev: json.dumps(ev).encode()),
)
keys = st.one_of(st.none(), st.sampled_from([b"n1", "n2", b"default"]), st.binary(max_size=8))


# -- the harness -----------------------------------------------------------------------------------


def warm_engine(policy: Policy) -> Engine:
    """An engine with some state: a topology, heartbeats, a reader and a prepared transaction."""
    engine = Engine(policy)
    prelude: list[dict[str, Any]] = [{"v": 1, "type": "topology", "version": 0, "wall_ms": T0, "nodes": {n: [] for n in NODES}}]
    for i, n in enumerate(NODES):
        base = {"v": 1, "node": n, "incarnation": 0, "wall_ms": T0 + i}
        prelude += [
            {**base, "type": "heartbeat", "seq": 0, "mvcc_now": 1_000, "pinned_bytes": 50},
            {**base, "type": "reader_open", "seq": 1, "reader_id": "a", "read_ts": 990},
            {**base, "type": "tx_begin", "seq": 2, "tx_id": "b", "begin_ts": 995},
            {**base, "type": "tx_prepare", "seq": 3, "tx_id": "b", "coordinator": "n1", "participants": list(NODES)},
        ]
    for i, ev in enumerate(prelude):
        engine.process(json.dumps(ev), Position(EVENTS_TOPIC, 0, i, None))
    return engine


def feed(engine: Engine, value: bytes | str | None, key: bytes | str | None, offset: int) -> None:
    """One message through the engine, with every per-message property checked."""
    before = dict(engine.counts)
    pos = Position(EVENTS_TOPIC, offset % 3, offset, key)
    outs = engine.process(value, pos)
    diff = {k: v - before.get(k, 0) for k, v in engine.counts.items() if v != before.get(k, 0)}
    assert list(diff.values()) == [1], f"counted {diff} for {value!r}"
    [label] = diff
    assert label in ("applied", "deadlettered") or (
        label.startswith("ignored:") and label.split(":", 1)[1] in IGNORE_REASONS
    ), label
    dead = [o for o in outs if o.channel == DEADLETTER]
    if label == "deadlettered":
        assert len(outs) == 1 and len(dead) == 1, outs
        dl = dead[0].value
        assert (dl["v"], dl["topic"], dl["partition"], dl["offset"]) == (1, EVENTS_TOPIC, pos.partition, pos.offset)
        assert isinstance(dl["error"], str) and dl["error"]
        assert dl["key"] == (key.decode("utf-8", "replace") if isinstance(key, bytes) else key)
        if value is None:
            assert dl["value"] is None
        elif isinstance(value, str) or dl.get("value_encoding", "utf-8") == "utf-8":
            assert dl["value"] == (value if isinstance(value, str) else value.decode("utf-8"))
        else:
            assert dl["value_encoding"] == "base64" and base64.b64decode(dl["value"]) == value
    else:
        assert not dead, dead
    for out in outs:
        check_output(out)
        encode(out.value).encode("utf-8")  # the sink writes UTF-8: nothing unencodable may come out


@SETTINGS
@given(policy=policies, batch=st.lists(st.tuples(raw_messages, keys), min_size=1, max_size=15))
def test_random_bytes_never_escape(policy: Policy, batch: list[tuple[bytes | None, Any]]) -> None:
    engine = warm_engine(policy)
    for i, (value, key) in enumerate(batch):
        feed(engine, value, key, 100 + i)
    restore_engine(engine)


@SETTINGS
@given(policy=policies, batch=st.lists(st.tuples(json_values, st.sampled_from(["bytes", "str"])), min_size=1, max_size=15))
def test_random_json_values_are_dead_lettered(policy: Policy, batch: list[tuple[Any, str]]) -> None:
    engine = warm_engine(policy)
    for i, (value, how) in enumerate(batch):
        feed(engine, as_wire(json.dumps(value), how), b"n1", 100 + i)
    restore_engine(engine)


@SETTINGS
@given(policy=policies, batch=st.lists(st.tuples(messages, keys), min_size=1, max_size=40))
def test_mutated_and_valid_events_mixed(policy: Policy, batch: list[tuple[bytes | str | None, Any]]) -> None:
    """Mutations among valid events: they meet real state (readers, prepared transactions, bands)."""
    engine = warm_engine(policy)
    for i, (value, key) in enumerate(batch):
        feed(engine, value, key, 100 + i)
        if i % 10 == 9:
            restore_engine(engine)  # a micro-batch boundary: the state goes through JSON
    restore_engine(engine)
    feed(engine, json.dumps({"v": 1, "type": "heartbeat", "node": "n1", "incarnation": 9, "seq": 0, "wall_ms": T0 + 9_000,
                             "mvcc_now": 5_000}).encode(), b"n1", 10_000)


@SETTINGS
@given(policy=policies, batch=st.lists(mutated_events(), min_size=1, max_size=20))
def test_every_mutation_is_applied_ignored_or_dead_lettered(policy: Policy, batch: list[str]) -> None:
    engine = warm_engine(policy)
    for i, text in enumerate(batch):
        feed(engine, text.encode("utf-8"), b"n2", 100 + i)
    restore_engine(engine)


def test_lone_surrogates_are_dead_lettered() -> None:
    """JSON may escape a lone UTF-16 surrogate that no UTF-8 output could carry: such a message is a dead letter."""
    engine = warm_engine(Policy())
    ev = {"v": 1, "type": "reader_open", "node": "n1", "incarnation": 0, "seq": 10, "wall_ms": T0 + 100,
          "reader_id": "r\ud800", "read_ts": 1, "label": "\udfff"}
    feed(engine, json.dumps(ev).encode("ascii"), b"n1", 100)
    assert engine.counts["deadlettered"] == 1


def _boundaries(schema: dict[str, Any]) -> list[Any]:
    """Values at and just past each bound the schema sets, and of the wrong type."""
    out: list[Any] = [None, True, 1.0, "1", [], {}]
    for alt in schema.get("oneOf", [schema]):
        if "minimum" in alt:
            out += [alt["minimum"], alt["minimum"] - 1]
        if "maximum" in alt:
            out += [alt["maximum"], alt["maximum"] + 1]
        if "minLength" in alt:
            out += ["x" * alt["minLength"], "x" * max(alt["minLength"] - 1, 0)]
        if "maxLength" in alt:
            out += ["y" * alt["maxLength"], "y" * (alt["maxLength"] + 1)]
        if "maxItems" in alt:
            out += [[], ["z"] * (alt["maxItems"] + 1)]
        if "const" in alt:
            out += [alt["const"]]
        out += list(alt.get("enum", []))
    return out


def _paths(value: Any, schema: dict[str, Any], path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Every place in an event with the schema that governs it (properties and array items)."""
    found = [(path, schema)] if path else []
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for key, sub in value.items():
            if key in props:
                found += _paths(sub, props[key], (*path, key))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, sub in enumerate(value):
            found += _paths(sub, schema["items"], (*path, i))
    return found


@st.composite
def boundary_events(draw: st.DrawFn) -> str:
    """A valid event with one value, anywhere in it, set at or just past a bound of its schema."""
    from safepoint.schemas import load

    ev = draw(valid_events)
    path, schema = draw(st.sampled_from(_paths(ev, load("events", ev["type"]))))
    return json.dumps(_with(ev, path, draw(st.sampled_from(_boundaries(schema)))))


def _with(event: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """A deep copy of ``event`` with ``value`` at ``path``."""
    ev = json.loads(json.dumps(event))
    target = ev
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return ev


def same_verdict(value: bytes | str | None) -> None:
    """``parse`` against the reference parser (``json``'s decoder and the full validator)."""
    fast, ref = parse(value, 1 << 20), parse(value, 1 << 20, reference=True)
    assert fast == ref, (value, fast, ref)  # the same dict, or the same dead letter (class and words)


@settings(max_examples=EXAMPLES * 5, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(value=st.one_of(messages, mutated_events(), boundary_events(), boundary_events(), st.builds(json.dumps, json_values)))
def test_the_fast_decoder_and_quick_test_give_the_validators_verdict(value: bytes | str | None) -> None:
    """msgspec's decoder and the schema-compiled quick test (``core/fastcheck.py``) accept and
    reject exactly what ``json`` and the JSON Schema validator do, with the same dead letter."""
    same_verdict(value)
    if isinstance(value, str):
        same_verdict(value.encode("utf-8", "surrogatepass"))
