"""Writes ``events.jsonl`` of the clock-behind example: one node's clock a minute behind the others'.

Two nodes of cluster ``c1`` (a topology names both) heartbeat every second for two minutes. Node
``n2``'s clock is 60 s behind: its ``wall_ms`` (and the MVCC time it derives from it) lag the
real time by a minute, while the broker appends its messages on time. Each line carries the log's
time of its record as ``log_ms`` (what the broker stamps on an events topic kept with
``message.timestamp.type = LogAppendTime``; a node's message arrives 5 ms after it is sent), so
replay reads the log as the job reads the topic.

Leases run on the log's time, so ``n2`` stays a live member and directives keep coming (held
back by ``n2``'s own MVCC time, which is its real history); ``clock_skew`` names ``n2`` and its
offset. Run from the project's root: ``.venv/bin/python examples/clock-behind/make_log.py``
(``tests/unit/test_clock.py`` checks that it writes the committed log).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
SKEW_MS = {"n1": 0, "n2": -60_000}
DELIVERY_MS = 5
SECONDS = 120


def log() -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [{"v": 1, "type": "topology", "cluster": "c1", "version": 1, "wall_ms": T0,
                                     "log_ms": T0, "nodes": {"n1": [], "n2": []}}]
    for second in range(1, SECONDS + 1):
        t = T0 + second * 1000
        for i, (node, skew) in enumerate(SKEW_MS.items()):
            wall = t + skew + i
            events.append({"v": 1, "type": "heartbeat", "cluster": "c1", "node": node, "incarnation": 1, "seq": second,
                           "wall_ms": wall, "mvcc_now": wall, "log_ms": t + i + DELIVERY_MS})
    return events


def main() -> None:
    out = Path(__file__).with_name("events.jsonl")
    out.write_text("".join(json.dumps(e, separators=(",", ":")) + "\n" for e in log()))


if __name__ == "__main__":
    main()
