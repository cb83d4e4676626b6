"""The benchmark's report: the markdown table with ratios, targets met or not, findings from the profiles, and the latency plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench_capacity import capacity_lines
from bench_common import TARGETS, fmt_rate, mb, scale_base
from bench_fleet import report_lines, targets
from bench_machine import machine_lines, saturation


def plot_latency(lat_runs: list[dict[str, Any]], path: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed (pip install -e '.[bench]'): no plot"
    fig, ax = plt.subplots(figsize=(10, 5))
    for r in lat_runs:
        if r.get("series"):
            xs = [a for a, _ in r["series"]]
            ys = [b for _, b in r["series"]]
            p99 = r["latency_s"]["p99"]
            ax.plot(xs, ys, ".", markersize=3, label=f"{r['offered_rate_target']:,.0f} ev/s offered (p99 {p99:.2f} s)")
    ax.axhline(TARGETS["p99_latency_s"], color="red", linestyle="--", linewidth=1, label=f"target p99 {TARGETS['p99_latency_s']:g} s")
    ax.set_xlabel("send time of the event, s since pacing started")
    ax.set_ylabel("event-to-directive latency, s")
    ax.set_yscale("log")
    ax.set_title("safepoint job: event-to-directive latency over time")
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def status(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "**not met**")


def _samples_table(L: list[str], intro: str, header: str, groups: list[Any], top_label: str, top: list[Any]) -> None:
    """A profile's samples by group, as a table, then its top self frames."""
    L.append(intro)
    L.append("")
    L.append(header)
    L.append("| --- | ---: |")
    for k, _n, sh in groups:
        L.append(f"| {k} | {sh:.1%} |")
    L.append("")
    L.append(top_label + "; ".join(f"{k} {sh:.1%}" for k, _n, sh in top))
    L.append("")


def values_line(st: dict[str, Any]) -> str:
    """The state's stored values (MessagePack, as the job writes them) at the end of the plain
    consumer's run, per hold; not measured when that phase did not run."""
    fixed = f"a node without holds adds {st['per_node_fixed_bytes']:,.0f} B to its bucket"
    if not st["node_bytes"]:
        return f"the stored values themselves not measured (the plain phase did not run); {fixed}"
    return (f"the stored values themselves (MessagePack): node buckets {mb(st['node_bytes'])}, cluster "
            f"{mb(st['cluster_bytes'])} = {st['logical_per_hold']:,.0f} B/hold ({fixed})")


