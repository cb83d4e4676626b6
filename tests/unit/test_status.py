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
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from safepoint.core import Position
from safepoint.core.codec import encode
from safepoint.core.engine import Engine
from safepoint.core.events import parse
from safepoint.core.status import assemble, cluster_status, node_status, status_key
from safepoint.ops.http_api import MAX_ADMIN_BODY, HttpServer, make_app
from safepoint.ops.status_store import JOB_KEY, StatusStore
from safepoint.replay import final_status

from core_helpers import NodeClient, Run, topology

T0 = 1_700_000_000_000
LEASE = 10_000


def store_of(engine: Engine) -> StatusStore:
    store = StatusStore()
    for (cluster, node), ns in engine.nodes.items():
        store.apply_raw(status_key(cluster, node).encode(), encode(node_status(ns, engine.policy)).encode())
    for name, cs in engine.clusters.items():
        store.apply_raw(status_key(name).encode(), encode(cluster_status(cs, engine.policy)).encode())
    assert store.bad == 0, store.skipped
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
    from safepoint.ops.metrics import StatusCollector

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
    page = client.get("/api/v1/clusters/c1/nodes", params={"limit": 2, "offset": 1}).json()
    assert [n["node"] for n in page["nodes"]] == ["n2", "n3"] and page["total"] == 3 and page["offset"] == 1


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


def admin_client(token: str = "s3cret", store: StatusStore | None = None) -> tuple[TestClient, list[dict[str, Any]]]:
    published: list[dict[str, Any]] = []  # what would go to the events topic (the integration test sends it)

    def publish(event: dict[str, Any]) -> str:
        published.append(event)
        return str(event["action_id"])

    app = make_app(store or store_of(silent_n3().engine), publish=publish, admin_token=token)
    return TestClient(app, raise_server_exceptions=False), published


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


def test_named_admin_tokens_record_who_sent_each_action(caplog: Any) -> None:
    import logging

    import pytest

    from safepoint.errors import ConfigError
    from safepoint.ops.serve import admin_tokens
    from safepoint.settings import load_settings

    tokens = admin_tokens(load_settings(environ={"SAFEPOINT_ADMIN_TOKENS": "alice:tok-a, bob:tok-b",
                                                 "SAFEPOINT_ADMIN_TOKEN": "tok-root"}))
    assert tokens == {"admin": "tok-root", "alice": "tok-a", "bob": "tok-b"}
    for bad in ("alice", "alice:", ":tok", "al ice:tok", "alice:a,alice:b"):
        with pytest.raises(ConfigError) as err:
            admin_tokens(load_settings(environ={"SAFEPOINT_ADMIN_TOKENS": bad}))
        assert "tok" not in str(err.value).replace("token", ""), "the message never shows a token"
    published: list[dict[str, Any]] = []
    app = make_app(store_of(silent_n3().engine), publish=lambda e: published.append(e) or str(e["action_id"]),
                   admin_token=tokens)
    c = TestClient(app, raise_server_exceptions=False)
    with caplog.at_level(logging.INFO, logger="safepoint.admin"):
        assert c.post("/api/v1/clusters/c1/pause", json={"reason": "restore"},
                      headers={"Authorization": "Bearer tok-b"}).status_code == 202
        assert c.post("/api/v1/clusters/c1/resume", headers={"Authorization": "Bearer tok-root"}).status_code == 202
        assert c.post("/api/v1/clusters/c1/resume", headers={"Authorization": "Bearer tok-c"}).status_code == 401
    assert [(e["type"], e["by"]) for e in published] == [("pause", "bob"), ("resume", "admin")]
    assert "admin action by bob: pause of cluster c1" in caplog.text and "tok-b" not in caplog.text
    for e in published:
        assert isinstance(parse(json.dumps(e), 1 << 20), dict), e

    from core_helpers import NodeClient, Run

    run = Run(node_lease_ms=10_000)
    run.feed(NodeClient("n1", "c1").hb(1_000, 5), {**published[0], "wall_ms": 1_000})
    [action] = final_status(run.engine)["clusters"][0]["actions"]
    assert (action["type"], action["outcome"], action["by"]) == ("pause", "applied", "bob")


def test_the_store_skips_records_the_job_does_not_write() -> None:
    store = store_of(silent_n3().engine)
    before = store.status("c1")
    store.apply_raw(b"c1", b'{"type": "node_status"}')  # a node's part under a cluster's key
    store.apply_raw(b"c1/n1", b"[1, 2]")
    store.apply_raw(b"c1/n2", b"not json")
    store.apply_raw(None, b"{}")
    assert store.bad == 4 and store.status("c1") == before
    assert TestClient(make_app(store)).get("/healthz").json()["status_messages_skipped"] == 4


# -- bad input to the store and the admin routes (issue 25, hole 5) --------------------------------


