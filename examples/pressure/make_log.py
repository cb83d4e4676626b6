"""Writes ``events.jsonl`` of the pressure example: a node filling up, closed in a loop with the job.

A database node (n1) whose MVCC time is its clock in ms writes 5 MB of history a second. A
monthly report opens at t = 10 s and holds history from then on; the node's pinned bytes grow.
Every second the database runs short reads; every 15 s it tries two long audit reads 0.5 s
apart, through the node client's real admission control (``safepoint.connectors.admission``)
fed with the directives the job's core sends back after every event. So the log shows what the
product does, not what a script says it does:

* t = 70 s on: pinned bytes grow 5 MB/s; at t = 113 s ``pressure_forecast`` (critical within
  the 120 s horizon at the rate fitted over the last 60 s);
* the warning band (600 MB for 10 s): the second audit of each pair is throttled;
* the critical band (1,000 MB for 10 s): audits are refused, short reads go on;
* compaction debt grows while critical: the cluster enters **emergency**;
* 30 s into critical, the report (open longer than 120 s) is expired gracefully; the node
  closes it as the client's ``on_expire`` would; pinned bytes fall, the bands clear, debt
  shrinks, and 30 s later the emergency ends; long reads are admitted again.

Heartbeats carry ``history_above`` (so the report's cost is shown), ``debt_bytes`` and the
admission counts. Run from the project's root: ``.venv/bin/python examples/pressure/make_log.py``
(``tests/unit/test_golden.py`` checks that it writes the committed log).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from safepoint.connectors.admission import Admission
from safepoint.core.engine import Engine, Position
from safepoint.core.outputs import DIRECTIVES
from safepoint.errors import AdmissionRefused, AdmissionThrottled
from safepoint.settings import load_settings

HERE = Path(__file__).resolve().parent
T0 = 1_767_225_600_000
"""2026-01-01 00:00:00 UTC: wall clock and MVCC time (ms) of the example's start."""
WRITE_BYTES_PER_S = 5_000_000
END_S = 360


class Node:
    """n1: its holds, history and debt, publishing events in seq order."""

    def __init__(self, retention: int) -> None:
        self.retention = retention
        self.seq = 0
        self.readers: dict[str, int] = {}
        self.debt = 0
        self.now_s = 0.0
        """The node's monotonic clock (s), which its admission control's token bucket reads."""
        self.admission = Admission("n1", long_per_s=1.0, clock=lambda: self.now_s)

    def event(self, kind: str, wall: int, **fields: Any) -> dict[str, Any]:
        self.seq += 1
        return {"v": 1, "type": kind, "cluster": "c1", "node": "n1", "incarnation": 1, "seq": self.seq,
                "wall_ms": wall, **fields}

    def low(self, now: int) -> int:
        """The oldest MVCC time the node keeps: its oldest reader or its retention bound."""
        return min([now - self.retention, *self.readers.values()])

    def pinned(self, now: int) -> int:
        return WRITE_BYTES_PER_S * (now - self.low(now)) // 1000

    def heartbeat(self, wall: int) -> dict[str, Any]:
        now = wall
        pinned = self.pinned(now)
        self.debt = max(0, self.debt + (pinned - 800_000_000) // 40) if pinned > 800_000_000 else max(0, self.debt - 20_000_000)
        low = self.low(now)
        curve = [{"ts": ts, "bytes": WRITE_BYTES_PER_S * (now - ts) // 1000} for ts in range(low, now, 60_000)]
        return self.event("heartbeat", wall, mvcc_now=now, pinned_bytes=pinned, debt_bytes=self.debt,
                          history_above=curve, admission_throttled=self.admission.throttled,
                          admission_refused=self.admission.refused)


def simulate() -> list[dict[str, Any]]:
    settings = load_settings(HERE / "safepoint.toml", environ={})
    engine = Engine(settings.policy())
    node = Node(settings.retention)
    log: list[dict[str, Any]] = []
    audits: dict[str, int] = {}  # open audit reader -> when it ends (s)

    def publish(ev: dict[str, Any]) -> None:
        log.append(ev)
        for out in engine.process(json.dumps(ev), Position("events", 0, len(log) - 1, ev.get("node"))):
            if out.channel != DIRECTIVES:
                continue
            d = out.value
            if d["type"] == "band" and d["node"] == "n1":
                node.admission.observe(d["band"])
            elif d["type"] == "compaction":
                node.admission.observe_emergency(d.get("emergency") is not None)
            elif d["type"] == "expire" and d.get("reader_id") in node.readers:
                expired.append(d["reader_id"])

    expired: list[str] = []
    publish({"v": 1, "type": "topology", "cluster": "c1", "version": 1, "wall_ms": T0, "nodes": {"n1": []}})
    for s in range(END_S + 1):
        wall = T0 + s * 1000
        node.now_s = float(s)
        publish(node.heartbeat(wall))
        for rid in expired:  # the node ends what the job expired (the client's on_expire)
            del node.readers[rid]
            publish(node.event("reader_close", wall + 1, reader_id=rid))
        expired.clear()
        if s == 10:
            node.readers["r-report"] = wall
            publish(node.event("reader_open", wall + 2, reader_id="r-report", read_ts=wall, label="monthly report"))
        publish(node.event("reader_open", wall + 3, reader_id=f"r-short-{s}", read_ts=wall, label="point read"))
        publish(node.event("reader_close", wall + 5, reader_id=f"r-short-{s}"))
        for rid in [r for r, end in audits.items() if end <= s]:
            del audits[rid], node.readers[rid]
            publish(node.event("reader_close", wall + 6, reader_id=rid))
        if s % 15 == 0 and s:
            for half in (0, 1):
                node.now_s = s + half / 2
                rid = f"r-audit-{s}-{half}"
                try:
                    node.admission.admit("reader", rid)
                except (AdmissionThrottled, AdmissionRefused):
                    continue
                node.readers[rid] = wall - 30_000
                audits[rid] = s + 5
                publish(node.event("reader_open", wall + 500 * half + 7, reader_id=rid, read_ts=wall - 30_000,
                                   label="audit (long)"))
    return log


def main() -> int:
    log = simulate()
    (HERE / "events.jsonl").write_text("".join(json.dumps(ev, separators=(",", ":")) + "\n" for ev in log))
    print(f"wrote {len(log)} events to {HERE / 'events.jsonl'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
