"""Two figures of the benchmark that need no Spark run of their own.

- **core ratio**: ``safepoint replay``'s core (``replay_file``) over a file of the throughput
  workload's events against bare ``json.loads`` of every line of the same file, timed one after the
  other in the same run (best of ``repeat`` each, so a noisy neighbour hurts both alike).
- **fleet**: how many database readers per second one job covers at p99 < 2 s, with every reader
  published (eager) and with lazy registration (``Reporter(..., retention=R)``). A sample fleet
  of real ``Reporter`` objects (their producer replaced by a list, nothing else) runs a realistic
  mix on a simulated clock: each node opens ``node_rate`` readers a second, most of them short
  (log-normal, median ~50 ms, cut at 1 s), ``long_share`` of them long (8-30 s), and sends a
  heartbeat every second. What the reporters send gives the events per reader of each mode; both
  streams are replayed by the core with the job's ``retention = R`` and must end at the same safe
  point. A fleet of N such nodes offers ``N * (1 + node_rate * events_per_reader)`` events per
  second, so the largest offered rate at which the latency runs kept p99 under 2 s gives the
  largest N, and ``N * node_rate`` readers per second.
"""

from __future__ import annotations

import json
import random
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench_common import TARGETS, mb, scale_base

__all__ = ["core_ratio", "fleet_figure", "fleet_mix", "replay_seconds", "report_lines", "targets", "write_events"]

MVCC_PER_MS = 1000
"""The sample fleet's MVCC clock counts microseconds, like the benchmark's workload."""


class _NullOut:
    def write(self, _s: str) -> int:
        return 0


def replay_seconds(path: Path, node_key_secret: str = "") -> float:
    """Seconds ``safepoint replay``'s core (``replay_file``) takes over the file at ``path``, its
    outputs dropped (``node_key_secret``: checking every node event's signature)."""
    from safepoint.core.policy import Policy
    from safepoint.replay import replay_file

    t = time.perf_counter()
    replay_file(str(path), _NullOut(), Policy(node_key_secret=node_key_secret), _NullOut())  # type: ignore[arg-type]
    return time.perf_counter() - t


def signing_cost(values: list[bytes], repeat: int = 2) -> dict[str, Any]:
    """What signed node events cost: each node event of ``values`` signed with its node's key (the
    Reporter's work per event), and the core's replay of that file checking every signature against
    the same file unchecked (the job's work per event, one run after the other)."""
    from safepoint.core.signing import node_key, sign_node

    secret = "bench-node-secret"
    keys: dict[tuple[str, str], str] = {}
    signed: list[bytes] = []
    t = time.perf_counter()
    nodes = 0
    for v in values:
        ev = json.loads(v)
        if isinstance(ev, dict) and "node" in ev and "seq" in ev:
            who = (ev.get("cluster", "default"), ev["node"])
            key = keys.get(who) or keys.setdefault(who, node_key(secret, *who))
            ev["sig"] = sign_node(ev, key)
            nodes += 1
        signed.append(json.dumps(ev, separators=(",", ":")).encode())
    sign_s = time.perf_counter() - t
    with tempfile.TemporaryDirectory(prefix="safepoint-signed-") as d:
        path = write_events(signed, d)
        plain_s = min(replay_seconds(path) for _ in range(repeat))
        checked_s = min(replay_seconds(path, secret) for _ in range(repeat))
    n = len(values)
    return {"events": n, "node_events": nodes, "sign_us": sign_s / max(nodes, 1) * 1e6,
            "replay_us": plain_s / n * 1e6, "replay_checked_us": checked_s / n * 1e6,
            "verify_us": (checked_s - plain_s) / max(nodes, 1) * 1e6, "ratio": checked_s / plain_s}


def write_events(values: list[bytes], directory: str) -> Path:
    """``values`` as a file of one event a line in ``directory``."""
    path = Path(directory) / "events.jsonl"
    path.write_bytes(b"".join(v + b"\n" for v in values))
    return path


