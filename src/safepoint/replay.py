"""``safepoint replay``: the core over a file of events, without Spark or Kafka."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from safepoint.core.codec import encode
from safepoint.core.engine import Engine, Position
from safepoint.core.outputs import DEADLETTER, Output
from safepoint.core.policy import Policy

__all__ = ["replay_lines", "replay_file"]


def replay_lines(lines: Iterable[bytes], policy: Policy, topic: str = "replay") -> Iterator[tuple[Output, Engine]]:
    """Run the core over raw lines (one message value a line, in log order)."""
    engine = Engine(policy)
    for offset, raw in enumerate(lines):
        value = raw.rstrip(b"\r\n")
        if not value.strip():
            continue
        for out in engine.process(value, Position(topic, 0, offset, None)):
            yield out, engine


def replay_file(
    input_path: str,
    output: IO[str] | None,
    policy: Policy,
    deadletter: IO[str] | None = None,
) -> Engine:
    """Write directives and alerts (one JSON object a line) to ``output``; dead letters apart."""
    engine = Engine(policy)
    src = sys.stdin.buffer if input_path == "-" else Path(input_path).open("rb")  # noqa: SIM115
    try:
        for offset, raw in enumerate(src):
            value = raw.rstrip(b"\r\n")
            if not value.strip():
                continue
            for out in engine.process(value, Position(input_path, 0, offset, None)):
                target = deadletter if out.channel == DEADLETTER else output
                if target is not None:
                    target.write(encode(out.value) + "\n")
    finally:
        if src is not sys.stdin.buffer:
            src.close()
    return engine
