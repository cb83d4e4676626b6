"""Outputs on the wire: JSON Schema conformance, exact bytes, and state persistence.

docs/contributing.md, rule 8: the JSON Schema files in ``schemas/`` are the single source; a test pins each
schema's exact bytes on the wire for a few examples.
"""

from __future__ import annotations

import importlib.util
import json
from typing import Any

import jsonschema
import pytest

from safepoint.core import ClusterState, NodeState
from safepoint.schemas import OUTPUT_NAMES, load

from core_helpers import NodeClient, Run, check_output, cluster_event, topology, validator

T0 = 1_700_000_000_000


def contract_example_run() -> Run:
    """The CONTRACT Directives example, rebuilt from events."""
    run = Run(node_lease_ms=30_000)
    n1, n2 = NodeClient("n1", cluster="c1"), NodeClient("n2", cluster="c1")
    run.feed(
        topology(1, T0, {"n1": [], "n2": []}, cluster="c1"),
        cluster_event("catalog", 1, T0, cluster="c1", catalog_version=7, activated_at=1_699_999_990_000_000),
    )
    reader = {
        "reader_id": "r-991",
        "read_ts": 1_700_000_000_000_000,
        "label": "report-job",
        "opened_wall_ms": T0 + 123 - 5_400_000,
    }
    run.feed(n2.snapshot(T0, readers=[reader], txs=[]))
    run.feed(n1.hb(T0, 1_700_000_000_500_000), n2.hb(T0 + 123, 1_700_000_000_600_000))
    return run


DIRECTIVE_WIRE = (
    '{"v": 1, "type": "compaction", "cluster": "c1", "seq": 1, "safe_ts": 1700000000000000, "catalog_floor": 7, '
    '"cluster_wall_ms": 1700000000123, '
    '"blocker": {"node": "n2", "kind": "reader", "id": "r-991", "ts": 1700000000000000, "age_ms": 5400000, '
    '"label": "report-job"}, '
    '"basis": {"n2": {"incarnation": 0, "seq": 1, "local_min": 1700000000000000}, '
    '"n1": {"incarnation": 0, "seq": 0, "local_min": 1700000000500000}}, '
    '"members": 2, "positions": {"0": 5}, '
    '"retention": 0}'  # the contract's example (the lowest minimums first), the member count, each partition's
    # position, and the job's retention (lazy registration checks it)
)

VIOLATION_WIRE = (
    '{"v": 1, "type": "alert", "kind": "horizon_violation", "state": "raised", "severity": "critical", '
    '"cluster": "c1", "node": "n2", "value": 1, "threshold": 1700000000000000, "since_wall_ms": 1700000000200, '
    '"cluster_wall_ms": 1700000000200, '
    '"detail": "reader late on node n2 needs ts 1, below safe_ts 1700000000000000 already sent: versions it reads '
    'may be compacted", "id": "c1/horizon_violation/n2/reader/late"}'
)

DEADLETTER_WIRE = (
    '{"v": 1, "error": "not UTF-8: invalid start byte at byte 40", "topic": "safepoint.events", "partition": 0, '
    '"offset": 6, "key": "n3", "value": "eyJ2IjogMSwgInR5cGUiOiAiaGVhcnRiZWF0IiwgIm5vZGUiOiAibv8ifQ==", '
    '"value_encoding": "base64"}'
)

DEADLETTER_TEXT_WIRE = (
    '{"v": 1, "error": "invalid heartbeat: mistyped field seq must be integer", "topic": "safepoint.events", '
    '"partition": 0, "offset": 7, "key": "n3", '
    '"value": "{\\"v\\":1,\\"type\\":\\"heartbeat\\",\\"node\\":\\"n3\\",\\"incarnation\\":0,\\"seq\\":1.0,'
    '\\"wall_ms\\":5,\\"mvcc_now\\":1}", "value_encoding": "utf-8"}'
)


def wire_examples() -> tuple[Run, list[Any]]:
    run = contract_example_run()
    n2 = NodeClient("n2", cluster="c1")
    n2.seq = 2
    run.feed(n2.open("late", 1, T0 + 200))
    run.raw(b'{"v": 1, "type": "heartbeat", "node": "n\xff"}', b"n3")
    run.raw('{"v":1,"type":"heartbeat","node":"n3","incarnation":0,"seq":1.0,"wall_ms":5,"mvcc_now":1}', "n3")
    return run, run.outputs


def test_contract_directive_example_exact_bytes() -> None:
    """docs/contract.md, Outputs; docs/contributing.md, rule 8: exact bytes of a directive, keys in contract order."""
    run = contract_example_run()
    [m, d] = [o for o in run.outputs if o.channel == "directives"]
    assert d.key == "c1"
    assert json.dumps(d.value) == DIRECTIVE_WIRE
    assert m.key == "c1/%members"
    assert json.dumps(m.value) == '{"v": 1, "type": "members", "cluster": "c1", "seq": 1, "nodes": ["n1", "n2"]}'


