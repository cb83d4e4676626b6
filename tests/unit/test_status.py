"""The status model (core/status.py), its store and the HTTP surface over it, without Kafka.

The store is fed the parts the job would publish for the same log (``node_status`` of every node,
``cluster_status`` of every cluster), so what the API shows here is what ``replay --status``
writes; the job's side of that equality is test_batch.py (in one process) and test_status_http.py
(through the broker and Spark)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings

from safepoint.core.engine import Engine
from safepoint.core.events import parse
from safepoint.core.status import assemble, cluster_status, node_status
from safepoint.replay import final_status
from safepoint.tools.http_api import make_app
from safepoint.tools.status_store import StatusStore

from core_helpers import NodeClient, Run, topology

T0 = 1_700_000_000_000
LEASE = 10_000


def store_of(engine: Engine) -> StatusStore:
    store = StatusStore()
    for (cluster, node), ns in engine.nodes.items():
        store.apply(f"{cluster}/{node}", node_status(ns, engine.policy))
    for name, cs in engine.clusters.items():
        store.apply(name, cluster_status(cs, engine.policy))
    return store


def silent_n3() -> Run:
    """n1 (a labelled reader) and n2 (a transaction) report; n3 is named by the topology, silent."""
    run = Run(retention=100, node_lease_ms=LEASE)
    n1, n2 = NodeClient("n1", "c1"), NodeClient("n2", "c1")
    run.feed(topology(1, T0, {"n1": [], "n2": [], "n3": []}, cluster="c1"))
    run.feed(n1.hb(T0, 1_000), n2.hb(T0 + 1, 1_000))
    run.feed(n1.open("r1", 950, T0 + 10, label="nightly-report"), n2.begin("t1", 970, T0 + 20, label="etl"))
    run.feed(n1.hb(T0 + 5_000, 2_000), n2.hb(T0 + 5_000, 2_100))
    return run


def test_the_status_names_the_silent_node_and_ranks_the_holds() -> None:
    run = silent_n3()
    [st] = final_status(run.engine)["clusters"]
    assert st["cluster"] == "c1" and st["safe_ts"] is None and st["seq"] == 0
    assert st["round"]["aborted"] is True
    [reason] = st["round"]["reasons"]
    assert reason["kind"] == "missing_node" and reason["node"] == "n3" and "never reported" in reason["detail"]
    assert [(h["node"], h["kind"], h["id"], h["ts"], h["label"]) for h in st["holds"]] == [
        ("n1", "reader", "r1", 950, "nightly-report"),
        ("n2", "tx", "t1", 970, "etl"),
        ("n1", "retention", None, 1_900, None),
        ("n2", "retention", None, 2_000, None),
    ]
    assert st["holds"][0]["age_ms"] == 5_000 - 10, "age on cluster time: cluster_wall_ms - opened"
    assert st["hold_counts"] == {"reader": 1, "tx": 1, "prepared_tx": 0, "retention": 2, "group": 0, "service": 0}
    assert st["blocker"]["kind"] == "reader" and st["blocker"]["label"] == "nightly-report"
    nodes = {n["node"]: n for n in st["nodes"]}
    assert nodes["n3"]["unknown"] == "never reported" and nodes["n3"]["in_topology"] and nodes["n3"]["stale"]
    assert nodes["n1"]["open"] == {"reader": 1, "tx": 0, "prepared_tx": 0} and nodes["n1"]["mvcc_now"] == 2_000
    assert [a["kind"] for a in st["alerts"]] == ["missing_node"], "the reason is alerted from the first round"
    assert st["lag"] is None, "no safe point yet, no lag"


def test_status_when_the_round_passes_and_during_discovery() -> None:
    run = Run(retention=100, node_lease_ms=LEASE)
    n1 = NodeClient("n1", "c1")
    run.feed(n1.hb(T0, 1_000))
    [st] = final_status(run.engine)["clusters"]
    assert [r["kind"] for r in st["round"]["reasons"]] == ["discovery"]
    assert "discovery window" in st["round"]["reasons"][0]["detail"]
    run.feed(n1.hb(T0 + LEASE, 5_000))
    [st] = final_status(run.engine)["clusters"]
    assert st["round"] == {"aborted": False, "reasons": []}
    assert st["safe_ts"] == 4_900 and st["lag"] == 100 and st["seq"] == 1


def test_holds_beyond_status_holds_are_counted_not_listed() -> None:
    run = Run(retention=100, node_lease_ms=LEASE, status_holds=3)
    n1 = NodeClient("n1", "c1")
    run.feed(topology(1, T0, {"n1": []}, cluster="c1"), n1.hb(T0, 1_000))
    run.feed(*[n1.open(f"r{i}", 960 - i, T0 + i) for i in range(10)])
    [st] = final_status(run.engine)["clusters"]
    assert [h["id"] for h in st["holds"] if h["kind"] == "reader"] == ["r9", "r8", "r7"], "the oldest three"
    assert st["hold_counts"]["reader"] == 10


def test_assemble_is_the_join_of_the_parts() -> None:
    run = silent_n3()
    policy = run.engine.policy
    parts = [node_status(ns, policy) for ns in run.engine.nodes.values()]
    cluster = cluster_status(run.engine.clusters["c1"], policy)
    assert assemble(cluster, reversed(parts)) == final_status(run.engine)["clusters"][0], "order of parts is irrelevant"



def big_cluster(status_nodes: int) -> Run:
    """300 nodes named by the topology: 180 report (each a reader), 10 of them then go stale, 120 never report."""
    run = Run(retention=100, node_lease_ms=LEASE, status_nodes=status_nodes)
    names = [f"n{i:03d}" for i in range(300)]
    run.feed(topology(1, T0, {n: [] for n in names}, cluster="c1"))
    clients = [NodeClient(n, "c1") for n in names[:180]]
    run.feed(*[c.hb(T0 + i, 1_000 + i) for i, c in enumerate(clients)])
    run.feed(*[c.open(f"r-{c.node}", 900 + i, T0 + 200 + i) for i, c in enumerate(clients)])
    run.feed(*[c.hb(T0 + LEASE + 500, 2_000 + i) for i, c in enumerate(clients[10:])])  # the first ten go stale
    return run


def test_a_large_cluster_status_part_is_bounded_and_assembles_to_the_same_status() -> None:
    """Past ``status_nodes`` the cluster's part lists the nodes with a problem first and then the
    lowest minimums; the rest are filled in from their own parts, so the assembled status is the
    one an unbounded part gives (120 never-reported nodes: the reasons and alerts are cut at 100
    and counted by kind)."""
    small, whole = big_cluster(150), big_cluster(10_000)
    part = cluster_status(small.engine.clusters["c1"], small.engine.policy)
    assert len(part["nodes"]) == 150 and part["nodes_total"] == 300
    assert sum(v["stale"] for v in part["nodes"].values()) == 130, "the never reported and the stale come first"
    assert {"n000", "n009", "n180", "n299", "n010", "n029"} <= set(part["nodes"]), "then the lowest minimums"
    assert "n030" not in part["nodes"] and "n179" not in part["nodes"]
    assert len(json.dumps(part)) < len(json.dumps(cluster_status(whole.engine.clusters["c1"], whole.engine.policy)))
    r = part["round"]
    assert len(r["reasons"]) == 100 and r["reasons_total"] == 130 and r["reason_counts"] == {"missing_node": 130}
    assert len(part["alerts"]) == 100 and part["alerts_total"] == 130 and part["alert_counts"] == {"missing_node/warning": 130}
    [a], [b] = final_status(small.engine)["clusters"], final_status(whole.engine)["clusters"]
    listed = {n["node"] for n in a["nodes"]}
    assert listed == {n["node"] for n in b["nodes"]} - {f"n{i:03d}" for i in range(180, 300)} | set(part["nodes"])
    by_name = {n["node"]: n for n in b["nodes"]}
    assert all(n == by_name[n["node"]] for n in a["nodes"]), "every node shown as the unbounded status shows it"
    assert a["holds"] == b["holds"] and a["hold_counts"] == b["hold_counts"]
    from safepoint.tools.metrics import StatusCollector

    def samples(run: Run) -> dict[tuple[str, tuple[str, ...]], float]:
        store = store_of(run.engine)
        return {(m.name, tuple(sorted(sm.labels.items()))): sm.value  # type: ignore[misc]
                for m in StatusCollector(store).collect() for sm in m.samples}

    assert samples(small) == samples(whole), "the metrics count every reason and alert"


def test_when_more_nodes_have_a_problem_than_are_listed_an_unlisted_node_is_not_called_a_member() -> None:
    """130 nodes have a problem and the part lists 100: an unlisted node may be one of the 30 left
    out, so the joined status says its membership is not known (null) rather than guess."""
    run, whole = big_cluster(100), big_cluster(10_000)
    part = cluster_status(run.engine.clusters["c1"], run.engine.policy)
    assert len(part["nodes"]) == 100 and part["unlisted_trouble"] == 30
    assert "unlisted_trouble" not in cluster_status(whole.engine.clusters["c1"], whole.engine.policy)
    [a], [b] = final_status(run.engine)["clusters"], final_status(whole.engine)["clusters"]
    by_name = {n["node"]: n for n in b["nodes"]}
    unlisted = [n for n in a["nodes"] if n["node"] not in part["nodes"]]
    assert unlisted and all(n["member"] is None and n["in_topology"] is None for n in unlisted)
    assert all(n == by_name[n["node"]] for n in a["nodes"] if n["node"] in part["nodes"])
    assert all({**n, "member": by_name[n["node"]]["member"], "in_topology": by_name[n["node"]]["in_topology"]}
               == by_name[n["node"]] for n in unlisted), "the rest is what the unbounded status says"


# -- the HTTP surface -----------------------------------------------------------------------------


@pytest.fixture
def client() -> TestClient:
    return TestClient(make_app(store_of(silent_n3().engine)))


def test_the_json_routes(client: TestClient) -> None:
    assert client.get("/healthz").json()["status"] == "ok"
    [st] = client.get("/api/v1/clusters").json()["clusters"]
    one = client.get("/api/v1/clusters/c1").json()
    assert one == st and {"safe_ts", "seq", "round", "blocker"} <= set(one)
    holds = client.get("/api/v1/clusters/c1/holds", params={"limit": 2}).json()["holds"]
    assert [h["label"] for h in holds] == ["nightly-report", "etl"]
    assert {"node", "kind", "id", "ts", "age_ms", "label"} <= set(holds[0])
    assert [n["node"] for n in client.get("/api/v1/clusters/c1/nodes").json()["nodes"]] == ["n1", "n2", "n3"]


def test_bad_input_is_a_4xx_with_a_json_error(client: TestClient) -> None:
    missing = client.get("/api/v1/clusters/nope")
    assert missing.status_code == 404 and missing.json()["error"] == "unknown cluster 'nope'"
    assert client.get("/api/v1/clusters/nope/holds").status_code == 404
    for bad in ("0", "-1", "x", "100001"):
        r = client.get("/api/v1/clusters/c1/holds", params={"limit": bad})
        assert r.status_code == 422 and "limit" in r.text
    assert client.get("/api/v1/nothing").status_code == 404


def test_metrics_in_prometheus_text(client: TestClient) -> None:
    text = client.get("/metrics").text
    assert re.search(r'^safepoint_round_aborted\{cluster="c1",reason="missing_node"\} 1\.0$', text, re.M)
    assert re.search(r'^safepoint_holds\{cluster="c1",kind="reader"\} 1\.0$', text, re.M)
    assert re.search(r'^safepoint_alerts_active\{cluster="c1",kind="missing_node",severity="warning"\} 1\.0$', text, re.M)
    assert re.search(r'^safepoint_node_stale\{cluster="c1",node="n3"\} 1\.0$', text, re.M)
    assert "safepoint_safe_ts{" not in text, "no safe point yet: no sample"
    assert "# TYPE safepoint_input_messages_total counter" in text
    labels = set(re.findall(r"^\w+\{([^}]*)\}", text, re.M))
    assert not any("r1" in lab or "t1" in lab for lab in labels), "never one label value per hold"


def test_the_dashboard_page(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "api/v1/clusters" in page.text


def _fuzz_app() -> Any:
    return make_app(store_of(silent_n3().engine))


schema = schemathesis.openapi.from_asgi("/openapi.json", _fuzz_app())


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_the_api_against_its_own_openapi_description(case: Any) -> None:
    """schemathesis: no input gives a 5xx, every status code and content type is documented."""
    case.call_and_validate()


# -- admin actions ----------------------------------------------------------------------------------


def admin_client(token: str = "s3cret") -> tuple[TestClient, list[dict[str, Any]]]:
    published: list[dict[str, Any]] = []  # what would go to the events topic (the integration test sends it)
    return TestClient(make_app(store_of(silent_n3().engine), publish=published.append, admin_token=token)), published


def test_admin_actions_are_off_without_a_token() -> None:
    c, published = admin_client(token="")
    r = c.post("/api/v1/clusters/c1/pause", json={"reason": "restore"}, headers={"Authorization": "Bearer x"})
    assert r.status_code == 403 and "admin_token" in r.json()["error"] and published == []


def test_admin_actions_need_the_bearer_token_and_publish_events() -> None:
    c, published = admin_client()
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret"}):
        r = c.post("/api/v1/clusters/c1/pause", json={"reason": "restore"}, headers=headers)
        assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"
    ok = {"Authorization": "Bearer s3cret"}
    r = c.post("/api/v1/clusters/c1/service-holds/backup", json={"ts": 900, "ttl_ms": 60_000, "label": "nightly"},
               headers=ok)
    assert r.status_code == 202
    assert c.post("/api/v1/clusters/c1/service-holds/backup/release", headers=ok).status_code == 202
    assert c.post("/api/v1/clusters/c1/pause", json={"reason": "restore"}, headers=ok).status_code == 202
    assert c.post("/api/v1/clusters/c1/resume", headers=ok).status_code == 202
    assert [(e["type"], e.get("holder"), e.get("reason")) for e in published] == [
        ("service_hold", "backup", None), ("service_release", "backup", None), ("pause", None, "restore"), ("resume", None, None)]
    assert published[0]["ts"] == 900 and published[0]["ttl_ms"] == 60_000 and published[0]["label"] == "nightly"
    for e in published:  # each is a valid event of the contract
        assert isinstance(parse(json.dumps(e), 1 << 20), dict), e
    bad = c.post("/api/v1/clusters/c1/service-holds/backup", json={"ts": 900, "ttl_ms": 0}, headers=ok)
    assert bad.status_code == 422 and len(published) == 4
    assert "s3cret" not in c.get("/openapi.json").text


def test_the_store_skips_records_the_job_does_not_write() -> None:
    store = store_of(silent_n3().engine)
    before = store.status("c1")
    store.apply_raw(b"c1", b'{"type": "node_status"}')  # a node's part under a cluster's key
    store.apply_raw(b"c1/n1", b"[1, 2]")
    store.apply_raw(b"c1/n2", b"not json")
    store.apply_raw(None, b"{}")
    assert store.bad == 4 and store.status("c1") == before
    assert TestClient(make_app(store)).get("/healthz").json()["status_messages_skipped"] == 4
