"""The report of the benchmark's mariadb phase (benchmarks/bench_mariadb.py) from a run's figures."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from bench_mariadb import mariadb_lines  # noqa: E402


def test_the_history_lists_side_by_side() -> None:
    def run(series: list[tuple[float, int, int]], ended: float, rolled_back: bool, killed: int) -> dict:
        lengths = [n for _, n, _ in series]
        return {"series": series, "ended_s": ended, "rolled_back": rolled_back, "killed": killed,
                "mean": sum(lengths) / len(lengths), "max": max(lengths), "end": lengths[-1],
                "undo_max": max(u for _, _, u in series)}

    res = {"hold_s": 60.0, "window_s": 20.0, "max_lifetime_s": 20.0, "writes": {"kill": 1000, "off": 1001},
           "kill": run([(0.0, 30, 0), (10.0, 500, 16384), (20.0, 4, 0)], 12.5, False, 1),
           "off": run([(0.0, 31, 0), (10.0, 510, 16384), (20.0, 990, 32768)], 60.0, True, 0)}
    text = "\n".join(mariadb_lines(res))
    assert "ended at 12.5 s (killed by the agent: 1)" in text and "at 60.0 s (its client's rollback" in text, text
    assert "| at 10 s | 500 | 510 |" in text and "| at 20 s | 4 | 990 |" in text, text
    assert "| max | 500 | 990 |" in text and "| undo at most | 16,384 B | 32,768 B |" in text, text
