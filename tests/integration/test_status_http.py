"""See what pins history, through HTTP, from the real job: ``safepoint run --http-port`` on the
embedded broker, then ``safepoint serve`` over the same topics.

A cluster of three nodes where n3 is named by the topology but silent: the round's reason names
it from the first round; a labelled reader on n1 and a transaction on n2 are ranked oldest first;
``/metrics`` has the series. Then n3 reports, the safe point comes out, and the job's status (the
last part of every key of the status topic, joined) equals what ``safepoint replay --status``
writes for the same log.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from safepoint.devtools.broker import free_port

from doc_blocks import block
from observers import Prometheus, browser_missing, dashboard_text, missing_tool, prometheus_missing
from tests_support import JOB_START_TIMEOUT_S, JobProcess, answers, get, job_env, job_flags, make_settings, send, wait_for

pytestmark = pytest.mark.integration
T0 = 1_767_225_600_000
LEASE = 4_000


def event(kind: str, node: str, seq: int, wall: int, **fields: Any) -> dict[str, Any]:
    return {"v": 1, "type": kind, "cluster": "c1", "node": node, "incarnation": 1, "seq": seq, "wall_ms": wall, **fields}


def first_log() -> list[dict[str, Any]]:
    return [
        {"v": 1, "type": "topology", "cluster": "c1", "version": 1, "wall_ms": T0, "nodes": {"n1": [], "n2": [], "n3": []}},
        event("heartbeat", "n1", 1, T0, mvcc_now=1_000_000),
        event("heartbeat", "n2", 1, T0 + 1, mvcc_now=1_000_000),
        event("reader_open", "n1", 2, T0 + 10, reader_id="r1", read_ts=950_000, label="nightly-report"),
        event("tx_begin", "n2", 2, T0 + 20, tx_id="t1", begin_ts=970_000, label="etl"),
        event("heartbeat", "n1", 3, T0 + 1_000, mvcc_now=2_000_000,
              history_above=[{"ts": 900_000, "bytes": 8_000_000}, {"ts": 1_500_000, "bytes": 2_000_000}]),
        event("heartbeat", "n2", 3, T0 + 1_000, mvcc_now=2_100_000),
    ]


def second_log() -> list[dict[str, Any]]:
    return [
        event("heartbeat", "n3", 1, T0 + 2_000, mvcc_now=2_000_000),
        event("heartbeat", "n1", 4, T0 + 2_000, mvcc_now=2_000_000),
    ]


def as_messages(events: list[dict[str, Any]]) -> list[tuple[int, str, Any]]:
    return [(0, e.get("node", e["cluster"]), e) for e in events]


def test_the_job_serves_what_pins_history(broker: Any, tmp_path: Path) -> None:
    settings = make_settings(broker.bootstrap, "status", 1, retention=100_000, node_lease_ms=LEASE, trigger_ms=200)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    job = JobProcess(job_flags(settings, tmp_path / "ckpt", http_port=port), tmp_path / "job.log")
    serve = None
    try:
        wait_for(lambda: answers(base + "/healthz"), JOB_START_TIMEOUT_S, "the job's HTTP surface", job)
        send(broker.bootstrap, settings.events_topic, as_messages(first_log()))

        def seen() -> bool:
            try:
                st = get(base + "/api/v1/clusters/c1")
            except urllib.error.HTTPError:
                return False
            return len(st["holds"]) >= 2 and st["cluster_wall_ms"] == T0 + 1_000

        wait_for(seen, 120, "the status of c1 with both holds", job, every_s=0.5)
        st = get(base + "/api/v1/clusters/c1")
        assert st["round"]["aborted"] and [(r["kind"], r["node"]) for r in st["round"]["reasons"]] == [("missing_node", "n3")]
        assert st["safe_ts"] is None and st["seq"] == 0
        holds = get(base + "/api/v1/clusters/c1/holds?limit=2")["holds"]
        assert [(h["node"], h["kind"], h["id"], h["label"], h["age_ms"]) for h in holds] == [
            ("n1", "reader", "r1", "nightly-report", 990), ("n2", "tx", "t1", "etl", 980)]
        assert [n["node"] for n in get(base + "/api/v1/clusters/c1/nodes")["nodes"]] == ["n1", "n2", "n3"]
        # n1 sends a history curve: its reader alone keeps the history from 950,000 to its retention
        # bound 1,900,000 (7,500,000 - 400,000 bytes on the curve); n2's transaction's cost is unknown
        by_cost = get(base + "/api/v1/clusters/c1/holds?order=cost&limit=2")["holds"]
        assert [(h["id"], h["cost_bytes"]) for h in by_cost] == [("r1", 7_100_000), ("t1", None)]
        metrics = get(base + "/metrics")
        assert 'safepoint_round_aborted{cluster="c1",reason="missing_node"} 1.0' in metrics
        assert 'safepoint_holds{cluster="c1",kind="reader"} 1.0' in metrics
        # the driver notes a batch when it polls the query's progress (every 0.5 s), after the batch
        # committed: the status it wrote can be read before that
        wait_for(lambda: get(base + "/healthz")["job"]["input_lag_messages"] == 0, 60, "the job's figures in /healthz", job)
        health = get(base + "/healthz")
        assert health["job"]["active"] is True and health["job"]["batches"] >= 1

        send(broker.bootstrap, settings.events_topic, as_messages(second_log()))
        wait_for(lambda: get(base + "/api/v1/clusters/c1")["safe_ts"] is not None, 120, "the first safe point", job,
                 every_s=0.5)
        time.sleep(1.0)  # the batch's node parts and cluster part arrive together; let the follower read all
        st = get(base + "/api/v1/clusters/c1")
        assert st["safe_ts"] == 950_000 and st["blocker"]["label"] == "nightly-report" and not st["round"]["aborted"]
        assert re.search(r'^safepoint_safe_ts\{cluster="c1"\} 950000\.0$', get(base + "/metrics"), re.M)
        wait_for(lambda: bool(re.search(r'^safepoint_input_messages_total\{outcome="applied"\} 9\.0$',
                                        get(base + "/metrics"), re.M)), 60, "every message counted as applied", job)

        # replay --status over the same log gives the same status
        log = tmp_path / "events.jsonl"
        log.write_text("".join(json.dumps(e) + "\n" for e in first_log() + second_log()))
        out = tmp_path / "status.json"
        proc = subprocess.run([sys.executable, "-m", "safepoint.cli", "replay", "--input", str(log), "--output", "/dev/null",
                               "--status", str(out), "--retention", "100000", "--node-lease-ms", str(LEASE)],
                              capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(out.read_text()) == get(base + "/api/v1/clusters")

        # safepoint serve: the same from the topics alone
        sport = free_port()
        serve = subprocess.Popen([sys.executable, "-m", "safepoint.cli", "serve", "--bootstrap", broker.bootstrap,
                                  "--status-topic", settings.status_topic, "--http-port", str(sport)],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=job_env())
        sbase = f"http://127.0.0.1:{sport}"
        wait_for(lambda: answers(sbase + "/api/v1/clusters/c1"), 60, "safepoint serve to show c1")
        wait_for(lambda: get(sbase + "/api/v1/clusters") == get(base + "/api/v1/clusters"), 30, "serve to catch up")
        assert get(sbase + "/healthz")["job"]["batches"] >= 2, "the job's own figures, from the status topic"

        # a real Prometheus scrapes the job, and a person looks at the dashboard in a real browser
        if prometheus_missing() is None:
            scrape = block("docs/operations.md", "scrape_configs:").text
            prom = Prometheus(scrape.replace("127.0.0.1:8000", f"127.0.0.1:{port}"), tmp_path)
            try:
                assert prom.value_of('safepoint_safe_ts{cluster="c1"}') == 950_000
                assert prom.value_of('safepoint_holds{cluster="c1",kind="tx"}') == 1
            finally:
                prom.stop()
        if browser_missing() is None:
            shot = tmp_path / "dashboard.png"
            seen_page = dashboard_text(base + "/", ["nightly-report", "950,000"], shot)
            assert seen_page["safe_ts"] == "950,000"
            assert re.fullmatch(r"\d\d:\d\d:\d\d UTC", seen_page["cluster_time"]), seen_page["cluster_time"]
            assert "growth" in seen_page["page"] and "critical in" in seen_page["page"], "the node table's forecast columns"
            assert "nightly-report" in seen_page["blocker"] and "n1" in seen_page["blocker"]
            assert "nightly-report" in seen_page["page"].split("oldest holds", 1)[1], "the top holder's label"
            assert shot.stat().st_size > 10_000
            print(f"[dashboard] screenshot {shot}")
        missing = [why for why in (prometheus_missing(), browser_missing()) if why]
    except BaseException:
        print(job.tail(80))
        raise
    finally:
        if serve is not None:
            serve.terminate()
            out_text = serve.communicate(timeout=30)[0]
            assert serve.returncode == 0 and "safepoint serve: stopped" in out_text, out_text
        assert job.stop() == 0, job.tail()
    if missing:
        missing_tool("; ".join(missing))
