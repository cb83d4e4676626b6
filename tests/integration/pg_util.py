"""The tests' real PostgreSQL (``safepoint.devtools.postgres``: Debian's PostgreSQL 15 as the
``postgres`` user, on loopback, in a temp dir), the fixture every PostgreSQL test module imports, and
helpers to read what an agent published."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from safepoint.connectors.postgres_agent import PostgresAgent
from safepoint.devtools.postgres import postgres_missing

from kafka_util import read_topic
from observers import missing_tool


@pytest.fixture(autouse=True)
def _needs_postgres() -> None:
    """Every test of a module that imports this fixture needs Debian's PostgreSQL."""
    why = postgres_missing()
    if why:
        missing_tool(why)


class Running:
    """A ``PostgresAgent`` polling in a thread of the test."""

    def __init__(self, agent: PostgresAgent, started: bool = False) -> None:
        self.agent = agent if started else agent.start()
        self.thread = threading.Thread(target=agent.run, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.agent.stop()
        self.thread.join(30)


def holds_published(bootstrap: str, topic: str, node: str, incarnation: int | None = None) -> dict[str, dict[str, Any]]:
    """The holds a node's events leave open (of one incarnation, or of its last), by id."""
    events = [e for e in read_topic(bootstrap, topic, timeout_s=3) if e.get("node") == node]
    if incarnation is None and events:
        incarnation = events[-1]["incarnation"]
    open_: dict[str, dict[str, Any]] = {}
    for e in events:
        if e["incarnation"] != incarnation:
            continue
        kind = e["type"]
        if kind in ("reader_open", "tx_begin"):
            open_[e.get("reader_id") or e["tx_id"]] = dict(e)
        elif kind == "tx_prepare":
            open_[e["tx_id"]]["prepared"] = True
        elif kind in ("reader_close", "tx_end"):
            open_.pop(e.get("reader_id") or e["tx_id"], None)
        elif kind == "snapshot":  # a restatement (the reporter's repair): the whole set
            open_ = {r["reader_id"]: {**r, "type": "reader_open"} for r in e["readers"]}
            open_.update((t["tx_id"], {**t, "type": "tx_begin"}) for t in e["txs"])
    return open_


def last_heartbeat(bootstrap: str, topic: str, node: str) -> dict[str, Any]:
    beats = [e for e in read_topic(bootstrap, topic, timeout_s=3) if e.get("node") == node and e["type"] == "heartbeat"]
    return beats[-1] if beats else {}
