"""``safepoint replay``: the core over a file of events, without Spark or Kafka."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from safepoint.core.alerts import problems
from safepoint.core.cluster import ClusterState
from safepoint.core.codec import encode
from safepoint.core.engine import Engine
from safepoint.core.outputs import DEADLETTER
from safepoint.core.policy import Policies, Policy
from safepoint.core.status import assemble, cluster_status, node_status

__all__ = ["replay_progress", "replay_file", "why_no_safe_point", "summary_lines", "final_status"]


def replay_file(
    input_path: str,
    output: IO[str] | None,
    policy: Policy | Policies,
    deadletter: IO[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Engine:
    """Write directives and alerts (one JSON object a line) to ``output``; dead letters apart.
    ``progress(bytes_read, messages)`` is called every few thousand lines."""
    engine = Engine(policy)
    src = sys.stdin.buffer if input_path == "-" else Path(input_path).open("rb")  # noqa: SIM115
    read = 0
    try:
        for offset, raw in enumerate(src):
            read += len(raw)
            if progress is not None and offset % 4096 == 0:
                progress(read, offset)
            value = raw.rstrip(b"\r\n")
            if not value or value.isspace():
                continue
            for out in engine.process_at(value, input_path, 0, offset):
                target = deadletter if out.channel == DEADLETTER else output
                if target is not None:
                    target.write(encode(out.value) + "\n")
    finally:
        if src is not sys.stdin.buffer:
            src.close()
    if progress is not None:
        progress(read, sum(engine.counts.values()))
    return engine


def final_status(engine: Engine) -> dict[str, Any]:
    """Every cluster's status at the end of the log, as ``GET /api/v1/clusters`` shows the job's
    (``{"clusters": [...]}`` by name): the same parts the job publishes, joined the same way."""
    policies = engine.policies
    by_cluster: dict[str, list[dict[str, Any]]] = {}
    for (cluster, _node), ns in sorted(engine.nodes.items()):
        by_cluster.setdefault(cluster, []).append(node_status(ns, policies.of(cluster)))
    return {"clusters": [assemble(cluster_status(cs, policies.of(name)), by_cluster.get(name, []))
                         for name, cs in sorted(engine.clusters.items())]}


def why_no_safe_point(state: ClusterState, policy: Policy) -> str | None:
    """Why a cluster has no safe point yet, in plain words (None when it has one)."""
    if state.safe_ts is not None:
        return None
    now, first = state.cluster_time, state.first_wall
    if now is None or first is None:
        return "no node event yet (cluster time starts with the nodes' wall_ms)"
    if state.members.topology is None and now < first + policy.node_lease_ms:
        return (f"no topology yet and the discovery window has not ended: cluster time is {now - first} ms past the "
                f"first event, node_lease_ms is {policy.node_lease_ms}")
    found = [p.detail for p in sorted(problems(state.members, state.recovery, now, policy).values())]
    if found:
        more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
        return "the round is aborted: " + "; ".join(found[:3]) + more
    return "no node minimum is known yet (no node of the round has sent a heartbeat)"


def summary_lines(engine: Engine) -> list[str]:
    """What a replay ends with: the counts, each cluster's safe point or why it has none, the dead letters."""
    counts = dict(sorted(engine.counts.items()))
    safe = {name: c.safe_ts for name, c in sorted(engine.clusters.items()) if name}
    lines = [f"replay: {sum(counts.values())} messages {counts}; final safe_ts {safe}"]
    for name, c in sorted(engine.clusters.items()):
        why = why_no_safe_point(c, engine.policies.of(name)) if name else None
        if why:
            lines.append(f"replay: cluster {name} has no safe point: {why}")
    dead = dict(sorted(engine.dead_letters.items()))
    if dead:
        lines.append(f"replay: {sum(dead.values())} dead letter(s): " + ", ".join(f"{k} {v}" for k, v in dead.items()))
    return lines


@contextlib.contextmanager
def replay_progress(path: str, min_bytes: int = 5_000_000) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar with the rate on stderr, for a long input read at a terminal (else None)."""
    size = os.path.getsize(path) if path != "-" and os.path.isfile(path) else 0
    if size < min_bytes or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    started = time.monotonic()
    with Progress(TextColumn("replay"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                  TextColumn("{task.fields[rate]}"), TimeRemainingColumn(), console=Console(stderr=True),
                  transient=True) as bar:
        task = bar.add_task("replay", total=size, rate="")

        def update(done: int, messages: int) -> None:
            rate = messages / max(time.monotonic() - started, 1e-3)
            bar.update(task, completed=done, rate=f"{messages:,} messages, {rate:,.0f}/s")

        yield update