def core_ratio(values: list[bytes], repeat: int = 2) -> dict[str, Any]:
    """Seconds per event of ``replay_file`` and of ``json.loads`` over the same file of ``values``."""
    with tempfile.TemporaryDirectory(prefix="safepoint-core-") as d:
        path = write_events(values, d)

        def loads() -> float:
            t = time.perf_counter()
            with path.open("rb") as f:
                for line in f:
                    json.loads(line)
            return time.perf_counter() - t

        loads_s = min(loads() for _ in range(repeat))
        replay_s = min(replay_seconds(path) for _ in range(repeat))
    from safepoint.core import CORE, CORE_WHY

    n = len(values)
    return {"events": n, "json_loads_us": loads_s / n * 1e6, "replay_us": replay_s / n * 1e6,
            "ratio": loads_s / replay_s, "target": TARGETS["core_vs_json"], "core": CORE, "core_why": CORE_WHY}


def fleet_mix(nodes: int, seconds: float, node_rate: float, long_share: float, seed: int) -> list[tuple[int, int, str, str, int]]:
    """The sample fleet's actions in time order: (wall ms, node, action, reader id, order)."""
    rng = random.Random(seed)
    acts: list[tuple[int, int, str, str, int]] = []
    end = int(seconds * 1000)
    order = 0
    for n in range(nodes):
        for hb in range(rng.randrange(1000), end, 1000):
            acts.append((hb, n, "hb", "", order))
            order += 1
        t = 0.0
        k = 0
        while True:
            t += rng.expovariate(node_rate / 1000.0)
            if t >= end:
                break
            if rng.random() < long_share:
                dur = rng.uniform(8_000, 30_000)
            else:
                dur = min(999.0, rng.lognormvariate(3.9, 1.0))  # median e^3.9 ~ 50 ms
            rid = f"r{n}-{k}"
            k += 1
            acts.append((int(t), n, "open", rid, order))
            acts.append((int(t + dur) + 1, n, "close", rid, order + 1))
            order += 2
    acts.sort(key=lambda a: (a[0], a[4]))
    return acts


def _run_mix(acts: list[tuple[int, int, str, str, int]], nodes: int, retention: int | None) -> list[bytes]:
    """What ``nodes`` real reporters send for ``acts`` (after a topology event)."""
    from safepoint.connectors.reporter import Reporter

    t0 = 1_700_000_000_000
    now = [t0]
    sent: list[bytes] = [json.dumps({"v": 1, "type": "topology", "cluster": "fleet", "wall_ms": t0, "version": 1,
                                     "nodes": {f"n{i}": [] for i in range(nodes)}}).encode()]
    reps = [Reporter("127.0.0.1:1", f"n{i}", cluster="fleet", incarnation=0, heartbeat_interval_s=None,
                     mvcc_clock=lambda: now[0] * MVCC_PER_MS, wall_clock=lambda: now[0], retention=retention,
                     kafka_conf={"log_level": 0}) for i in range(nodes)]
    try:
        for rep in reps:
            rep._sender.produce = sent.append  # type: ignore[method-assign]  # the only stand-in: no broker here
            rep.heartbeat()
        open_: dict[str, Any] = {}
        for wall, n, what, rid, _ in acts:
            now[0] = t0 + wall
            if what == "hb":
                reps[n].heartbeat()
            elif what == "open":
                h = reps[n].reader(reader_id=rid)
                h.open()
                open_[rid] = h
            else:
                open_.pop(rid).close()
    finally:
        for rep in reps:
            rep.close(0.1)
    return sent


def _final_safe_ts(stream: list[bytes], retention: int) -> int | None:
    from safepoint.core import DIRECTIVES, Engine, Policy, Position

    engine = Engine(Policy(retention=retention, node_lease_ms=10**9, directive_interval_ms=0, stall_ms=0))
    last = None
    for i, v in enumerate(stream):
        for out in engine.process(v, Position("fleet", 0, i)):
            if out.channel == DIRECTIVES and out.value["type"] == "compaction":
                last = out.value["safe_ts"]
    return last


