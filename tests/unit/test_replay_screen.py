"""``safepoint replay`` says why a cluster has no safe point, sums up its dead letters, and shows a
progress bar with the rate on a long input read at a terminal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from safepoint.cli import main

from pty_util import run_at_terminal

T = 1_700_000_000_000


def write(path: Path, events: list[object]) -> str:
    path.write_text("\n".join(e if isinstance(e, str) else json.dumps(e) for e in events) + "\n")
    return str(path)


def hb(node: str, seq: int, wall: int) -> dict[str, object]:
    return {"v": 1, "type": "heartbeat", "node": node, "incarnation": 0, "seq": seq, "wall_ms": wall, "mvcc_now": 1000 + seq}


def replay_err(tmp_path: Path, events: list[object], capsys: pytest.CaptureFixture[str]) -> list[str]:
    rc = main(["replay", "--input", write(tmp_path / "e.jsonl", events), "--output", str(tmp_path / "o.jsonl")])
    assert rc == 0
    return capsys.readouterr().err.strip().splitlines()


def test_why_no_safe_point_in_the_discovery_window(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = replay_err(tmp_path, [hb("n1", 0, T), hb("n1", 1, T + 2_000)], capsys)
    assert err[1] == ("replay: cluster default has no safe point: no topology yet and the discovery window has not "
                      "ended: cluster time is 2000 ms past the first event, node_lease_ms is 30000")


def test_why_no_safe_point_when_the_round_is_aborted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    topo = {"v": 1, "type": "topology", "version": 1, "wall_ms": T, "nodes": {"n1": [], "n2": []}}
    err = replay_err(tmp_path, [topo, hb("n1", 0, T), "{not json", "[]", "{also not"], capsys)
    assert err[1] == ("replay: cluster default has no safe point: the round is aborted: "
                      "node n2 is in the topology but never reported")
    assert err[2] == "replay: 3 dead letter(s): not_json 2, not_object 1"


def test_a_long_input_at_a_terminal_shows_progress_with_a_rate(tmp_path: Path) -> None:
    events = [hb(f"n{i % 50}", i // 50, T + i) for i in range(70_000)]
    path = write(tmp_path / "big.jsonl", events)
    assert os.path.getsize(path) > 5_000_000
    rc, screen = run_at_terminal([sys.executable, "-m", "safepoint.cli", "replay", "--input", path, "--output", os.devnull],
                                 columns=120, stdout=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "120"})
    assert rc == 0
    assert "replay" in screen and "%" in screen and "messages" in screen and "/s" in screen, screen[-2000:]
    assert "final safe_ts" in screen