def test_a_wrong_typed_record_is_skipped_and_the_metrics_still_answer() -> None:
    """A record of the right type under the right key whose fields are off (a round that is a
    string, a safe point that is text) would break the join and every scrape: it is skipped."""
    store = store_of(silent_n3().engine)
    before = store.status("c1")
    good = cluster_status(silent_n3().engine.clusters["c1"], silent_n3().engine.policy)
    for bad in ({**good, "round": "aborted"}, {**good, "safe_ts": "950"}, {**good, "nodes": []}, {**good, "cluster": "c2"}):
        store.apply_raw(b"c1", json.dumps(bad).encode())
    node = node_status(silent_n3().engine.nodes[("c1", "n1")], silent_n3().engine.policy)
    store.apply_raw(b"c1/n1", json.dumps({**node, "holds": [{"kind": "reader"}]}).encode())
    store.apply_raw(b"c1/n2", json.dumps(node).encode())  # n1's part under n2's key
    store.apply_raw(b"c1/n1/x", json.dumps(node).encode())
    assert store.skipped == {"invalid": 4, "key_mismatch": 2, "bad_key": 1} and store.status("c1") == before
    client = TestClient(make_app(store))
    assert client.get("/metrics").status_code == 200
    health = client.get("/healthz").json()
    assert health["status"] == "ok" and health["status_messages_skipped"] == 7 and health["skipped"]["invalid"] == 4


def test_status_keys_are_escaped_and_no_cluster_is_the_jobs_record() -> None:
    """Clusters and nodes whose names hold a ``/`` or look like the job's own key keep apart."""
    engine = Engine(silent_n3().engine.policy)
    for cluster in ("a/b", "a", "_job", "%job"):
        for node in ("x/y", "x"):
            client = NodeClient(node, cluster)
            engine.process(encode(topology(1, T0, {"x/y": [], "x": []}, cluster=cluster)), Position("events", 0, 0))
            engine.process(encode(client.hb(T0 + 1, 1_000)), Position("events", 0, 1))
    store = store_of(engine)
    store.apply_raw(JOB_KEY.encode(), b'{"type": "job_status", "active": true}')
    assert sorted(store.clusters()) == ["%job", "_job", "a", "a/b"] and store.job == {"type": "job_status", "active": True}
    for cluster in ("a/b", "a", "_job", "%job"):
        st = store.status(cluster)
        assert st is not None and st["cluster"] == cluster
        assert sorted(n["node"] for n in st["nodes"]) == ["x", "x/y"] and all(n["mvcc_now"] == 1_000 for n in st["nodes"])
    assert status_key("a/b", "x/y") == "a%2Fb/x%2Fy" and status_key("%job") != JOB_KEY


def test_the_token_is_checked_before_the_body_is_read() -> None:
    c, published = admin_client()
    url = "/api/v1/clusters/c1/service-holds/backup"
    for body in (b"{not json", b"x" * (MAX_ADMIN_BODY + 1), b'{"ts": "a"}'):
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r = c.post(url, content=body, headers={**headers, "Content-Type": "application/json"})
            assert r.status_code == 401 and r.json() == {"error": "a valid bearer token is required"}
    assert published == []