def fleet_figure(latency: list[dict[str, Any]], *, nodes: int, seconds: float, node_rate: float, long_share: float,
                 retention_s: float, seed: int, sustained: float | None = None) -> dict[str, Any]:
    """Events per reader eager and lazy (from the sample fleet) and the readers/s the job covers:
    at p99 < 2 s (the largest latency run's rate that kept it), and, apart, at the rate the job
    sustains over a backlog (``sustained``; latency not bounded)."""
    acts = fleet_mix(nodes, seconds, node_rate, long_share, seed)
    readers = sum(1 for a in acts if a[2] == "open")
    retention = int(retention_s * 1000 * MVCC_PER_MS)
    res: dict[str, Any] = {"sample_nodes": nodes, "sample_s": seconds, "node_rate": node_rate, "long_share": long_share,
                           "retention_s": retention_s, "readers": readers}
    for mode, r in (("eager", None), ("lazy", retention)):
        t = time.perf_counter()
        stream = _run_mix(acts, nodes, r)
        types = Counter(json.loads(v)["type"] for v in stream)
        per_reader = (types["reader_open"] + types["reader_close"]) / max(1, readers)
        res[mode] = {"events": len(stream), "types": dict(types), "events_per_reader": per_reader,
                     "events_per_node_s": 1.0 + node_rate * per_reader,  # and one heartbeat a second
                     "reporter_s": time.perf_counter() - t, "final_safe_ts": _final_safe_ts(stream, retention)}
    res["same_safe_point"] = res["eager"]["final_safe_ts"] == res["lazy"]["final_safe_ts"]
    ok = [x for x in latency if (x.get("latency_s") or {}).get("p99") is not None and x["latency_s"]["p99"] < 2.0
          and x.get("directives_measured")]
    res["capacity"] = None
    if ok:
        best = max(ok, key=lambda x: x["offered_rate_target"])
        cap = float(best["offered_rate_target"])
        res["capacity"] = {"events_per_s": cap, "p99_s": best["latency_s"]["p99"]}
        for mode in ("eager", "lazy"):
            fleet_nodes = cap / res[mode]["events_per_node_s"]
            res[mode]["fleet_nodes"] = fleet_nodes
            res[mode]["readers_per_s"] = fleet_nodes * node_rate
    res["sustained"] = sustained
    if sustained:
        for mode in ("eager", "lazy"):
            res[mode]["sustained_readers_per_s"] = sustained / res[mode]["events_per_node_s"] * node_rate
    measured = [(x["offered_rate_target"], (x.get("latency_s") or {}).get("p99")) for x in latency]
    res["latency_measured"] = measured
    return res


def _core_kind(core: dict[str, Any]) -> str:
    """How the core ran, in words (runs recorded before the compiled core say nothing of it)."""
    kind = core.get("core")
    if kind == "compiled":
        return "compiled by mypyc (`scripts/build_core.py`; the job's workers load the same build)"
    if kind == "python":
        return f"as Python ({core.get('core_why')})"
    return "as Python (recorded before the core was compiled)"


