"""The dashboard as a person reads it, in a real browser (Debian's chromium), over the example logs.

The pressure example (``examples/pressure/``) is replayed to the middle of its crisis and the
tenants example (renamed cluster ``tenants``) to while tenant ``a``'s report holds its namespace.
Their status parts go into a ``StatusStore`` every 10 s of cluster time, as the job writes them
each micro-batch, so the lag chart has many points; the app is served as ``serve`` serves it, with
``mvcc_unit = "ms"``. The page must show MVCC times as UTC times and the lag as a duration, the
chart with its axes, the emergency mark, holds with their costs and the costliest holds, each
node's held bytes, and the namespaces panel.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from safepoint.core.codec import encode
from safepoint.core.engine import Engine, Position
from safepoint.core.status import cluster_status, node_status, status_key
from safepoint.devtools.broker import free_port
from safepoint.ops.http_api import HttpServer, make_app
from safepoint.ops.status_store import StatusStore
from safepoint.settings import load_settings

from observers import browser_missing, dashboard_text, missing_tool

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
T0 = 1_767_225_600_000


def publish(engine: Engine, store: StatusStore) -> None:
    """Every status part of ``engine`` into ``store``, as one micro-batch of the job writes them."""
    for (cluster, node), ns in sorted(engine.nodes.items()):
        store.apply_raw(status_key(cluster, node).encode(), encode(node_status(ns, engine.policy)).encode())
    for name, cs in sorted(engine.clusters.items()):
        store.apply_raw(status_key(name).encode(), encode(cluster_status(cs, engine.policy)).encode())


def replay_into(store: StatusStore, name: str, until: Any, rename: str | None = None) -> None:
    """Replay ``examples/<name>`` while ``until(event)`` is false, publishing every 10 s of wall time."""
    d = ROOT / "examples" / name
    engine = Engine(load_settings(d / "safepoint.toml", environ={}).policy())
    last = None
    for i, line in enumerate((d / "events.jsonl").read_text().splitlines()):
        ev = json.loads(line)
        if rename is not None:
            ev["cluster"] = rename
        if until(ev, engine):
            break
        engine.process(json.dumps(ev), Position("events", 0, i, ev.get("node")))
        if last is None or ev["wall_ms"] - last >= 10_000:
            publish(engine, store)
            last = ev["wall_ms"]
    publish(engine, store)


def holds_a(_ev: dict[str, Any], engine: Engine) -> bool:
    """Stop once tenant a's own bound is 30 s behind the other namespaces'."""
    cs = engine.clusters.get("tenants")
    if cs is None:
        return False
    st = cluster_status(cs, engine.policy)
    a, others = (st.get("namespaces") or {}).get("a"), st.get("namespace_safe_ts")
    return a is not None and others is not None and others > a + 30_000


def test_the_dashboard_reads_in_human_units_with_costs_chart_and_namespaces(tmp_path: Path) -> None:
    if browser_missing() is not None:
        missing_tool(str(browser_missing()))
    store = StatusStore()
    replay_into(store, "pressure", lambda ev, _e: ev["wall_ms"] > T0 + 240_000)
    replay_into(store, "tenants", holds_a, rename="tenants")
    assert store.bad == 0, store.skipped
    server = HttpServer(make_app(store, mvcc_unit="ms"), "127.0.0.1", free_port()).start()
    try:
        seen = dashboard_text(server.url, ["monthly report", "namespaces"], tmp_path / "dashboard.png")
    finally:
        server.stop()
    # MVCC time in ms is a clock: the safe point is the report's read time, the lag a duration
    assert seen["c1:safe_ts"] == "2026-01-01 00:00:10 UTC", seen["c1:safe_ts"]
    assert re.fullmatch(r"\d+(\.\d)? (s|min)", seen["c1:lag"]), seen["c1:lag"]
    assert seen["c1:emergency"] == "emergency"
    # the chart has its axes: the lag in time units, cluster time in UTC at both ends
    assert re.fullmatch(r"\d+(\.\d)? (ms|s|min)", seen["c1:y-max"]), seen["c1:y-max"]
    assert re.fullmatch(r"\d\d:\d\d:\d\d UTC", seen["c1:x-start"]) and seen["c1:x-start"] < seen["c1:x-end"]
    # costs: the blocker and the costliest holds name what the report alone keeps, in bytes
    assert "monthly report" in seen["c1:blocker"] and "alone keeps" in seen["c1:blocker"], seen["c1:blocker"]
    assert "MB" in seen["c1:blocker"]
    costliest = seen["c1:"].split("costliest holds", 1)[1].split("nodes", 1)[0]
    assert costliest.splitlines()[2].startswith("monthly report"), costliest
    assert re.search(r"\d+(\.\d)? (MB|GB)", seen["c1:held"]), seen["c1:held"]
    # tenants: the namespaces panel with tenant a's own bound, as a UTC time
    panel = seen["tenants:"].split("namespaces", 1)[1]
    bound = re.search(r"^a (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC$", panel, re.M)
    others = re.fullmatch(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC", seen["tenants:namespace_safe_ts"])
    assert bound and others and bound[1] < others[1], panel
    assert (tmp_path / "dashboard.png").stat().st_size > 10_000
    print(f"[dashboard] screenshot {tmp_path / 'dashboard.png'}")
