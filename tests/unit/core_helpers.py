"""Shared helpers for the core's unit tests: event builders, a recording engine, schema checks.

Named ``core_helpers`` (not ``helpers``) so that it cannot clash in ``sys.modules`` with a
helper module of another test tier: the test folders have no ``__init__.py`` and pytest's
default import mode puts each folder on ``sys.path`` under the module's bare name.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import jsonschema

from safepoint.core import ALERTS, DEADLETTER, DIRECTIVES, ClusterState, Engine, NodeState, Output, Policy, Position
from safepoint.core.policy import Policies
from safepoint.core.recovery import StartPlan
from safepoint.schemas import load

EVENTS_TOPIC = "safepoint.events"
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1

_VALIDATORS: dict[str, jsonschema.protocols.Validator] = {}


def validator(name: str) -> jsonschema.protocols.Validator:
    """A Draft 7 validator for ``schemas/outputs/<name>.json``."""
    if name not in _VALIDATORS:
        schema = load("outputs", name)
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
        _VALIDATORS[name] = cls(schema)
    return _VALIDATORS[name]


def schema_for(out: Output) -> str:
    if out.channel == DEADLETTER:
        return "deadletter"
    if out.channel == ALERTS:
        return "alert"
    assert out.channel == DIRECTIVES, out.channel
    kind = out.value.get("type")
    return kind if kind in ("expire", "snapshot_request", "members", "band") else "compaction"


def check_output(out: Output) -> None:
    """Every output must validate against its JSON Schema and be JSON-serialisable as is."""
    validator(schema_for(out)).validate(out.value)
    assert isinstance(out.key, str)
    assert json.loads(json.dumps(out.value)) == out.value


class NodeClient:
    """Builds the events of one node process: seq grows by one, incarnation bumps on restart."""

    def __init__(self, node: str, cluster: str | None = None, incarnation: int = 0) -> None:
        self.node = node
        self.cluster = cluster
        self.incarnation = incarnation
        self.seq = -1

    def event(self, type_: str, wall_ms: int, **fields: Any) -> dict[str, Any]:
        self.seq += 1
        ev: dict[str, Any] = {
            "v": 1,
            "type": type_,
            "node": self.node,
            "incarnation": self.incarnation,
            "seq": self.seq,
            "wall_ms": wall_ms,
        }
        if self.cluster is not None:
            ev["cluster"] = self.cluster
        ev.update(fields)
        return ev

    def restart(self) -> None:
        self.incarnation += 1
        self.seq = -1

    def hb(self, wall_ms: int, mvcc_now: int, **fields: Any) -> dict[str, Any]:
        return self.event("heartbeat", wall_ms, mvcc_now=mvcc_now, **fields)

    def open(self, reader_id: str, read_ts: int, wall_ms: int, **fields: Any) -> dict[str, Any]:
        return self.event("reader_open", wall_ms, reader_id=reader_id, read_ts=read_ts, **fields)

    def close(self, reader_id: str, wall_ms: int) -> dict[str, Any]:
        return self.event("reader_close", wall_ms, reader_id=reader_id)

    def begin(self, tx_id: str, begin_ts: int, wall_ms: int, **fields: Any) -> dict[str, Any]:
        return self.event("tx_begin", wall_ms, tx_id=tx_id, begin_ts=begin_ts, **fields)

    def prepare(self, tx_id: str, wall_ms: int, coordinator: str = "n1", participants: Iterable[str] = ("n1",)) -> dict[str, Any]:
        return self.event("tx_prepare", wall_ms, tx_id=tx_id, coordinator=coordinator, participants=list(participants))

    def end(self, tx_id: str, wall_ms: int, outcome: str = "commit", **fields: Any) -> dict[str, Any]:
        return self.event("tx_end", wall_ms, tx_id=tx_id, outcome=outcome, **fields)

    def snapshot(self, wall_ms: int, readers: list[dict[str, Any]], txs: list[dict[str, Any]], cut: int = 0) -> dict[str, Any]:
        return self.event("snapshot", wall_ms, cut=cut, readers=readers, txs=txs)


def cluster_event(type_: str, version: int, wall_ms: int, cluster: str | None = None, **fields: Any) -> dict[str, Any]:
    ev: dict[str, Any] = {"v": 1, "type": type_, "version": version, "wall_ms": wall_ms}
    if cluster is not None:
        ev["cluster"] = cluster
    ev.update(fields)
    return ev


def topology(version: int, wall_ms: int, nodes: dict[str, list[str]], cluster: str | None = None) -> dict[str, Any]:
    return cluster_event("topology", version, wall_ms, cluster, nodes=nodes)


class Run:
    """An ``Engine`` fed one message at a time, recording and schema-checking every output."""

    def __init__(self, policy: Policy | Policies | None = None, start: StartPlan | None = None, **policy_fields: Any) -> None:
        self.engine = Engine(policy or Policy(**policy_fields), start=start)
        self.offset = 0
        self.outputs: list[Output] = []

    def raw(self, value: bytes | str | None, key: bytes | str | None = None) -> list[Output]:
        pos = Position(EVENTS_TOPIC, 0, self.offset, key)
        self.offset += 1
        outs = self.engine.process(value, pos)
        for out in outs:
            check_output(out)
        self.outputs.extend(outs)
        return outs

    def feed(self, *events: dict[str, Any]) -> list[Output]:
        outs: list[Output] = []
        for ev in events:
            key = ev.get("node", ev.get("cluster", "default"))
            outs.extend(self.raw(json.dumps(ev), key))
        return outs

    @property
    def counts(self) -> dict[str, int]:
        return dict(self.engine.counts)

    def directives(self) -> list[dict[str, Any]]:
        return directives(self.outputs)

    def alerts(self, kind: str | None = None, state: str | None = None) -> list[dict[str, Any]]:
        return alerts(self.outputs, kind, state)

    def expires(self) -> list[dict[str, Any]]:
        return expires(self.outputs)

    def restore(self) -> None:
        """Carry every state object through JSON text, as the job does between micro-batches."""
        restore_engine(self.engine)

    def last_safe_ts(self) -> int | None:
        ds = self.directives()
        return ds[-1]["safe_ts"] if ds else None


def directives(outs: Iterable[Output]) -> list[dict[str, Any]]:
    return [o.value for o in outs if o.channel == DIRECTIVES and o.value["type"] == "compaction"]


def expires(outs: Iterable[Output]) -> list[dict[str, Any]]:
    """The forced-expiry directives among ``outs``."""
    return [o.value for o in outs if o.channel == DIRECTIVES and o.value["type"] == "expire"]


def restore_engine(engine: Engine) -> None:
    """Replace every state object of ``engine`` (node states, cluster states) by its to_json -> JSON
    text -> from_json copy."""
    engine.nodes = {k: NodeState.from_json(json.loads(json.dumps(s.to_json()))) for k, s in engine.nodes.items()}
    engine.clusters = {k: ClusterState.from_json(json.loads(json.dumps(s.to_json()))) for k, s in engine.clusters.items()}


def alerts(outs: Iterable[Output], kind: str | None = None, state: str | None = None) -> list[dict[str, Any]]:
    return [
        o.value
        for o in outs
        if o.channel == ALERTS and (kind is None or o.value["kind"] == kind) and (state is None or o.value["state"] == state)
    ]


def dead_letters(outs: Iterable[Output]) -> list[dict[str, Any]]:
    return [o.value for o in outs if o.channel == DEADLETTER]


def two_node_cluster(run: Run, wall: int = 1_000, mvcc: int = 1_000, lease: int = 30_000) -> tuple[NodeClient, NodeClient]:
    """n1 and n2 heartbeating, then a topology naming both (so no node is ever missing, and no
    ``missing_node`` alert is raised): the first directive is out."""
    n1, n2 = NodeClient("n1"), NodeClient("n2")
    run.feed(n1.hb(wall, mvcc), n2.hb(wall, mvcc), topology(1, wall, {"n1": [], "n2": []}))
    return n1, n2