def report_lines(res: dict[str, Any]) -> list[str]:
    """The report's paragraphs for the core ratio, the scale run and the fleet figure."""
    L: list[str] = directive_lines(res.get("directive_sizes") or [])  # noqa: N806
    core = res.get("core")
    if core:
        L.append(f"Core: `safepoint replay`'s core over a {core['events']:,}-event file of the workload takes "
                 f"{core['replay_us']:.1f} us/event; bare `json.loads` of the same lines {core['json_loads_us']:.2f} us/event: "
                 f"ratio **{core['ratio']:.2f}** (target {core['target']:.2f}; best of two each, one after the other). "
                 f"The core ran {_core_kind(core)}.")
        L.append("")
    td = res.get("typed_decode")
    if td:
        L.append(f"Typed decode (`benchmarks/bench_typed.py`, over {td['events']:,} lines of the same file, best of three "
                 f"each, alternating): the core's `parse` {td['parse_us']:.2f} us/event; one msgspec decoder of structs "
                 f"made from the schemas, which validates as it decodes, {td['typed_us']:.2f}; the same made into the "
                 f"maps the rules read {td['typed_map_us']:.2f}. What a typed decode saves comes only with rules that "
                 f"read the structs: {td['parse_us'] - td['typed_us']:.2f} us/event.")
        L.append("")
    for bc in res.get("batch_cost") or []:
        ms = bc["ms_per_batch"]
        L.append(f"The operator's batch of {bc['batch_rows']:,} events (`benchmarks/bench_profiling.py` `batch_cost`: "
                 f"the job's batch logic without Spark, {bc['batches']} batches after the state has grown, the collector "
                 f"paused, the states it wrote kept for the next as the operator keeps them): "
                 f"**{bc['operator_ms']:.1f} ms** ({bc['status_off_operator_ms']:.1f} with the status off, "
                 f"{bc.get('decoded_operator_ms', float('nan')):.1f} with every state decoded as read; "
                 f"{bc['us_per_event']:.1f} us/event with the router's {ms['route']:.1f} ms); by part: "
                 + ", ".join(f"{k} {v:.1f} ms" for k, v in ms.items() if k != "route") + ".")
        L.append("")
    sc = res.get("scale")
    base = scale_base(res)
    if sc and base:
        n1, n2 = res["args"]["nodes"] + 1, res["workloads"]["scale"]["nodes"] + 1
        h1, h2 = base["holds"], sc["holds"]
        L.append("Memory and cost as the fleet grows (local[2], same event count, the two runs one right after the other; "
                 "RSS of the JVM + Python workers at the end):")
        L.append("")
        L.append("| nodes | holds at the end | ev/s | CPU us/event (all processes) | RSS | RSS per 1,000 nodes | RSS per 10,000 holds |")
        L.append("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for n, h, t in ((n1, h1, base), (n2, h2, sc)):
            rss = t["jvm_plus_workers_rss_end"]
            cpu = sum(t["cpu_us_per_event"].values())
            L.append(f"| {n:,} | {h:,} | {t['sustained_events_per_s'] or 0:,.0f} | {cpu:.0f} | {mb(rss)} | "
                     f"{mb(rss / (n / 1000))} | {mb(rss / max(1, h) * 10_000)} |")
        d_rss = sc["jvm_plus_workers_rss_end"] - base["jvm_plus_workers_rss_end"]
        c1, c2 = sum(base["cpu_us_per_event"].values()), sum(sc["cpu_us_per_event"].values())
        L.append("")
        L.append(f"From {n1:,} to {n2:,} nodes: RSS {d_rss / 1e6:+,.0f} MB ({d_rss / ((n2 - n1) / 1000) / 1e6:+,.1f} MB per "
                 f"further 1,000 nodes), CPU per event x{c2 / c1:.2f}, events/s x"
                 f"{(sc['sustained_events_per_s'] or 0) / max(1e-9, base['sustained_events_per_s'] or 0):.2f}.")
        L.append("")
    fl = res.get("fleet")
    if fl:
        L.append(f"Fleet: a sample of {fl['sample_nodes']} real reporters, {fl['sample_s']:.0f} s, each node opening "
                 f"{fl['node_rate']:,.0f} readers/s (log-normal, median ~50 ms, under 1 s; {fl['long_share']:.1%} for 8-30 s), "
                 f"a heartbeat a second, retention {fl['retention_s']:g} s; {fl['readers']:,} readers. The same final safe point "
                 f"with both: {'yes' if fl['same_safe_point'] else '**no**'}.")
        L.append("")
        cap = fl.get("capacity")
        L.append("| publishing | events per reader | events/s per node | nodes covered at p99 < 2 s | readers/s covered at "
                 "p99 < 2 s | readers/s at the sustained rate (latency not bounded) |")
        L.append("| --- | ---: | ---: | ---: | ---: | ---: |")
        for mode in ("eager", "lazy"):
            m = fl[mode]
            covered = (f"{m['fleet_nodes']:,.0f} | {m['readers_per_s']:,.0f}" if cap else "none | none")
            kept = f"{m['sustained_readers_per_s']:,.0f}" if fl.get("sustained") else "-"
            L.append(f"| {mode} | {m['events_per_reader']:.4f} | {m['events_per_node_s']:,.1f} | {covered} | {kept} |")
        L.append("")
        if fl.get("sustained"):
            L.append(f"The last column uses the job's sustained rate over the backlog on local[2], "
                     f"{fl['sustained']:,.0f} ev/s, where batches are large and latency is not bounded.")
            L.append("")
        measured = ", ".join(f"{r:,.0f} ev/s: p99 {'-' if q is None else f'{q:.2f} s'}" for r, q in fl["latency_measured"])
        if cap:
            L.append(f"Capacity: the largest offered rate whose p99 stayed under 2 s, {cap['events_per_s']:,.0f} ev/s "
                     f"(p99 {cap['p99_s']:.2f} s); measured: {measured}.")
        else:
            L.append(f"No latency run kept p99 under 2 s ({measured or 'none run'}), so no fleet is covered at that bound; "
                     "the events per reader above still give the ratio lazy registration buys.")
        L.append("")
    return L


DIRECTIVE_TARGET_BYTES = 8_000


def directive_bytes(nodes: int, holds_per_node: int = 3) -> dict[str, Any]:
    """The largest compaction directive and members record of a cluster of ``nodes`` members, each
    with a few open readers, through the core (what the job writes): bytes as they go on the wire."""
    from safepoint.core import DIRECTIVES, Engine, Policy, Position
    from safepoint.core.codec import encode

    engine = Engine(Policy(directive_interval_ms=0))
    names = [f"node-{i:05}" for i in range(nodes)]
    sizes: dict[str, int] = {"compaction": 0, "members": 0}
    offset = 0

    def feed(event: dict[str, Any]) -> None:
        nonlocal offset
        for out in engine.process(encode(event).encode(), Position("bench", 0, offset)):
            if out.channel == DIRECTIVES and out.value["type"] in sizes:
                sizes[out.value["type"]] = max(sizes[out.value["type"]], len(encode(out.value).encode()))
        offset += 1

    t0 = 1_700_000_000_000
    feed({"v": 1, "type": "topology", "cluster": "c1", "version": 1, "wall_ms": t0, "nodes": {n: [] for n in names}})
    for i, n in enumerate(names):
        base = {"v": 1, "cluster": "c1", "node": n, "incarnation": 1, "wall_ms": t0 + 1}
        for k in range(holds_per_node):
            feed({**base, "type": "reader_open", "seq": k + 1, "reader_id": f"r{k}", "read_ts": 1_000_000 + i + k})
        feed({**base, "type": "heartbeat", "seq": holds_per_node + 1, "mvcc_now": 2_000_000})
    return {"nodes": nodes, "compaction_bytes": sizes["compaction"], "members_bytes": sizes["members"]}


def directive_sizes(nodes: tuple[int, ...] = (1_000, 10_000)) -> list[dict[str, Any]]:
    return [directive_bytes(n) for n in nodes]


def directive_lines(sizes: list[dict[str, Any]]) -> list[str]:
    if not sizes:
        return []
    L = ["Directive size (through the core, each member with 3 open readers; the members record goes out only "  # noqa: N806
         "when the member set changed):", "", "| members | compaction directive | members record |", "| ---: | ---: | ---: |"]
    L += [f"| {d['nodes']:,} | {d['compaction_bytes']:,} B | {d['members_bytes']:,} B |" for d in sizes]
    L.append("")
    return L


def targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    core = res.get("core")
    if core:
        out.append({"target": f"replay >= {core['target']:.2f} of bare json.loads over the same file",
                    "measured": f"{core['ratio']:.2f} ({core['replay_us']:.1f} vs {core['json_loads_us']:.2f} us/event)",
                    "ok": core["ratio"] >= core["target"]})
    big = max(res.get("directive_sizes") or [], key=lambda d: d["nodes"], default=None)
    if big is not None:
        out.append({"target": f"a directive at {big['nodes']:,} nodes < {DIRECTIVE_TARGET_BYTES:,} B",
                    "measured": f"{big['compaction_bytes']:,} B", "ok": big["compaction_bytes"] < DIRECTIVE_TARGET_BYTES})
    return out