def build_report(res: dict[str, Any]) -> str:
    L: list[str] = []  # noqa: N806
    a = res["args"]
    L.append(f"# safepoint benchmark {res['timestamp']}")
    L.append("")
    L.append(f"Machine: {res['machine']['cpus']} CPUs, load average at start {res['machine']['loadavg_start']}, at end "
             f"{res['machine'].get('loadavg_end')}. Total run {res['total_s']:.0f} s. Broker: "
             + ("memory only (tansu, `--broker memory`; each backlog ends with a one-record batch per partition, "
                "a dead letter: see benchmarks/bench_brokers.py)." if a.get("broker") == "memory"
                else "Apache Kafka (one KRaft broker, `--broker kafka`)." if a.get("broker") == "kafka"
                else "the embedded broker (noida-db).")
             + (f" Broker start: {res['broker_start_s']:.1f} s." if res.get("broker_start_s") else "")
             + f" The job's source: {a.get('sources', ['python'])[0]}.")
    tw = res["workloads"].get("throughput")
    if tw:
        L.append(f"Workload: {a['nodes']} nodes + 1 probe node, {tw['events']:,} events backlog ({tw['types']}), "
                 f"{tw['heartbeat_ms']} ms heartbeats, long-reader share {a['long_share']}, probe {a['probe_hz']} Hz "
                 f"({tw['probe_closes']} probe closes = directives); {a['partitions']} partitions.")
    L.append("")
    L.append("| measurement | events/s | vs plain | vs raw consume | memory (RSS) | notes |")
    L.append("| --- | ---: | ---: | ---: | ---: | --- |")
    raw = res.get("raw_consume")
    plain = res.get("plain")
    raw_r = raw["events_per_s"] if raw else None
    plain_r = plain["events_per_s"] if plain else None

    def ratio(x: float | None, y: float | None) -> str:
        return "-" if not x or not y else f"{x / y:.2f}x"

    if res.get("produce"):
        p = res["produce"]
        L.append(f"| broker produce (backlog load) | {fmt_rate(p['events_per_s'])} | | | | idempotent producer, linger 20 ms |")
    if raw:
        L.append(f"| (1) raw consume | {fmt_rate(raw_r)} | {ratio(raw_r, plain_r)} | 1.00x | | {raw['mb_per_s']:.1f} MB/s, "
                 f"confluent-kafka, no processing |")
    if plain:
        L.append(f"| (2) plain consumer (1 process) | {fmt_rate(plain_r)} | 1.00x | {ratio(plain_r, raw_r)} | "
                 f"{mb(plain['rss_peak'])} peak | consume + Engine.process + produce; outputs {plain['outputs']} |")
    for tp in res.get("spark_throughput", []):
        s = tp["sustained_events_per_s"]
        cpu = ", ".join(f"{k} {v:.0f}" for k, v in sorted(tp["cpu_us_per_event"].items()))
        L.append(f"| (3a) job {tp['master']}{'' if tp.get('status', True) else ', status off'}, sustained after batch 0 | {fmt_rate(s)} | {ratio(s, plain_r)} | {ratio(s, raw_r)} | "
                 f"{mb(tp['jvm_plus_workers_rss_end'])} (JVM {mb(tp['rss_end'].get('jvm'))} + {tp['rss_end'].get('workers_n')} "
                 f"workers {mb(tp['rss_end'].get('workers'))}; PSS {mb(tp['rss_end'].get('jvm_pss', 0) + tp['rss_end'].get('workers_pss', 0))}) | "
                 f"{tp['batches']} batches, "
                 f"{tp['directives']} directives; batch 0: {tp['batch0_rows']} rows in "
                 f"{tp['batch0_ms']} ms; wall after batch 0 {fmt_rate(tp['wall_events_per_s_after_batch0'])}/s; "
                 f"CPU us/event: {cpu} |")
    prof_tp = res.get("profile", {}).get("spark_pyspy_run")
    if prof_tp:
        L.append(f"| job {prof_tp['master']} under py-spy (not a figure) | {fmt_rate(prof_tp['sustained_events_per_s'])} | "
                 f"{ratio(prof_tp['sustained_events_per_s'], plain_r)} | | | sampling overhead included |")
    L.append("")
    lat = res.get("latency", [])
    if lat:
        L.append(f"Latency (job on {lat[0]['master']}, trigger {a['trigger_ms']} ms; each directive's arrival minus the send time "
                 "of the events whose `wall_ms` equals its `cluster_wall_ms`; warm-up excluded):")
        L.append("")
        L.append("| offered ev/s (actual) | directives | p50 s | p95 s | p99 s | max s | job ev/s (sustained) | backlog at end | "
                 "RSS JVM+workers | state dir |")
        L.append("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in lat:
            q = r["latency_s"]

            def f(x: float | None, q: dict[str, Any] = q) -> str:
                return "-" if x is None else (">=" if q.get("lower_bound") else "") + f"{x:.2f}"

            L.append(f"| {r['offered_rate_target']:,.0f} ({fmt_rate(r['offered_rate_actual'])}) | {r['directives_measured']}/"
                     f"{r['directives_expected']} | {f(q['p50'])} | {f(q['p95'])} | {f(q['p99'])} | {f(q['max'])} | "
                     f"{fmt_rate(r['job_sustained_events_per_s'])} | {r['backlog_at_end_of_pacing']:,} ev"
                     f"{'' if r['drained'] else ' (not drained)'} | {mb(r['jvm_plus_workers_rss_end'])} | "
                     f"{mb(r['state_dir_bytes'])} |")
        L.append("")
        if res.get("plot"):
            L.append(f"![latency over time]({res['plot']})")
            L.append("")
    st = res.get("state")
    if st:
        L.append(f"State at the end of the backlog: {st['holds']:,} active holds (open readers + undecided transactions) on "
                 f"{st['nodes']:,} nodes. Checkpoint `state/` dir (du): {mb(st['state_dir_bytes'])} = "
                 f"**{st['state_dir_per_hold']:,.0f} B/hold**; live RocksDB SST + memtable per the last batch: "
                 f"{mb(st.get('rocksdb_bytes'))}; {values_line(st)}. JVM+workers RSS per hold: {st['rss_per_hold']:,.0f} B.")
        L.append("")
    L.extend(report_lines(res))
    L.extend(machine_lines(res))
    L.extend(capacity_lines(res))
    L.append("## Targets (reported, not asserted)")
    L.append("")
    L.append("| target | measured | status |")
    L.append("| --- | --- | --- |")
    for t in res["targets"]:
        L.append(f"| {t['target']} | {t['measured']} | {status(t['ok'])} |")
    L.append("")
    prof = res.get("profile")
    if prof:
        L.append("## Profile: where the job's per-event time goes")
        L.append("")
        for line in prof.get("findings", []):
            L.append(f"- {line}")
        L.append("")
        ps = prof.get("pyspy")
        if ps and "groups" in ps:
            _samples_table(L, f"py-spy over the job's Python processes ({ps['samples']:,} samples at {ps['rate_hz']} Hz; "
                           f"by process: {ps['by_process_kind']}), deepest matching frame:",
                           "| where | share of Python samples |", ps["groups"], "Top self frames: ", ps["top_self"][:10])
        jf = prof.get("jfr")
        if jf and jf.get("groups"):
            _samples_table(L, f"Java Flight Recorder over the job's JVM during the same run ({jf['samples']:,} execution samples; "
                           f"{jf['by_thread']}; {jf['gc_count']} GCs, {jf['gc_pauses_ms']:,.0f} ms of pauses), deepest matching frame:",
                           "| where (JVM) | share of JVM samples |", jf["groups"], "Top self frames (JVM): ", jf["top_self"][:8])
        pp = prof.get("processors_local")
        if pp:
            L.append(f"The job's processors run locally without Spark ({pp['events']:,} events in batches of {pp['batch_rows']:,}): "
                     f"router {pp['route_us_per_event']:.1f} us/event, stateful operator {pp['operator_us_per_event']:.1f}, "
                     f"{fmt_rate(pp['events_per_s'])} ev/s. "
                     + _cumulative(pp["cumulative_us_per_event"]))
            L.append("")
        pl = prof.get("plain_core")
        if pl:
            L.append(f"The core alone (Engine.process, no Kafka): {pl['us_per_event']:.1f} us/event ({fmt_rate(pl['events_per_s'])} ev/s). "
                     + _cumulative(pl["cumulative_us_per_event"]))
            L.append("")
    L += source_lines(res)
    if res.get("notes"):
        L.append("## Notes")
        L.append("")
        for n in res["notes"]:
            L.append(f"- {n}")
        L.append("")
    return "\n".join(L)


def source_lines(res: dict[str, Any]) -> list[str]:
    """The job's two sources side by side (``--source python,kafka``): throughput and CPU per event of
    the same local[2] run, p99 event to directive at each rate, each from one run on the same broker."""
    by = res.get("by_source") or {}
    if len(by) < 2:
        return []
    L = ["## The job's two sources", "",  # noqa: N806
         "Each row from its own runs, one after the other on the same kind of broker (`source_format`: `python`, the "
         "job's own source, which routes and packs in its read tasks and sends outputs from the operator; `kafka`, "
         "Spark's connector, with a router stage and Spark's Kafka sink).", "",
         "| source | local[2] sustained ev/s | CPU us/event (JVM, workers, driver, broker) | "
         + " | ".join(f"p99 at {lat['offered_rate_target']:,.0f} ev/s" for lat in (next(iter(by.values())).get("latency") or []))
         + " |",
         "| --- | ---: | --- |" + " ---: |" * len(next(iter(by.values())).get("latency") or [])]
    for source, runs in by.items():
        tp = next((t for t in runs.get("spark_throughput") or [] if t["master"] == "local[2]" and t.get("status", True)), None)
        cpu = ", ".join(f"{k} {v:.0f}" for k, v in sorted((tp or {}).get("cpu_us_per_event", {}).items())) or "-"
        p99 = [f"{lat['latency_s']['p99']:.2f} s" if lat["latency_s"]["p99"] is not None else "-"
               for lat in runs.get("latency") or []]
        L.append(f"| {source} | {fmt_rate(tp['sustained_events_per_s']) if tp else '-'} | {cpu} | " + " | ".join(p99) + " |")
    L.append("")
    return L


def _latency_target(res: dict[str, Any], rate: int, bound: float) -> dict[str, Any]:
    """The p99 target at one offered rate (a lower bound under it proves nothing)."""
    name = f"p99 event-to-directive latency <= {bound:g} s at {rate:,} ev/s"
    lat = [x for x in res.get("latency", []) if x["offered_rate_target"] == rate]
    if not lat:
        return {"target": name, "measured": f"not run at {rate:,} ev/s", "ok": None}
    q = lat[0]["latency_s"]
    p99, lb = q["p99"], q.get("lower_bound")
    ok = None if p99 is None else p99 <= bound
    if lb and ok:
        ok = None
    return {"target": name,
            "measured": "-" if p99 is None else f"{'>= ' if lb else ''}{p99:.2f} s (p50 {q['p50']:.2f} s; job "
            f"{fmt_rate(lat[0]['job_sustained_events_per_s'])} ev/s sustained, backlog "
            f"{lat[0]['backlog_at_end_of_pacing']:,} events when pacing ended)",
            "ok": ok}


def evaluate_targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    plain = (res.get("plain") or {}).get("events_per_s")
    tps = {t["master"]: t for t in res.get("spark_throughput", []) if t.get("status", True)}
    best_master = "local[2]" if "local[2]" in tps else (
        max(tps.values(), key=lambda t: t["sustained_events_per_s"] or 0)["master"] if tps else None)
    best = (tps[best_master]["sustained_events_per_s"] or None) if best_master else None
    r = best / plain if best and plain else None
    sat = saturation(res)
    job_bound = (f"; at its CPU per event, every core the broker leaves would give "
                 f"{sat['job_bound_events_per_s'] / plain:.2f}x" if plain and "job_bound_events_per_s" in sat else "")
    out.append({"target": f"job throughput ({best_master or 'local[2]'}) >= plain consumer (aim 1.5x)",
                "measured": f"{r:.2f}x ({best_master}: {fmt_rate(best)} vs {fmt_rate(plain)} ev/s{job_bound})" if r else "-",
                "ok": (r >= TARGETS["throughput_vs_plain"]) if r else None})
    out.append({"target": "aim: job throughput 1.5x plain", "measured": f"{r:.2f}x" if r else "-",
                "ok": (r >= TARGETS["throughput_vs_plain_aim"]) if r else None})
    for rate, bound in ((TARGETS["p99_at_rate"], TARGETS["p99_latency_s"]), (TARGETS["p99_low_rate"], TARGETS["p99_low_latency_s"])):
        out.append(_latency_target(res, rate, bound))
    plain_cpu = (res.get("plain") or {}).get("cpu_us_per_event", {}).get("plain")
    for t in tps.values():
        job_cpu = sum(v for k, v in (t.get("cpu_us_per_event") or {}).items() if k != "broker")
        if plain_cpu and job_cpu:
            out.append({"target": f"the job's CPU per event besides the broker <= {TARGETS['cpu_vs_plain']:g}x the plain "
                                  f"consumer's ({t['master']})",
                        "measured": f"{job_cpu / plain_cpu:.2f}x ({job_cpu:.1f} vs {plain_cpu:.1f} us)",
                        "ok": job_cpu / plain_cpu <= TARGETS["cpu_vs_plain"]})
    for t in res.get("spark_throughput", []):
        if t.get("batch0_ms") is not None:
            out.append({"target": f"batch 0 < {TARGETS['batch0_s']:g} s ({t['master']}{'' if t.get('status', True) else ', status off'})",
                        "measured": f"{t['batch0_ms'] / 1000:.1f} s ({t['batch0_rows']:,} rows)",
                        "ok": t["batch0_ms"] < TARGETS["batch0_s"] * 1000})
    rss = [t["jvm_plus_workers_rss_end"] for t in [*res.get("spark_throughput", []), res.get("scale") or {}]
           if t.get("jvm_plus_workers_rss_end")]
    if rss:
        out.append({"target": f"RSS of the JVM and workers < {TARGETS['rss_bytes'] / 1e9:g} GB (every job run)",
                    "measured": f"at most {max(rss) / 1e6:,.0f} MB", "ok": max(rss) < TARGETS["rss_bytes"]})
    sc, base = res.get("scale"), scale_base(res)
    if sc and base and sc.get("cpu_us_per_event") and base.get("cpu_us_per_event"):
        big, small = sum(sc["cpu_us_per_event"].values()), sum(base["cpu_us_per_event"].values())
        out.append({"target": f"CPU per event with 10x the nodes <= {TARGETS['cpu_growth_10x_nodes']:g}x (all processes; "
                              "two local[2] runs, one right after the other)",
                    "measured": f"{big / small:.2f}x ({small:.0f} -> {big:.0f} us)",
                    "ok": big / small <= TARGETS["cpu_growth_10x_nodes"]})
    st = res.get("state")
    if st:
        clusters = int((res.get("args") or {}).get("clusters") or 1)
        bound = TARGETS["state_bytes_per_hold" if clusters == 1 else "state_bytes_per_hold_clusters"]
        out.append({"target": f"state <= {bound} bytes per active hold ({clusters} cluster{'s' if clusters > 1 else ''})",
                    "measured": f"{st['state_dir_per_hold']:,.0f} B/hold (checkpoint state dir)"
                                + (f"; the stored values alone {st['logical_per_hold']:,.0f} B/hold" if st["node_bytes"] else ""),
                    "ok": st["state_dir_per_hold"] <= bound})
    if "local[1]" in tps and "local[2]" in tps and tps["local[1]"]["sustained_events_per_s"]:
        s = tps["local[2]"]["sustained_events_per_s"] / tps["local[1]"]["sustained_events_per_s"]
        out.append({"target": "scaling 1 -> 2 cores (local[2] / local[1]; 1.5x taken as the bar, 2.0x ideal)",
                    "measured": f"{s:.2f}x ({fmt_rate(tps['local[1]']['sustained_events_per_s'])} -> "
                                f"{fmt_rate(tps['local[2]']['sustained_events_per_s'])} ev/s)"
                                + (f"; this machine's ceiling {res['cores_together']['scaling_ceiling']:.2f}x (cores together)"
                                   if res.get("cores_together") else "")
                                + (f", {sat['scaling_bound']:.2f}x (cores the broker leaves)" if "scaling_bound" in sat else ""),
                    "ok": s >= TARGETS["scaling_2_vs_1"]})
    for off in (t for t in res.get("spark_throughput", []) if not t.get("status", True)):
        on = tps.get(off["master"])
        if on and on["sustained_events_per_s"] and off["sustained_events_per_s"]:
            cost = 1 - on["sustained_events_per_s"] / off["sustained_events_per_s"]
            out.append({"target": f"the status costs <= 10% of the job's throughput ({off['master']})",
                        "measured": f"{cost:+.1%} ({fmt_rate(on['sustained_events_per_s'])} ev/s with it, "
                                    f"{fmt_rate(off['sustained_events_per_s'])} without; one run each, noisy)",
                        "ok": cost <= 0.10})
    out.extend(targets(res))
    return out


def _cumulative(cumulative: dict[str, float]) -> str:
    """cProfile's cumulative us/event of the named functions; none are seen when the core runs compiled."""
    if not cumulative:
        return ("The core ran compiled: cProfile sees only Python functions, so it gives no breakdown "
                "(`SAFEPOINT_CORE=python safepoint bench --phases profile` gives that of the core as Python).")
    return "Cumulative us/event: " + ", ".join(f"`{k}` {v:.1f}" for k, v in sorted(cumulative.items(), key=lambda kv: -kv[1]))


def _cores_taken(taken: dict[str, float | None]) -> str:
    """``; while pacing, the broker took 0.62 of a core and the load generator 0.20`` (or "")."""
    if taken.get("broker") is None:
        return ""
    load = f" and the load generator {taken['load']:.2f}" if taken.get("load") is not None else ""
    return f"; while pacing, the broker took {taken['broker']:.2f} of a core{load}"


def findings(res: dict[str, Any]) -> list[str]:
    """Plain-language top findings from the numbers (the .md and the console)."""
    out: list[str] = []
    tps = [t for t in res.get("spark_throughput", []) if t.get("status", True)]
    t2 = next((t for t in tps if t["master"] == "local[2]"), tps[-1] if tps else None)
    prof = res.get("profile", {})
    pp = prof.get("processors_local")
    pl = prof.get("plain_core")
    ps = prof.get("pyspy")
    if t2 and t2.get("sustained_events_per_s"):
        per_ev = 1e6 / t2["sustained_events_per_s"]
        cpu = t2.get("cpu_us_per_event") or {}
        tot = sum(cpu.values())
        out.append(
            f"Job {t2['master']}: {per_ev:.0f} us of wall time per event; CPU per event "
            + ", ".join(f"{k} {v:.0f} us ({v / tot:.0%})" for k, v in sorted(cpu.items(), key=lambda kv: -kv[1]))
            + f" = {tot:.0f} us of CPU per event on 2 cores"
            + (f" (the plain consumer: {1e6 / res['plain']['events_per_s']:.0f} us of wall time per event in one process)"
               if res.get("plain") else "")
            + "."
        )
        ph = t2.get("phase_ms_after_batch0") or {}
        if ph.get("triggerExecution"):
            te = ph["triggerExecution"]
            parts = ", ".join(f"{k} {v / te:.0%}" for k, v in sorted(ph.items(), key=lambda kv: -kv[1]) if k != "triggerExecution")
            out.append(f"Micro-batch time after batch 0 by phase (of triggerExecution): {parts}.")
        ops = t2.get("state_operators_last") or []
        if ops:
            out.append("State operators in the last batch: " + "; ".join(
                f"{o['name']}: rows {o['numRowsTotal']}, updated {o['numRowsUpdated']}, allUpdates {o['allUpdatesTimeMs']} ms, "
                f"commit {o['commitTimeMs']} ms" for o in ops) + ".")
    for r in res.get("latency", []):
        if r.get("job_batch_ms_p50") and r.get("job_batch_rows_p50"):
            out.append(f"At {r['offered_rate_target']:,.0f} ev/s offered, the job's batches held {r['job_batch_rows_p50']:,.0f} "
                       f"rows (p50) and took {r['job_batch_ms_p50']:,.0f} ms (p50): "
                       f"{r['job_batch_ms_p50'] * 1000 / r['job_batch_rows_p50']:,.0f} us per event in small batches, "
                       f"{'behind' if r['backlog_at_end_of_pacing'] > r['offered_rate_target'] else 'keeping up'} "
                       f"({r['backlog_at_end_of_pacing']:,} events of backlog when pacing ended)"
                       + _cores_taken(r.get("cores_taken_while_pacing") or {}) + ".")
    if pp and pl:
        out.append(
            f"Python work per event in the job's batch logic, measured without Spark: "
            f"{pp['total_us_per_event']:.1f} us (router {pp['route_us_per_event']:.1f}, stateful operator "
            f"{pp['operator_us_per_event']:.1f}), "
            f"Engine.process alone {pl['us_per_event']:.1f} us. Stored state values at the end: {pp['state_value_bytes']:,} B."
        )
    jf = prof.get("jfr")
    if jf and jf.get("groups"):
        top = ", ".join(f"{k} {sh:.0%}" for k, _n, sh in jf["groups"][:6])
        out.append(f"JFR over the JVM: {top}; GC pauses {jf['gc_pauses_ms']:,.0f} ms over {jf['gc_count']} collections.")
    if ps and ps.get("groups"):
        top = ", ".join(f"{k} {sh:.0%}" for k, _n, sh in ps["groups"][:6])
        out.append(f"py-spy over the job's Python processes: {top}.")
        if ps.get("busy_python_processes") is not None:
            out.append(f"On average {ps['busy_python_processes']:.2f} Python processes were on CPU during the profiled run "
                       "(out of 2 cores): the rest is the JVM, the broker and idle time.")
    return out
