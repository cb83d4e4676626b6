"""``safepoint view`` at a terminal (a pseudo-terminal 72 columns wide): the screen is drawn to the
terminal's width, with the safe point as a time and its lag computed now."""

from __future__ import annotations

import os
import re
import sys
import time
from typing import Any

import pytest

from safepoint.connectors.kafka.topics import ensure_topics, topic_specs

from kafka_util import produce, unique
from pty_util import run_at_terminal

pytestmark = pytest.mark.integration
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]|\r")


def test_view_fits_a_72_column_terminal(broker: Any) -> None:
    tag = unique("view")
    topics = {"events": f"{tag}.events", "directives": f"{tag}.directives", "alerts": f"{tag}.alerts",
              "deadletter": f"{tag}.deadletter"}
    ensure_topics({"bootstrap.servers": broker.bootstrap}, topic_specs(topics, 1, log_append_time=False))
    now_ms = time.time_ns() // 1_000_000
    produce(broker.bootstrap, topics["directives"], [("c1", {
        "v": 1, "type": "compaction", "cluster": "c1", "seq": 1, "safe_ts": (now_ms - 60_000) * 1000, "catalog_floor": None,
        "cluster_wall_ms": now_ms - 50_000, "basis": {}, "retention": 10_000_000,
        "blocker": {"node": "n2", "kind": "reader", "id": "r-1", "ts": 0, "age_ms": 1000, "label": "nightly " * 20}})])
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    rc, drawn = run_at_terminal([sys.executable, "-m", "safepoint.cli", "view", "--bootstrap", broker.bootstrap,
                                 "--directives-topic", topics["directives"], "--alerts-topic", topics["alerts"],
                                 "--mvcc-unit", "us", "--duration", "6"], columns=72, env=env)
    out = ANSI.sub("", drawn)
    assert rc == 0, out[-2000:]
    lines = out.splitlines()
    assert max(len(x) for x in lines) <= 72, [x for x in lines if len(x) > 72][:3]
    assert "safe point (UTC)" in out and re.search(r"\d\d:\d\d:\d\d\.\d{3}", out)
    assert " 1 min " in out, "the lag is computed now: a minute behind, not the 10 s the directive was written at"
    assert re.search(r"open (5[1-9]|6\d) s", out), "the blocker's age is as of now too"
