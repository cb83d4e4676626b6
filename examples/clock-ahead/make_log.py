"""Writes ``events.jsonl`` of the clock-ahead example: one node's clock jumps a day ahead for 30 s.

Two nodes of cluster ``c1`` (a topology names both) heartbeat every second for two minutes. At
10 s an operator sets a backup's service hold (TTL 10 minutes) at 5 s of MVCC time. From 30 s to
60 s node ``n2``'s clock is a day ahead (its ``wall_ms``; its MVCC clock, a hybrid clock that
checks its peers, stays right), then it is fixed. At 90 s the backup releases its hold. Each line
carries the log's time of its record as ``log_ms`` (the broker's append time; a node's message
arrives 5 ms after it is sent), so replay reads the log as the job reads the topic.

On the log's time the jump expires nothing and makes no node stale: the backup's hold keeps the
safe point at its ``ts`` until the release, then it moves on; ``clock_skew`` is raised for ``n2``
while its clock is off and cleared once it is right again. Run from the project's root:
``.venv/bin/python examples/clock-ahead/make_log.py`` (``tests/unit/test_clock.py`` checks that it
writes the committed log).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
DAY_MS = 86_400_000
DELIVERY_MS = 5
SECONDS = 120


def skew(node: str, second: int) -> int:
    return DAY_MS if node == "n2" and 30 <= second < 60 else 0


def log() -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [{"v": 1, "type": "topology", "cluster": "c1", "version": 1, "wall_ms": T0,
                                     "log_ms": T0, "nodes": {"n1": [], "n2": []}}]
    for second in range(1, SECONDS + 1):
        t = T0 + second * 1000
        for i, node in enumerate(("n1", "n2")):
            events.append({"v": 1, "type": "heartbeat", "cluster": "c1", "node": node, "incarnation": 1, "seq": second,
                           "wall_ms": t + skew(node, second) + i, "mvcc_now": t + i, "log_ms": t + i + DELIVERY_MS})
        if second == 10:
            events.append({"v": 1, "type": "service_hold", "cluster": "c1", "holder": "backup", "ts": T0 + 5_000,
                           "ttl_ms": 600_000, "label": "nightly backup", "wall_ms": t + 500, "log_ms": t + 500,
                           "action_id": "backup-1"})
        if second == 90:
            events.append({"v": 1, "type": "service_release", "cluster": "c1", "holder": "backup", "wall_ms": t + 500,
                           "log_ms": t + 500, "action_id": "backup-2"})
    return events


def main() -> None:
    out = Path(__file__).with_name("events.jsonl")
    out.write_text("".join(json.dumps(e, separators=(",", ":")) + "\n" for e in log()))


if __name__ == "__main__":
    main()