def test_alert_and_dead_letter_exact_bytes() -> None:
    """CONTRACT Alerts / Dead letters: exact bytes of a horizon_violation alert and two dead letters."""
    _, outs = wire_examples()
    alert, dl_bin, dl_text = outs[-3:]
    assert (alert.channel, alert.key) == ("alerts", "n2")
    assert json.dumps(alert.value) == VIOLATION_WIRE
    assert (dl_bin.channel, dl_bin.key) == ("deadletter", "n3")
    assert json.dumps(dl_bin.value) == DEADLETTER_WIRE
    assert json.dumps(dl_text.value) == DEADLETTER_TEXT_WIRE


def test_codec_is_compact_form_of_the_same_bytes() -> None:
    """docs/contributing.md, rule 8: the one encoding the job writes (core/codec.py) is the same object, compact."""
    if importlib.util.find_spec("safepoint.core.codec") is None:
        pytest.skip("safepoint.core.codec is not there yet")
    from safepoint.core.codec import encode

    for wire, out in zip(
        (DIRECTIVE_WIRE, VIOLATION_WIRE), (contract_example_run().outputs[-1], wire_examples()[1][-3]), strict=True
    ):
        assert encode(out.value) == json.dumps(json.loads(wire), separators=(",", ":"), ensure_ascii=False)


def test_output_schemas_are_valid_draft7_and_strict_enough() -> None:
    """docs/contributing.md, rule 8: the output schemas load through safepoint.schemas.load and reject wrong shapes."""
    for name in OUTPUT_NAMES:
        schema = load("outputs", name)
        jsonschema.Draft7Validator.check_schema(schema)
    run = contract_example_run()
    good = run.directives()[-1]
    validator("compaction").validate(good)
    for bad in (
        good | {"safe_ts": 1.5},
        good | {"seq": 0},
        good | {"safe_ts": 1 << 63},
        {k: v for k, v in good.items() if k != "basis"},
        good | {"blocker": good["blocker"] | {"kind": "lease"}},
    ):
        with pytest.raises(jsonschema.ValidationError):
            validator("compaction").validate(bad)


def test_every_kind_of_output_validates() -> None:
    """CONTRACT Directives/Alerts/Dead letters: every output of a busy run validates against its schema."""
    run = Run(node_lease_ms=1_000, retention=10)
    n1, n2, n3 = NodeClient("n1"), NodeClient("n2"), NodeClient("n3")
    run.feed(topology(1, T0, {"n1": ["g"], "n2": [], "n3": []}))
    run.feed(n1.hb(T0, 100, groups=[{"group": "g", "leader": True, "published_min_tx_time": None}]))
    run.feed(n2.begin("t", 50, T0), n2.prepare("t", T0, "n2", ["n1", "n2"]), n2.hb(T0, 100))
    run.feed(n1.hb(T0 + 2_000, 200, groups=[{"group": "g", "leader": True, "published_min_tx_time": 150}]))
    run.feed(n3.hb(T0 + 2_000, 300), n2.hb(T0 + 2_000, 300), n2.end("t", T0 + 2_000))
    run.feed(n3.open("old", -5, T0 + 2_001), n3.close("old", T0 + 2_002))
    run.raw(b"\x00\x01", None)
    run.raw("[]", "k")
    kinds = {(o.channel, o.value.get("kind"), o.value.get("state")) for o in run.outputs}
    assert ("directives", None, None) in kinds
    assert {
        ("alerts", k, s) for k in ("missing_node", "unknown_node_min", "horizon_violation") for s in ("raised", "cleared")
    } <= kinds
    assert ("deadletter", None, None) in kinds
    for out in run.outputs:
        check_output(out)


def test_dead_letter_with_null_key() -> None:
    """deadletter.json: key is a string or null; the Output key is what the job writes as the Kafka key."""
    run = Run()
    [out] = run.raw("nope", None)
    assert out.value["key"] is None
    check_output(out)


def roundtrip(state: Any) -> Any:
    return type(state).from_json(json.loads(json.dumps(state.to_json())))


def test_state_round_trips_through_json() -> None:
    """docs/contributing.md, rules 1 and 20: state objects serialise via to_json()/from_json() and survive a JSON round trip."""
    run, _ = wire_examples()
    run.feed(cluster_event("index_build", 1, T0, cluster="c1", index="i", catalog_version=7, state="started"))
    for node in run.engine.nodes.values():
        again = roundtrip(node)
        assert isinstance(again, NodeState)
        assert again.to_json() == json.loads(json.dumps(node.to_json()))
    for cluster in run.engine.clusters.values():
        again = roundtrip(cluster)
        assert isinstance(again, ClusterState)
        assert again.to_json() == json.loads(json.dumps(cluster.to_json()))
        assert again.safe_ts == cluster.safe_ts and again.dseq == cluster.dseq
