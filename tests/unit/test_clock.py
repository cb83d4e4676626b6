"""Time one node cannot rule: leases, TTLs and windows run on the log's time (``core/clock.py``).

The two example logs (``examples/clock-behind``, ``examples/clock-ahead``) are the scenarios of a
node a minute behind and a node a day ahead for 30 s; each is checked with the log's times and,
to show what they fix, without them (each node's ``wall_ms`` then stands in, as a topic that
keeps its producers' times gives).
"""

from __future__ import annotations

import importlib.util
import io
import json
from pathlib import Path
from typing import Any

from safepoint.core import Engine, Policy, Position
from safepoint.core.clock import ClockWatch
from safepoint.core.signals import AlertChange, Signal
from safepoint.replay import replay_file
from safepoint.settings import load_settings

LOGS = Path(__file__).resolve().parents[2] / "examples"


def script(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"make_{name}", LOGS / name / "make_log.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def replayed(name: str, strip_log_time: bool = False) -> list[dict[str, Any]]:
    d = LOGS / name
    policy = load_settings(d / "safepoint.toml", environ={}).policy()
    lines = (d / "events.jsonl").read_text().splitlines()
    if strip_log_time:
        lines = [json.dumps({k: v for k, v in json.loads(x).items() if k != "log_ms"}) for x in lines]
    source = d / "events.jsonl" if not strip_log_time else None
    out = io.StringIO()
    if source is not None:
        replay_file(str(source), out, policy, io.StringIO())
    else:
        engine = Engine(policy)
        for i, line in enumerate(lines):
            for o in engine.process(line, Position("file", 0, i)):
                out.write(json.dumps(o.value) + "\n")
    return [json.loads(x) for x in out.getvalue().splitlines()]


def alerts(out: list[dict[str, Any]], kind: str, state: str = "raised") -> list[dict[str, Any]]:
    return [d for d in out if d["type"] == "alert" and d["kind"] == kind and d["state"] == state]


def test_the_examples_are_what_their_scripts_write() -> None:
    for name in ("clock-behind", "clock-ahead"):
        committed = [json.loads(x) for x in (LOGS / name / "events.jsonl").read_text().splitlines()]
        assert committed == script(name).log(), name


def test_a_node_a_minute_behind_is_alerted_and_directives_keep_coming() -> None:
    make = script("clock-behind")
    out = replayed("clock-behind")
    directives = [d for d in out if d["type"] == "compaction"]
    assert len(directives) >= make.SECONDS - 2, "one directive a second, from the second second on"
    last = [d for d in directives if d["cluster_wall_ms"] > make.T0 + 100_000]
    assert last and last[-1]["safe_ts"] == make.T0 + make.SECONDS * 1000 - 60_000 + 1 - 20_000, \
        "held by n2's own MVCC time (its clock's) less retention, to the end"
    stale = [a for a in alerts(out, "missing_node") if a["cluster_wall_ms"] > make.T0 + 2_000]
    assert stale == [], "n2 reports every second: never stale"
    (skew,) = alerts(out, "clock_skew")
    assert skew["node"] == "n2" and -60_010 < skew["value"] < -59_990
    assert skew["cluster_wall_ms"] - skew["since_wall_ms"] == 10_000, "after clock_skew_window_ms of breach"

    # the same log without the log's times: n2's clock rules it stale and the cluster freezes
    flawed = replayed("clock-behind", strip_log_time=True)
    assert [d for d in flawed if d["type"] == "compaction"] == []
    n2 = [a["state"] for a in flawed if a["type"] == "alert" and a["kind"] == "missing_node" and a["node"] == "n2"]
    assert n2 and n2[-1] == "raised", "n2 is never seen as live"


def test_a_jump_a_day_ahead_expires_no_hold_and_makes_no_node_stale() -> None:
    make = script("clock-ahead")
    out = replayed("clock-ahead")
    assert alerts(out, "service_hold_expired") == []
    assert [a for a in alerts(out, "missing_node") if a["cluster_wall_ms"] > make.T0 + 2_000] == []
    held = [d for d in out if d["type"] == "compaction" and make.T0 + 11_000 < d["cluster_wall_ms"] < make.T0 + 90_000]
    assert held and max(d["safe_ts"] for d in held) == make.T0 + 5_000, "the backup's hold holds through the jump"
    after = [d for d in out if d["type"] == "compaction" and d["cluster_wall_ms"] > make.T0 + 91_000]
    assert after and after[-1]["safe_ts"] == make.T0 + make.SECONDS * 1000 - 20_000, "released: it moves on"
    (raised,) = alerts(out, "clock_skew")
    (cleared,) = alerts(out, "clock_skew", "cleared")
    assert raised["node"] == cleared["node"] == "n2" and raised["value"] > 86_000_000
    assert make.T0 + 40_000 <= raised["cluster_wall_ms"] < cleared["cluster_wall_ms"] <= make.T0 + 71_000

    # without the log's times the jump expires the backup's hold at once and makes n1 stale
    flawed = replayed("clock-ahead", strip_log_time=True)
    assert alerts(flawed, "service_hold_expired")
    assert any(a["node"] == "n1" for a in alerts(flawed, "missing_node") if a["cluster_wall_ms"] > make.T0 + 2_000)


def test_one_late_delivery_is_no_skew_but_a_lasting_offset_is() -> None:
    policy = Policy()  # 10 s beyond 10 s
    watch = ClockWatch("n1")
    signals: list[Signal] = []
    t = 1_000_000

    def take(wall: int, log: int) -> None:
        said = watch.take(wall, log, policy)
        if said is not None:
            signals.append(said)

    take(t, t + 5)
    take(t + 1_000, t + 40_000)  # sent before a broker outage, appended 39 s late
    take(t + 41_000, t + 41_005)  # on time again: the breach ends
    take(t + 60_000, t + 60_005)
    assert signals == [] and watch.band.quiet and watch.offset == -5
    for k in range(12):  # a clock 15 s behind, one event a second
        take(t + 61_000 + k * 1000 - 15_000, t + 61_000 + k * 1000)
    assert [(s.body["kind"], s.state, s.body["value"]) for s in signals if isinstance(s, AlertChange)] == [
        ("clock_skew", "raised", -15_000)]
    assert len(signals) == 1
    assert ClockWatch("n1", watch.to_stored()).to_stored() == watch.to_stored(), "stored and read back"


def test_a_replay_line_may_carry_its_log_time_and_the_job_ignores_a_nodes_own() -> None:
    """A file's ``log_ms`` is the record's time; a message read from Kafka takes the broker's (or,
    without one, its ``wall_ms``), whatever its own ``log_ms`` says."""
    from safepoint.core.batch import route

    hb = {"v": 1, "type": "heartbeat", "cluster": "c1", "node": "n1", "incarnation": 1, "seq": 1, "wall_ms": 1_000,
          "mvcc_now": 5, "log_ms": 9_999_999}
    engine = Engine(Policy())
    engine.process(json.dumps(hb), Position("file", 0, 0))
    assert engine.clusters["c1"].cluster_time == 9_999_999
    engine = Engine(Policy())
    engine.process(json.dumps(hb), Position("t", 0, 0), log_ms=2_000)
    assert engine.clusters["c1"].cluster_time == 2_000
    ((_, (routed,)),) = route([(0, 0, b"n1", json.dumps(hb).encode(), None)], "t", Policy()).items()
    assert routed.log_ms == routed.payload["log_ms"] == 1_000, "no broker time: the node's wall_ms, not its log_ms"
    ((_, (routed,)),) = route([(0, 0, b"n1", json.dumps(hb).encode(), 3_000)], "t", Policy()).items()
    assert routed.log_ms == routed.payload["log_ms"] == 3_000