def test_a_body_over_the_cap_is_413_and_a_malformed_one_422() -> None:
    c, published = admin_client()
    ok = {"Authorization": "Bearer s3cret", "Content-Type": "application/json"}
    url = "/api/v1/clusters/c1/service-holds/backup"
    big = json.dumps({"ts": 900, "ttl_ms": 1_000, "label": "x" * MAX_ADMIN_BODY}).encode()
    r = c.post(url, content=big, headers=ok)
    assert r.status_code == 413 and "at most" in r.json()["error"]

    def chunks() -> Any:  # no content-length: the cap is counted as the body arrives
        yield b'{"ts": 900, "ttl_ms": 1000, "label": "'
        for _ in range(MAX_ADMIN_BODY // 1000 + 2):
            yield b"y" * 1000
        yield b'"}'

    assert c.post(url, content=chunks(), headers=ok).status_code == 413
    r = c.post(url, content=b"{not json", headers=ok)
    assert r.status_code == 422 and r.headers["content-type"] == "application/json"
    assert published == []


def test_two_actions_in_the_same_millisecond_are_both_applied() -> None:
    """Each action has its own id: the job applies both, whatever their wall_ms."""
    run = silent_n3()
    c, published = admin_client()
    ok = {"Authorization": "Bearer s3cret"}
    a = c.post("/api/v1/clusters/c1/service-holds/backup", json={"ts": 900, "ttl_ms": 60_000}, headers=ok).json()
    b = c.post("/api/v1/clusters/c1/service-holds/cdc", json={"ts": 920, "ttl_ms": 60_000}, headers=ok).json()
    assert a["action_id"] != b["action_id"] and a["outcome"] == f"/api/v1/clusters/c1/actions/{a['action_id']}"
    for e in published:
        run.feed({**e, "wall_ms": T0 + 6_000})
    st = final_status(run.engine)["clusters"][0]
    assert [h["holder"] for h in st["service_holds"]] == ["backup", "cdc"]
    assert [(x["id"], x["outcome"]) for x in st["actions"]] == [(a["action_id"], "applied"), (b["action_id"], "applied")]


def test_an_actions_outcome_is_served_once_the_job_reports_it() -> None:
    run = silent_n3()
    n1, n2, n3 = NodeClient("n1", "c1"), NodeClient("n2", "c1"), NodeClient("n3", "c1")
    n1.seq = n2.seq = 3
    run.feed(n3.hb(T0 + 5_001, 2_000), n1.close("r1", T0 + 5_002), n2.end("t1", T0 + 5_003),
             n1.hb(T0 + 5_004, 2_000), n2.hb(T0 + 5_005, 2_000), n3.hb(T0 + 5_006, 2_000))
    assert run.last_safe_ts() is not None
    c, published = admin_client(store=store_of(run.engine))
    ok = {"Authorization": "Bearer s3cret"}
    r = c.post("/api/v1/clusters/c1/service-holds/late", json={"ts": 10, "ttl_ms": 60_000}, headers=ok).json()
    assert c.get(r["outcome"]).json() == {"id": r["action_id"], "outcome": "pending", "type": None, "holder": None,
                                          "reason": None, "detail": None, "cluster_wall_ms": None}
    run.feed(published[0])
    c2, _ = admin_client(store=store_of(run.engine))
    done = c2.get(r["outcome"]).json()
    assert done["outcome"] == "refused" and done["reason"] == "below_safe_ts" and done["holder"] == "late"


def test_the_admin_routes_on_a_non_loopback_address_without_tls_log_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """Only built, never started: no address but loopback is bound here."""
    with_token, _ = admin_client()
    app = with_token.app
    HttpServer(app, "127.0.0.1", 0)
    HttpServer(app, "0.0.0.0", 0, certfile="/etc/ssl/cert.pem", keyfile="/etc/ssl/key.pem")  # noqa: S104
    HttpServer(make_app(store_of(silent_n3().engine)), "0.0.0.0", 0)  # noqa: S104 - no token: nothing to leak
    assert not [r for r in caplog.records if "without TLS" in r.message]
    HttpServer(app, "0.0.0.0", 0)  # noqa: S104
    [warning] = [r for r in caplog.records if "without TLS" in r.message]
    assert warning.levelname == "WARNING" and "0.0.0.0" in warning.message


def _admin_fuzz_app() -> Any:
    return admin_client()[0].app


admin_schema = schemathesis.openapi.from_asgi("/openapi.json", _admin_fuzz_app())


@admin_schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_the_admin_api_against_its_own_openapi_description(case: Any) -> None:
    """schemathesis with the admin routes on: bad tokens, odd names and bodies give no 5xx."""
    case.call_and_validate()


ODD_NAMES = ["a%2Fb", "%job", "_job", "..", "x" * 256, "ü-😀", "a b", "%25", "-"]


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(["/api/v1/clusters/{c}/service-holds/{h}", "/api/v1/clusters/{c}/service-holds/{h}/release",
                        "/api/v1/clusters/{c}/pause", "/api/v1/clusters/{c}/resume", "/api/v1/clusters/{c}/actions/{h}",
                        "/api/v1/clusters/{c}/holds", "/api/v1/clusters/{c}"]),
       st.sampled_from(ODD_NAMES), st.sampled_from(ODD_NAMES),
       st.sampled_from([None, "Bearer s3cret", "Bearer wrong", "Bearer ", "s3cret", "Bearer s3cret\u00e9", "bearer  s3cret"]),
       st.one_of(st.binary(max_size=64), st.just(b"{" * (MAX_ADMIN_BODY + 1)), st.just(b'{"ts": 1, "ttl_ms": 1}'),
                 st.just(b'{"reason": "x"}'), st.just(b'{"ts": 1e400, "ttl_ms": -1}'), st.just(b"[]")))
@example("/api/v1/clusters/{c}/service-holds/{h}", "%job", "%job", "bearer  s3cret", b'{"ts": 1e400, "ttl_ms": -1}')
def test_no_bad_input_gives_a_5xx(path: str, cluster: str, holder: str, auth: str | None, body: bytes) -> None:
    c, _ = admin_client()
    headers: dict[str, Any] = {"Content-Type": "application/json"}
    if auth is not None:
        headers["Authorization"] = auth.encode()  # bytes: a header that is not ASCII goes as it is
    url = path.format(c=cluster, h=holder)
    r = c.post(url, content=body, headers=headers) if "actions" not in url and "holds" != url[-5:] else c.get(url)
    assert r.status_code < 500, (url, r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json"), (url, r.status_code)
